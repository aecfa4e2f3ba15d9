"""`kvprobe verify` and `kvprobe bundle pack` against forged bundles: one named tamper per case.

Every case asserts the exit code, a defect naming the failure kind and the path, and that
nothing was written anywhere but a private temp dir (the bundle and a canary directory are
unchanged; the temp root is empty afterwards). No subprocess, no network.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import tarfile
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main
from kvprobe.evidence import manifest
from kvprobe.rules import compare
from tests import forge


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A private temp root (must end empty), a canary dir (must stay empty), a valid bundle."""
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_root))
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret.txt").write_bytes(b"outside the bundle\n")
    bundle = forge.build(tmp_path / "bundle")
    return {"tmp": tmp_path, "temp_root": temp_root, "canary": canary, "bundle": bundle}


def verify(env, target: Path, *args: str, code: int) -> dict:
    """Run `kvprobe verify --json`; assert the exit code and that nothing was written."""
    before = forge.snapshot(target) if target.is_dir() else target.read_bytes()
    canary = forge.snapshot(env["canary"])
    result = CliRunner().invoke(main, ["verify", str(target), "--json", *args], catch_exceptions=False)
    assert result.exit_code == code, result.stderr + result.stdout
    assert (forge.snapshot(target) if target.is_dir() else target.read_bytes()) == before, "bundle changed"
    assert forge.snapshot(env["canary"]) == canary, "canary changed"
    assert list(env["temp_root"].iterdir()) == [], "temp dirs left behind"
    doc = json.loads(result.stdout) if result.stdout else {}
    doc["_stderr"] = result.stderr
    return doc


def defects(doc: dict) -> list[dict]:
    return [d for step in doc["steps"] for d in step["defects"]]


def assert_defect(doc: dict, code: str, path: str, step: int | None = None) -> dict:
    """A defect with ``code`` about ``path`` is reported (JSON), and named on stderr."""
    found = [d for d in defects(doc) if d["code"] == code and d["path"] == path]
    assert found, f"no {code} at {path}: {json.dumps(defects(doc), indent=1)}"
    if step is not None:
        assert found[0]["step"] == step
    assert code in doc["_stderr"] and path in doc["_stderr"]
    assert doc["outcome"] == "failed"
    return found[0]


def step_status(doc: dict) -> dict[int, str]:
    return {s["number"]: s["status"] for s in doc["steps"]}


B = "raw/base/probes/doors.json"


# --- the valid bundle --------------------------------------------------------------------


def test_pristine_forge_is_only_self_consistent(env):
    """Nothing outside the bundle vouches for it: not `verified`, and nothing anchors it."""
    doc = verify(env, env["bundle"], code=0)
    assert doc["outcome"] == "self-consistent" and defects(doc) == []
    assert doc["anchored_by"] == []
    assert step_status(doc) == {1: "pass", 2: "pass", 3: "pass", 4: "pass", 5: "self-consistent"}
    assert doc["manifest_sha256"] == forge.sha((env["bundle"] / "manifest.json").read_bytes())


def test_pristine_forge_passes_its_own_sha256sums_format(env):
    sums = (env["bundle"] / "SHA256SUMS").read_text()
    for line in sums.splitlines():
        digest, rel = line.split("  ", 1)
        assert forge.sha((env["bundle"] / rel).read_bytes()) == digest


# --- step 1: layout ----------------------------------------------------------------------


def test_symlink_to_outside(env):
    target = env["bundle"] / "logs/base/probes/doors.stderr"
    target.unlink()
    target.symlink_to(env["canary"] / "secret.txt")
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "symlink", "logs/base/probes/doors.stderr", step=1)
    assert_defect(doc, "not-regular", "logs/base/probes/doors.stderr", step=3)
    assert "outside the bundle" not in doc["_stderr"]


def test_symlinked_directory_is_not_entered(env):
    (env["bundle"] / "logs/evil").symlink_to(env["canary"], target_is_directory=True)
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "symlink", "logs/evil")
    assert not any(d["path"].startswith("logs/evil/") for d in defects(doc))


def test_symlink_inside(env):
    readme = env["bundle"] / "README.md"
    readme.unlink()
    readme.symlink_to("receipt.json")
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "symlink", "README.md", step=1)
    assert_defect(doc, "not-regular", "README.md")


