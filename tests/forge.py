"""A forge for bundles: a small VALID bundle built without running anything, and named
mutations (tampers) to apply to it, one per case.

The valid bundle mirrors what ``kvprobe.runner`` writes for a git pin set with one probe
and one upstream test file: raw/<side>/probes/<probe>.json, raw/<side>/tests/<file>.json
(+ junit), logs, probes/<id>/ (experiment.toml and the probe source, byte for byte),
receipt.json (comparison from ``compare.compare``), README.md, manifest.json, SHA256SUMS.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvprobe import schema
from kvprobe.evidence import manifest
from kvprobe.evidence.bundle_readme import render_readme
from kvprobe.model.receipt import Receipt
from kvprobe.model.records import SourceKind
from kvprobe.names import MANIFEST, SUMS
from kvprobe.rules import compare
from kvprobe.rules.run_limits import run_limits

EXP_ID = "forge-exp"
PIN_SET = "commits"
BASE_SHA, HEAD_SHA = "1" * 40, "2" * 40
PROBE = "doors"
TEST_PATH = "test/unit/test_doors.py"
TEST_RAW = "test__unit__test_doors.py"
RUN_ID = f"{EXP_ID}-{PIN_SET}-20260101T000000Z-abc123"
SIDES = ("base", "head")

EXPERIMENT_TOML = f'''schema = "kvprobe.experiment/1"
id = "{EXP_ID}"
title = "A forged but valid experiment"
layer = "diff-probe"
upstream = "https://example.invalid/upstream"
profile = "pytest-minimal"
default_pins = "{PIN_SET}"

[fix]
prs = [1]
summary = "The door stops enqueueing rejected requests."

[vulnerability]
id = "KVPROBE-2026-0001"
fix_kind = "security"

[pins.{PIN_SET}]
kind = "git"
pr = 1
[pins.{PIN_SET}.base]
commit = "{BASE_SHA}"
[pins.{PIN_SET}.head]
commit = "{HEAD_SHA}"

[checks]
tests = [{{ path = "{TEST_PATH}" }}]
probes = [{{ path = "{PROBE}.py" }}]

[scope]
shows = "a forged difference"
does_not_show = ["anything real"]

[expect.base."{PROBE}/reject"]
enqueued = true
[expect.head."{PROBE}/reject"]
enqueued = false
'''.encode()

PROBE_SOURCE = b"import kvprobe_probe as kp\n# the forge's probe source, never run\n"


def probe_doc(side: str) -> dict[str, Any]:
    return {
        "schema": "kvprobe.probe-output/1",
        "probe": PROBE,
        "description": "forged",
        "python": "3.11.7",
        "facts": {},
        "mocks": {"sender": "MagicMock KV sender"},
        "configuration": [
            {"name": "enable_hicache_storage", "value": True, "default": False, "why": "reach the door", "case": None}
        ],
        "absorbed": [{"case": "reject", "mock": "sender", "call": "sender.send", "count": 1}],
        "cases": [
            {
                "name": "reject",
                "description": "a rejected request",
                "status": "ok",
                "observation": "observed",
                "decision_point": "Door.add",
                "reason": None,
                "missing": [],
                "preconditions": {},
                "observations": {"enqueued": side == "base", "placeholder_len": 1},
                "error": None,
                "notes": [],
                "duration_s": 0.01,
            }
        ],
    }


def testrun_doc(side: str) -> dict[str, Any]:
    failed = side == "base"
    entry = {"nodeid": f"{TEST_PATH}::test_door", "when": "call", "outcome": "failed" if failed else "passed"}
    if failed:
        entry["exception"] = {
            "root_type": "AttributeError",
            "top_type": "AttributeError",
            "root_message": "no attribute retire",
        }
    report = {
        "schema": "kvprobe.pytest-report/1",
        "complete": True,
        "exitstatus": 1 if failed else 0,
        "collected": 1,
        "collection_errors": [],
        "tests": [entry],
        "running": None,
        "runner": {"file_nodeid": TEST_PATH, "returncode": 1 if failed else 0, "timed_out": False},
    }
    return {
        "schema": "kvprobe.test-run/1",
        "path": TEST_PATH,
        "side": side,
        "exit_code": 1 if failed else 0,
        "timed_out": False,
        "overlay": "replaced",
        "problem": None,
        "report": report,
    }


def dumps(doc: Any) -> bytes:
    """The runner's JSON format."""
    return (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(root: Path, rel: str, data: bytes) -> dict[str, str]:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"path": rel, "sha256": sha(data)}


