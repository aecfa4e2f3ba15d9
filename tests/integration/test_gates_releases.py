"""Fix markers and code settings on real SGLang releases before and after the fixes (issue #27).

0.5.13 has no deferred KV release and no handoff checksum at all: the gate-3 and gate-4 fixes
are absent there, not unknown, and the deferred-release check fails whatever the environment
says. 0.5.23 has every fix. Only the code is read (no gate-2 probes run): one wheel each,
fetched into the user's kvprobe cache by its index digest.
"""

from __future__ import annotations

import pytest

from kvprobe.gates import settings
from kvprobe.gates.fixmarkers import CodeTree, Presence, code_settings, find_all
from kvprobe.gates.target import resolve_target
from kvprobe.model.gates_receipt import WorkerFacts
from kvprobe.progress import Reporter
from kvprobe.rules import gate4

pytestmark = [pytest.mark.slow, pytest.mark.network]

ON = WorkerFacts("1", "decode.env:1", "mooncake", "-")


@pytest.mark.parametrize(
    ("version", "presence", "deferred"),
    [("0.5.13", Presence.ABSENT, "fail"), ("0.5.23", Presence.PRESENT, "pass")],
)
def test_markers_and_deferred_release_on_real_releases(tmp_path, version, presence, deferred):
    from kvprobe.env.cache import default_cache_root

    target = resolve_target(version, tmp_path, default_cache_root(), Reporter())
    tree = CodeTree(target.code_root, target.identity.get("version"))
    assert {f.marker.pr: f.presence for f in find_all(tree)} == {
        pr: presence for pr in (39500, 40645, 41402, 41404, 41023)
    }
    code = code_settings(tree)
    assert code.has_checksum_flag is (version == "0.5.23")
    assert code.deferred_declared is (version == "0.5.23")
    status, detail = gate4.worker_state(ON, settings.release_facts(code))
    assert status.value == deferred, detail
