"""What an env build's heartbeat says while the installer runs."""

from __future__ import annotations

from pathlib import Path

from kvprobe.env.venv import _last_action, uv_summary


def test_before_any_output_the_heartbeat_names_the_installer_that_runs(tmp_path: Path):
    assert _last_action(tmp_path / "uv-lock.out", "uv pip install (lock)") == "starting uv pip install (lock)"
    (tmp_path / "empty.out").write_text("\n\n")
    assert _last_action(tmp_path / "empty.out", "pip install (lock)") == "starting pip install (lock)"


def test_the_heartbeat_shows_the_installers_last_line(tmp_path: Path):
    out = tmp_path / "uv-lock.out"
    out.write_text("Resolved 80 packages\nPrepared 3 packages in 2.1s\n" + "x" * 300 + "\n")
    assert _last_action(out, "uv pip install (lock)") == "x" * 100


def test_a_finished_uv_install_is_summed_up_by_its_own_phase_times(tmp_path: Path):
    err = tmp_path / "uv-lock.err"
    err.write_text(
        "Using Python 3.11.7 environment at: env\n"
        "Resolved 119 packages in 1.02s\n"
        "Downloading torch (858.1MiB)\n"
        "Prepared 119 packages in 1m 02s\n"
        "Installed 119 packages in 830ms\n"
        "Bytecode compiled 13478 files in 31.20s\n"
        " + torch==2.14.1\n"
    )
    assert uv_summary(err) == (
        "Resolved 119 packages in 1.02s; Prepared 119 packages in 1m 02s; "
        "Installed 119 packages in 830ms; Bytecode compiled 13478 files in 31.20s"
    )
    assert uv_summary(tmp_path / "absent.err") == "uv said nothing of its phases"
