"""`kvprobe attest`: a bundle's in-toto statement as a DSSE envelope signed with a local key.

The envelope is the one ``verify --attestation`` checks (:mod:`kvprobe.verify.attestation`),
made with the same library (securesystemslib's DSSE envelope and ``CryptoSigner``): the
statement is the one ``report --format intoto`` writes, of a bundle that verifies (steps 1-5).
The key is a PEM private key (PKCS#8 or traditional OpenSSL; ECDSA, RSA or Ed25519), encrypted
ones with their password in ``$KVPROBE_KEY_PASSWORD``. cosign's own key file (``ENCRYPTED
SIGSTORE PRIVATE KEY``) is not PEM of that kind: sign with cosign then, or export the key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from kvprobe.errors import UsageError
from kvprobe.exports.bundle_view import BundleView
from kvprobe.exports.render import ExportOptions, render
from kvprobe.names import INTOTO_PAYLOAD_TYPE

PASSWORD_ENV = "KVPROBE_KEY_PASSWORD"
_MAX_KEY_BYTES = 1 << 20


@dataclass(frozen=True)
class Attestation:
    """The envelope's text (JSON, one document) and what it signs, by which key."""

    text: str
    manifest_sha256: str
    keyid: str


def load_signer(path: Path) -> CryptoSigner:
    """The PEM private key at ``path`` as a signer; UsageError when it cannot be read, is
    encrypted without ``$KVPROBE_KEY_PASSWORD`` (or with a wrong one), or is not a key
    securesystemslib signs with."""
    try:
        if path.stat().st_size > _MAX_KEY_BYTES:
            raise UsageError(f"--key {path}: larger than 1 MiB; not a PEM private key")
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--key {path}: cannot read it: {exc.strerror or exc}") from exc
    password = os.environ.get(PASSWORD_ENV)
    try:
        private = load_pem_private_key(data, password.encode() if password is not None else None)
    except TypeError as exc:  # encrypted without a password, or a password for a plain key
        raise UsageError(f"--key {path}: {exc} (the password is read from ${PASSWORD_ENV})") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise UsageError(
            f"--key {path}: not a PEM private key kvprobe can read (PKCS#8 or OpenSSL; ECDSA, RSA, "
            f"Ed25519; a wrong ${PASSWORD_ENV} reads the same): {exc}"
        ) from exc
    try:
        return CryptoSigner(private)  # a kind it cannot sign with (DSA, X25519) raises, caught here
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise UsageError(f"--key {path}: a {type(private).__name__} cannot sign DSSE here: {exc}") from exc


def attest(view: BundleView, signer: CryptoSigner, *, archive: Path | None = None) -> Attestation:
    """The bundle's in-toto statement (``report --format intoto``, schema-checked) signed into
    a DSSE envelope; ``archive`` is the packed bundle to add as a subject."""
    statement = render(view, "intoto", ExportOptions(archive=archive))
    envelope = Envelope(statement.encode("utf-8"), INTOTO_PAYLOAD_TYPE, {})
    signature = envelope.sign(signer)
    text = json.dumps(envelope.to_dict(), indent=2, sort_keys=True) + "\n"
    return Attestation(text, view.manifest_sha256, signature.keyid)
