"""`kvprobe run experiment-c experiment-d` on the real SGLang wheels: two experiments of the
sglang-cpu profile in one invocation, one env and one preloaded fork server (issue #23)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.network]


def test_c_and_d_reproduce_in_one_invocation_through_one_preloaded_server(tmp_path, monkeypatch):
    import kvprobe.run.session as session_mod
    from kvprobe.checks.forkserver import ForkServer

    started: list[ForkServer] = []

    class Recorded(ForkServer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(session_mod, "ForkServer", Recorded)
    out = tmp_path / "cd"
    args = ["run", "experiment-c", "experiment-d", "--out", str(out), "--json"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    document = json.loads(result.stdout)
    assert result.exit_code == 0, [r.get("reasons", r.get("error")) for r in document["runs"]]
    assert [(r["experiment"], r["verdict"]) for r in document["runs"]] == [
        ("experiment-c", "reproduced"),
        ("experiment-d", "reproduced"),
    ]
    assert len(started) == 1
    receipts = [json.loads((out / name / "receipt.json").read_text()) for name in ("experiment-c", "experiment-d")]
    assert receipts[0]["execution"]["shared"] == receipts[1]["execution"]["shared"]
    assert receipts[0]["execution"]["shared"]["experiments"] == ["experiment-c", "experiment-d"]
    for receipt in receipts:
        assert {c["mode"] for c in receipt["execution"]["checks"]} == {"forked"}
        assert "torch" in receipt["execution"]["preloaded"]
    assert receipts[0]["env"]["key"] == receipts[1]["env"]["key"]
    for run in document["runs"]:
        verified = CliRunner().invoke(
            main, ["verify", run["bundle"], "--expect-manifest-sha256", run["manifest_sha256"]]
        )
        assert verified.exit_code == 0, verified.stdout
