"""Helper modules that two shipped experiments share are byte-identical copies.

A bundle carries the .py files beside its experiment.toml (experiment.bundled_files), so an
experiment cannot import a helper from another experiment's folder; experiments D and E keep
one world module each, and these copies must not drift apart.
"""

from __future__ import annotations

from kvprobe.experiments import experiment
from kvprobe.resources import builtin_probes_dir

SHARED = {"deferred_world.py": ("experiment-d", "experiment-e")}


def test_shared_world_modules_are_identical_in_every_experiment_that_ships_them():
    for name, owners in SHARED.items():
        copies = {owner: (builtin_probes_dir() / owner / name).read_bytes() for owner in owners}
        assert len(set(copies.values())) == 1, f"{name} differs between {', '.join(owners)}"


def test_each_copy_is_part_of_its_experiments_bundle():
    for name, owners in SHARED.items():
        for owner in owners:
            files = experiment.bundled_files(builtin_probes_dir() / owner)
            assert name in {f.name for f in files}
