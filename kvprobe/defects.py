"""What can be wrong with a bundle: one error subclass (and one stable code) per failure kind.

``kvprobe verify`` collects these instead of stopping at the first one, so a report names
every defect; each carries the step it belongs to and the bundle path it is about. They
are VerificationFailed subclasses (exit 1), except NotABundle (exit 2: not a bundle at all).
"""

from __future__ import annotations

from typing import TypeVar

from kvprobe.errors import UsageError, VerificationFailed


class NotABundle(UsageError):
    """The path is not a bundle directory or a readable bundle archive (exit 2)."""


class BundleDefect(VerificationFailed):
    """One defect found in a bundle: a stable ``code``, the ``step`` and the ``path``."""

    code = "defect"
    step = 0

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{self.code}: {path}: {detail}")
        self.path = path
        self.detail = detail

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "step": self.step, "path": self.path, "detail": self.detail}


_Step = TypeVar("_Step", bound=BundleDefect)


def _kind(name: str, step: type[_Step], code: str) -> type[_Step]:
    """One row of the tables below: a defect kind is its step's class with a stable code;
    ``isinstance`` and ``except`` see it as a class of its own."""
    return type(name, (step,), {"code": code, "__module__": __name__, "__qualname__": name})


# --- step 1: layout ----------------------------------------------------------------------


class LayoutDefect(BundleDefect):
    step = 1


MissingRequired = _kind("MissingRequired", LayoutDefect, "missing-required")
SymlinkEntry = _kind("SymlinkEntry", LayoutDefect, "symlink")
# A FIFO, device or socket: never opened.
SpecialFile = _kind("SpecialFile", LayoutDefect, "special-file")
# Non-UTF-8, non-canonical, '.', '..', absolute or over-long names.
BadName = _kind("BadName", LayoutDefect, "bad-name")
# Two names equal after case folding or Unicode (NFC) normalisation.
NameCollision = _kind("NameCollision", LayoutDefect, "name-collision")
# A directory the verifier cannot open (permissions, or it changed while scanned).
UnreadableEntry = _kind("UnreadableEntry", LayoutDefect, "unreadable-entry")
TooManyFiles = _kind("TooManyFiles", LayoutDefect, "too-many-files")
FileTooLarge = _kind("FileTooLarge", LayoutDefect, "file-too-large")
BundleTooLarge = _kind("BundleTooLarge", LayoutDefect, "bundle-too-large")
ArchiveLinkMember = _kind("ArchiveLinkMember", LayoutDefect, "archive-link-member")
ArchiveSpecialMember = _kind("ArchiveSpecialMember", LayoutDefect, "archive-special-member")
# An absolute member name or one with '..' components.
ArchiveTraversal = _kind("ArchiveTraversal", LayoutDefect, "archive-traversal")
ArchiveDuplicateMember = _kind("ArchiveDuplicateMember", LayoutDefect, "archive-duplicate-member")
# A PAX or GNU long-name header (or a sparse map) larger than any bundle needs: never read.
ArchiveHeaderTooLarge = _kind("ArchiveHeaderTooLarge", LayoutDefect, "archive-header-too-large")


# --- step 2: JSON ------------------------------------------------------------------------


class JsonDefect(BundleDefect):
    step = 2


JsonNotUtf8 = _kind("JsonNotUtf8", JsonDefect, "json-not-utf8")
JsonMalformed = _kind("JsonMalformed", JsonDefect, "json-malformed")
JsonDuplicateKey = _kind("JsonDuplicateKey", JsonDefect, "json-duplicate-key")
# NaN, Infinity or -Infinity: not JSON.
JsonNonFinite = _kind("JsonNonFinite", JsonDefect, "json-non-finite")
JsonTooLarge = _kind("JsonTooLarge", JsonDefect, "json-too-large")
JsonTooDeep = _kind("JsonTooDeep", JsonDefect, "json-too-deep")
UnknownSchemaVersion = _kind("UnknownSchemaVersion", JsonDefect, "schema-unknown-version")
SchemaViolation = _kind("SchemaViolation", JsonDefect, "schema-violation")
TomlMalformed = _kind("TomlMalformed", JsonDefect, "toml-malformed")
# A document the verifier needs is missing or not a regular file.
Unreadable = _kind("Unreadable", JsonDefect, "unreadable")


# --- step 3: integrity -------------------------------------------------------------------


class IntegrityDefect(BundleDefect):
    step = 3


