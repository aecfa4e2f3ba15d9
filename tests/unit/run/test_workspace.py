"""The bundle workspace run, sweep and gates write in: the --out rule, and nothing half-written."""

from __future__ import annotations

import pytest

from kvprobe.errors import BundleExistsError, SchemaError
from kvprobe.names import RECEIPT_SCHEMA
from kvprobe.run.workspace import Workspace, bundle_path


def test_out_must_be_absent_or_an_empty_directory(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept").write_text("someone's file")
    (tmp_path / "file").write_text("")
    for taken in ("full", "file"):
        with pytest.raises(BundleExistsError, match="refusing to overwrite"):
            bundle_path(tmp_path / taken, tmp_path / "bundles", "name")
    (tmp_path / "empty").mkdir()
    assert bundle_path(tmp_path / "empty", tmp_path / "bundles", "name") == (tmp_path / "empty").resolve()
    assert bundle_path(None, tmp_path / "bundles", "name") == (tmp_path / "bundles" / "name").resolve()


@pytest.mark.parametrize("beside", [False, True])
def test_a_bundle_that_does_not_seal_leaves_neither_its_dirs_nor_a_bundle(tmp_path, beside):
    final = tmp_path / "bundles" / "run"
    with pytest.raises(SchemaError), Workspace(final, "kvprobe-test-") as workspace:
        staging = workspace.stage(beside=beside)
        assert (staging.parent == final.parent) is beside
        (staging / "raw").mkdir()
        workspace.seal({}, {"schema": RECEIPT_SCHEMA}, RECEIPT_SCHEMA, "# not a receipt\n")
    assert not workspace.work.exists() and not staging.exists() and not final.exists()
    assert list(final.parent.iterdir()) == [] if beside else not final.parent.exists()
