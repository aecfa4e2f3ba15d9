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

from kvprobe.evidence.sweep_view import TIMELINE
from kvprobe.resources import builtin_probes_dir
from tests import forge
from tests.attacks.harness import COMMITTED, assert_outcome, copy_committed, reseal_sweep

pytestmark = pytest.mark.attack

RELEASE = "0.5.20"


def _rederive(bundle: Path, change) -> None:
    """Edit the sweep receipt, then reseal it as a genuine writer would (harness.reseal_sweep)."""
    receipt = forge.load(bundle, "receipt.json")
    change(receipt)
    reseal_sweep(bundle, receipt)


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


# --- the release set: order, completeness, identity (issue 22) -------------------------------
#
# Each forgery below starts from a genuine sweep bundle, keeps every raw output genuine and
# reseals (summary, observed range, README.md, timeline.svg, manifest): kvprobe before the
# sweep receipt recorded its listing verified each of them, and `report --format osv` drew a
# false range from it.

FLOOR = "older than the profile's floor: profile sglang-cpu serves >=0.5.13"


def _release(receipt, version):
    (found,) = [r for r in receipt["releases"] if r["version"] == version]
    return found


def _listed(receipt, version):
    (found,) = [e for e in receipt["listing"]["selected"] if e["version"] == version]
    return found


def _sorted_key(receipt):
    return [r["version"] for r in receipt["releases"]]


def test_order_a_later_release_stored_before_an_earlier_one_is_refused(sandbox, anchored_sweep):
    """Attack: 0.5.21 listed before 0.5.20; an export walking the receipt's order drew the
    fixed event at the wrong release."""

    def change(receipt):
        versions = _sorted_key(receipt)
        i, j = versions.index("0.5.20"), versions.index("0.5.21")
        receipt["releases"][i], receipt["releases"][j] = receipt["releases"][j], receipt["releases"][i]

    _rederive(anchored_sweep, change)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "release-set", "0.5.20 is stored after 0.5.21")


def test_order_fixed_releases_stored_first_is_refused(sandbox, anchored_sweep):
    """Attack: the fixed releases first, so the export reads one open affected range."""

    def change(receipt):
        receipt["releases"].sort(key=lambda r: r["classification"]["overall"] != "fixed")

    _rederive(anchored_sweep, change)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "release-set", "out of order")


def test_completeness_a_release_deleted_from_the_range_is_refused(sandbox, anchored_sweep):
    """Attack: the 0.5.20 entry and its raw outputs deleted; the listing still holds it."""

    def change(receipt):
        receipt["releases"].remove(_release(receipt, RELEASE))

    _rederive(anchored_sweep, change)
    for top in ("raw", "logs"):
        forge_tree = anchored_sweep / top / RELEASE
        for path in sorted(forge_tree.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        forge_tree.rmdir()
    forge.rehash(anchored_sweep)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "release-set", f"holds {RELEASE}", "incomplete")


def test_completeness_a_served_release_moved_to_unserved_is_refused(sandbox, anchored_sweep):
    """Attack: 0.5.20 'not served by the profile', with the profile's own wording, although
    the profile serves it: verify recomputes the reason."""

    def change(receipt):
        receipt["releases"].remove(_release(receipt, RELEASE))
        receipt["unserved"].append(RELEASE)
        _listed(receipt, RELEASE)["not_run"] = FLOOR

    _rederive(anchored_sweep, change)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "release-set", f"release {RELEASE}", "must be a release entry")


def test_completeness_a_spec_rewritten_against_the_listing_is_refused(sandbox, anchored_sweep):
    """Attack: the spec widened to 0.5.10..0.5.23 as if older releases had been swept."""
    _rederive(anchored_sweep, lambda receipt: receipt.update(spec="0.5.10..0.5.23"))
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "listing-mismatch", "spec '0.5.10..0.5.23' selects")


