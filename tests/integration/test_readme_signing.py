"""The README's signing round trip, run as written: openssl makes the key pair, `kvprobe
attest` signs, `kvprobe verify --attestation --require-anchor` says verified (exit 0)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests import forge

ROOT = Path(__file__).resolve().parents[2]


def _blocks() -> list[list[str]]:
    """The two sh blocks under '### Sign and verify the in-toto statement', as command lines."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Sign and verify the in-toto statement", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


def _run(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line.replace("BUNDLE", "bundle"))
    if argv[0] == "kvprobe":
        argv = [sys.executable, "-m", "kvprobe", *argv[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPROBE_")}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_the_readme_signing_commands_round_trip(tmp_path):
    forge.build(tmp_path / "bundle")
    publish, check = _blocks()
    assert any(line.startswith("kvprobe attest") for line in publish)
    for line in publish:
        done = _run(line, tmp_path)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
    verify = check[0]
    done = _run(verify + " --json", tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["outcome"] == "verified" and [a["kind"] for a in doc["anchored_by"]] == ["attestation"]
    # the same commands against a bundle changed after signing: exit 1
    forge.edit_receipt(tmp_path / "bundle", lambda r: r["host"].update(system="Linux, edited"))
    assert _run("kvprobe bundle pack BUNDLE -o bundle.tar.gz --force", tmp_path).returncode == 0
    assert _run(verify, tmp_path).returncode == 1
