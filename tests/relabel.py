"""A sweep bundle relabelled as a hostile publisher would (issue #22, "Relabelled"): a copy of
the committed experiment-a sweep, its experiment renamed to one kvprobe does not ship, its
``[vulnerability]`` set to a public id with ``fix_kind = "security"`` (and, for the "Text"
attack, its title replaced), everything derived re-derived: `verify` calls it self-consistent.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvprobe.evidence.sweep_view import TIMELINE, render_readme, timeline_svg
from kvprobe.model.sweep_receipt import SweepReceipt
from tests import forge

REPO = Path(__file__).resolve().parents[1]
(SWEEP_A,) = sorted((REPO / "bundles").glob("experiment-a-sweep-*"))
NEW_ID = "relabelled-a"
CVE = "CVE-2026-99999"


def relabelled_sweep(dst: Path, *, vuln_id: str = CVE, title: str | None = None) -> Path:
    """``dst``: the relabelled copy (see the module docstring)."""
    from tests.attacks.harness import rename_experiment  # harness imports forge: import late

    bundle = forge.copy(SWEEP_A, dst)
    rename_experiment(bundle, NEW_ID)
    rel = f"probes/{NEW_ID}/experiment.toml"
    toml = bundle / rel
    text = toml.read_text(encoding="utf-8")
    text = text.replace('id = "KVPROBE-2026-0001"', f"id = {json.dumps(vuln_id)}", 1)
    text = text.replace('fix_kind = "performance"', 'fix_kind = "security"', 1)
    if title is not None:
        text = re.sub(r"(?m)^title = .*$", lambda _m: f"title = {json.dumps(title)}", text, count=1)
    toml.write_text(text, encoding="utf-8")
    receipt = forge.load(bundle, "receipt.json")
    receipt["experiment"]["vulnerability"].update(id=vuln_id, fix_kind="security")
    if title is not None:
        receipt["experiment"]["title"] = title
    receipt["experiment"]["sha256"] = forge.sha(toml.read_bytes())
    (bundle / "receipt.json").write_bytes(forge.dumps(receipt))
    typed = SweepReceipt.from_json(receipt)
    (bundle / "README.md").write_text(render_readme(typed), encoding="utf-8")
    (bundle / TIMELINE).write_text(timeline_svg(typed), encoding="utf-8")
    forge.rehash(bundle)
    forge.recite(bundle, rel)
    return bundle