def test_fifo_is_never_opened(env):
    path = env["bundle"] / "logs/base/probes/doors.stdout"
    path.unlink()
    os.mkfifo(path)
    signal.alarm(20)  # opening the FIFO for reading would block forever
    try:
        doc = verify(env, env["bundle"], code=1)
    finally:
        signal.alarm(0)
    assert_defect(doc, "special-file", "logs/base/probes/doors.stdout", step=1)
    assert_defect(doc, "not-regular", "logs/base/probes/doors.stdout")


def test_case_collision(env):
    (env["bundle"] / "readme.md").write_bytes(b"shadow\n")
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "name-collision", "readme.md", step=1)
    assert_defect(doc, "unlisted-file", "readme.md")


def test_unicode_normalisation_collision(env):
    (env["bundle"] / "logs/caf\u00e9").write_bytes(b"a")
    (env["bundle"] / "logs/cafe\u0301").write_bytes(b"b")
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "bad-name", "logs/cafe\u0301")
    assert any(d["code"] == "name-collision" for d in defects(doc))


def test_non_utf8_name(env):
    os.close(os.open(os.fsencode(env["bundle"] / "logs") + b"/\xff.log", os.O_CREAT | os.O_WRONLY, 0o644))
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "bad-name", "logs/\\xff.log", step=1)


def test_missing_receipt(env):
    (env["bundle"] / "receipt.json").unlink()
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "missing-required", "receipt.json", step=1)
    assert step_status(doc)[2] == "skipped"


def test_too_many_files_and_raising_the_cap(env):
    doc = verify(env, env["bundle"], "--max-files", "5", code=1)
    assert any(d["code"] == "too-many-files" for d in defects(doc))
    verify(env, env["bundle"], "--max-files", "100", code=0)


def test_file_over_size_cap(env):
    doc = verify(env, env["bundle"], "--max-file-bytes", "2000", code=1)
    big = max(forge.load(env["bundle"], "manifest.json")["files"], key=lambda f: f["size"])
    assert_defect(doc, "file-too-large", big["path"], step=1)


def test_bundle_over_total_cap(env):
    doc = verify(env, env["bundle"], "--max-bytes", "5000", code=1)
    assert any(d["code"] == "bundle-too-large" for d in defects(doc))


# --- step 2: documents -------------------------------------------------------------------


def test_duplicate_key(env):
    path = env["bundle"] / "receipt.json"
    path.write_bytes(
        path.read_bytes().replace(
            b'"verdict": "reproduced"\n}', b'"verdict": "reproduced",\n  "verdict": "reproduced"\n}'
        )
    )
    forge.rehash(env["bundle"])
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "json-duplicate-key", "receipt.json", step=2)


def test_nan_in_raw_output(env):
    forge.replace_cited(env["bundle"], B, b'"duration_s": 0.01', b'"duration_s": NaN')
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "json-non-finite", B, step=2)


def test_unknown_schema_version(env):
    forge.edit_receipt(env["bundle"], lambda r: r.update(schema="kvprobe.receipt/9"))
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "schema-unknown-version", "receipt.json", step=2)
    assert "upgrade kvprobe" in defect["detail"]


def test_schema_violation(env):
    forge.edit_receipt(env["bundle"], lambda r: r.update(verdict="definitely-fine"))
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "schema-violation", "receipt.json", step=2)
    assert "verdict" in defect["detail"]


def test_json_nested_too_deep(env):
    forge.edit_receipt(env["bundle"], lambda r: r["host"].update(deep=json.loads("[" * 100 + "]" * 100)))
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "json-too-deep", "receipt.json", step=2)


def test_invalid_utf8_json(env):
    path = env["bundle"] / "receipt.json"
    path.write_bytes(path.read_bytes().replace(b"A forged but valid", b"A forged \xff\xfe valid", 1))
    forge.rehash(env["bundle"])
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "json-not-utf8", "receipt.json", step=2)


# --- step 3: integrity -------------------------------------------------------------------


def test_byte_flipped(env):
    path = env["bundle"] / B
    data = bytearray(path.read_bytes())
    data[10] ^= 0x01
    path.write_bytes(bytes(data))
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "digest-mismatch", B, step=3)


def test_truncated_file(env):
    path = env["bundle"] / B
    path.write_bytes(path.read_bytes()[:-20])
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "size-mismatch", B, step=3)
    assert "not hashed" in defect["detail"]


def test_missing_file(env):
    (env["bundle"] / "logs/base/probes/doors.stderr").unlink()
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "missing-file", "logs/base/probes/doors.stderr", step=3)


