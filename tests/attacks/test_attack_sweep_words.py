"""Words a sweep bundle's publisher could put into kvprobe's mouth (hostile review 3).

A sweep receipt's ``profile.serves_why`` says why the profile does not serve some releases;
verify holds it to the installed profile's only where kvprobe ships that profile. A bundle of
an experiment kvprobe does not ship may name a profile kvprobe does not ship either: its
``serves``, its ``serves_why`` and every not-run reason built from them are then the
publisher's own, and an export must say so, never state them as what kvprobe found.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvprobe.rules.sweep_listing import unserved_reason
from tests import forge
from tests.attacks.harness import COMMITTED, assert_outcome, copy_committed, line_naming
from tests.attacks.test_attack_claims import EXP_B_SWEEP, SWEEP_RAW, _reobserve
from tests.relabel import NEW_ID, relabelled_sweep

pytestmark = pytest.mark.attack

PROFILE = "sglang-gpu"
WHY = "the fix is present in every older release, so none needed a run"
UNSERVED = ("0.5.12", "0.5.12.post1")


@pytest.fixture
def publisher_profile_sweep(sandbox) -> Path:
    """The relabelled experiment-a sweep (tests/relabel.py), its experiment's profile renamed to
    one kvprobe does not ship whose ``serves_why`` says the fix is in every older release, and
    its range widened to two releases that profile does not serve: it verifies."""
    bundle = relabelled_sweep(sandbox.inputs / "relabelled")
    rel = f"probes/{NEW_ID}/experiment.toml"
    toml = bundle / rel
    toml.write_text(re.sub(r"(?m)^profile = .*$", f'profile = "{PROFILE}"', toml.read_text(encoding="utf-8")))
    receipt = forge.load(bundle, "receipt.json")
    receipt["experiment"]["sha256"] = forge.sha(toml.read_bytes())
    receipt["profile"] = {"name": PROFILE, "serves": ">=0.5.13", "serves_why": WHY}
    receipt["spec"] = "0.5.12..0.5.23"
    added = [
        {
            "file": f"sglang-{v}-cp311-cp311-manylinux_2_34_x86_64.whl",
            "not_run": unserved_reason(PROFILE, ">=0.5.13", v, WHY),
            "problem": None,
            "sha256": forge.sha(v.encode()),
            "version": v,
        }
        for v in UNSERVED
    ]
    receipt["listing"]["selected"] = added + receipt["listing"]["selected"]
    receipt["unserved"] = list(UNSERVED)
    (bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    _reobserve(bundle, {})
    forge.recite(bundle, rel)
    return bundle


def test_an_unshipped_profiles_reason_is_never_kvprobes_word(sandbox, publisher_profile_sweep):
    """Attack: OSV's ``kvprobe_introduced`` and ``older`` said the releases before 0.5.13 were
    "not observed (...: the fix is present in every older release ...)", and the Markdown
    report's not-run line "Why: the fix is present ...", as kvprobe's own findings: the
    publisher's words, which nothing verified, under kvprobe's name."""
    bundle = publisher_profile_sweep
    verified = sandbox.run("verify", bundle)
    assert_outcome(sandbox, verified, 0)
    assert line_naming(verified.out + verified.err, PROFILE, "not one kvprobe ships"), verified.describe()

    osv = sandbox.run("report", bundle, "--format", "osv", "--osv-id", "GHSA-aaaa-bbbb-cccc", "--allow-unanchored")
    assert_outcome(sandbox, osv, 0)
    record = json.loads(osv.out)
    (affected,) = record["affected"]
    assert WHY not in osv.out, affected["database_specific"]
    assert "UNSHIPPED PROFILE" in record["details"] and PROFILE in record["details"], record["details"]

    md = sandbox.run("report", bundle, "--format", "markdown")
    assert_outcome(sandbox, md, 0)
    (line,) = [x for x in md.out.splitlines() if x.startswith("Not run:")]
    assert line.endswith(f"Why, in the words of the bundle's publisher (not kvprobe's): {WHY}."), line
    assert line_naming(md.out, "UNSHIPPED PROFILE", PROFILE), md.out

    vex = sandbox.run("report", bundle, "--format", "openvex", "--author", "a <a@b>", "--allow-unanchored")
    assert_outcome(sandbox, vex, 0)
    notes = {s["status_notes"] for s in json.loads(vex.out)["statements"]}
    assert all("UNSHIPPED PROFILE" in n for n in notes), notes
    assert WHY not in vex.out


# --- a not-present case whose own error says the release did not import -----------------------

NAME = "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin"
CANNOT = (
    "importing sglang.srt.disaggregation.prefill failed: No module named 'sgl_kernel' (a dependency outside the "
    f"package); this env cannot import the release, so that it lacks {NAME} (which the probe's own code imports) "
    "says nothing of the code path"
)


def _absent(case: dict, error_type: str, message: str) -> dict:
    """``case`` rewritten as not-present, its error the probe API's record of ``error_type``."""
    return {
        **case,
        "status": "raised",
        "observation": "not-present",
        "observations": {},
        "missing": [NAME],
        "reason": f"not present in this release: {NAME}",
        "preconditions": {},
        "error": {
            "type": error_type,
            "message": message,
            "root_type": "ModuleNotFoundError",
            "root_message": "No module named 'sgl_kernel'",
            "traceback": "ModuleNotFoundError: No module named 'sgl_kernel'\n",
        },
    }


@pytest.mark.parametrize(
    "error_type",
    [
        "kvprobe_probe.CannotObserve",  # the probe API's own words: nothing observable here
        "AttributeError",  # set-up raised: the probe API writes that as unobserved
    ],
)
def test_a_not_present_case_its_own_error_contradicts_is_refused(sandbox, error_type):
    """Attack: 0.5.13's cases claim not-present, each recording the probe API's CannotObserve
    (the release does not import in this env: no evidence of absence) as its error. The
    classification read only ``observation``, so verify accepted 0.5.13 as not-present and OSV
    drew ``introduced: 0.5.13.post1`` as "observed: 0.5.13 was observed not-present", a
    boundary the bundle's own record of the import denies. The probe API writes a case
    not-present only from its NotPresent, whose message names exactly what is missing."""
    bundle = copy_committed(EXP_B_SWEEP, sandbox, "sweep-b")
    own = forge.load(bundle, SWEEP_RAW.format("0.5.13"))
    message = CANNOT if error_type.endswith("CannotObserve") else f"type object has no attribute {NAME!r}"
    _reobserve(bundle, {"0.5.13": {**own, "cases": [_absent(c, error_type, message) for c in own["cases"]]}})
    assert forge.load(bundle, "receipt.json")["summary"]["not-present"] == ["0.5.13"]
    result = sandbox.run("verify", bundle)
    assert_outcome(sandbox, result, 1, "raw-invalid", "not-present", error_type)
    exported = sandbox.run("report", bundle, "--format", "osv", "--osv-id", "GHSA-aaaa-bbbb-cccc")
    assert_outcome(sandbox, exported, 1, "raw-invalid")
    assert exported.out == ""


def test_a_genuine_not_present_case_still_verifies(sandbox):
    """The rule above keeps the probe API's own not-present records: the committed experiment-c
    sweep's not-present releases verify."""
    (sweep_c,) = sorted(COMMITTED.glob("experiment-c-sweep-*"))
    bundle = copy_committed(sweep_c, sandbox, "sweep-c")
    assert "not-present" in forge.load(bundle, "receipt.json")["summary"]
    assert_outcome(sandbox, sandbox.run("verify", bundle), 0)
