"""Rewriting [expect] tables keeps every other byte; TOML values read back exactly."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kvprobe.experiments import tomltext
from kvprobe.experiments.expectations import Recording, render_section, replace_section

PROBES = Path(__file__).resolve().parents[2] / "probes"


def _recording(values) -> Recording:
    return Recording("x", Path("experiment.toml"), "0" * 64, "run-1", values)


@pytest.mark.parametrize("name", ["experiment-a", "experiment-b"])
def test_replacing_keeps_the_rest_of_a_real_experiment(name):
    text = (PROBES / name / "experiment.toml").read_text()
    values = {"base": {"p/c.one": {"x": 1}}, "head": {"p/c.one": {"x": 2}}}
    new = replace_section(text, render_section(_recording(values)))
    old_data, new_data = tomllib.loads(text), tomllib.loads(new)
    assert new_data.pop("expect") == values
    old_data.pop("expect")
    assert new_data == old_data
    first = text.index("[expect.")
    assert new.startswith(text[:first])  # the comment above the first [expect] table stays
    assert new.count("[expect.") == 2


def test_interleaved_tables_and_comments_outside_are_kept():
    text = (
        'id = "x"  # keep\n\n[expect.base."p/a"]\nv = 1\n\n# about scope\n[scope]\nshows = "s"\n'
        '[expect.head."p/a"]\nv = 2\n# trailing\n'
    )
    new = replace_section(text, '[expect.base."p/b"]\nw = true\n')
    assert new == (
        'id = "x"  # keep\n\n[expect.base."p/b"]\nw = true\n\n# about scope\n[scope]\nshows = "s"\n# trailing\n'
    )


def test_appended_when_there_are_none():
    assert replace_section('id = "x"', '[expect.base."p/a"]\nv = 1\n') == 'id = "x"\n\n[expect.base."p/a"]\nv = 1\n'


@pytest.mark.parametrize(
    "value",
    [
        'quote " back \\ tab \t nl \n del \x7f é 😀',
        True,
        False,
        0,
        -(1 << 63),
        1.5,
        1e-300,
        [1, "a", [True]],
        {"k.e y": [1.0, {}]},
        [],
    ],
)
def test_values_read_back_exactly(value):
    text = f"{tomltext.key('a.b')} = {tomltext.value(value)}\n"
    got = tomllib.loads(text)["a.b"]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("value", [None, float("nan"), float("inf"), 1 << 63, [1, None], object()])
def test_values_toml_cannot_hold_are_refused(value):
    with pytest.raises(ValueError):
        tomltext.value(value)