def test_extra_file(env):
    (env["bundle"] / "raw/base/probes/extra.json").write_bytes(b"{}\n")
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "unlisted-file", "raw/base/probes/extra.json", step=3)


def test_sums_and_manifest_disagree(env):
    sums = env["bundle"] / "SHA256SUMS"
    text = sums.read_text()
    old = forge.sha((env["bundle"] / "README.md").read_bytes())
    sums.write_text(text.replace(old, "0" * 64))
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "sums-mismatch", "README.md", step=3)


def test_malformed_sums_line(env):
    sums = env["bundle"] / "SHA256SUMS"
    sums.write_text(sums.read_text() + "not a checksum line\n")
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "sums-malformed", "SHA256SUMS", step=3)
    assert "line" in defect["detail"]


def test_uppercase_hex(env):
    sums = env["bundle"] / "SHA256SUMS"
    lines = sums.read_text().splitlines(keepends=True)
    lines[0] = lines[0][:64].upper() + lines[0][64:]
    sums.write_text("".join(lines))
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "sums-uppercase-hex", "SHA256SUMS", step=3)


def test_crlf_line_endings(env):
    sums = env["bundle"] / "SHA256SUMS"
    sums.write_bytes(sums.read_bytes().replace(b"\n", b"\r\n"))
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "sums-crlf", "SHA256SUMS", step=3)


def test_bsd_style_line(env):
    sums = env["bundle"] / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    digest, rel = lines[0].split("  ", 1)
    lines[0] = f"SHA256 ({rel}) = {digest}"
    sums.write_text("\n".join(lines) + "\n")
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "sums-bsd-style", "SHA256SUMS", step=3)
    assert_defect(doc, "sums-mismatch", rel)


def test_dotdot_entry_in_sums(env):
    sums = env["bundle"] / "SHA256SUMS"
    sums.write_text(sums.read_text() + f"{'0' * 64}  ../canary/secret.txt\n")
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "unsafe-path", "SHA256SUMS", step=3)
    assert "../canary/secret.txt" in defect["detail"] and "traversal" in defect["detail"]


def test_oversized_file_claim(env):
    doc_ = forge.load(env["bundle"], "manifest.json")
    entry = next(f for f in doc_["files"] if f["path"] == "README.md")
    entry["size"] = 10**13
    forge.write_manifest_doc(env["bundle"], doc_)
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "oversized-claim", "README.md", step=3)
    assert "not read" in defect["detail"]


def test_manifest_not_canonical(env):
    path = env["bundle"] / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=4, sort_keys=True) + "\n")
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "manifest-not-canonical", "manifest.json", step=3)


# --- step 4: consistency -----------------------------------------------------------------


def test_forged_verdict_with_consistent_hashes(env):
    def forge_verdict(receipt):
        receipt["verdict"] = receipt["comparison"]["verdict"] = "not-reproduced"

    forge.edit_receipt(env["bundle"], forge_verdict)
    doc = verify(env, env["bundle"], code=1)
    assert step_status(doc)[3] == "pass"
    defect = assert_defect(doc, "forged-verdict", "receipt.json", step=4)
    assert "'reproduced'" in defect["detail"]


def test_forged_observation_with_consistent_hashes(env):
    path = env["bundle"] / "raw/head/probes/doors.json"
    raw = forge.load(env["bundle"], "raw/head/probes/doors.json")
    raw["cases"][0]["observations"]["enqueued"] = True  # the bug persists on head
    path.write_bytes(forge.dumps(raw))
    forge.recite(env["bundle"], "raw/head/probes/doors.json")
    doc = verify(env, env["bundle"], code=1)
    assert step_status(doc)[3] == "pass"
    assert_defect(doc, "forged-verdict", "receipt.json", step=4)
    assert_defect(doc, "comparison-mismatch", "receipt.json", step=4)


def test_forged_comparison_row(env):
    def change(receipt):
        row = next(r for r in receipt["comparison"]["observations"] if r["observation"] == "placeholder_len")
        row["head"] = 2

    forge.edit_receipt(env["bundle"], change)
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "comparison-mismatch", "receipt.json", step=4)
    assert "placeholder_len" in json.dumps(doc["steps"][3]) and "recomputed 1" in defect["detail"]