@pytest.mark.parametrize("twin", ["0.5.20.0", "0.5.020"])
def test_identity_a_twin_of_a_release_is_refused(sandbox, anchored_sweep, twin):
    """Attack: 0.5.20.0 or 0.5.020 (== 0.5.20 under PEP 440) added as another release with
    0.5.19's raw outputs and wheel digest, in the listing too."""
    source = anchored_sweep / "raw" / "0.5.19"
    target = anchored_sweep / "raw" / twin
    target.mkdir()
    (target / "probes").mkdir()
    for path in sorted((source / "probes").iterdir()):
        (target / "probes" / path.name).write_bytes(path.read_bytes())

    def change(receipt):
        copy = forge.load(anchored_sweep, "receipt.json")
        twin_release = _release(copy, "0.5.19")
        twin_release["version"] = twin
        twin_release["wheel"]["version"] = twin
        twin_release["wheel"]["file"] = f"sglang-{twin}-cp311-cp311-manylinux_2_34_x86_64.whl"
        for probe in twin_release["probes"]:
            if probe["raw"]:
                probe["raw"]["path"] = probe["raw"]["path"].replace("raw/0.5.19/", f"raw/{twin}/")
        receipt["releases"].insert(_sorted_key(receipt).index("0.5.20") + 1, twin_release)
        entry = {**_listed(receipt, "0.5.19"), "version": twin, "file": twin_release["wheel"]["file"]}
        receipt["listing"]["selected"].insert(
            receipt["listing"]["selected"].index(_listed(receipt, "0.5.20")) + 1, entry
        )
        receipt["listing"]["versions"].insert(receipt["listing"]["versions"].index("0.5.20") + 1, twin)

    _rederive(anchored_sweep, change)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, f"{twin} and 0.5.20 are one version", "twin")


def test_identity_two_releases_wheel_digests_swapped_is_refused(sandbox, anchored_sweep):
    """Attack: 0.5.20's and 0.5.21's wheel sha256 swapped, in the listing and the releases
    alike (each digest still stands under one version)."""

    def change(receipt):
        a, b = _release(receipt, "0.5.20")["wheel"], _release(receipt, "0.5.21")["wheel"]
        a["sha256"], b["sha256"] = b["sha256"], a["sha256"]
        la, lb = _listed(receipt, "0.5.20"), _listed(receipt, "0.5.21")
        la["sha256"], lb["sha256"] = lb["sha256"], la["sha256"]

    _rederive(anchored_sweep, change)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "pin-mismatch", "release 0.5.20", "not the wheel the bundled experiment pins")


def test_identity_a_digest_under_two_versions_is_refused(sandbox, anchored_sweep):
    """Attack: 0.5.19's wheel digest recorded for 0.5.18 too (listing and release)."""

    def change(receipt):
        digest = _release(receipt, "0.5.19")["wheel"]["sha256"]
        _release(receipt, "0.5.18")["wheel"]["sha256"] = digest
        _listed(receipt, "0.5.18")["sha256"] = digest

    _rederive(anchored_sweep, change)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "pin-mismatch", "is under 0.5.18 and 0.5.19")


# --- the rendered files -----------------------------------------------------------------------


def test_a_readme_that_says_every_release_is_fixed_is_refused(sandbox, anchored_sweep):
    """Attack: README.md (what a reviewer reads first) says every release is fixed."""
    readme = anchored_sweep / "README.md"
    text = readme.read_text(encoding="utf-8")
    readme.write_text(text.replace("| affected |", "| fixed |").replace("- affected: ", "- fixed: "), encoding="utf-8")
    forge.rehash(anchored_sweep)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "readme-mismatch", "README.md", "not what kvprobe renders")


def test_an_all_green_timeline_with_a_script_is_refused(sandbox, anchored_sweep):
    """Attack: timeline.svg, which reviewers embed, all green and carrying a <script>."""
    svg = anchored_sweep / TIMELINE
    text = svg.read_text(encoding="utf-8").replace('fill="#d55e00"', 'fill="#009e73"')
    svg.write_text(text.replace("</svg>", "<script>alert(document.domain)</script></svg>"), encoding="utf-8")
    forge.rehash(anchored_sweep)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "rendered-mismatch", TIMELINE, "not what kvprobe renders")


# --- verify --rerun reads the listing again -----------------------------------------------------


