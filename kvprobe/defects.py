"""What can be wrong with a bundle: one error subclass (and one stable code) per failure kind.

``kvprobe verify`` collects these instead of stopping at the first one, so a report names
every defect; each carries the step it belongs to and the bundle path it is about. They
are VerificationFailed subclasses (exit 1), except NotABundle (exit 2: not a bundle at all).
"""

from __future__ import annotations

from kvprobe.errors import UsageError, VerificationFailed


class NotABundle(UsageError):
    """The path is not a bundle directory or a readable bundle archive (exit 2)."""


class BundleDefect(VerificationFailed):
    """One defect found in a bundle: a stable ``code``, the ``step`` and the ``path``.

    A kind is a subclass of its step's class that names its code (``class BadName(LayoutDefect,
    code="bad-name")``), so ``isinstance``, ``except`` and mypy see each kind as a class of its own.
    """

    code = "defect"
    step = 0

    def __init_subclass__(cls, code: str = "", **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code:
            cls.code = code

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{self.code}: {path}: {detail}")
        self.path = path
        self.detail = detail

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "step": self.step, "path": self.path, "detail": self.detail}


# --- step 1: layout ----------------------------------------------------------------------


class LayoutDefect(BundleDefect):
    step = 1


class MissingRequired(LayoutDefect, code="missing-required"): ...


class SymlinkEntry(LayoutDefect, code="symlink"): ...


class SpecialFile(LayoutDefect, code="special-file"):
    """A FIFO, device or socket: never opened."""


class BadName(LayoutDefect, code="bad-name"):
    """Non-UTF-8, non-canonical, '.', '..', absolute or over-long names."""


class NameCollision(LayoutDefect, code="name-collision"):
    """Two names equal after case folding or Unicode (NFC) normalisation."""


class UnreadableEntry(LayoutDefect, code="unreadable-entry"):
    """A directory the verifier cannot open (permissions, or it changed while scanned)."""


class TooManyFiles(LayoutDefect, code="too-many-files"): ...


class FileTooLarge(LayoutDefect, code="file-too-large"): ...


class BundleTooLarge(LayoutDefect, code="bundle-too-large"): ...


class ArchiveLinkMember(LayoutDefect, code="archive-link-member"): ...


class ArchiveSpecialMember(LayoutDefect, code="archive-special-member"): ...


class ArchiveTraversal(LayoutDefect, code="archive-traversal"):
    """An absolute member name or one with '..' components."""


class ArchiveDuplicateMember(LayoutDefect, code="archive-duplicate-member"): ...


class ArchiveHeaderTooLarge(LayoutDefect, code="archive-header-too-large"):
    """A PAX or GNU long-name header (or a sparse map) larger than any bundle needs: never read."""


# --- step 2: JSON ------------------------------------------------------------------------


class JsonDefect(BundleDefect):
    step = 2


class JsonNotUtf8(JsonDefect, code="json-not-utf8"): ...


class JsonMalformed(JsonDefect, code="json-malformed"): ...


class JsonDuplicateKey(JsonDefect, code="json-duplicate-key"): ...


class JsonNonFinite(JsonDefect, code="json-non-finite"):
    """NaN, Infinity or -Infinity: not JSON."""


class JsonTooLarge(JsonDefect, code="json-too-large"): ...


class JsonTooDeep(JsonDefect, code="json-too-deep"): ...


class UnknownSchemaVersion(JsonDefect, code="schema-unknown-version"): ...


class SchemaViolation(JsonDefect, code="schema-violation"): ...


class TomlMalformed(JsonDefect, code="toml-malformed"): ...


class Unreadable(JsonDefect, code="unreadable"):
    """A document the verifier needs is missing or not a regular file."""


# --- step 3: integrity -------------------------------------------------------------------


class IntegrityDefect(BundleDefect):
    step = 3


class MissingFile(IntegrityDefect, code="missing-file"): ...


class NotRegular(IntegrityDefect, code="not-regular"): ...


class SizeMismatch(IntegrityDefect, code="size-mismatch"): ...


class OversizedClaim(IntegrityDefect, code="oversized-claim"):
    """The manifest claims a size over the cap: refused before any byte is hashed."""


class FileDigestMismatch(IntegrityDefect, code="digest-mismatch"): ...


class UnlistedFile(IntegrityDefect, code="unlisted-file"): ...


class UnsafePath(IntegrityDefect, code="unsafe-path"):
    """A listed or cited path that is absolute, has '..' or is not canonical."""


