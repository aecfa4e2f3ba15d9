"""Claims a verifying bundle could make that its raw outputs do not support (hostile review 2).

Each attack starts from a genuine bundle (a committed one, or a fresh `kvprobe gates` bundle),
rewrites a claim a reviewer or an export reads, and re-derives everything a forger can
(README where kvprobe renders it, hashes): `verify` must refuse it, and `report` must write
no export of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import forge
from tests.attacks.harness import COMMITTED, assert_outcome, copy_committed, line_naming, reseal_sweep

pytestmark = pytest.mark.attack

# experiment B: a security fix on release wheels, so OpenVEX states affected/fixed from it
(EXP_B_RELEASE,) = sorted(COMMITTED.glob("experiment-b-release-*"))
AUTHOR = "Security Team <sec@example.com>"


@pytest.fixture
def release_b(sandbox) -> Path:
    return copy_committed(EXP_B_RELEASE, sandbox, "release-b")


@pytest.mark.parametrize(
    "limits",
    [
        # kvprobe's caveat "CPU only; no GPU, RDMA or model weights" dropped: the OpenVEX notes
        # then state no limit at all
        [],
        # kvprobe's own words replaced by the publisher's
        ["host: GPU cluster with RDMA transport and production weights: the cross-tenant leak reproduced end to end"],
    ],
)
def test_run_limits_rewritten_are_refused(sandbox, release_b, limits):
    """Attack: evidence.limits, which the Markdown and OpenVEX exports quote as kvprobe's own
    caveats, were the receipt's say-so: rewritten (README re-rendered, re-hashed), the bundle
    verified and `report --format openvex` quoted the publisher's words."""
    forge.edit_receipt(release_b, lambda r: r["evidence"].__setitem__("limits", limits))
    result = sandbox.run("verify", release_b)
    assert_outcome(sandbox, result, 1, "record-mismatch", "evidence.limits")
    exported = sandbox.run("report", release_b, "--format", "openvex", "--author", AUTHOR)
    assert_outcome(sandbox, exported, 1, "evidence.limits")
    assert exported.out == ""


def test_run_readme_of_a_claimed_other_kvprobe_is_refused(sandbox, release_b):
    """Attack: README.md (what a reviewer reads first) was held to kvprobe's rendering only
    when the receipt said this kvprobe made it; `tool.version` is the receipt's own claim, so
    naming another version let any README through with a note."""
    forge.edit_receipt(release_b, lambda r: r["tool"].__setitem__("version", "0.0.9"))
    (release_b / "README.md").write_text(
        "# experiment-b: REPRODUCED a cross-tenant KV cache leak on production GPUs\n", encoding="utf-8"
    )
    forge.rehash(release_b)
    result = sandbox.run("verify", release_b)
    assert_outcome(sandbox, result, 1, "readme-mismatch", "README.md")


# --- gates bundles: what the change ticket reads ---------------------------------------------


def test_a_gates_readme_that_says_every_gate_passes_is_refused(sandbox, gates_bundle):
    """Attack: a gates bundle's README.md (the summary an operator attaches to a change ticket)
    was never checked: a bundle whose gates fail verified with a README saying they all pass."""
    receipt = forge.load(gates_bundle, "receipt.json")
    assert receipt["overall"] != "pass", "the fixture's deployment must not pass"
    (gates_bundle / "README.md").write_text(
        "# kvprobe gates: pass\n\nAll four gates pass: this deployment cannot leak KV across requests.\n",
        encoding="utf-8",
    )
    forge.rehash(gates_bundle)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "readme-mismatch", "README.md")


@pytest.mark.parametrize("claim", ["shows", "does_not_show", "limits"])
def test_a_gates_scope_rewritten_is_refused(sandbox, gates_bundle, claim):
    """Attack: a gates receipt's scope (what `report --format markdown` states the evidence shows,
    does not show, and its limits) is kvprobe's own statement, but was the receipt's say-so:
    rewritten to claim that no exposure can happen, the bundle verified and the Markdown said so."""
    stated = {
        "shows": "That this deployment cannot expose one request's KV cache to another: verified end to end on GPUs.",
        # "that no cross-request KV exposure happened or can happen" dropped
        "does_not_show": ["GPU, RDMA or transport behaviour"],
        "limits": [],
    }[claim]
    receipt = forge.load(gates_bundle, "receipt.json")
    receipt["evidence"][claim] = stated
    (gates_bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    (gates_bundle / "README.md").unlink()  # optional; the README test above holds one that is present
    forge.rehash(gates_bundle)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 1, "record-mismatch", f"evidence.{claim}")
    exported = sandbox.run("report", gates_bundle, "--format", "markdown")
    assert_outcome(sandbox, exported, 1, f"evidence.{claim}")
    assert exported.out == ""


