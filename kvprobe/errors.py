"""The error tree. The core raises these; only the CLI turns them into exit codes.

Exit codes (the README's command table): 1 = the verdict asked for does not hold (a result, not an
error, so no class here maps to it except verification failures), 2 = usage or bad
input, 3 = could not observe (network, git, pip, timeout, broken environment).
"""

from __future__ import annotations


class KvprobeError(Exception):
    """Base class: a one-line message plus optional diagnostic lines."""

    exit_code = 3

    def __init__(self, message: str, *, hints: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hints = list(hints or [])

    def diagnostics(self) -> list[str]:
        """The message first, then hints a user can act on."""
        return [self.message, *self.hints]


class UsageError(KvprobeError):
    """Bad input from the user: a malformed SHA, URL, path or option (exit 2)."""

    exit_code = 2


class ExperimentError(UsageError):
    """An experiment file that is missing, malformed or fails its schema (exit 2)."""


class SchemaError(UsageError):
    """A document that fails its JSON Schema (exit 2 when it came from the user)."""


class PinError(UsageError):
    """A pin that is not a full lowercase 40-hex SHA or a sha256-pinned wheel (exit 2)."""


class ObserveError(KvprobeError):
    """Something needed to observe failed: network, git, pip, a timeout (exit 3)."""

    exit_code = 3


class FetchError(ObserveError):
    """A source (git object or wheel) could not be fetched."""


class DigestMismatch(ObserveError):
    """Downloaded bytes do not match their pinned digest; nothing was cached."""


class CheckoutError(ObserveError):
    """A materialized tree does not match its pin, or could not be written."""


class EnvBuildError(ObserveError):
    """A virtualenv for a dependency lock could not be built."""


class CheckRunError(ObserveError):
    """A check could not be run at all (not the same as a check that failed)."""


class BundleExistsError(UsageError):
    """--out names a directory that exists and is not empty; never overwrite."""


class VerificationFailed(KvprobeError):
    """A bundle did not verify (exit 1)."""

    exit_code = 1


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached kvprobe: not an error of the run, so no ``except Exception``
    of the core may take it for one; every ``finally`` on the way out still runs (temporary
    directories removed, locks released). The CLI exits 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
