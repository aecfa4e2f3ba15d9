"""What a release's server imports: the probes' leading imports of the package under test."""

from __future__ import annotations

import os

from kvprobe.checks.releaseserver import probe_imports
from kvprobe.experiments import experiment
from kvprobe.run.release_imports import release_modules


def test_probe_imports_are_the_leading_imports_of_the_probe_and_its_helpers(tmp_path):
    (tmp_path / "world.py").write_text(
        '"""doc"""\nimport os\nimport kvprobe_probe as kp\nprobe: kp.Probe\nLIMIT = 3\n'
        "import pkg.a\nfrom pkg.b import C, d\nos.environ['X'] = '1'\nimport pkg.late\n"
    )
    (tmp_path / "probe.py").write_text(
        "import kvprobe_probe as kp\nMOCKS = {'x': 'y'}\nprobe = kp.Probe('p', mocks=MOCKS)\n"
        "import world\nfrom pkg import first\n\ndef f():\n    import pkg.lazy\n"
    )
    assert probe_imports([tmp_path / "probe.py", tmp_path / "world.py"], "pkg") == [
        "pkg.a",
        "pkg.b",
        "pkg.b.C",
        "pkg.b.d",
        "pkg",
        "pkg.first",
    ]
    assert os.environ.get("X") is None


def test_the_shipped_probes_import_sglang_at_module_level_and_lazily():
    exps = [experiment.load(name) for name in ("experiment-a", "experiment-b")]
    modules = release_modules(exps, "sglang")
    assert modules[0] == "sglang"
    assert {"sglang.srt.managers.scheduler", "sglang.srt.disaggregation.prefill"} <= set(modules)
    # imported inside a function of admission_world.py (after the probe may have patched): the probe's own
    assert "sglang.srt.distributed.parallel_state" not in modules
    assert len(modules) == len(set(modules))