def _local_index(sandbox, versions: list[str], filename) -> dict[str, str]:
    """A PEP 503 index in the sandbox listing ``versions`` (names only: listing needs no
    bytes), and pip's environment pointing at it alone."""
    root = sandbox.inputs / "index" / "sglang"
    root.mkdir(parents=True)
    links = "".join(f'<a href="{filename(v)}">{filename(v)}</a>\n' for v in versions)
    (root / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return {"PIP_INDEX_URL": (sandbox.inputs / "index").as_uri(), "PIP_CONFIG_FILE": "/dev/null"}


def test_rerun_of_a_truncated_range_finds_the_release_the_listing_left_out(sandbox, anchored_sweep):
    """Attack: a 0.5.19..0.5.21 sweep with 0.5.20 cut from its releases, its raw outputs and
    its listing alike: self-consistent, so step 4 passes, and `verify --rerun` re-ran '2 of 2
    releases'. The rerun reads the index's listing again first: 0.5.20 is on it."""
    genuine = forge.load(anchored_sweep, "receipt.json")
    files = {e["version"]: e["file"] for e in genuine["listing"]["selected"]}

    def change(receipt):
        receipt["spec"] = "0.5.19..0.5.21"
        receipt["releases"] = [r for r in receipt["releases"] if r["version"] in ("0.5.19", "0.5.21")]
        receipt["listing"]["versions"].remove(RELEASE)
        receipt["listing"]["selected"] = [
            e for e in receipt["listing"]["selected"] if e["version"] in ("0.5.19", "0.5.21")
        ]

    _rederive(anchored_sweep, change)
    for top in ("raw", "logs"):
        for version in {*files} - {"0.5.19", "0.5.21"}:
            tree = anchored_sweep / top / version
            for path in sorted(tree.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
            tree.rmdir()
    forge.rehash(anchored_sweep)
    assert_outcome(sandbox, sandbox.run("verify", anchored_sweep), 0)  # step 4 cannot see it
    env = _local_index(
        sandbox,
        list(genuine["listing"]["versions"]),
        lambda v: files.get(v, f"sglang-{v}-cp311-cp311-manylinux_2_34_x86_64.whl"),
    )
    # pip asks `rustc --version` for its user agent; a rustup shim then writes its settings in HOME
    result = sandbox.run("verify", anchored_sweep, "--rerun", env=env, timeout=120, allow=(sandbox.home / ".rustup",))
    assert_outcome(sandbox, result, 1, "listing-changed", f"the index lists {RELEASE}", "does not hold it")


# --- sweep --repeat N: stability is evidence too ---------------------------------------------


def _repeated(bundle: Path, flip: str | None = None) -> None:
    """``bundle`` as `sweep --repeat 2` writes it: each probe's run 2 beside its run 1, cited
    and classified with it. ``flip``: the release whose run 2 saw ``enqueued`` the other way on
    prefill.rejected_new (unstable: could-not-observe)."""
    from kvprobe.model.sweep_receipt import ReleaseRecord
    from kvprobe.rules.sweep_classification import classify_release, release_problems

    def change(receipt):
        receipt["repeats"] = 2
        for release in receipt["releases"]:
            again = {}
            for probe in release["probes"]:
                doc = forge.load(bundle, probe["raw"]["path"])
                if release["version"] == flip:
                    case = next(c for c in doc["cases"] if c["name"] == "prefill.rejected_new")
                    case["observations"]["enqueued"] = not case["observations"]["enqueued"]
                rel = f"raw/{release['version']}/probes/{probe['name']}.repeat-2.json"
                (bundle / rel).write_bytes(forge.dumps(doc))
                probe["repeats"] = [
                    {"raw": {"path": rel, "sha256": forge.sha(forge.dumps(doc))}, "exit_code": 0, "problem": None}
                ]
                again[probe["name"]] = [doc]
            docs = {p["name"]: forge.load(bundle, p["raw"]["path"]) for p in release["probes"]}
            typed = ReleaseRecord.from_json(release)
            problems = release_problems(typed.problem, typed.probes)
            release["classification"] = classify_release(receipt["expectations"], docs, problems, again)

    _rederive(bundle, change)


def test_a_repeated_sweep_verifies_and_its_unstable_release_is_could_not_observe(sandbox, anchored_sweep):
    """The tampers below start from a genuine `sweep --repeat 2` bundle that passes steps 1-5."""
    _repeated(anchored_sweep, flip=RELEASE)
    receipt = forge.load(anchored_sweep, "receipt.json")
    classification = _release(receipt, RELEASE)["classification"]
    assert classification["overall"] == "could-not-observe"
    assert list(classification["unstable"]) == ["admission_doors/prefill.rejected_new"]
    assert RELEASE in receipt["summary"]["could-not-observe"]
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 0)


def test_a_sweep_claiming_its_repeats_agreed_is_refused(sandbox, anchored_sweep):
    """Attack: run 2 of 0.5.20 differs; the resealed receipt says it agreed and calls the release
    affected, as its first run alone would."""
    _repeated(anchored_sweep, flip=RELEASE)

    def claim_stable(receipt):
        classification = _release(receipt, RELEASE)["classification"]
        classification.update(overall="affected", reasons=[], unstable={})
        for key in classification["cases"]:
            if classification["cases"][key]["class"] == "could-not-observe":
                classification["cases"][key] = {"class": "affected"}

    _rederive(anchored_sweep, claim_stable)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "forged-verdict", f"release {RELEASE} is stated 'affected'")