class DuplicateEntry(IntegrityDefect, code="duplicate-entry"): ...


class ReservedEntry(IntegrityDefect, code="reserved-entry"):
    """manifest.json or SHA256SUMS listed inside the manifest itself."""


class ManifestNotCanonical(IntegrityDefect, code="manifest-not-canonical"): ...


class SumsMismatch(IntegrityDefect, code="sums-mismatch"):
    """SHA256SUMS and manifest.json disagree on the set of files or a digest."""


class SumsMalformed(IntegrityDefect, code="sums-malformed"): ...


class SumsBsdStyle(IntegrityDefect, code="sums-bsd-style"): ...


class SumsUppercaseHex(IntegrityDefect, code="sums-uppercase-hex"): ...


class SumsCrlf(IntegrityDefect, code="sums-crlf"): ...


class SumsNotCanonical(IntegrityDefect, code="sums-not-canonical"):
    """Parsable but not byte-identical to the writer's render (order, '*', no final LF)."""


# --- step 4: consistency -----------------------------------------------------------------


class ConsistencyDefect(BundleDefect):
    step = 4


class CitationNotInManifest(ConsistencyDefect, code="citation-not-in-manifest"): ...


class CitationDigestMismatch(ConsistencyDefect, code="citation-digest-mismatch"): ...


class CitationMisplaced(ConsistencyDefect, code="citation-misplaced"):
    """A cited raw output that is not where its side and check put it."""


class RawInvalid(ConsistencyDefect, code="raw-invalid"):
    """A raw output that is not what the receipt says it is (side, probe, path, schema)."""


class RecordMismatch(ConsistencyDefect, code="record-mismatch"):
    """The receipt's per-check record disagrees with its raw output."""


class ForgedVerdict(ConsistencyDefect, code="forged-verdict"): ...


class ComparisonMismatch(ConsistencyDefect, code="comparison-mismatch"): ...


class RecomputeFailed(ConsistencyDefect, code="recompute-failed"): ...


class ComparisonAlgorithmUnknown(ConsistencyDefect, code="comparison-algorithm-unknown"): ...


class ExpectationsMismatch(ConsistencyDefect, code="expectations-mismatch"): ...


class ExperimentDigestMismatch(ConsistencyDefect, code="experiment-digest-mismatch"): ...


class ExperimentMismatch(ConsistencyDefect, code="experiment-mismatch"):
    """The receipt's experiment block disagrees with the bundled experiment.toml."""


class BadPin(ConsistencyDefect, code="bad-pin"): ...


class PinMismatch(ConsistencyDefect, code="pin-mismatch"): ...


class RunIdMismatch(ConsistencyDefect, code="run-id-mismatch"): ...


class ReadmeMismatch(ConsistencyDefect, code="readme-mismatch"):
    """README.md (what a reviewer reads first) is not the one kvprobe renders from the receipt."""


class RenderedMismatch(ConsistencyDefect, code="rendered-mismatch"):
    """A sweep's timeline.svg is not the picture kvprobe renders from the receipt."""


class ReleaseSetDefect(ConsistencyDefect, code="release-set"):
    """A sweep's releases are not its listing's range: twins, out of order, missing, or
    not run without the profile's reason."""


class ListingMismatch(ConsistencyDefect, code="listing-mismatch"):
    """A sweep's listing disagrees with itself, its spec or its releases' wheels."""


class RangeMismatch(ConsistencyDefect, code="range-mismatch"):
    """A sweep's observed range (oldest, introduced, first fixed) is not what its releases give."""


# --- step 5: authenticity, step 6: rerun -------------------------------------------------


class AuthenticityDefect(BundleDefect):
    step = 5


class ManifestDigestMismatch(AuthenticityDefect, code="manifest-digest-mismatch"): ...


class DiffersFromInstalled(AuthenticityDefect, code="differs-from-installed"):
    """A bundled file of an experiment kvprobe ships that is not the installed copy's."""


class RerunDiffers(BundleDefect, code="rerun-differs"):
    """Step 6: the rerun observed something other than the bundle."""

    step = 6


class ListingChanged(RerunDiffers, code="listing-changed"):
    """The index lists other releases in a sweep's range than the bundle's listing recorded."""


class IndexServesOtherBytes(RerunDiffers, code="index-serves-other-bytes"):
    """A release's version now names other bytes on the index than the bundle recorded.

    The same version serving other code is the finding, so the release is not re-run (a sweep's
    step 6).
    """
