"""A DSSE-signed in-toto statement checked offline against a public key (``verify --attestation``).

The envelope is a bare DSSE envelope (any DSSE signer, e.g. securesystemslib) or a Sigstore
bundle holding one (``cosign attest-blob --statement ... --bundle``). Only the signature over
the statement and the given key are checked: no certificate, no transparency log (what cosign
does with ``--key`` and ``--insecure-ignore-tlog``). The signed statement must be kvprobe's
and name a manifest.json digest; step 5 (authenticity) then holds the bundle to that digest.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import FormatError, UnverifiedSignatureError, VerificationError
from securesystemslib.signer import Signature, SSlibKey

from kvprobe import schema, strict_json
from kvprobe.defects import BundleDefect, JsonTooDeep, JsonTooLarge
from kvprobe.errors import SchemaError, UsageError, VerificationFailed
from kvprobe.files import read_regular
from kvprobe.names import INTOTO_PAYLOAD_TYPE, INTOTO_PREDICATE_TYPE, MANIFEST
from kvprobe.strict_json import load_document

_MAX_BYTES = 64 << 20  # a statement carries the whole receipt; the verify JSON cap


@dataclass(frozen=True)
class SignedStatement:
    """What a verified attestation says: the bundle digest it signs, and by which key."""

    manifest_sha256: str
    keyid: str

    def to_json(self) -> dict[str, str]:
        return {"manifest_sha256": self.manifest_sha256, "keyid": self.keyid}


def check(envelope_path: Path, key_path: Path) -> SignedStatement:
    """Verify the envelope's signature with the PEM public key, then read the statement.

    UsageError (exit 2): a file is unreadable, not a DSSE envelope or not a public key.
    VerificationFailed (exit 1): no signature verifies with the key, or the signed payload
    is not kvprobe's in-toto statement naming manifest.json."""
    key = _load_key(key_path)
    envelope = _load_envelope(envelope_path)
    if not any(_verifies(key, sig, envelope.pae()) for sig in envelope.signatures.values()):
        raise VerificationFailed(f"{envelope_path}: no signature in it verifies with the key in {key_path}")
    return SignedStatement(_manifest_digest(envelope, envelope_path), key.keyid)


def _read(path: Path, what: str) -> bytes:
    """A regular file's bytes, capped (a FIFO or a device is refused, never read)."""
    try:
        return read_regular(path, _MAX_BYTES)
    except ValueError:
        raise UsageError(f"{path}: larger than {_MAX_BYTES >> 20} MiB; not {what}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc


def _load_key(path: Path) -> SSlibKey:
    try:
        return SSlibKey.from_crypto(load_pem_public_key(_read(path, "a public key")))
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise UsageError(f"{path}: not a PEM public key (ECDSA, RSA or Ed25519): {exc}") from exc


def _load_envelope(path: Path) -> Envelope:
    try:
        doc = load_document(_read(path, "a DSSE envelope"), str(path))
    except SchemaError as exc:
        raise UsageError(exc.message) from exc
    if isinstance(doc, dict) and isinstance(doc.get("dsseEnvelope"), dict):
        doc = doc["dsseEnvelope"]  # a Sigstore bundle (cosign --bundle)
    try:
        signatures = [{"keyid": "", **s} for s in doc["signatures"]]  # keyid is optional in DSSE
        envelope = Envelope.from_dict({**doc, "signatures": signatures})
    except (KeyError, TypeError, ValueError, binascii.Error, FormatError) as exc:
        raise UsageError(f"{path}: not a DSSE envelope (payload, payloadType, signatures): {exc!r}") from exc
    if not envelope.signatures:
        raise UsageError(f"{path}: the DSSE envelope holds no signature")
    return envelope


def _verifies(key: SSlibKey, signature: Signature, pae: bytes) -> bool:
    # DSSE keyids are hints (cosign writes ""): every signature is tried against the key.
    try:
        key.verify_signature(Signature(key.keyid, signature.signature), pae)
    except (UnverifiedSignatureError, VerificationError):
        return False
    return True


def _manifest_digest(envelope: Envelope, path: Path) -> str:
    if envelope.payload_type != INTOTO_PAYLOAD_TYPE:
        raise VerificationFailed(f"{path}: signed payload type {envelope.payload_type!r} is not {INTOTO_PAYLOAD_TYPE}")
    try:
        statement = strict_json.loads(envelope.payload, f"{path}: signed payload")
    except (JsonTooDeep, JsonTooLarge) as defect:  # input no statement could be: bad input
        raise UsageError(f"{path}: the signed payload is not strict JSON: {defect.detail}") from None
    except BundleDefect as defect:
        detail = defect.detail
        raise VerificationFailed(f"{path}: the signed payload is not an in-toto statement v1: {detail}") from None
    try:
        schema.validate(statement, "in-toto/statement-v1", source=f"{path}: signed statement")
    except SchemaError as exc:
        raise VerificationFailed(f"{path}: the signed payload is not an in-toto statement v1: {exc}") from exc
    if statement["predicateType"] != INTOTO_PREDICATE_TYPE:
        raise VerificationFailed(
            f"{path}: signed predicate type {statement['predicateType']!r} is not kvprobe's {INTOTO_PREDICATE_TYPE}"
        )
    digests = {s["digest"].get("sha256") for s in statement["subject"] if s["name"] == MANIFEST}
    if len(digests) != 1 or None in digests:
        raise VerificationFailed(f"{path}: the signed statement names no single {MANIFEST} sha256")
    return digests.pop()