@pytest.mark.parametrize("drop", ["the-run", "the-count"])
def test_a_sweep_that_drops_the_repeat_that_differed_is_refused(sandbox, anchored_sweep, drop):
    """Attack: run 2 of 0.5.20 (the one that differed) dropped from its release entry, file and
    all, and the release reclassified from run 1 alone; or the receipt's count dropped, so the
    sweep reads as one run."""
    from kvprobe.rules.sweep_classification import classify_release

    _repeated(anchored_sweep, flip=RELEASE)

    def drop_run(receipt):
        release = _release(receipt, RELEASE)
        for probe in release["probes"]:
            (anchored_sweep / probe.pop("repeats")[0]["raw"]["path"]).unlink()
        docs = {p["name"]: forge.load(anchored_sweep, p["raw"]["path"]) for p in release["probes"]}
        release["classification"] = classify_release(receipt["expectations"], docs, {})

    def drop_count(receipt):
        receipt.pop("repeats")
        for release in receipt["releases"]:
            release["classification"].pop("unstable")
            docs = {p["name"]: forge.load(anchored_sweep, p["raw"]["path"]) for p in release["probes"]}
            release["classification"] = classify_release(receipt["expectations"], docs, {})

    _rederive(anchored_sweep, drop_run if drop == "the-run" else drop_count)
    result = sandbox.run("verify", anchored_sweep)
    assert_outcome(sandbox, result, 1, "record-mismatch", "the receipt records")


# --- reused units: what a sweep says it took from the kvprobe cache ---------------------------


@pytest.mark.parametrize("claim", ["observed-after-the-sweep-began", "observed-at-no-time", "a-repeat-left-no-output"])
def test_a_forged_reuse_claim_is_refused(sandbox, anchored_sweep, claim):
    """Attack: 0.5.20 claims its unit came from the cache (README: "reused from ..."), observed
    after the sweep that reused it began, or at a time that never was (the README then says
    "reused from 0000-00-00T00:00:00Z"); or, in a `sweep --repeat 2` bundle, claims a unit
    whose run 2 of a probe left no output (could-not-observe): kvprobe keeps no such unit, it
    observes that release again."""
    from kvprobe.model.sweep_receipt import ReleaseRecord
    from kvprobe.rules.sweep_classification import classify_release, release_problems

    _repeated(anchored_sweep)

    def claim_reuse(receipt):
        release = _release(receipt, RELEASE)
        when = {"observed-after-the-sweep-began": "2099-01-01T00:00:00Z", "observed-at-no-time": "0000-00-00T00:00:00Z"}
        when = when.get(claim, "2026-12-01T00:00:00Z")
        release["reused"] = {"observed_utc": when, "unit_manifest_sha256": "0" * 64}
        if claim == "a-repeat-left-no-output":
            for probe in release["probes"]:
                (anchored_sweep / probe["repeats"][0]["raw"]["path"]).unlink()
                probe["repeats"] = [{"raw": None, "exit_code": -9, "problem": "crashed (signal 9)"}]
            docs = {p["name"]: forge.load(anchored_sweep, p["raw"]["path"]) for p in release["probes"]}
            again = {p["name"]: [None] for p in release["probes"]}
            typed = ReleaseRecord.from_json({**release, "classification": {**release["classification"]}})
            release["classification"] = classify_release(
                receipt["expectations"], docs, release_problems(typed.problem, typed.probes), again
            )
            assert release["classification"]["overall"] == "could-not-observe"

    _rederive(anchored_sweep, claim_reuse)
    result = sandbox.run("verify", anchored_sweep)
    words = {"observed-after-the-sweep-began": ("after the sweep began",), "observed-at-no-time": ("not a time",)}
    words = words.get(claim, ("its unit did not observe",))
    assert_outcome(sandbox, result, 1, "record-mismatch", f"release {RELEASE} is reused", *words)