def test_receipt_cites_raw_not_in_manifest(env):
    doc_ = forge.load(env["bundle"], "manifest.json")
    doc_["files"] = [f for f in doc_["files"] if f["path"] != B]
    forge.write_manifest_doc(env["bundle"], doc_)
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "citation-not-in-manifest", B, step=4)
    assert_defect(doc, "unlisted-file", B, step=3)


@pytest.mark.parametrize("key", ["configuration", "absorbed"])
def test_probe_records_hidden_from_the_receipt_are_named(env, key):
    forge.edit_receipt(env["bundle"], lambda r: r["evidence"][key]["head"].update({forge.PROBE: []}))
    defect = assert_defect(verify(env, env["bundle"], code=1), "record-mismatch", "receipt.json", step=4)
    assert f"evidence.{key}.head" in defect["detail"]


def test_a_receipt_of_this_comparison_without_probe_records_is_refused(env):
    forge.edit_receipt(env["bundle"], lambda r: r["evidence"].pop("absorbed"))
    defect = assert_defect(verify(env, env["bundle"], code=1), "record-mismatch", "receipt.json", step=4)
    assert "evidence.absorbed is missing" in defect["detail"]


def test_a_receipt_of_an_earlier_comparison_without_probe_records_verifies(env, tmp_path):
    bundle = forge.build(tmp_path / "compare-3", algorithm="kvprobe.compare/3")
    forge.edit_receipt(bundle, lambda r: [r["evidence"].pop(k) for k in ("configuration", "absorbed")])
    verify(env, bundle, code=0)


def test_citation_digest_mismatch(env):
    forge.edit_receipt(env["bundle"], lambda r: r["sides"]["base"]["probes"][0]["source"].update(sha256="a" * 64))
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "citation-digest-mismatch", f"probes/{forge.EXP_ID}/doors.py", step=4)


def test_expectations_differ_from_bundled_experiment(env):
    rel = f"probes/{forge.EXP_ID}/experiment.toml"
    forge.replace_cited(env["bundle"], rel, b"enqueued = false", b"enqueued = true")
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "expectations-mismatch", rel, step=4)


def test_experiment_digest_mismatch(env):
    rel = f"probes/{forge.EXP_ID}/experiment.toml"
    path = env["bundle"] / rel
    path.write_bytes(path.read_bytes() + b"# edited\n")
    forge.rehash(env["bundle"])
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "experiment-digest-mismatch", rel, step=4)
    assert_defect(doc, "citation-digest-mismatch", rel, step=4)


def test_malformed_pin(env):
    forge.edit_receipt(env["bundle"], lambda r: r["sides"]["base"]["pin"].update(commit="main"))
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "bad-pin", "receipt.json", step=4)
    assert "sides.base.pin" in defect["detail"]


def test_pin_not_the_experiments(env):
    def swap(receipt):
        for side in ("base", "head"):
            receipt["sides"][side]["pin"]["commit"] = receipt["sides"][side]["source"]["commit"] = "4" * 40

    forge.edit_receipt(env["bundle"], swap)
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "pin-mismatch", f"probes/{forge.EXP_ID}/experiment.toml", step=4)


def test_run_id_names_another_experiment(env):
    forge.edit_receipt(env["bundle"], lambda r: r.update(run_id="other-exp-commits-20260101T000000Z-abc123"))
    doc = verify(env, env["bundle"], code=1)
    assert_defect(doc, "run-id-mismatch", "receipt.json", step=4)


def test_raw_output_of_the_other_side(env):
    base, head = env["bundle"] / B, env["bundle"] / "raw/head/tests/test__unit__test_doors.py.json"
    data = forge.load(env["bundle"], "raw/head/tests/test__unit__test_doors.py.json")
    data["side"] = "base"
    head.write_bytes(forge.dumps(data))
    forge.recite(env["bundle"], "raw/head/tests/test__unit__test_doors.py.json")
    doc = verify(env, env["bundle"], code=1)
    assert base.exists()
    assert_defect(doc, "raw-invalid", "raw/head/tests/test__unit__test_doors.py.json", step=4)


# --- step 5: authenticity ----------------------------------------------------------------


def test_expected_manifest_digest_matches(env):
    digest = forge.sha((env["bundle"] / "manifest.json").read_bytes())
    doc = verify(env, env["bundle"], "--expect-manifest-sha256", digest, code=0)
    assert step_status(doc)[5] == "pass"
    assert doc["outcome"] == "verified"
    assert [a["kind"] for a in doc["anchored_by"]] == ["expect-manifest-sha256"]


