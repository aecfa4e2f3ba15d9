"""The README's signing round trip, run as written: openssl makes the key pair, `kvprobe
attest` signs, `kvprobe verify --attestation --require-anchor` says verified (exit 0)."""

from __future__ import annotations

import hashlib
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


def test_the_readme_ci_recipe_runs_as_written(tmp_path):
    """The two lines under "In CI: require an anchor", through bash as a CI job runs them (the
    digest from $PUBLISHED_DIGEST, the JSON redirected): exit 0 on an anchored bundle, and
    verify.json names the anchor; exit 1 when the published digest is another bundle's."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### In CI: require an anchor", 1)[1].split("\n#", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    signed, digested = [line for line in block.splitlines() if line.strip()]
    forge.build(tmp_path / "bundle")
    for line in _blocks()[0]:  # the publisher's commands make the key, archive and statement
        assert _run(line, tmp_path).returncode == 0, line
    digest = hashlib.sha256((tmp_path / "bundle" / "manifest.json").read_bytes()).hexdigest()
    kvprobe = Path(sys.executable).parent / "kvprobe"
    assert kvprobe.is_file(), f"no kvprobe console script beside {sys.executable}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPROBE_")}
    env["PATH"] = f"{kvprobe.parent}{os.pathsep}{env.get('PATH', '')}"

    def bash(line: str, published: str) -> int:
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=tmp_path,
            env={**env, "PUBLISHED_DIGEST": published},
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.returncode

    assert bash(signed, digest) == 0
    assert bash(digested, digest) == 0
    doc = json.loads((tmp_path / "verify.json").read_text())
    assert doc["outcome"] == "verified"
    assert [a["kind"] for a in doc["anchored_by"]] == ["expect-manifest-sha256"]
    assert bash(digested, "0" * 64) == 1
    assert json.loads((tmp_path / "verify.json").read_text())["outcome"] == "failed"
