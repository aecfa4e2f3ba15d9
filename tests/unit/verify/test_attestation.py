"""`kvprobe verify --attestation FILE --key PUB`: a DSSE-signed in-toto statement of the bundle,
checked offline with a key pair the test makes (securesystemslib signs, as any DSSE signer)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from kvprobe.cli import main
from tests import forge


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def key_pair(directory: Path, name: str) -> tuple[CryptoSigner, Path]:
    """An ECDSA P-256 key (cosign's kind); the public half as PEM, like cosign.pub."""
    private = ec.generate_private_key(ec.SECP256R1())
    public = directory / f"{name}.pub"
    public.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return CryptoSigner(private), public


def sign(statement: bytes, signer: CryptoSigner, out: Path, *, cosign_keyid: bool = True) -> Path:
    envelope = Envelope(statement, "application/vnd.in-toto+json", {})
    envelope.sign(signer)
    doc = envelope.to_dict()
    if cosign_keyid:
        doc["signatures"][0]["keyid"] = ""  # what cosign writes
    out.write_text(json.dumps(doc))
    return out


@pytest.fixture
def signed(tmp_path):
    bundle = forge.build(tmp_path / "bundle")
    result = cli("report", bundle, "--format", "intoto")
    assert result.exit_code == 0, result.output
    signer, public = key_pair(tmp_path, "cosign")
    return bundle, result.stdout.encode(), signer, public, sign(result.stdout.encode(), signer, tmp_path / "att.json")


def test_a_signed_statement_of_the_bundle_verifies(signed):
    bundle, _, _, public, envelope = signed
    result = cli("verify", bundle, "--attestation", envelope, "--key", public, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["outcome"] == "verified"
    assert [a["kind"] for a in doc["anchored_by"]] == ["attestation"]
    assert doc["attestation"]["manifest_sha256"] == forge.sha((bundle / "manifest.json").read_bytes())
    assert "attestation: signature verified" in result.stderr


def test_a_sigstore_bundle_wrapping_the_envelope_verifies(signed, tmp_path):
    bundle, _, _, public, envelope = signed
    wrapped = tmp_path / "att.sigstore.json"
    wrapped.write_text(
        json.dumps(
            {
                "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                "dsseEnvelope": json.loads(envelope.read_text()),
            }
        )
    )
    assert cli("verify", bundle, "--attestation", wrapped, "--key", public).exit_code == 0


def test_another_key_fails(signed, tmp_path):
    bundle, _, _, _, envelope = signed
    _, other = key_pair(tmp_path, "other")
    result = cli("verify", bundle, "--attestation", envelope, "--key", other)
    assert result.exit_code == 1
    assert "no signature in it verifies with the key" in result.stderr


def test_a_changed_payload_fails(signed, tmp_path):
    bundle, statement, _, public, envelope = signed
    doc = json.loads(envelope.read_text())
    doc["payload"] = base64.b64encode(statement.replace(b"forge-exp", b"forge-exq")).decode()
    envelope.write_text(json.dumps(doc))
    assert cli("verify", bundle, "--attestation", envelope, "--key", public).exit_code == 1


def test_a_signed_statement_of_another_bundle_fails_authenticity(signed, tmp_path):
    bundle, _, signer, public, _ = signed
    other = forge.build(tmp_path / "other")
    forge.edit_receipt(other, lambda r: r["host"].update(system="Linux, another run"))
    statement = cli("report", other, "--format", "intoto").stdout.encode()
    envelope = sign(statement, signer, tmp_path / "other.json")
    result = cli("verify", bundle, "--attestation", envelope, "--key", public, "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["outcome"] == "failed"


def test_a_signed_payload_that_is_not_kvprobes_statement_fails(signed, tmp_path):
    bundle, _, signer, public, _ = signed
    envelope = sign(b'{"hello": "world"}', signer, tmp_path / "x.json")
    result = cli("verify", bundle, "--attestation", envelope, "--key", public)
    assert result.exit_code == 1 and "not an in-toto statement v1" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--attestation", "ATT"), "--attestation and --key go together"),
        (("--attestation", "ATT", "--key", "ATT"), "not a PEM public key"),
        (("--attestation", "PUB", "--key", "PUB"), "not strict JSON"),
        (("--attestation", "ATT", "--key", "PUB", "--expect-manifest-sha256", "0" * 64), "cannot both hold"),
    ],
)
def test_bad_attestation_input_is_exit_2(signed, args, message):
    bundle, _, _, public, envelope = signed
    paths = {"ATT": str(envelope), "PUB": str(public)}
    result = cli("verify", bundle, *[paths.get(a, a) for a in args])
    assert result.exit_code == 2 and message in result.stderr
