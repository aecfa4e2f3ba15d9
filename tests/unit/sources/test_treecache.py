"""sources/treecache: a planted entry is a problem, never a crash or a write outside the cache."""

from __future__ import annotations

import json
import os
import stat

from kvprobe.sources import treecache


def test_discarding_an_entry_that_is_a_symlink_touches_nothing_it_points_to(tmp_path):
    outside = tmp_path / "outside"
    (outside / "private").mkdir(parents=True)
    os.chmod(outside / "private", 0o700)
    entry = tmp_path / "trees" / "k"
    entry.parent.mkdir()
    entry.symlink_to(outside)
    treecache.discard(entry)
    assert not os.path.lexists(entry)
    assert stat.S_IMODE(os.lstat(outside / "private").st_mode) == 0o700  # os.walk would have entered it


def test_a_listing_record_that_is_no_file_record_is_a_problem(tmp_path):
    entry = tmp_path / "k"
    (entry / "tree").mkdir(parents=True)
    (entry / "kvprobe-tree.json").write_text(json.dumps({"files": {"a.py": 5, "b.py": {"size": "x"}}}))
    problems = {p.path: p.what for p in treecache.verify(entry)}
    assert problems == {"a.py": "not a file record", "b.py": "not a file record"}
