"""`kvprobe cache prune --kind unit` on a cache someone else can write (#26: sweep units).

A unit entry's lock (units/<name>.lock) planted as a symlink, or as a directory, cannot be
taken. Prune crashed on the first such entry ("internal error ... a bug in kvprobe", exit 4)
and removed none of the entries after it; now it skips that entry, says why, and prunes the
rest. The symlink's target is never touched.
"""

from __future__ import annotations

import json

import pytest

from tests.attacks.harness import assert_outcome

pytestmark = pytest.mark.attack


@pytest.mark.parametrize("lock", ["symlink", "directory"])
def test_a_unit_lock_that_cannot_be_taken_skips_that_unit_only(sandbox, lock):
    units = sandbox.cache / "units"
    for name in ("exp-1.0-aaaa", "exp-2.0-bbbb"):
        (units / name).mkdir(parents=True)
        (units / name / "unit.tar.gz").write_bytes(b"not a unit")
        (units / name / "kvprobe-unit.json").write_text("{}")
    target = sandbox.inputs / "precious.txt"
    target.write_text("keep me")
    held = units / "exp-1.0-aaaa.lock"
    if lock == "symlink":
        held.symlink_to(target)
    else:
        held.mkdir()

    result = sandbox.run("cache", "prune", "--kind", "unit", "--all", "--json", allow=(sandbox.cache,))
    assert_outcome(sandbox, result, 0)
    outcomes = {o["path"].rsplit("/", 1)[-1]: o for o in json.loads(result.out)["outcomes"]}
    assert outcomes["exp-1.0-aaaa"]["action"] == "skipped" and "lock" in outcomes["exp-1.0-aaaa"]["reason"]
    assert outcomes["exp-2.0-bbbb"]["action"] == "deleted"
    assert (units / "exp-1.0-aaaa").is_dir() and not (units / "exp-2.0-bbbb").exists()
    assert target.read_text() == "keep me"
