"""A hostile sweep bundle (one experiment on many releases) and what `verify --rerun` asks
the index for.

A sweep bundle of experiment-a is anchored (step 5 holds its probes to the installed copy),
so `verify --rerun` re-runs it without asking for consent: whatever the rerun takes from the
bundle before it runs anything must be checked first. The fixture makes such a bundle from
the committed experiment-a sweep, its probes refreshed to the installed copy and everything
derived from them re-derived, so steps 1-5 pass before any tamper.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprobe.evidence.sweep_view import TIMELINE, render_readme, timeline_svg
from kvprobe.resources import builtin_probes_dir
from tests import forge
from tests.attacks.harness import COMMITTED, assert_outcome, copy_committed

pytestmark = pytest.mark.attack

RELEASE = "0.5.20"


def _rederive(bundle: Path, change) -> None:
    """Edit the sweep receipt, then re-render README.md and the timeline and re-hash."""
    receipt = forge.load(bundle, "receipt.json")
    change(receipt)
    (bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    (bundle / "README.md").write_text(render_readme(receipt), encoding="utf-8")
    (bundle / TIMELINE).write_text(timeline_svg(receipt), encoding="utf-8")
    forge.rehash(bundle)


@pytest.fixture
def anchored_sweep(sandbox) -> Path:
    (committed,) = sorted(COMMITTED.glob("experiment-a-sweep-*"))
    bundle = copy_committed(committed, sandbox, "sweep-a")
    installed = builtin_probes_dir() / "experiment-a"
    for old in (bundle / "probes" / "experiment-a").iterdir():
        old.unlink()
    for source in sorted(installed.iterdir()):
        if source.is_file() and source.suffix in (".py", ".toml"):
            (bundle / "probes" / "experiment-a" / source.name).write_bytes(source.read_bytes())

    def recite_probes(receipt):
        for release in receipt["releases"]:
            for probe in release["probes"]:
                probe["source"]["sha256"] = forge.sha((bundle / probe["source"]["path"]).read_bytes())

    _rederive(bundle, recite_probes)
    return bundle


def test_the_anchored_sweep_verifies(sandbox, anchored_sweep):
    """The attacks below start from a bundle that passes steps 1-5."""
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 0)


def _evil_sdist(sandbox, name: str) -> Path:
    """A source tree whose build backend writes the marker: pip runs it to read its metadata."""
    tree = sandbox.inputs / name
    tree.mkdir()
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "evilbackend"\nbackend-path = ["."]\n'
    )
    (tree / "evilbackend.py").write_text(
        f"import pathlib\npathlib.Path({str(sandbox.marker)!r}).write_text('bundle code ran')\n"
        "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
    )
    return tree


@pytest.mark.parametrize(
    "tamper",
    [
        # a requirement of the bundle's choosing: a local source tree pip builds (an sdist on
        # the index would do the same), the file name no wheel name, so no --only-binary
        "package-is-a-path",
        # the wheel of another release recorded for this one
        "file-of-another-release",
        # a package the experiment never pins
        "other-package",
    ],
)
def test_sweep_rerun_asks_the_index_only_for_the_experiments_own_wheels(sandbox, anchored_sweep, tamper):
    """Attack: a release's recorded wheel names what the rerun resolves on the index (`pip
    install --dry-run PACKAGE==VERSION`), before anything compares it with the experiment."""
    if tamper == "package-is-a-path":
        tree = _evil_sdist(sandbox, f"evil=={RELEASE}")
        wheel = {"package": str(tree)[: -len(f"=={RELEASE}")], "file": "not-a-wheel"}
    elif tamper == "file-of-another-release":
        wheel = {"file": "sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl"}
    else:
        wheel = {"package": "sglang-evil", "file": f"sglang_evil-{RELEASE}-py3-none-any.whl"}

    def change(receipt):
        (release,) = [r for r in receipt["releases"] if r["version"] == RELEASE]
        release["wheel"].update(wheel)

    _rederive(anchored_sweep, change)
    result = sandbox.run("verify", anchored_sweep, "--rerun", "--release", RELEASE, timeout=120)
    assert_outcome(sandbox, result, 1, f"release {RELEASE}", "not a wheel of")


@pytest.mark.parametrize(
    "claim",
    [
        # a vulnerability of the bundle's choosing, its fix a security fix: OpenVEX would name it
        {"vulnerability": {"id": "CVE-2099-0001", "aliases": [], "fix_kind": "security"}},
        # another upstream fix than the bundled experiment.toml's
        {"fix": {"prs": [99999], "release": "0.5.21", "summary": "closes CVE-2099-0001"}},
        {"title": "Remote code execution in the scheduler"},
    ],
)
def test_the_experiment_a_sweep_quotes_is_the_bundled_one(sandbox, anchored_sweep, claim):
    """Attack: the receipt's experiment facts (what OpenVEX and OSV exports quote) relabel the
    installed experiment-a, whose file and probes step 5 finds unchanged."""
    _rederive(anchored_sweep, lambda receipt: receipt["experiment"].update(claim))
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "experiment-mismatch", "the receipt disagrees with the bundled experiment")