def test_require_anchor_fails_a_self_consistent_bundle(env):
    doc = verify(env, env["bundle"], "--require-anchor", code=1)
    assert doc["outcome"] == "self-consistent" and defects(doc) == []
    assert "--require-anchor" in doc["_stderr"]
    digest = forge.sha((env["bundle"] / "manifest.json").read_bytes())
    anchored = verify(env, env["bundle"], "--require-anchor", "--expect-manifest-sha256", digest, code=0)
    assert anchored["outcome"] == "verified"


def test_the_result_lines_say_what_anchored_it(env):
    plain = CliRunner().invoke(main, ["verify", str(env["bundle"])], catch_exceptions=False)
    assert plain.exit_code == 0
    assert "result: self-consistent" in plain.stdout and "result: verified" not in plain.stdout
    assert "anchored by: nothing" in plain.stdout
    digest = forge.sha((env["bundle"] / "manifest.json").read_bytes())
    pinned = CliRunner().invoke(
        main, ["verify", str(env["bundle"]), "--expect-manifest-sha256", digest], catch_exceptions=False
    )
    assert "result: verified" in pinned.stdout
    assert "anchored by: expect-manifest-sha256" in pinned.stdout


def test_expected_manifest_digest_mismatch(env):
    doc = verify(env, env["bundle"], "--expect-manifest-sha256", "f" * 64, code=1)
    assert step_status(doc)[3] == "pass" and step_status(doc)[5] == "fail"
    assert_defect(doc, "manifest-digest-mismatch", "manifest.json", step=5)


def test_bad_expected_digest_is_usage_error(env):
    result = CliRunner().invoke(
        main, ["verify", str(env["bundle"]), "--expect-manifest-sha256", "abc"], catch_exceptions=False
    )
    assert result.exit_code == 2 and "64-hex" in result.stderr


# --- not a bundle ------------------------------------------------------------------------


def test_not_a_bundle(env):
    empty = env["tmp"] / "empty"
    empty.mkdir()
    for target in (empty, env["tmp"] / "nonexistent", env["canary"] / "secret.txt"):
        result = CliRunner().invoke(main, ["verify", str(target)], catch_exceptions=False)
        assert result.exit_code == 2 and "not a bundle" in result.stderr


def test_corrupt_archive_is_not_a_bundle(env):
    bad = env["tmp"] / "bad.tar.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00 definitely not gzip")
    result = CliRunner().invoke(main, ["verify", str(bad)], catch_exceptions=False)
    assert result.exit_code == 2 and "not a readable .tar.gz" in result.stderr
    assert list(env["temp_root"].iterdir()) == []


# --- archives ----------------------------------------------------------------------------


def pack(env, bundle: Path, out: Path, code: int = 0):
    result = CliRunner().invoke(main, ["bundle", "pack", str(bundle), "-o", str(out), "--json"], catch_exceptions=False)
    assert result.exit_code == code, result.stderr
    return json.loads(result.stdout) if code == 0 else result


def test_pack_is_deterministic_and_verifies(env):
    first = pack(env, env["bundle"], env["tmp"] / "one.tar.gz")
    moved = forge.copy(env["bundle"], env["tmp"] / "elsewhere")
    os.utime(moved / "README.md", (1, 1))
    second = pack(env, moved, env["tmp"] / "two.tar.gz")
    one, two = (env["tmp"] / "one.tar.gz").read_bytes(), (env["tmp"] / "two.tar.gz").read_bytes()
    assert one == two and first["sha256"] == second["sha256"] == forge.sha(one)
    assert one[4:8] == b"\0\0\0\0" and not one[3] & 0x08  # gzip mtime 0, no file name
    with tarfile.open(env["tmp"] / "one.tar.gz") as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    assert all(i.mtime == 0 and i.uid == 0 and i.gid == 0 and i.uname == "" and i.gname == "" for i in infos)
    assert {i.mode for i in infos} == {0o755, 0o644}
    doc = verify(env, env["tmp"] / "one.tar.gz", code=0)
    assert doc["manifest_sha256"] == first["manifest_sha256"]


def test_pack_refuses_a_bundle_that_does_not_verify(env):
    (env["bundle"] / "README.md").write_bytes(b"changed\n")
    result = pack(env, env["bundle"], env["tmp"] / "x.tar.gz", code=2)
    assert "does not verify" in result.stderr and "size-mismatch: README.md" in result.stderr
    assert not (env["tmp"] / "x.tar.gz").exists()


