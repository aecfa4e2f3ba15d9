"""README.md's commands, run as written: each fenced ``sh`` line under its heading goes to
``bash -c`` with the test environment's ``kvprobe`` first on PATH (a fresh venv per test would
cost minutes: the install half of a line is checked, then the installed kvprobe runs the
rest). Placeholders (``BUNDLE``, ``SWEEP``, ...) name committed bundles; an optional
``[...]`` part runs both left out and written in. What a user reads off the output (the
``result:`` line, the files written, the sample's ``observations:`` and ``verdict:`` lines) is
compared with what the README shows.

Not run here, with why: the test block (it is this suite), the lint line (.ci/run runs it),
``kvprobe new`` (its paths name the reader's own mirror; tests/integration/test_new_experiment.py
scaffolds the same flags), ``kvprobe gates`` (its inputs are the reader's deployment;
tests/integration/test_gates_*.py). The signing round trip and the CI recipe are run by
tests/integration/test_readme_signing.py; every option the command table shows is checked by
tests/unit/test_readme_commands.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BUNDLES = ROOT / "bundles"


def section(heading: str) -> str:
    """The README text under ``heading`` (a line of #s and a title) up to the next heading."""
    return re.split(r"\n#+ ", README.split(f"\n{heading}\n", 1)[1], maxsplit=1)[0]


def sh_lines(heading: str) -> list[str]:
    """The command lines of the ``sh`` blocks under ``heading`` (backslash continuations joined)."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", section(heading), re.S):
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return lines


def expand(usage: str, *, full: bool) -> str:
    """A usage line with its optional ``[...]`` parts left out, or written in (innermost first)."""
    while "[" in usage:
        usage = re.sub(r"\s*\[([^\[\]]*)\]", (lambda m: " " + m.group(1)) if full else "", usage)
    return usage


def bash(line: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    kvprobe = Path(sys.executable).parent / "kvprobe"
    assert kvprobe.is_file(), f"no kvprobe console script beside {sys.executable}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVPROBE_") or k == "KVPROBE_CACHE_DIR"}
    clean["PATH"] = f"{kvprobe.parent}{os.pathsep}{clean.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=900
    )


def committed(prefix: str) -> Path:
    (found,) = sorted(BUNDLES.glob(f"{prefix}-*"))
    return found


def published_digest(bundle: Path) -> str:
    """The digest the README's bundle table publishes for ``bundle``."""
    (digest,) = re.findall(rf"\| `bundles/{re.escape(bundle.name)}` \| `([0-9a-f]{{64}})` \|", README)
    return digest


def test_verify_a_published_bundle_as_written(tmp_path):
    first, archive, rerun = sh_lines("## Verify a bundle someone published")
    # the first line names a committed bundle and the digest the bundle table publishes for it
    name, digest = re.fullmatch(r"kvprobe verify bundles/(\S+) --expect-manifest-sha256 ([0-9a-f]{64})", first).groups()
    assert published_digest(BUNDLES / name) == digest
    done = bash(first, ROOT)
    assert done.returncode == 0, done.stderr
    # "The last line says what was proved" (results on stdout)
    result, anchored = done.stdout.splitlines()[-2:]
    assert result == "result: verified" and anchored.startswith("anchored by: expect-manifest-sha256")

    packed = bash(f"kvprobe bundle pack {BUNDLES / name} -o bundle.tar.gz", tmp_path)
    assert packed.returncode == 0, packed.stderr
    done = bash(archive, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:][0] == "result: self-consistent"
    assert rerun.startswith("kvprobe verify --rerun BUNDLE")  # run on real SGLang below (slow)


@pytest.mark.parametrize("full", [False, True], ids=["as-is", "every-option"])
def test_report_commands_as_written(tmp_path, full):
    """BUNDLE: the committed experiment-b run (a security fix: OpenVEX states it); SWEEP: its sweep."""
    lines = sh_lines("## Attach a receipt to a security review: `kvprobe report`")
    formats = [re.search(r"--format (\S+?)\]?(?: |$)", line) for line in lines]
    assert [m.group(1) if m else None for m in formats] == ["markdown", "openvex", "intoto", "osv"]
    run, sweep = committed("experiment-b-release"), committed("experiment-b-sweep")
    packed = bash(f"kvprobe bundle pack {run} -o {run.name}.tar.gz", tmp_path)
    assert packed.returncode == 0, packed.stderr
    for line in lines:
        command = expand(line, full=full)
        command = command.replace("BUNDLE.tar.gz", f"{run.name}.tar.gz").replace("BUNDLE", str(run))
        command = command.replace("SWEEP", str(sweep)).replace("GHSA-...", "GHSA-xxxx-xxxx-xxxx")
        command = command.replace("ROLE", "'Document Creator'")
        done = bash(command, tmp_path)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        written = re.findall(r"-o (\S+)", command)
        if written:
            text = (tmp_path / written[0]).read_text(encoding="utf-8")
            if written[0].endswith(".json"):
                json.loads(text)
        else:
            assert done.stdout.strip(), command
        assert "warning: SELF-CONSISTENT ONLY" in done.stderr  # no anchor given: the export says so


def test_cache_commands_of_the_table_as_written(tmp_path):
    """`cache ls`, `cache prune [...]`, `cache verify`, `cache servers [...]`, on an empty cache of
    their own (the shared one is never pruned by a test), every option written in too."""
    cells = re.findall(r"^\| (`kvprobe cache [^|]*?`(?: / `kvprobe cache [^|]*?`)?) \|", README, re.M)
    usages = [u for cell in cells for u in re.findall(r"`(kvprobe cache [^`]+)`", cell)]
    assert {u.split()[2] for u in usages} == {"ls", "prune", "verify", "servers"}
    for usage in usages:
        for full in (False, True):
            command = expand(usage, full=full).replace("DAYS", "30").replace("KIND", "unit").replace("--all", "")
            done = bash(command, tmp_path, KVPROBE_CACHE_DIR=str(tmp_path / "cache"), XDG_RUNTIME_DIR=str(tmp_path))
            assert done.returncode == 0, f"{command}\n{done.stderr}"


# --- on real SGLang: the main job, and its sample output ---------------------------------------


def _shape(line: str) -> str:
    """A progress line without what changes between runs: durations and the preload's module list."""
    line = re.sub(r"\d+(?:\.\d+)?s\b", "Ns", line)
    return re.sub(r"importing .*?(?= in the background|$)", "importing MODULES", line)


@pytest.mark.slow
@pytest.mark.network
def test_install_and_run_the_main_job_as_written(tmp_path):
    (line,) = sh_lines("## Install and run the main job")
    install, command = (part.strip() for part in line.split("&&"))
    assert install == "python3 -m pip install ."  # the test environment's own install
    done = bash(command, tmp_path)
    assert done.returncode == 0, done.stderr
    sample = re.findall(r"```text\n(.*?)```", section("## Install and run the main job"), re.S)[0].splitlines()
    printed = done.stdout.splitlines()
    for prefix in ("observations:", "verdict:"):
        assert [x for x in sample if x.startswith(prefix)] == [x for x in printed if x.startswith(prefix)], prefix
    assert re.fullmatch(r"bundle: \S+/bundles/experiment-a-release-\d{8}T\d{6}Z", printed[-2])
    assert re.fullmatch(r"manifest sha256: [0-9a-f]{64}", printed[-1])
    progress = [_shape(x) for x in done.stderr.splitlines() if x[:1] in "·…✓"]
    shown = [_shape(x) for x in sample if x[:1] in "·…✓"]
    assert not Counter(shown) - Counter(progress), "a progress line of the sample is not what the run prints"

    (bundle,) = (tmp_path / "bundles").iterdir()
    rerun = sh_lines("## Verify a bundle someone published")[2].split("#")[0].strip()
    done = bash(rerun.replace("BUNDLE", str(bundle)), tmp_path)
    assert done.returncode == 0, done.stderr
    result, anchored = done.stdout.splitlines()[-2:]
    assert result == "result: verified" and anchored.startswith("anchored by: rerun"), done.stdout
    shutil.rmtree(bundle)
