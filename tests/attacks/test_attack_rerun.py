"""Code from a bundle never runs without consent; a known experiment is a trust anchor (issue #11).

The model experiment re-runs in seconds without SGLang, so every rerun here is real. A
bundle of an experiment kvprobe does not ship is made by renaming the committed model
bundle's experiment (``model-fork``): self-consistent, verifies, and its probes are armed.
"""

from __future__ import annotations

import hashlib

import pytest

from tests import forge
from tests.attacks.harness import (
    EXP_A_BUNDLE,
    MODEL_BUNDLE,
    arm,
    assert_outcome,
    copy_committed,
    line_naming,
    payload,
    rename_experiment,
)

pytestmark = pytest.mark.attack

TRUST_FLAG = "--trust-bundle-code"


@pytest.fixture
def fork(sandbox):
    """A self-consistent bundle of an experiment kvprobe does not ship, every .py armed."""
    bundle = copy_committed(MODEL_BUNDLE, sandbox, "model-fork-bundle")
    rename_experiment(bundle, "model-fork")
    arm(bundle, sandbox.marker)
    return bundle


@pytest.fixture
def model_helper_swapped(sandbox):
    """The committed model bundle with its uncited helper module (pd_model.py) armed, re-hashed."""
    bundle = copy_committed(MODEL_BUNDLE, sandbox)
    arm(bundle, sandbox.marker, ["pd_model.py"])
    return bundle


def test_rerun_does_not_run_bundle_code_without_consent(sandbox, fork):
    """Attack: `verify --rerun` on a self-consistent bundle whose probe writes a file."""
    result = sandbox.run("verify", fork, "--rerun")
    assert_outcome(sandbox, result, (2, 3), TRUST_FLAG)


def test_piped_yes_is_not_consent(sandbox, fork):
    """Attack: `yes | kvprobe verify --rerun`: without a terminal there is never an implicit yes."""
    result = sandbox.run("verify", fork, "--rerun", stdin=b"y\n" * 8)
    assert_outcome(sandbox, result, (2, 3), TRUST_FLAG)