# --- sweep advisories: what OSV and OpenVEX draw from the classes ----------------------------

(EXP_B_SWEEP,) = sorted(COMMITTED.glob("experiment-b-sweep-*"))
SWEEP_RAW = "raw/{}/probes/prefill_result_cleanup.json"
FIXED_CASE = "result.aborted_final"


def _reobserve(bundle: Path, outputs: dict[str, dict]) -> None:
    """Give releases other raw outputs (``{version: probe output}``) and re-derive all a sweep
    writer derives from them: the classification, then what harness.reseal_sweep re-derives.
    The bundle stays self-consistent."""
    from kvprobe.rules.sweep_classification import classify_release

    receipt = forge.load(bundle, "receipt.json")
    for release in receipt["releases"]:
        doc = outputs.get(release["version"])
        if doc is None:
            continue
        (probe,) = release["probes"]
        (bundle / probe["raw"]["path"]).write_bytes(forge.dumps(doc))
        probe["raw"]["sha256"] = forge.sha((bundle / probe["raw"]["path"]).read_bytes())
        release["classification"] = classify_release(receipt["expectations"], {probe["name"]: doc}, {})
    reseal_sweep(bundle, receipt)


@pytest.fixture
def early_fixed_sweep(sandbox) -> Path:
    """Experiment B's sweep, its two oldest releases re-observed: 0.5.13 behaves as fixed and
    0.5.13.post1 as neither (mixed: one case as fixed, the rest as the bug), every later
    release as published (0.5.14-0.5.19 affected, 0.5.20 on fixed). It verifies."""
    bundle = copy_committed(EXP_B_SWEEP, sandbox, "sweep-b")
    fixed = forge.load(bundle, SWEEP_RAW.format("0.5.20"))
    own = forge.load(bundle, SWEEP_RAW.format("0.5.13.post1"))
    mixed = {
        **fixed,
        "cases": [
            c if c["name"] != FIXED_CASE else next(o for o in own["cases"] if o["name"] == FIXED_CASE)
            for c in fixed["cases"]
        ],
    }
    _reobserve(bundle, {"0.5.13": fixed, "0.5.13.post1": mixed})
    classes = forge.load(bundle, "receipt.json")["summary"]
    assert classes["fixed"][0] == "0.5.13" and classes["mixed"] == ["0.5.13.post1"], classes
    return bundle


def test_osv_never_states_a_release_observed_fixed_as_affected(sandbox, early_fixed_sweep):
    """Attack: the first range opened at "0" whenever the release right before the oldest
    affected one was not itself observed unaffected, so OSV stated 0.5.13, observed fixed,
    affected (introduced "0", fixed 0.5.20)."""
    assert sandbox.run("verify", early_fixed_sweep).code == 0
    result = sandbox.run("report", early_fixed_sweep, "--format", "osv", "--osv-id", "GHSA-aaaa-bbbb-cccc")
    assert_outcome(sandbox, result, 0)
    record = json.loads(result.out)
    (affected,) = record["affected"]
    assert affected["ranges"][0]["events"] == [{"introduced": "0.5.13.post1"}, {"fixed": "0.5.20"}]
    assert "0.5.13" not in affected["versions"]
    assert affected["database_specific"]["kvprobe_introduced"].startswith(
        "unknown, from 0.5.13.post1: 0.5.13 was observed fixed"
    )


