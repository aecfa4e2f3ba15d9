"""Fix-marker checks of gates 3 and 4, pure: a marker's presence -> the check's status, and
whether a release predates a fix. `kvprobe gates` decides with it; verify holds each
receipt's marker checks to the marker records and the target's version with it."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from kvprobe.rules.gate_status import Status

# present: the fix is in the code; absent: it is not; unknown: the code could not be read for it
STATUS = {"present": Status.PASS, "absent": Status.FAIL, "unknown": Status.UNKNOWN}
NOT_IN_RELEASE = "not in this release: the fix first ships in"


def older_than(release: str | None, first_release: str) -> bool:
    """Is ``release`` a version before ``first_release``? False when either is not a version."""
    if not release or not first_release:
        return False
    try:
        return Version(release) < Version(first_release)
    except InvalidVersion:
        return False


def not_in_release(first_release: str, release: str | None) -> str:
    """The words a marker's evidence carries when the release predates the fix."""
    return f"{NOT_IN_RELEASE} {first_release}, this code is sglang {release}"
