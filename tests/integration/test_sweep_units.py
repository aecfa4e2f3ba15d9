"""The driver's side of a sweep unit: a real one-release bundle, produced and packed by a
unit on the local fake index, is merged; the same bundle is refused, as that release's
could-not-observe with the reason, whenever it is not what the driver asked for."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from pathlib import Path

import pytest

from kvprobe.experiments import experiment
from kvprobe.experiments.experiment import copy_into_bundle
from kvprobe.model.records import WheelPin
from kvprobe.progress import Reporter
from kvprobe.run.session import SessionSettings
from kvprobe.run.sweep_unit import (
    Expected,
    UnitOutcome,
    UnitRequest,
    accept_unit,
    open_session,
    produce_unit,
)
from tests.integration.test_sweep_local_index import sweep, world  # noqa: F401  (fixtures)

pytestmark = pytest.mark.network  # the env's lock comes from PyPI


def _pin(world, version: str) -> WheelPin:  # noqa: F811  (the fixture's name)
    path = next((world["root"] / "simple" / "scrubkv").glob(f"scrubkv-{version}-*.whl"))
    return WheelPin("scrubkv", version, path.name, hashlib.sha256(path.read_bytes()).hexdigest())


def test_driver_merges_a_unit_it_asked_for_and_refuses_one_it_did_not(world, sweep, tmp_path, monkeypatch):  # noqa: F811
    from kvprobe.env.venv import EnvManager, load_profile

    monkeypatch.delenv("PIP_INDEX_URL")  # the env's lock comes from PyPI
    EnvManager(world["cache"]).ensure(load_profile("pytest-minimal"))
    monkeypatch.setenv("PIP_INDEX_URL", world["index"])
    exp = experiment.load("scrub-sweep")
    request = UnitRequest(exp.id, exp.file_sha256, _pin(world, "1.1"), 120.0, None, world["cache"])
    with contextlib.ExitStack() as held:
        session = held.enter_context(open_session(exp, SessionSettings(world["cache"]), Reporter()))
        archive = produce_unit(request, session)

    def accept(outcome: UnitOutcome, exp=exp, env=session.record, tamper_probe: bool = False):
        staging = Path(tmp_path / f"staging-{len(list(tmp_path.glob('staging-*')))}")
        copy_into_bundle(exp, staging)
        if tamper_probe:
            (staging / "probes" / exp.id / "scrub.py").write_text("# the driver's copy differs\n")
        entry, _ = accept_unit(outcome, Expected(exp, staging, env), tmp_path)
        return entry, staging

    entry, staging = accept(UnitOutcome(request, archive))
    assert entry.classification.overall == "affected"
    assert entry.wheel is not None and entry.wheel.sha256 == request.pin.sha256
    assert (staging / "raw" / "1.1" / "probes" / "scrub.json").is_file()

    other = dataclasses.replace(request, pin=_pin(world, "2.0"))
    wrong_sha = dataclasses.replace(request, pin=dataclasses.replace(request.pin, sha256="0" * 64))
    cases = [
        (accept(UnitOutcome(other, archive)), "releases ['1.1'], asked for 2.0"),
        (accept(UnitOutcome(wrong_sha, archive)), f"asked for {request.pin.filename} sha256 {'0' * 64}"),
        # a unit must run its probes as often as asked (sweep --repeat): one run hides instability
        (accept(UnitOutcome(dataclasses.replace(request, repeat=2), archive)), "1 time(s), asked for 2"),
        (
            accept(UnitOutcome(request, archive), exp=dataclasses.replace(exp, file_sha256="0" * 64)),
            "experiment sha256",
        ),
        (
            accept(UnitOutcome(request, archive), env=dataclasses.replace(session.record, key="another-env")),
            "the sweep's is 'another-env'",
        ),
        (accept(UnitOutcome(request, archive), tamper_probe=True), "probe source probes/scrub-sweep/scrub.py"),
        (accept(UnitOutcome(request, b"not a packed bundle")), "unit bundle refused"),
        (accept(UnitOutcome(request, archive[: len(archive) // 2])), "unit bundle refused"),
        (accept(UnitOutcome(request, None, "the unit failed: boom")), "the unit failed: boom"),
    ]
    for (refused, staging), reason in cases:
        assert refused.problem is not None and reason in refused.problem, (reason, refused.problem)
        assert refused.classification.overall == "could-not-observe"
        assert refused.wheel is None and refused.probes == ()
        assert not (staging / "raw").exists()  # nothing of a refused unit is merged