def build(root: Path, algorithm: str = compare.ALGORITHM) -> Path:
    """Write a valid bundle at ``root`` (created) and return it; ``algorithm`` names the
    comparison that made it (a predecessor's bundle, as an older kvprobe wrote it)."""
    root.mkdir(parents=True)
    made = {root}
    for rel, data in _template(algorithm):
        path = root / rel
        if path.parent not in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        path.write_bytes(data)
    return root


@functools.cache
def _template(algorithm: str) -> tuple[tuple[str, bytes], ...]:
    """The bundle's files, forged once per process: several hundred tests build it, and its
    comparison, receipt and manifest come out byte for byte the same each time."""
    with tempfile.TemporaryDirectory() as tmp:
        root = _forge(Path(tmp) / "b", algorithm)
        return tuple(
            (path.relative_to(root).as_posix(), path.read_bytes()) for path in sorted(root.rglob("*")) if path.is_file()
        )


def _forge(root: Path, algorithm: str) -> Path:
    """What ``build`` writes, computed: the probe and test outputs, the comparison, the receipt."""
    root.mkdir(parents=True)
    exp_ref = _write(root, f"probes/{EXP_ID}/experiment.toml", EXPERIMENT_TOML)
    src_ref = _write(root, f"probes/{EXP_ID}/{PROBE}.py", PROBE_SOURCE)
    sides, docs, runs = {}, {}, {}
    for side in SIDES:
        probe_ref = _write(root, f"raw/{side}/probes/{PROBE}.json", dumps(probe_doc(side)))
        test_ref = _write(root, f"raw/{side}/tests/{TEST_RAW}.json", dumps(testrun_doc(side)))
        junit_ref = _write(root, f"raw/{side}/tests/{TEST_RAW}.junit.xml", b"<testsuites/>\n")
        _write(root, f"logs/{side}/probes/{PROBE}.stdout", b"")
        _write(root, f"logs/{side}/probes/{PROBE}.stderr", f"{side} ran\n".encode())
        commit = BASE_SHA if side == "base" else HEAD_SHA
        sides[side] = {
            "pin": {"kind": "git", "commit": commit},
            "source": {"kind": "git", "url": "https://example.invalid/upstream", "commit": commit, "tree": "3" * 40},
            "tests": [
                {
                    "path": TEST_PATH,
                    "raw": test_ref,
                    "junit": junit_ref,
                    "exit_code": testrun_doc(side)["exit_code"],
                    "overlay": "replaced",
                    "problem": None,
                }
            ],
            "probes": [{"name": PROBE, "source": src_ref, "raw": probe_ref, "exit_code": 0, "problem": None}],
        }
        docs[side] = {PROBE: probe_doc(side)}
        runs.setdefault(TEST_PATH, {})[side] = testrun_doc(side)
    expectations = {"base": {f"{PROBE}/reject": {"enqueued": True}}, "head": {f"{PROBE}/reject": {"enqueued": False}}}
    comparison = compare.compare(
        expect=expectations,
        probe_docs=docs,
        probe_problems={"base": {}, "head": {}},
        test_runs=runs,
        algorithm=algorithm,
    )
    assert comparison["verdict"] == "reproduced", comparison["reasons"]
    receipt = _receipt(exp_ref, sides, expectations, comparison)
    receipt["evidence"].update(compare.probe_records(docs))
    schema.validate(receipt, "kvprobe.receipt/1", source="forge receipt")
    _write(root, "receipt.json", dumps(receipt))
    _write(root, "README.md", render_readme(Receipt.from_json(receipt)).encode("utf-8"))
    manifest.write(root)
    return root