def test_openvex_never_advises_upgrading_to_an_older_release(sandbox, early_fixed_sweep):
    """Attack: an affected release's action statement named every release observed fixed,
    0.5.13 included: "upgrade to 0.5.13" from 0.5.14 is a downgrade to a release no fix reached."""
    result = sandbox.run("report", early_fixed_sweep, "--format", "openvex", "--author", AUTHOR)
    assert_outcome(sandbox, result, 0)
    statements = json.loads(result.out)["statements"]
    actions = {s["products"][0]["@id"]: s.get("action_statement") for s in statements if s["status"] == "affected"}
    assert actions["pkg:pypi/sglang@0.5.14"] == (
        "Upgrade sglang to a later release kvprobe observed fixed (0.5.20, 0.5.21, 0.5.22, 0.5.23)"
    )


# --- receipts the schema admits but the renderers cannot read --------------------------------


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("counts", {}),  # the schema leaves the comparison's tables open
        ("cases", {"base": "not a table"}),
        ("observations", [{}]),
    ],
)
def test_a_comparison_the_readme_renderer_cannot_read_is_a_defect_not_a_crash(sandbox, forged, where, value):
    """Attack: a run receipt whose comparison table passes the schema but not the README
    renderer; verify re-rendered README.md to compare it and crashed (exit 4, 'a bug in
    kvprobe') instead of refusing the bundle."""
    forge.edit_receipt(forged, lambda r: r["comparison"].__setitem__(where, value))
    result = sandbox.run("verify", forged)
    assert_outcome(sandbox, result, 1, "readme-mismatch", "cannot be rendered")
    exported = sandbox.run("report", forged, "--format", "markdown")
    assert_outcome(sandbox, exported, 1)
    assert exported.out == ""


# --- a user's output path that is the evidence -----------------------------------------------


@pytest.mark.parametrize(
    ("command", "name", "force"),
    [
        ("report", "report.md", False),  # a new file beside the evidence: the bundle no longer verifies
        ("report", "receipt.json", True),  # --force: the receipt replaced by the export drawn from it
        ("pack", "bundle.tar.gz", False),
    ],
)
def test_an_output_inside_the_bundle_is_refused(sandbox, release_b, command, name, force):
    """Bad input: `report -o BUNDLE/report.md` (or `bundle pack -o` into the bundle) wrote into
    the bundle it read: the next `kvprobe verify` failed on an unlisted file, and with --force
    the receipt itself was replaced by its own Markdown."""
    target = release_b / name
    if command == "report":
        argv = ["report", release_b, "--format", "markdown", "-o", target]
    else:
        argv = ["bundle", "pack", release_b, "-o", target]
    result = sandbox.run(*argv, *(["--force"] if force else []))
    assert_outcome(sandbox, result, 2, "inside the bundle")
    assert sandbox.run("verify", release_b).code == 0


def test_a_report_over_its_own_archive_is_refused(sandbox, release_b):
    """Bad input: `report B.tar.gz -o B.tar.gz --force` replaced the bundle with its export."""
    packed = sandbox.run("bundle", "pack", release_b, "-o", sandbox.inputs / "b.tar.gz")
    assert packed.code == 0, packed.describe()
    archive = sandbox.inputs / "b.tar.gz"
    before = archive.read_bytes()
    result = sandbox.run("report", archive, "--format", "markdown", "-o", archive, "--force")
    assert_outcome(sandbox, result, 2, "the bundle being read")
    assert archive.read_bytes() == before


def test_an_intoto_archive_subject_that_is_not_the_bundle_is_refused(sandbox, release_b):
    """Attack: `report --format intoto --subject-archive A` named A by sha256 as the bundle
    packed once A's manifest.json was byte for byte the bundle's, whatever else A held: an
    archive with the genuine manifest.json beside a rewritten raw output became an attested
    subject of the genuine bundle's statement (a consumer checks the archive by that digest)."""
    tampered = forge.copy(release_b, sandbox.inputs / "tampered")
    raw = tampered / "raw" / "head" / "probes" / "prefill_result_cleanup.json"
    doc = json.loads(raw.read_bytes())
    doc["description"] = "rewritten after the run"
    raw.write_bytes(forge.dumps(doc))  # manifest.json and SHA256SUMS left as the bundle's
    archive = forge.tar_of(tampered, sandbox.inputs / "tampered.tar.gz")
    assert (tampered / "manifest.json").read_bytes() == (release_b / "manifest.json").read_bytes()
    result = sandbox.run("report", release_b, "--format", "intoto", "--subject-archive", archive)
    assert_outcome(sandbox, result, 2, "--subject-archive", "does not verify")
    assert result.out == ""


