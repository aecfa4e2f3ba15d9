"""Resource bounds of the one bundle reader: each cap refuses its document before the
expensive part (parsing, schema, reading a header) and names the document."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.defects import JsonNonFinite, JsonTooLarge
from kvprobe.evidence.archive import scan_archive
from kvprobe.evidence.safetree import Limits
from kvprobe.strict_json import loads, value_bound
from tests import forge

EXP_TOML = f"probes/{forge.EXP_ID}/experiment.toml"


def verify_json(bundle) -> dict:
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    doc["exit"] = result.exit_code
    return doc


def codes(doc: dict) -> set[tuple[str, str]]:
    return {(d["code"], d["path"]) for s in doc["steps"] for d in s["defects"]}


@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"1" + b"0" * 400 + b".0"])
def test_numbers_that_overflow_to_infinity_are_not_json(number):
    with pytest.raises(JsonNonFinite, match="overflows to infinity"):
        loads(b'{"t": ' + number + b"}", "receipt.json")


def test_finite_floats_still_parse():
    assert loads(b'{"t": 1e300, "u": -0.5}', "r.json") == {"t": 1e300, "u": -0.5}


def test_values_are_counted_before_parsing():
    data = b"[" + b",".join([b"[]"] * 1000) + b"]"
    assert value_bound(data) >= 1001
    with pytest.raises(JsonTooLarge, match="more than 500 values"):
        loads(data, "receipt.json", max_values=500)
    assert len(loads(data, "receipt.json", max_values=5000)) == 1000


def _archive_with_header(path, kind: bytes, size: int) -> None:
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = kind, size
    body = info.tobuf(tarfile.USTAR_FORMAT) + b"a" * size + b"\0" * ((-size) % 512) + b"\0" * 1024
    with gzip.open(path, "wb") as gz:
        gz.write(body)


@pytest.mark.parametrize(
    "kind, word",
    [(tarfile.XHDTYPE, "PAX"), (tarfile.GNUTYPE_LONGNAME, "long-name"), (tarfile.GNUTYPE_SPARSE, "sparse")],
)
def test_extended_archive_headers_are_refused_by_their_declared_size(tmp_path, kind, word):
    archive = tmp_path / "h.tar.gz"
    _archive_with_header(archive, kind, 200_000)  # over the 64 KiB allowance
    members, defects = scan_archive(archive, Limits())
    assert members == []
    assert [(d.code, d.path) for d in defects] == [("archive-header-too-large", "h.tar.gz")]
    assert word in defects[0].detail


def test_a_long_member_name_in_a_pax_header_still_reads(tmp_path):
    name = "b/" + "/".join(["d" * 50] * 5) + "/f"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"x\n"))
    archive = tmp_path / "ok.tar.gz"
    archive.write_bytes(gzip.compress(buf.getvalue()))
    members, defects = scan_archive(archive, Limits())
    assert defects == [] and [m.name for m in members] == [name]


def _retoml(bundle, data: bytes) -> None:
    (bundle / EXP_TOML).write_bytes(data)
    forge.edit_receipt(bundle, lambda r: r["experiment"].update(sha256=forge.sha(data)))
    forge.recite(bundle, EXP_TOML)


def test_deep_experiment_toml_is_a_defect_not_a_crash(bundle):
    _retoml(bundle, (bundle / EXP_TOML).read_bytes() + b"\n[deep]\nx = " + b"[" * 5000 + b"]" * 5000 + b"\n")
    doc = verify_json(bundle)
    assert doc["exit"] == 1 and ("toml-malformed", EXP_TOML) in codes(doc)


def test_experiment_toml_has_a_size_cap_of_its_own(bundle):
    _retoml(bundle, (bundle / EXP_TOML).read_bytes() + b"\n# " + b"x" * (1 << 20) + b"\n")
    doc = verify_json(bundle)
    assert doc["exit"] == 1 and ("unreadable", EXP_TOML) in codes(doc)


def test_sha256sums_is_capped_by_the_manifest(bundle):
    manifest_size = (bundle / "manifest.json").stat().st_size
    with open(bundle / "SHA256SUMS", "a") as sums:
        sums.write(("0" * 64 + "  raw/x\n") * (manifest_size // 70 + 1))
    doc = verify_json(bundle)
    assert doc["exit"] == 1 and ("sums-malformed", "SHA256SUMS") in codes(doc)


def test_a_manifest_listing_more_than_max_files_is_refused_before_its_schema(bundle):
    doc = forge.load(bundle, "manifest.json")
    doc["files"] += [{"path": f"raw/x{i:03}", "sha256": "0" * 64, "size": 1} for i in range(50)]
    doc["files"].sort(key=lambda f: f["path"])
    forge.write_manifest_doc(bundle, doc)
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json", "--max-files", "40"], catch_exceptions=False)
    found = codes(json.loads(result.stdout))
    assert result.exit_code == 1 and ("oversized-claim", "manifest.json") in found
    assert not any(code == "missing-file" for code, _ in found)  # refused whole, not entry by entry
