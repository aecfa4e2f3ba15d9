"""What an env build's heartbeat says while the installer runs."""

from __future__ import annotations

from pathlib import Path

from kvprobe.env.venv import _last_action


def test_before_any_output_the_heartbeat_names_the_installer_that_runs(tmp_path: Path):
    assert _last_action(tmp_path / "uv-lock.out", "uv pip install (lock)") == "starting uv pip install (lock)"
    (tmp_path / "empty.out").write_text("\n\n")
    assert _last_action(tmp_path / "empty.out", "pip install (lock)") == "starting pip install (lock)"


def test_the_heartbeat_shows_the_installers_last_line(tmp_path: Path):
    out = tmp_path / "uv-lock.out"
    out.write_text("Resolved 80 packages\nPrepared 3 packages in 2.1s\n" + "x" * 300 + "\n")
    assert _last_action(out, "uv pip install (lock)") == "x" * 100
