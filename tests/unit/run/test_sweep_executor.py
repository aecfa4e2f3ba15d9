"""`kvprobe sweep --executor ray` refuses clearly, before any work, when it cannot run."""

from __future__ import annotations

import sys

from click.testing import CliRunner

from kvprobe.cli import main


def test_executor_ray_without_ray_installed_is_a_one_line_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ModuleNotFoundError
    result = CliRunner().invoke(main, ["sweep", "experiment-a", "--executor", "ray", "--address", "127.0.0.1:1"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "pip install 'kvprobe[ray]'" in lines[0]


def test_executor_ray_needs_an_address():
    result = CliRunner().invoke(main, ["sweep", "experiment-a", "--executor", "ray"])
    assert result.exit_code == 2
    assert "--address HOST:PORT" in result.stderr
