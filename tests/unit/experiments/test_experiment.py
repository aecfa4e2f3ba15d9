"""Experiment files: schema validation with errors naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprobe.errors import ExperimentError
from kvprobe.experiments import experiment
from kvprobe.model.records import Layer, SourceKind

GOOD = """
schema = "kvprobe.experiment/1"
id = "demo"
title = "demo"
layer = "diff-probe"
upstream = "https://example.org/repo.git"
profile = "pytest-minimal"
[fix]
prs = [1]
summary = "fix"
[pins.commits]
kind = "git"
pr = 1
[pins.commits.base]
commit = "1111111111111111111111111111111111111111"
[pins.commits.head]
commit = "2222222222222222222222222222222222222222"
[checks]
tests = [{ path = "tests/test_x.py" }]
probes = [{ path = "probe_x.py" }]
[expect.base."probe_x/case.one"]
value = 1
[scope]
shows = "a difference"
does_not_show = ["a leak"]
"""


def write(tmp_path: Path, text: str, probe: bool = True) -> Path:
    folder = tmp_path / "demo"
    folder.mkdir(exist_ok=True)
    if probe:
        (folder / "probe_x.py").write_text("# probe\n")
    path = folder / "experiment.toml"
    path.write_text(text)
    return path


def test_good_file_loads(tmp_path):
    exp = experiment.load_file(write(tmp_path, GOOD))
    assert exp.id == "demo" and exp.layer is Layer.DIFF_PROBE
    assert exp.pin_sets["commits"].kind is SourceKind.GIT and exp.pin_sets["commits"].pr == 1
    assert exp.default_pin_set == "commits"
    assert exp.expectations["base"]["probe_x/case.one"] == {"value": 1}
    assert len(exp.file_sha256) == 64


@pytest.mark.parametrize(
    "old,new,field",
    [
        ('commit = "1111111111111111111111111111111111111111"', 'commit = "main"', "pins.commits.base.commit"),
        (
            'commit = "1111111111111111111111111111111111111111"',
            'commit = "ABCDEF1111111111111111111111111111111111"',
            "pins.commits.base.commit",
        ),
        ('commit = "1111111111111111111111111111111111111111"', 'commit = "1111111"', "pins.commits.base.commit"),
        ('layer = "diff-probe"', 'layer = "vibes"', "layer"),
        ('title = "demo"\n', "", "title"),
        ('path = "tests/test_x.py"', 'path = "../escape.py"', "checks.tests.0.path"),
        ('kind = "git"', 'kind = "svn"', "pins.commits.kind"),
        ('does_not_show = ["a leak"]', "does_not_show = []", "scope.does_not_show"),
        # a case expected absent records nothing else there, and names what is missing
        ("value = 1", 'not_present = ["m.f"]\nvalue = 1', "expect.base.probe_x/case.one"),
        ("value = 1", "not_present = []", "expect.base.probe_x/case.one.not_present"),
        ("value = 1", 'not_present = "m.f"', "expect.base.probe_x/case.one.not_present"),
    ],
)
def test_schema_errors_name_file_and_field(tmp_path, old, new, field):
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(ExperimentError) as caught:
        experiment.load_file(path)
    assert str(path) in caught.value.message
    assert field in caught.value.message
    assert caught.value.exit_code == 2


def test_a_case_can_be_expected_not_present(tmp_path):
    exp = experiment.load_file(write(tmp_path, GOOD.replace("value = 1", 'not_present = ["m.Feature(option=)"]')))
    assert exp.expectations["base"]["probe_x/case.one"] == {"not_present": ["m.Feature(option=)"]}


def test_invalid_toml(tmp_path):
    path = write(tmp_path, GOOD + "\n[[[")
    with pytest.raises(ExperimentError, match="not valid TOML"):
        experiment.load_file(path)


def test_missing_probe_file(tmp_path):
    path = write(tmp_path, GOOD, probe=False)
    with pytest.raises(ExperimentError, match=r"probe_x\.py does not exist"):
        experiment.load_file(path)


def test_expectation_for_unknown_probe(tmp_path):
    path = write(tmp_path, GOOD.replace('"probe_x/case.one"', '"other/case.one"'))
    with pytest.raises(ExperimentError, match="no probe named 'other'"):
        experiment.load_file(path)


def test_id_must_match_folder(tmp_path):
    path = write(tmp_path, GOOD.replace('id = "demo"', 'id = "other"'))
    with pytest.raises(ExperimentError, match="folder name"):
        experiment.load_file(path)


@pytest.mark.parametrize("bad", ["Experiment-A", "../x", "a", "x y", "-x"])
def test_bad_ids_are_rejected(bad):
    with pytest.raises(ExperimentError, match="bad experiment id"):
        experiment.find(bad)


def test_builtin_experiments_load():
    ids = experiment.list_ids()
    assert {"experiment-a", "experiment-b"} <= set(ids)
    for exp_id in ids:
        exp = experiment.load(exp_id)
        assert exp.scope.does_not_show


def test_builtin_pins_match_domain_table():
    a, b = experiment.load("experiment-a"), experiment.load("experiment-b")
    assert a.pin_sets["release"].base.version == "0.5.20" and a.pin_sets["release"].head.version == "0.5.21"
    assert b.pin_sets["release"].base.version == "0.5.19" and b.pin_sets["release"].head.version == "0.5.20"
    assert a.pin_sets["commits"].head.commit == "8f3d6944b76c428d884582cb6c82a39db1465360"
    assert b.pin_sets["commits"].base.commit == "9c254df8cdbe99ef5f58e7fcd932da052f258538"
    assert a.default_pin_set == b.default_pin_set == "release"
    c = experiment.load("experiment-c")  # #40645 + #41402: 0.5.20 -> 0.5.21, 0.5.22 as the later release
    assert c.pin_sets["release"].base.version == "0.5.20" and c.pin_sets["release"].head.version == "0.5.21"
    assert c.pin_sets["later-release"].head.version == "0.5.22"
    assert c.default_pin_set == "release" and set(c.pin_sets) == {"release", "later-release"}


VULNERABILITY = """
[vulnerability]
id = "CVE-2026-12345"
aliases = ["GHSA-8r8j-xvfj-36f9", "KVPROBE-2026-0001"]
fix_kind = "hardening"
"""


def test_vulnerability_table_is_loaded_and_optional(tmp_path):
    exp = experiment.load_file(write(tmp_path, GOOD + VULNERABILITY))
    assert exp.vulnerability.to_json() == {
        "id": "CVE-2026-12345",
        "aliases": ["GHSA-8r8j-xvfj-36f9", "KVPROBE-2026-0001"],
        "fix_kind": "hardening",
    }
    assert experiment.load_file(write(tmp_path, GOOD)).vulnerability is None


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('id = "CVE-2026-12345"', 'id = "SGLANG-PD-KV-38935"', "vulnerability.id"),
        ('fix_kind = "hardening"', 'fix_kind = "waste"', "vulnerability.fix_kind"),
        ('fix_kind = "hardening"', "", "vulnerability: 'fix_kind' is a required property"),
        ('"KVPROBE-2026-0001"]', '"CVE-2026-12345"]', "is the id itself"),
    ],
)
def test_bad_vulnerability_names_the_field(tmp_path, old, new, field):
    with pytest.raises(ExperimentError, match=field.replace(".", r"\.")):
        experiment.load_file(write(tmp_path, GOOD + VULNERABILITY.replace(old, new)))


def test_shipped_experiments_declare_their_vulnerability():
    kinds = {
        i: experiment.load(i).vulnerability
        for i in ("experiment-a", "experiment-b", "experiment-c", "experiment-f", "model")
    }
    assert {v.id for v in kinds.values()} == {"KVPROBE-2026-0001"}
    # #39500's checksum is opt-in detection on the vulnerability's path, not its fix
    assert kinds["experiment-f"].fix_kind.value == "hardening"
    # upstream calls #38935 a waste/latency fix; #36988 is the correctness (security) fix
    assert kinds["experiment-a"].fix_kind.value == "performance"
    assert kinds["experiment-b"].fix_kind.value == "security"
    # #40645 + #41402 fix ACK delivery (robustness of the page-lifetime protocol), not the vulnerability
    assert kinds["experiment-c"].fix_kind.value == "correctness"
