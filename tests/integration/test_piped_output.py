"""Every command piped (issue #16): plain lines, results on stdout, diagnostics on stderr.

Each command runs as ``python -m kvprobe`` with stdout and stderr as pipes and COLUMNS=80,
as in CI or ``kvprobe ... | grep``. The checks: an identifier or a digest is never split
across lines, the result is on stdout, progress and problems are on stderr, and --json
stdout is one JSON document.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests import forge
from tests.attacks.gatelogs import CONTEXT, INCIDENT, RAISED, startup_log

REPO = Path(__file__).resolve().parents[2]
MODEL_BUNDLE = REPO / "bundles" / "model-model-20261129T202024Z"
_HEX_RUN = re.compile(r"(?<![0-9a-f])[0-9a-f]{20,}(?![0-9a-f])")


def kvprobe(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("KVPROBE_PROBES_PATH", "FORCE_COLOR")},
        "COLUMNS": "80",
        "PYTHONPATH": str(REPO),
        "KVPROBE_CACHE_DIR": str(tmp_path / "cache"),
    }
    return subprocess.run(
        [sys.executable, "-m", "kvprobe", *args],
        cwd=cwd or tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def assert_plain(result: subprocess.CompletedProcess[str], *whole: str) -> None:
    """No escape byte, no box drawing, every digest-like hex run a full SHA (40 or 64), and
    every one of ``whole`` (identifiers, paths, digests) on one line of stdout."""
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        assert "\x1b" not in text, f"escape sequence on a piped {name}"
        assert not re.search("[┏┃━│─┌└╭]", text), f"a boxed table on a piped {name}:\n{text}"
        for run in _HEX_RUN.findall(text):
            assert len(run) in (40, 64), f"a digest split across lines on {name}: {run}\n{text}"
    for item in whole:
        assert any(item in line for line in result.stdout.splitlines()), (
            f"{item!r} not whole on stdout:\n{result.stdout}"
        )


def assert_json(result: subprocess.CompletedProcess[str]) -> object:
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout)


def test_list_and_show(tmp_path):
    listed = kvprobe(tmp_path, "list")
    assert listed.returncode == 0, listed.stderr
    assert_plain(listed, "later-release", "experiment-a", "built-in")
    assert listed.stderr == ""
    rows = [line for line in listed.stdout.splitlines() if line.startswith(("experiment-a ", "model "))]
    assert len(rows) == 2 and all("built-in" in row for row in rows), listed.stdout
    listed_json = assert_json(kvprobe(tmp_path, "list", "--json"))
    assert isinstance(listed_json, dict) and listed_json["schema"] == "kvprobe.cli.list/1"
    ids = {e["id"]: e["source"] for e in listed_json["experiments"]}
    assert ids["model"] == "built-in"

    shown = kvprobe(tmp_path, "show", "experiment-a")
    assert shown.returncode == 0, shown.stderr
    sha = json.loads(kvprobe(tmp_path, "show", "experiment-a", "--json").stdout)["pins"]["release"]["base"]["sha256"]
    assert_plain(shown, f"sha256:{sha}", "source: built-in")


def test_a_project_folder_that_shadows_a_built_in_is_reported(tmp_path):
    target = tmp_path / "probes" / "model"
    target.mkdir(parents=True)
    for path in (REPO / "probes" / "model").iterdir():
        if path.is_file():
            (target / path.name).write_bytes(path.read_bytes())
    same = kvprobe(tmp_path, "show", "model")  # the same files: the same experiment, no warning
    assert same.returncode == 0 and "shadows" not in same.stderr, same.stderr
    (target / "experiment.toml").write_text((target / "experiment.toml").read_text() + "\n# a local edit\n")
    for args in (("list",), ("show", "model"), ("list", "--json")):
        result = kvprobe(tmp_path, *args)
        assert result.returncode == 0, result.stderr
        warning = [line for line in result.stderr.splitlines() if "shadows" in line]
        assert warning and "./probes" in warning[0] and "built-in" in warning[0], result.stderr
    assert "source: ./probes" in kvprobe(tmp_path, "show", "model").stdout
    swept = kvprobe(tmp_path, "sweep", "model")  # warned before the sweep refuses (no wheel pins)
    assert swept.returncode == 2 and "no wheel pin set" in swept.stderr
    assert any("shadows" in line and "./probes" in line for line in swept.stderr.splitlines()), swept.stderr


def test_model_run_verify_report_and_pack(tmp_path):
    out = tmp_path / "bundle-with-a-long-name-that-would-wrap-at-eighty-columns-in-a-table"
    ran = kvprobe(tmp_path, "run", "model", "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["experiment"]["source"] == "built-in"
    digest = forge.sha((out / "manifest.json").read_bytes())
    assert_plain(ran, f"manifest sha256: {digest}", f"bundle: {out}", "verdict: reproduced")
    assert len(ran.stdout.splitlines()) < 40, f"a piped model run prints a summary:\n{ran.stdout}"
    assert "manifest sha256" not in ran.stderr and "running" in ran.stderr  # progress on stderr
    assert any(line.startswith("✓ ") for line in ran.stderr.splitlines()), ran.stderr
    full = kvprobe(tmp_path, "run", "model", "-v", "--out", str(tmp_path / "second"))
    assert len(full.stdout.splitlines()) > len(ran.stdout.splitlines())
    quiet = kvprobe(tmp_path, "run", "model", "-q", "--out", str(tmp_path / "third"))
    assert quiet.stderr == "" and "verdict: reproduced" in quiet.stdout
    as_json = kvprobe(tmp_path, "run", "model", "--json", "--out", str(tmp_path / "fourth"))
    assert assert_json(as_json)["verdict"] == "reproduced"

    verified = kvprobe(tmp_path, "verify", str(out))
    assert verified.returncode == 0, verified.stderr
    assert_plain(verified, f"manifest sha256: {digest}", "result: self-consistent")
    grep = [line for line in verified.stdout.splitlines() if "manifest sha256:" in line]
    assert grep == [f"manifest sha256: {digest}"]
    assert "self-consistent" in verified.stderr  # step 5 without --expect-manifest-sha256: a diagnostic
    assert assert_json(kvprobe(tmp_path, "verify", str(out), "--json"))["outcome"] == "self-consistent"
    assert kvprobe(tmp_path, "verify", "--debug", "-qq", str(out)).stdout == ""

    for fmt in ("openvex", "intoto"):
        reported = kvprobe(tmp_path, "report", str(MODEL_BUNDLE), "--format", fmt)
        if reported.returncode == 0:
            assert_json(reported)
    markdown = kvprobe(tmp_path, "report", str(out), "--format", "markdown")
    assert markdown.returncode == 0, markdown.stderr
    assert_plain(markdown, digest)

    packed = kvprobe(tmp_path, "bundle", "pack", str(out))
    assert packed.returncode == 0, packed.stderr
    assert_plain(packed, f"{out}.tar.gz", digest)
    assert packed.stderr == ""


def test_gates(tmp_path):
    logs = []
    for role, pool in (("prefill", RAISED), ("decode", INCIDENT)):
        path = tmp_path / f"{role}.log"
        path.write_text(startup_log(role, pool, CONTEXT, canary=True))
        logs += ["--log", str(path)]
    out = tmp_path / "gates"
    result = kvprobe(tmp_path, "gates", *logs, "--out", str(out))
    assert result.returncode == 1, result.stderr
    digest = forge.sha((out / "manifest.json").read_bytes())
    assert_plain(result, f"manifest sha256: {digest}", "overall: fail")
    assert any(line.startswith("gate 1: fail") for line in result.stderr.splitlines()), result.stderr
    again = kvprobe(tmp_path, "gates", *logs, "--out", str(tmp_path / "gates2"), "--json")
    assert assert_json(again)["overall"] == "fail"


def test_cache_and_help(tmp_path):
    listed = kvprobe(tmp_path, "cache", "ls")
    assert listed.returncode == 0 and "total:" in listed.stdout, listed.stderr
    assert assert_json(kvprobe(tmp_path, "cache", "ls", "--json"))["entries"] == []
    pruned = kvprobe(tmp_path, "cache", "prune", "--dry-run")
    assert pruned.returncode == 0 and "would free" in pruned.stdout, pruned.stderr
    helped = kvprobe(tmp_path, "--help")
    assert "…" not in helped.stdout
    for word in ("KVPROBE_TORCH_INDEX", "KVPROBE_PROBES_PATH", "KVPROBE_CACHE_DIR", "_KVPROBE_COMPLETE"):
        assert word in helped.stdout
    assert kvprobe(tmp_path, "-V").stdout.strip().startswith("kvprobe, version")


def test_errors_go_to_stderr_and_debug_works_after_the_subcommand(tmp_path):
    result = kvprobe(tmp_path, "show", "no-such-experiment")
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith("kvprobe: error:") and "Traceback" not in result.stderr, result.stderr
    debug = kvprobe(tmp_path, "verify", "--debug", "/nonexistent")
    assert debug.returncode == 2 and debug.stdout == "", debug
    assert "Traceback" in debug.stderr and debug.stderr.splitlines()[-1].startswith("kvprobe: error:")