MissingFile = _kind("MissingFile", IntegrityDefect, "missing-file")
NotRegular = _kind("NotRegular", IntegrityDefect, "not-regular")
SizeMismatch = _kind("SizeMismatch", IntegrityDefect, "size-mismatch")
# The manifest claims a size over the cap: refused before any byte is hashed.
OversizedClaim = _kind("OversizedClaim", IntegrityDefect, "oversized-claim")
FileDigestMismatch = _kind("FileDigestMismatch", IntegrityDefect, "digest-mismatch")
UnlistedFile = _kind("UnlistedFile", IntegrityDefect, "unlisted-file")
# A listed or cited path that is absolute, has '..' or is not canonical.
UnsafePath = _kind("UnsafePath", IntegrityDefect, "unsafe-path")
DuplicateEntry = _kind("DuplicateEntry", IntegrityDefect, "duplicate-entry")
# manifest.json or SHA256SUMS listed inside the manifest itself.
ReservedEntry = _kind("ReservedEntry", IntegrityDefect, "reserved-entry")
ManifestNotCanonical = _kind("ManifestNotCanonical", IntegrityDefect, "manifest-not-canonical")
# SHA256SUMS and manifest.json disagree on the set of files or a digest.
SumsMismatch = _kind("SumsMismatch", IntegrityDefect, "sums-mismatch")
SumsMalformed = _kind("SumsMalformed", IntegrityDefect, "sums-malformed")
SumsBsdStyle = _kind("SumsBsdStyle", IntegrityDefect, "sums-bsd-style")
SumsUppercaseHex = _kind("SumsUppercaseHex", IntegrityDefect, "sums-uppercase-hex")
SumsCrlf = _kind("SumsCrlf", IntegrityDefect, "sums-crlf")
# Parsable but not byte-identical to the writer's render (order, '*', no final LF).
SumsNotCanonical = _kind("SumsNotCanonical", IntegrityDefect, "sums-not-canonical")


# --- step 4: consistency -----------------------------------------------------------------


class ConsistencyDefect(BundleDefect):
    step = 4


CitationNotInManifest = _kind("CitationNotInManifest", ConsistencyDefect, "citation-not-in-manifest")
CitationDigestMismatch = _kind("CitationDigestMismatch", ConsistencyDefect, "citation-digest-mismatch")
# A cited raw output that is not where its side and check put it.
CitationMisplaced = _kind("CitationMisplaced", ConsistencyDefect, "citation-misplaced")
# A raw output that is not what the receipt says it is (side, probe, path, schema).
RawInvalid = _kind("RawInvalid", ConsistencyDefect, "raw-invalid")
# The receipt's per-check record disagrees with its raw output.
RecordMismatch = _kind("RecordMismatch", ConsistencyDefect, "record-mismatch")
ForgedVerdict = _kind("ForgedVerdict", ConsistencyDefect, "forged-verdict")
ComparisonMismatch = _kind("ComparisonMismatch", ConsistencyDefect, "comparison-mismatch")
RecomputeFailed = _kind("RecomputeFailed", ConsistencyDefect, "recompute-failed")
ComparisonAlgorithmUnknown = _kind("ComparisonAlgorithmUnknown", ConsistencyDefect, "comparison-algorithm-unknown")
ExpectationsMismatch = _kind("ExpectationsMismatch", ConsistencyDefect, "expectations-mismatch")
ExperimentDigestMismatch = _kind("ExperimentDigestMismatch", ConsistencyDefect, "experiment-digest-mismatch")
# The receipt's experiment block disagrees with the bundled experiment.toml.
ExperimentMismatch = _kind("ExperimentMismatch", ConsistencyDefect, "experiment-mismatch")
BadPin = _kind("BadPin", ConsistencyDefect, "bad-pin")
PinMismatch = _kind("PinMismatch", ConsistencyDefect, "pin-mismatch")
RunIdMismatch = _kind("RunIdMismatch", ConsistencyDefect, "run-id-mismatch")
# README.md (what a reviewer reads first) is not the one kvprobe renders from the receipt.
ReadmeMismatch = _kind("ReadmeMismatch", ConsistencyDefect, "readme-mismatch")


# --- step 5: authenticity, step 6: rerun -------------------------------------------------


class AuthenticityDefect(BundleDefect):
    step = 5


ManifestDigestMismatch = _kind("ManifestDigestMismatch", AuthenticityDefect, "manifest-digest-mismatch")
# A bundled file of an experiment kvprobe ships that is not the installed copy's.
DiffersFromInstalled = _kind("DiffersFromInstalled", AuthenticityDefect, "differs-from-installed")


class RerunDiffers(BundleDefect):
    """Step 6: the rerun observed something other than the bundle (a class, so rerun annotates with it)."""

    step = 6
    code = "rerun-differs"


# A release's version now names other bytes on the index than the bundle recorded: the same
# version serving other code is the finding, so the release is not re-run (a sweep's step 6).
IndexServesOtherBytes = _kind("IndexServesOtherBytes", RerunDiffers, "index-serves-other-bytes")