# --- a planted cache ---------------------------------------------------------------------------


def test_cache_verify_on_planted_tree_entries_names_them_and_reads_nothing_outside(sandbox):
    """Planted cache: tree entries whose `tree` is missing, a file, or a symlink out of the
    cache, and a listing that names a path out of the tree. `cache verify` crashed on the first
    (exit 4) and hashed files outside the cache for the others; each is now DAMAGED, by name."""
    outside = sandbox.inputs / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not the cache's\n")
    trees = sandbox.cache / "trees"
    record = {"sha256": "0" * 64, "size": 1, "mtime_ns": 1}
    plants = {
        "no-tree": {},
        "file-tree": {},
        "linked-tree": {"secret": record},
        "escaping": {"../../../inputs/outside/secret": record},
    }
    for key, files in plants.items():
        (trees / key).mkdir(parents=True)
        (trees / key / "kvprobe-tree.json").write_text(json.dumps({"files": files}))
    (trees / "file-tree" / "tree").write_text("a file where the tree goes\n")
    (trees / "linked-tree" / "tree").symlink_to(outside)
    (trees / "escaping" / "tree").mkdir()
    result = sandbox.run("cache", "verify")
    assert_outcome(sandbox, result, 1, "no-tree", "tree", "unreadable")
    assert line_naming(result.err, "file-tree", "not a directory"), result.describe()
    assert line_naming(result.err, "linked-tree", "not a directory"), result.describe()
    assert line_naming(result.err, "escaping", "not a path inside the tree"), result.describe()
    assert line_naming(result.out, "4 trees", "4 damaged"), result.describe()


@pytest.mark.parametrize("kind", ["trees", "units"])
def test_a_bundle_out_inside_the_cache_is_refused(sandbox, kind):
    """Bad input: `gates --out ~/.cache/kvprobe/trees/today` wrote the bundle where the next
    plain `kvprobe cache prune` (no --all) removes it as a half-written cache entry."""
    from tests.attacks.gatelogs import CONTEXT, startup_log

    log = sandbox.inputs / "prefill.log"
    log.write_text(startup_log("prefill", CONTEXT, canary=True))
    (sandbox.cache / kind).mkdir()
    out = sandbox.cache / kind / "gates-today"
    result = sandbox.run("gates", "--log", f"prefill={log}", "--out", out)
    assert_outcome(sandbox, result, 2, "inside kvprobe's cache")
    assert not out.exists()


# --- a file system that serves a file differently to two reads ----------------------------------

TWO_FACED = '''
import os
from kvprobe.evidence import safetree

_read, _served = safetree.Tree.read_bytes, set()


def read_bytes(self, rel, cap):
    """The first read of receipt.json gets the forged copy; every later read (and step 3's
    hashing, which opens the file itself) the genuine bytes on disk."""
    if rel == "receipt.json" and rel not in _served:
        _served.add(rel)
        with open(os.environ["KV_FORGED_RECEIPT"], "rb") as forged:
            return forged.read()
    return _read(self, rel, cap)


safetree.Tree.read_bytes = read_bytes
'''


def test_a_receipt_served_differently_to_the_parse_and_the_hash_is_refused(sandbox, release_b):
    """Attack (a hostile or changing file system: a FUSE or network mount the publisher serves,
    simulated here by a sitecustomize in the child): step 2 parsed one receipt.json and step 3
    hashed a second read of it, so a forged receipt parsed and exported while the genuine bytes
    matched the published manifest digest: `report --expect-manifest-sha256` called it anchored."""
    import hashlib

    from tests.attacks.harness import REPO

    shim = sandbox.inputs / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(TWO_FACED)
    receipt = forge.load(release_b, "receipt.json")
    receipt["env"]["python"] = "3.11.7 (FORGED: served to the parser only)"
    forged = sandbox.inputs / "forged-receipt.json"
    forged.write_bytes(forge.dumps(receipt))
    digest = hashlib.sha256((release_b / "manifest.json").read_bytes()).hexdigest()
    env = {"PYTHONPATH": f"{shim}:{REPO}", "KV_FORGED_RECEIPT": str(forged)}
    result = sandbox.run("report", release_b, "--format", "markdown", "--expect-manifest-sha256", digest, env=env)
    assert_outcome(sandbox, result, 1, "receipt.json", "changed while it was read")
    assert "FORGED" not in result.out