def test_tampered_archive_fails_like_the_directory(env):
    (env["bundle"] / "README.md").write_bytes(b"changed!!\n"[: len((env["bundle"] / "README.md").read_bytes())])
    archive = forge.tar_of(env["bundle"], env["tmp"] / "t.tar.gz")
    doc = verify(env, archive, code=1)
    assert any(d["code"] in ("digest-mismatch", "size-mismatch") and d["path"] == "README.md" for d in defects(doc))


@pytest.mark.parametrize(
    "name, kind, link, code",
    [
        ("b/logs/evil", tarfile.SYMTYPE, "/etc/passwd", "archive-link-member"),
        ("b/logs/hard", tarfile.LNKTYPE, "b/receipt.json", "archive-link-member"),
        ("b/../../canary/pwned", tarfile.REGTYPE, "", "archive-traversal"),
        ("/tmp/kvprobe-absolute-pwned", tarfile.REGTYPE, "", "archive-traversal"),
        ("b/logs/null", tarfile.CHRTYPE, "", "archive-special-member"),
        ("b/logs/pipe", tarfile.FIFOTYPE, "", "archive-special-member"),
    ],
    ids=["symlink-member", "hardlink-member", "dotdot-member", "absolute-member", "device-member", "fifo-member"],
)
def test_hostile_archive_member(env, name, kind, link, code):
    data = b"pwned\n" if kind == tarfile.REGTYPE else None
    archive = forge.tar_of(env["bundle"], env["tmp"] / "h.tar.gz", [forge.member(name, kind, data, link)])
    doc = verify(env, archive, code=1)
    assert_defect(doc, code, name, step=1)
    assert step_status(doc)[2] == "skipped"  # nothing extracted, nothing else read
    assert not Path("/tmp/kvprobe-absolute-pwned").exists()
    assert not (env["tmp"] / "pwned").exists()


def test_archive_duplicate_member(env):
    archive = forge.tar_of(
        env["bundle"], env["tmp"] / "d.tar.gz", [forge.member("b/README.md", tarfile.REGTYPE, b"second copy\n")]
    )
    doc = verify(env, archive, code=1)
    assert_defect(doc, "archive-duplicate-member", "b/README.md", step=1)


def test_archive_case_collision(env):
    archive = forge.tar_of(
        env["bundle"], env["tmp"] / "c.tar.gz", [forge.member("b/readme.md", tarfile.REGTYPE, b"shadow\n")]
    )
    doc = verify(env, archive, code=1)
    assert_defect(doc, "name-collision", "b/readme.md", step=1)


def test_archive_gzip_bomb_is_capped(env):
    archive = env["tmp"] / "bomb.tar.gz"
    with gzip.open(archive, "wb") as gz:
        info, _ = forge.member("b/receipt.json", tarfile.REGTYPE, b"")
        info.size = 50_000
        gz.write(info.tobuf(tarfile.PAX_FORMAT) + b"\0" * 50_000 + b"\0" * 1024)
    doc = verify(env, archive, "--max-bytes", "10000", "--max-files", "1", code=1)
    assert any(d["code"] in ("bundle-too-large", "file-too-large") for d in defects(doc))


# --- step 6: rerun (the runner replaced; no subprocess here) -----------------------------


def _verify_rerun(env, monkeypatch, *, code, **fake):
    """``verify --rerun --trust-bundle-code`` of the env's bundle, the run replaced by ``_fake_run(**fake)``."""
    BUNDLE_UNDER_TEST[:] = [env["bundle"]]
    monkeypatch.setattr("kvprobe.run.runner.run_experiment", _fake_run(**fake))
    return verify(env, env["bundle"], "--rerun", "--trust-bundle-code", code=code)


def _fake_run(receipt_change=None, error=None):
    from kvprobe.model.receipt import Receipt
    from kvprobe.run.workspace import SealedBundle

    def run_experiment(exp, opts, reporter=None):
        assert exp.id == forge.EXP_ID and opts.pin_set == forge.PIN_SET
        assert exp.directory != Path(forge.EXP_ID)  # loaded from a private copy of the bundle
        if error:
            raise error
        receipt = forge.load(BUNDLE_UNDER_TEST[0], "receipt.json")
        if receipt_change:
            receipt_change(receipt)
        return SealedBundle(opts.out, Receipt.from_json(receipt), "0" * 64)

    return run_experiment