def _receipt(exp_ref, sides, expectations, comparison) -> dict[str, Any]:
    return {
        "schema": "kvprobe.receipt/1",
        "tool": {"name": "kvprobe", "version": "0.1.0"},
        "run_id": RUN_ID,
        "created_utc": "2026-01-01T00:00:00Z",
        "experiment": {
            "id": EXP_ID,
            "title": "A forged but valid experiment",
            "layer": "diff-probe",
            "file": exp_ref["path"],
            "sha256": exp_ref["sha256"],
            "upstream": "https://example.invalid/upstream",
            "profile": "pytest-minimal",
            "fix": {"prs": [1], "release": None, "summary": "The door stops enqueueing rejected requests."},
            "vulnerability": {"id": "KVPROBE-2026-0001", "aliases": [], "fix_kind": "security"},
        },
        "pin_set": {"name": PIN_SET, "kind": "git", "pr": 1, "python_path": ["."]},
        "sides": sides,
        "env": {
            "key": "k",
            "python": "3.11.7",
            "profile": "pytest-minimal",
            "lock_name": None,
            "lock_sha256": None,
            "packages": {},
            "torch": None,
            "torch_index": None,
            "shared_by_sides": True,
        },
        "host": {"system": "Linux", "machine": "x86_64", "release": "6", "python": "3.11.7", "cpus": 2},
        "settings": {},
        "expectations": expectations,
        "comparison": comparison,
        "verdict": comparison["verdict"],
        "evidence": {
            "layer": "diff-probe",
            "shows": "a forged difference",
            "does_not_show": ["anything real"],
            "mocks": {PROBE: {"sender": "MagicMock KV sender"}},
            "limits": ["host: Linux x86_64, CPU only; no GPU, RDMA or model weights"],
        },
        "timings": {"checks_s": 0.1},
    }


# --- helpers for mutations ---------------------------------------------------------------


def load(root: Path, rel: str) -> Any:
    return json.loads((root / rel).read_bytes())


def rehash(root: Path) -> None:
    """Re-write manifest.json and SHA256SUMS so step 3 passes: a tamper with 'consistent hashes'."""
    (root / MANIFEST).unlink()
    (root / SUMS).unlink()
    manifest.write(root)


def edit_receipt(root: Path, change: Callable[[dict], None]) -> None:
    """Change the receipt, then re-derive what a writer derives from it: README.md (when it was
    the rendering of the old receipt and the new one still renders) and the hashes."""
    receipt = load(root, "receipt.json")
    readme = root / "README.md"
    derived = readme.is_file() and not readme.is_symlink() and readme.read_bytes() == _rendered(receipt)
    limits = _limits(receipt)
    stated = receipt.get("evidence", {}).get("limits") if isinstance(receipt.get("evidence"), dict) else None
    change(receipt)
    if limits is not None and limits == stated and receipt.get("evidence", {}).get("limits") == stated:
        # a writer derives the limits from the host, pin set and env (rules/run_limits): re-derive
        # them where they were derived and the change left them alone
        receipt["evidence"]["limits"] = _limits(receipt) or stated
    (root / "receipt.json").write_bytes(dumps(receipt))
    if derived and _rendered(receipt) is not None:
        readme.write_bytes(_rendered(receipt))
    rehash(root)


def _limits(receipt: dict) -> list[str] | None:
    try:
        ps, env = receipt["pin_set"], receipt["env"]
        commit = (ps.get("tests_from") or {}).get("commit")
        return run_limits(receipt["host"], SourceKind(ps["kind"]), commit, env.get("torch"), env.get("torch_index"))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # not a run receipt, or a tamper that breaks its shape


