"""The env record names the installer that filled the env (uv or pip) and its version; a
receipt without it (written before, or kvprobe's own interpreter) still validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprobe import schema
from kvprobe.model.receipt import EnvRecord, InstallerRecord
from kvprobe.model.records import EnvInfo
from kvprobe.run.session import installer_record
from tests import forge


def info(installer, packages=None) -> EnvInfo:
    build = {} if installer is None else {"installer": installer}
    return EnvInfo("k", Path("/e"), "3.11.7", "l.txt", "0" * 64, packages or {"pip": "25.3"}, build)


@pytest.mark.parametrize(
    "recorded,expected",
    [
        ({"tool": "uv", "version": "uv 0.13.9 (x86_64-unknown-linux-gnu)"}, InstallerRecord("uv", "0.13.9")),
        ({"tool": "uv", "version": "uv (version unknown)"}, InstallerRecord("uv", None)),
        ({"tool": "pip"}, InstallerRecord("pip", "25.3")),
        ({"tool": "pip", "fallback_from_uv": "uv: boom"}, InstallerRecord("pip", "25.3")),
        (None, None),  # an env whose build did not record it: not guessed
    ],
)
def test_the_installer_the_build_recorded(recorded, expected):
    assert installer_record(info(recorded)) == expected


def test_the_env_record_writes_it_and_the_receipt_schema_takes_it_or_its_absence(bundle):
    receipt = forge.load(bundle, "receipt.json")
    assert "installer" not in receipt["env"] and schema.errors(receipt, "kvprobe.receipt/1") == []
    env = EnvRecord.from_json(receipt["env"])
    assert env.installer is None and "installer" not in env.to_json()
    receipt["env"]["installer"] = {"name": "uv", "version": "0.13.9"}
    assert schema.errors(receipt, "kvprobe.receipt/1") == []
    assert EnvRecord.from_json(receipt["env"]).installer == InstallerRecord("uv", "0.13.9")
    receipt["env"]["installer"] = {"name": "conda", "version": "1"}
    assert schema.errors(receipt, "kvprobe.receipt/1") != []