BUNDLE_UNDER_TEST: list[Path] = []


def test_rerun_that_reproduces(env, monkeypatch):
    doc = _verify_rerun(env, monkeypatch, code=0)
    assert step_status(doc)[6] == "pass"
    assert doc["outcome"] == "verified" and [a["kind"] for a in doc["anchored_by"]] == ["rerun"]


def test_rerun_that_differs_reports_each_difference(env, monkeypatch):
    def change(receipt):
        row = next(r for r in receipt["comparison"]["observations"] if r["observation"] == "enqueued")
        row["head"] = True
        receipt["verdict"] = "not-reproduced"

    doc = _verify_rerun(env, monkeypatch, code=1, receipt_change=change)
    defect = assert_defect(doc, "rerun-differs", "raw/head/probes/doors.json", step=6)
    assert "enqueued" in defect["detail"] and "published bool:False, rerun bool:True" in defect["detail"]
    assert_defect(doc, "rerun-differs", "receipt.json")


def test_rerun_where_a_case_no_longer_reaches_its_decision_point_is_named(env, monkeypatch):
    def change(receipt):
        case = receipt["comparison"]["cases"]["base"][f"{forge.PROBE}/reject"]
        case.update(observation="unobserved", reason="constructor changed")
        receipt["verdict"] = "could-not-observe"

    doc = _verify_rerun(env, monkeypatch, code=1, receipt_change=change)
    defect = assert_defect(doc, "rerun-differs", "raw/base/probes/doors.json", step=6)
    assert "'observed'), rerun ('ok', None, 'unobserved')" in defect["detail"]


def test_rerun_names_the_probe_that_could_not_run(env, monkeypatch):
    def change(receipt):
        probe = receipt["sides"]["head"]["probes"][0]
        probe["problem"] = "probe doors exited 1 without output: ModuleNotFoundError: No module named 'helper'"
        receipt["verdict"] = "error"

    doc = _verify_rerun(env, monkeypatch, code=1, receipt_change=change)
    defect = assert_defect(doc, "rerun-differs", "raw/head/probes/doors.json", step=6)
    assert "could not run it" in defect["detail"] and "No module named 'helper'" in defect["detail"]


def test_rerun_that_cannot_observe_exits_3(env, monkeypatch):
    from kvprobe.errors import FetchError

    doc = _verify_rerun(env, monkeypatch, code=3, error=FetchError("network unreachable"))
    assert doc["outcome"] == "could-not-rerun" and step_status(doc)[6] == "could-not-run"


def test_rerun_is_skipped_for_a_bundle_that_does_not_verify(env, monkeypatch):
    monkeypatch.setattr("kvprobe.run.runner.run_experiment", _fake_run(error=AssertionError("must not run")))
    (env["bundle"] / "README.md").write_bytes(b"x")
    doc = verify(env, env["bundle"], "--rerun", "--trust-bundle-code", code=1)
    assert step_status(doc)[6] == "skipped"


def test_manifest_module_digest_is_the_bundle_digest(env):
    assert (
        manifest.sha256_bytes((env["bundle"] / "manifest.json").read_bytes())
        == verify(env, env["bundle"], code=0)["manifest_sha256"]
    )


def test_bundle_from_another_comparison_algorithm_is_named_not_called_forged(env, tmp_path):
    from kvprobe.evidence import manifest

    bundle = forge.copy(env["bundle"], tmp_path / "other-algorithm")
    receipt = forge.load(bundle, "receipt.json")
    receipt["comparison"]["algorithm"] = "kvprobe.compare/99"
    (bundle / "receipt.json").write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    manifest.write(bundle)
    doc = verify(env, bundle, code=1)
    defect = assert_defect(doc, "comparison-algorithm-unknown", "receipt.json", step=4)
    assert "kvprobe.compare/99" in defect["detail"] and compare.ALGORITHM in defect["detail"]
    assert not any(d["code"] in ("forged-verdict", "comparison-mismatch") for d in defects(doc))


@pytest.mark.parametrize("algorithm", sorted(compare.PREDECESSORS))
def test_bundle_from_a_predecessor_comparison_verifies_where_its_output_is_the_same(env, tmp_path, algorithm):
    bundle = forge.build(tmp_path / "older", algorithm=algorithm)
    comparison = forge.load(bundle, "receipt.json")["comparison"]
    assert ("error_to_pass" in comparison["counts"]) == (algorithm >= "kvprobe.compare/3")  # compare/2's block
    assert "flips_expected" not in comparison["counts"]  # compare/5 counts flips and controls apart
    reached = "observation" in comparison["cases"]["base"][f"{forge.PROBE}/reject"]
    assert reached == (algorithm >= "kvprobe.compare/4")  # decision points from compare/4
    verify(env, bundle, code=0)