def _rendered(receipt: dict) -> bytes | None:
    try:
        return render_readme(Receipt.from_json(receipt)).encode("utf-8")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None  # a tamper that breaks the receipt's shape


def recite(root: Path, rel: str) -> None:
    """Make the receipt's citations of ``rel`` record its current digest."""
    digest = sha((root / rel).read_bytes())

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("path") == rel and "sha256" in node:
                node["sha256"] = digest
            for value in node.values():
                fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)

    edit_receipt(root, fix)


def replace_cited(root: Path, rel: str, old: bytes, new: bytes) -> None:
    """Edit a cited file's bytes and make the receipt (and the manifest) agree with the edit."""
    path = root / rel
    path.write_bytes(path.read_bytes().replace(old, new))
    recite(root, rel)


def write_manifest_doc(root: Path, doc: dict) -> None:
    (root / MANIFEST).write_bytes(manifest.render_manifest(doc))
    (root / SUMS).write_text(manifest.render_sums(doc), encoding="utf-8")


# --- archives ----------------------------------------------------------------------------


def tar_of(root: Path, out: Path, extra: list[tuple[tarfile.TarInfo, bytes | None]] = (), top: str = "b") -> Path:
    """A .tar.gz of ``root`` under ``top/``, plus hostile ``extra`` members."""
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=f"{top}/{path.relative_to(root).as_posix()}", recursive=False)
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = None, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    if data is not None:
        info.size = len(data)
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, data


def snapshot(root: Path) -> dict[str, Any]:
    """Every entry under ``root`` (lstat only; regular files' bytes): proof nothing changed."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            rel = os.fsencode(path.relative_to(root))
            found[rel] = (
                st.st_mode,
                st.st_size,
                path.read_bytes()
                if path.is_file() and not path.is_symlink()
                else os.readlink(path)
                if path.is_symlink()
                else None,
            )
    return found


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def tamper_file(path: Path, data: bytes, *, keep_stat: bool) -> None:
    """Overwrite a (read-only) file; with ``keep_stat``, put its mode and times back, as an
    attacker hiding the change from a stat-based check would."""
    before = os.stat(path)
    os.chmod(path, 0o644)
    path.write_bytes(data)
    if keep_stat:
        os.chmod(path, before.st_mode)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def add_repeats(root: Path, again: dict[str, list[dict[str, Any]]]) -> None:
    """Make ``root`` (from build()) a bundle of ``run --repeat N``: ``again[side]`` are the probe's
    outputs of runs 2..N, written and cited as a run writes them, with the comparison they give."""
    receipt = load(root, "receipt.json")
    docs = {side: {PROBE: load(root, f"raw/{side}/probes/{PROBE}.json")} for side in SIDES}
    for side in SIDES:
        refs = [
            _write(root, f"raw/{side}/probes/{PROBE}.repeat-{run}.json", dumps(doc))
            for run, doc in enumerate(again[side], start=2)
        ]
        receipt["sides"][side]["probes"][0]["repeats"] = [{"raw": ref, "exit_code": 0, "problem": None} for ref in refs]
    runs = {TEST_PATH: {side: load(root, f"raw/{side}/tests/{TEST_RAW}.json") for side in SIDES}}
    comparison = compare.compare(
        expect=receipt["expectations"],
        probe_docs=docs,
        probe_problems={"base": {}, "head": {}},
        test_runs=runs,
        repeats={side: {PROBE: again[side]} for side in SIDES},
    )
    receipt.update(comparison=comparison, verdict=comparison["verdict"], repeats=1 + len(again["base"]))
    schema.validate(receipt, "kvprobe.receipt/1", source="forge receipt")
    (root / "receipt.json").write_bytes(dumps(receipt))
    (root / "README.md").write_bytes(render_readme(Receipt.from_json(receipt)).encode("utf-8"))
    rehash(root)
