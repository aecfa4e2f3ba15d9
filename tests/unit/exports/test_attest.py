"""`kvprobe attest BUNDLE --key KEY`: the bundle's in-toto statement signed into a DSSE
envelope, round-tripped through `kvprobe verify --attestation FILE --key PUB`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from kvprobe.cli import main
from tests import forge


def cli(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


def key_files(directory: Path, kind: str, password: bytes | None = None) -> tuple[Path, Path]:
    """A private key (PKCS#8 PEM, as `openssl genpkey` writes) and its public half."""
    private = {
        "ed25519": lambda: ed25519.Ed25519PrivateKey.generate(),
        "ecdsa": lambda: ec.generate_private_key(ec.SECP256R1()),
        "rsa": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
    }[kind]()
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    key = directory / f"{kind}.key"
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    pub = directory / f"{kind}.pub"
    pub.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return key, pub


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_attest_then_verify_is_verified_by_the_attestation(bundle, tmp_path, kind):
    key, pub = key_files(tmp_path, kind)
    made = cli("attest", bundle, "--key", key, "-o", tmp_path / "att.json")
    assert made.exit_code == 0, made.output
    digest = forge.sha((bundle / "manifest.json").read_bytes())
    assert f"manifest sha256 {digest}" in made.stdout  # with -o, what was signed is the result
    envelope = json.loads((tmp_path / "att.json").read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and len(envelope["signatures"]) == 1
    checked = cli("verify", bundle, "--attestation", tmp_path / "att.json", "--key", pub, "--json", "--require-anchor")
    assert checked.exit_code == 0, checked.output
    doc = json.loads(checked.stdout)
    assert doc["outcome"] == "verified"
    assert [a["kind"] for a in doc["anchored_by"]] == ["attestation"]
    assert doc["attestation"]["manifest_sha256"] == digest


def test_the_envelope_goes_to_stdout_without_o(bundle, tmp_path):
    key, pub = key_files(tmp_path, "ed25519")
    made = cli("attest", bundle, "--key", key)
    assert made.exit_code == 0, made.output
    (tmp_path / "att.json").write_text(made.stdout)
    assert cli("verify", bundle, "--attestation", tmp_path / "att.json", "--key", pub).exit_code == 0


def test_a_bundle_tampered_after_signing_fails(bundle, tmp_path):
    key, pub = key_files(tmp_path, "ecdsa")
    assert cli("attest", bundle, "--key", key, "-o", tmp_path / "att.json").exit_code == 0
    forge.edit_receipt(bundle, lambda r: r["host"].update(system="Linux, edited after signing"))
    result = cli("verify", bundle, "--attestation", tmp_path / "att.json", "--key", pub, "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["outcome"] == "failed" and doc["anchored_by"] == []
    assert "manifest-digest-mismatch" in {d["code"] for s in doc["steps"] for d in s["defects"]}


def test_another_key_fails(bundle, tmp_path):
    key, _ = key_files(tmp_path, "ed25519")
    _, other = key_files(tmp_path, "ecdsa")
    assert cli("attest", bundle, "--key", key, "-o", tmp_path / "att.json").exit_code == 0
    result = cli("verify", bundle, "--attestation", tmp_path / "att.json", "--key", other)
    assert result.exit_code == 1 and "no signature in it verifies" in result.stderr


def test_a_bundle_that_does_not_verify_is_not_signed(bundle, tmp_path):
    key, _ = key_files(tmp_path, "ed25519")
    (bundle / "logs/base/probes/doors.stderr").write_bytes(b"edited, not re-hashed\n")
    result = cli("attest", bundle, "--key", key, "-o", tmp_path / "att.json")
    assert result.exit_code == 1 and "does not verify" in result.stderr
    assert not (tmp_path / "att.json").exists()


def test_an_encrypted_key_needs_its_password(bundle, tmp_path):
    key, pub = key_files(tmp_path, "ecdsa", password=b"hunter2")
    refused = cli("attest", bundle, "--key", key, "-o", tmp_path / "att.json")
    assert refused.exit_code == 2 and "KVPROBE_KEY_PASSWORD" in refused.stderr
    assert not (tmp_path / "att.json").exists()
    made = cli("attest", bundle, "--key", key, "-o", tmp_path / "att.json", env={"KVPROBE_KEY_PASSWORD": "hunter2"})
    assert made.exit_code == 0, made.output
    assert cli("verify", bundle, "--attestation", tmp_path / "att.json", "--key", pub).exit_code == 0


def test_a_public_key_is_not_a_signing_key(bundle, tmp_path):
    _, pub = key_files(tmp_path, "ed25519")
    result = cli("attest", bundle, "--key", pub)
    assert result.exit_code == 2 and "not a PEM private key" in result.stderr and result.stdout == ""


def test_an_existing_output_is_kept_unless_force(bundle, tmp_path):
    key, _ = key_files(tmp_path, "ed25519")
    out = tmp_path / "att.json"
    out.write_text("mine\n")
    assert cli("attest", bundle, "--key", key, "-o", out).exit_code == 2
    assert out.read_text() == "mine\n"
    assert cli("attest", bundle, "--key", key, "-o", out, "--force").exit_code == 0
    assert out.read_text() != "mine\n"


@pytest.mark.parametrize("kind", ["sweep", "gates"])
def test_sweep_and_gates_bundles_round_trip(bundles, tmp_path, kind):
    key, pub = key_files(tmp_path, "ed25519")
    made = cli("attest", bundles[kind], "--key", key, "-o", tmp_path / "att.json")
    assert made.exit_code == 0, made.output
    result = cli("verify", bundles[kind], "--attestation", tmp_path / "att.json", "--key", pub, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outcome"] == "verified"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    from tests.unit.exports.test_export_formats import one_bundle_of_each_kind

    return one_bundle_of_each_kind(tmp_path_factory.mktemp("kinds"))