@pytest.mark.parametrize(
    "name",
    [
        "A" * 300,  # crashed before the fix
        "sglang-cpu\u0000",  # held: regression guards beside it
        "../../../etc/profile",
    ],
)
def test_a_sweep_naming_an_impossible_profile_is_refused_not_a_crash(sandbox, name):
    """Attack: a sweep receipt's profile name is looked up among the installed profiles (which
    releases it serves); a 300-character name crashed verify (OSError ENAMETOOLONG, exit 4), and
    a name is now never a path to look up (it was, outside the profiles folder)."""
    bundle = copy_committed(EXP_B_SWEEP, sandbox, "sweep-b")
    receipt = forge.load(bundle, "receipt.json")
    receipt["profile"]["name"] = name
    (bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    _reobserve(bundle, {})
    result = sandbox.run("verify", bundle)
    assert_outcome(sandbox, result, 1, "experiment-mismatch", "profile")


@pytest.mark.parametrize(("flag", "target"), [("--log", "dir"), ("--server-args", "/dev/zero")])
def test_a_gates_input_that_is_no_regular_file_is_named_for_what_it_is(sandbox, flag, target):
    """Bad input: `gates --log DIR` (or a device) said "no such file" of a path that exists."""
    path = sandbox.inputs if target == "dir" else target
    result = sandbox.run("gates", flag, path)
    assert_outcome(sandbox, result, 2, flag, "not a regular file")


def test_a_wheel_pin_field_of_another_type_is_a_bad_pin_not_a_crash(sandbox, release_b):
    """Attack: a run receipt's wheel pin whose file name is null passes the schema; checking
    the pin crashed verify (AttributeError, exit 4) instead of naming a bad pin."""
    forge.edit_receipt(release_b, lambda r: r["sides"]["head"]["pin"].__setitem__("filename", None))
    result = sandbox.run("verify", release_b)
    assert_outcome(sandbox, result, 1, "bad-pin", "sides.head.pin")


def test_a_gates_readme_carries_no_link_or_html_from_the_receipt(sandbox, gates_bundle):
    """Attack: a gate's title is the receipt's text, and README.md (which verify now holds to
    kvprobe's rendering, and which a repository host renders) wrote it raw: a title carrying a
    link or an image became a live one in a README that verify vouched for."""
    from kvprobe.evidence.gates_readme import render_readme
    from kvprobe.model.gates_receipt import GatesReceipt

    receipt = forge.load(gates_bundle, "receipt.json")
    receipt["gates"][0]["title"] = "[All four gates pass: signed report](https://evil.example/r) <img src=x>"
    (gates_bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    (gates_bundle / "README.md").write_text(render_readme(GatesReceipt.from_json(receipt)), encoding="utf-8")
    forge.rehash(gates_bundle)
    result = sandbox.run("verify", gates_bundle)
    assert_outcome(sandbox, result, 0)
    readme = (gates_bundle / "README.md").read_text(encoding="utf-8")
    assert "](https://evil.example/r)" not in readme and "<img" not in readme, readme


def test_an_osv_record_of_a_sweep_that_observed_no_affected_release_is_refused(sandbox):
    """Attack: a sweep that observed no release affected still exported an OSV record of the
    vulnerability for the package, its `affected` entry without ranges or versions: consumers
    read such an entry as every version affected (or none), a claim nothing observed."""
    bundle = copy_committed(EXP_B_SWEEP, sandbox, "sweep-b")
    fixed = forge.load(bundle, SWEEP_RAW.format("0.5.20"))
    receipt = forge.load(bundle, "receipt.json")
    _reobserve(bundle, {r["version"]: fixed for r in receipt["releases"]})
    assert set(forge.load(bundle, "receipt.json")["summary"]) == {"fixed"}
    assert sandbox.run("verify", bundle).code == 0
    result = sandbox.run("report", bundle, "--format", "osv", "--osv-id", "GHSA-aaaa-bbbb-cccc")
    assert_outcome(sandbox, result, 2, "no release", "affected")
    assert result.out == ""