def test_a_current_bundle_relabelled_as_a_predecessor_is_named(env, tmp_path):
    bundle = forge.copy(env["bundle"], tmp_path / "relabelled")
    forge.edit_receipt(bundle, lambda r: r["comparison"].update(algorithm="kvprobe.compare/2"))
    doc = verify(env, bundle, code=1)
    assert_defect(doc, "comparison-algorithm-unknown", "receipt.json", step=4)


def test_bundle_from_a_predecessor_comparison_that_differs_is_named_not_called_forged(env, tmp_path):
    bundle = forge.build(tmp_path / "compare-1-differs", algorithm="kvprobe.compare/1")

    def older(receipt):
        receipt["comparison"]["algorithm"] = "kvprobe.compare/1"
        receipt["comparison"]["test_summary"][forge.TEST_PATH]["base"]["failure_kinds"]["infrastructure"] = 1

    forge.edit_receipt(bundle, older)
    doc = verify(env, bundle, code=1)
    defect = assert_defect(doc, "comparison-algorithm-unknown", "receipt.json", step=4)
    assert "subtests" in defect["detail"] and "failure_kinds" in defect["detail"]
    assert not any(d["code"] in ("forged-verdict", "comparison-mismatch") for d in defects(doc))


# --- run --repeat: stability is recomputed from every bundled repeat ----------------------


def _repeated(env, flip_head_run: int | None = None) -> dict:
    """The forge's bundle as ``run --repeat 3`` writes it; ``flip_head_run``: that head run saw
    the bug (the case is unstable)."""
    again = {side: [forge.probe_doc(side), forge.probe_doc(side)] for side in ("base", "head")}
    if flip_head_run is not None:
        again["head"][flip_head_run - 2]["cases"][0]["observations"]["enqueued"] = True
    forge.add_repeats(env["bundle"], again)
    return forge.load(env["bundle"], "receipt.json")


def test_stable_repeats_verify_and_keep_the_verdict(env):
    receipt = _repeated(env)
    assert receipt["verdict"] == "reproduced" and receipt["repeats"] == 3
    doc = verify(env, env["bundle"], code=0)
    assert defects(doc) == []


def test_unstable_repeats_verify_as_could_not_observe(env):
    receipt = _repeated(env, flip_head_run=3)
    assert receipt["verdict"] == "could-not-observe"
    assert receipt["comparison"]["reasons"] == [
        "head: doors/reject: unstable across repeats: observation 'enqueued' was False in run 1, True in run 3"
    ]
    assert defects(verify(env, env["bundle"], code=0)) == []


def test_a_receipt_that_claims_stable_when_the_repeats_differ_is_refused(env):
    _repeated(env, flip_head_run=2)

    def claim_stable(receipt):
        receipt["comparison"]["unstable"]["head"] = {}
        receipt["comparison"]["reasons"] = []
        receipt["comparison"]["counts"]["unstable_cases"] = 0
        for row in receipt["comparison"]["observations"]:
            if row.pop("unstable", False):
                row["base_ok"] = row["head_ok"] = True
        receipt["verdict"] = receipt["comparison"]["verdict"] = "reproduced"

    forge.edit_receipt(env["bundle"], claim_stable)
    doc = verify(env, env["bundle"], code=1)
    defect = assert_defect(doc, "forged-verdict", "receipt.json", step=4)
    assert "'could-not-observe'" in defect["detail"]


@pytest.mark.parametrize("drop", ["a-repeat", "the-count"])
def test_a_receipt_that_drops_a_repeat_is_refused(env, drop):
    _repeated(env, flip_head_run=3)

    def dropped(receipt):
        if drop == "a-repeat":  # the run that differed is no longer cited: it would look stable
            receipt["sides"]["head"]["probes"][0]["repeats"].pop()
        else:
            receipt["repeats"] = 2

    forge.edit_receipt(env["bundle"], dropped)
    doc = verify(env, env["bundle"], code=1)
    found = [d for d in defects(doc) if d["code"] == "record-mismatch" and "run(s)" in d["detail"]]
    assert found, json.dumps(defects(doc), indent=1)
