"""Step 4 of a sweep bundle: the releases it says it reused from the kvprobe cache.

A reused release verifies exactly as a fresh one: its raw outputs are in the bundle, cited,
and its classification is recomputed from them like any other's. What ``reused`` adds is
checked against the rest of the receipt: the unit was observed before the sweep that
reused it started, and it is a unit kvprobe keeps (its wheel was had and every probe ran
and wrote its output; run/unit_cache.keepable). The unit's manifest digest names the cache
entry it came from; the sweep bundle does not hold that manifest, so it is not recomputed.
"""

from __future__ import annotations

from datetime import datetime

from kvprobe.defects import BundleDefect, RecordMismatch
from kvprobe.model.sweep_receipt import SweepReceipt
from kvprobe.names import RECEIPT


def reused_defects(receipt: SweepReceipt) -> list[BundleDefect]:
    """Each reused release was observed no later than the sweep began, by a unit that observed."""
    found: list[BundleDefect] = []
    for release in receipt.releases:
        if release.reused is None:
            continue
        where = f"release {release.version}"
        try:  # the schema's pattern lets through a time that never was (0000-00-00T00:00:00Z)
            datetime.strptime(release.reused.observed_utc, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            found.append(
                RecordMismatch(
                    RECEIPT, f"{where} is reused from a unit observed at {release.reused.observed_utc}: not a time"
                )
            )
        # both are UTC in one fixed format (the schema's pattern): text order is time order
        if release.reused.observed_utc > receipt.created_utc:
            found.append(
                RecordMismatch(
                    RECEIPT,
                    f"{where} is reused from a unit observed at {release.reused.observed_utc}, after the sweep "
                    f"began ({receipt.created_utc})",
                )
            )
        ran = all(p.problem is None and p.raw is not None for p in release.probes) and all(
            r.problem is None and r.raw is not None for p in release.probes for r in p.repeats or ()
        )  # runs 2..N of sweep --repeat N too
        if release.wheel is None or release.problem is not None or not release.probes or not ran:
            found.append(
                RecordMismatch(
                    RECEIPT, f"{where} is reused, but its unit did not observe (no wheel, or a probe did not run)"
                )
            )
    return found