def test_trust_flag_prints_the_digests_before_bundle_code_runs(sandbox, fork):
    """With explicit consent the bundle's code runs, after the digests of what will run are shown."""
    result = sandbox.run("verify", fork, "--rerun", TRUST_FLAG)
    assert_outcome(sandbox, result, 0, code_may_run=True)
    assert sandbox.marker.exists(), "the consented rerun did not run the bundle's probes"
    lines = result.err.splitlines()
    first_run = next((i for i, line in enumerate(lines) if "running checks" in line), len(lines))
    for path in sorted(fork.glob("probes/model-fork/*.py")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shown = [i for i, line in enumerate(lines) if digest in line]
        assert shown and shown[0] < first_run, f"sha256 of {path.name} not printed before the rerun\n{result.err}"


def test_rerun_never_starts_after_the_digest_check_failed(sandbox):
    """Attack: a wrong --expect-manifest-sha256 fails step 5; step 6 must not run at all."""
    bundle = copy_committed(MODEL_BUNDLE, sandbox)
    result = sandbox.run("verify", bundle, "--rerun", "--expect-manifest-sha256", "f" * 64)
    assert_outcome(sandbox, result, 1, "manifest-digest-mismatch")
    assert not line_naming(result.err, "running checks"), f"the rerun ran after step 5 failed\n{result.err}"
    assert line_naming(result.err, "rerun", "skipped"), result.err


def test_consented_rerun_never_starts_after_the_digest_check_failed(sandbox, fork):
    """Even with consent, bundle code does not run once an earlier step failed."""
    result = sandbox.run("verify", fork, "--rerun", TRUST_FLAG, "--expect-manifest-sha256", "f" * 64)
    assert_outcome(sandbox, result, 1, "manifest-digest-mismatch")


def test_known_experiment_reruns_the_installed_copy(sandbox, model_helper_swapped):
    """Attack: a model bundle whose helper module was swapped; rerun must use kvprobe's own copy
    and report the bundle's file as different from it."""
    result = sandbox.run("verify", model_helper_swapped, "--rerun")
    assert_outcome(sandbox, result, 1, "probes/model/pd_model.py")


def test_extra_sitecustomize_in_a_known_experiment(sandbox):
    """Attack (own): an extra probes/model/sitecustomize.py, only re-hashed. The probe directory
    is on the probes' PYTHONPATH, so Python runs it at start-up of every probe on rerun."""
    bundle = copy_committed(MODEL_BUNDLE, sandbox)
    (bundle / "probes/model/sitecustomize.py").write_bytes(payload(sandbox.marker))
    forge.rehash(bundle)
    result = sandbox.run("verify", bundle, "--rerun")
    assert_outcome(sandbox, result, 1, "sitecustomize.py")


def test_rerun_from_inside_the_bundle_does_not_trust_its_probes(sandbox, model_helper_swapped):
    """Attack (own): `cd BUNDLE && kvprobe verify --rerun .`: ./probes is on the experiment
    search path, so the bundle's own probes must not pass for the installed copy."""
    result = sandbox.run("verify", ".", "--rerun", cwd=model_helper_swapped)
    assert_outcome(sandbox, result, 1, "pd_model.py")


# --- a known experiment is a trust anchor (no rerun) ---------------------------------------


def test_swapped_probe_in_an_experiment_a_bundle(sandbox):
    """Attack: experiment A's probe swapped inside the committed bundle, re-cited and re-hashed."""
    bundle = copy_committed(EXP_A_BUNDLE, sandbox)
    rel = "probes/experiment-a/admission_doors.py"
    (bundle / rel).write_bytes((bundle / rel).read_bytes() + b"\n# a probe that would see nothing\n")
    forge.recite(bundle, rel)
    result = sandbox.run("verify", bundle)
    assert_outcome(sandbox, result, 1, rel, ("differ", "installed", "kvprobe's"))


def test_swapped_helper_module_in_a_model_bundle(sandbox, model_helper_swapped):
    """Attack: pd_model.py is not cited by the receipt, only listed: re-hashing is enough."""
    result = sandbox.run("verify", model_helper_swapped)
    assert_outcome(sandbox, result, 1, "probes/model/pd_model.py", ("differ", "installed", "kvprobe's"))


def test_rewritten_scope_of_a_known_experiment(sandbox):
    """Attack (own): the model bundle claims to show an SGLang leak and drops its caveats; its
    experiment.toml and receipt agree with each other, so only the installed copy can tell."""
    bundle = copy_committed(MODEL_BUNDLE, sandbox)
    rel = "probes/model/experiment.toml"
    text = (bundle / rel).read_text()
    start, end = text.index("[scope]"), text.index("\n\n\n[expect")
    claim = "That SGLang 0.5.21 leaks another tenant's KV cache in production, on GPUs."
    caveat = "throughput under load"
    (bundle / rel).write_text(text[:start] + f'[scope]\nshows = "{claim}"\ndoes_not_show = ["{caveat}"]' + text[end:])

    def change(receipt):
        receipt["evidence"].update(shows=claim, does_not_show=[caveat])
        receipt["experiment"]["sha256"] = forge.sha((bundle / rel).read_bytes())

    forge.edit_receipt(bundle, change)
    forge.recite(bundle, rel)
    result = sandbox.run("verify", bundle)
    assert_outcome(sandbox, result, 1, rel, ("differ", "installed", "kvprobe's"))


def test_untouched_known_bundle_is_named_as_the_installed_experiment(sandbox):
    """The positive half: a committed model bundle is reported the same as kvprobe's own model."""
    result = sandbox.run("verify", copy_committed(MODEL_BUNDLE, sandbox))
    assert_outcome(sandbox, result, 0, "same as", "model")


def test_self_consistent_bundle_says_it_only_agrees_with_itself(sandbox, forged):
    """Regression guard: without a published digest, verify says what self-consistency proves."""
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 0, "agrees with itself")
