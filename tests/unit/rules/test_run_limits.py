"""rules/run_limits: the limits a run receipt states, from the facts it records."""

from __future__ import annotations

from kvprobe.model.records import SourceKind
from kvprobe.rules.run_limits import run_limits

HOST = {"system": "Linux", "machine": "x86_64"}
TORCH = {"version": "2.14.1+cu130", "cuda": "13.0", "cuda_available": False}


def test_a_git_run_without_torch_states_the_host_alone():
    assert run_limits(HOST, SourceKind.GIT, None, None, None) == [
        "host: Linux x86_64, CPU only; no GPU, RDMA or model weights"
    ]


def test_a_wheel_run_says_which_tests_it_ran_and_its_torch():
    bare = run_limits(HOST, SourceKind.WHEEL, None, TORCH, "pypi")
    assert bare[1] == "release wheels carry no upstream tests: only the probes ran on these pins"
    assert bare[2] == "torch 2.14.1+cu130 (cuda build 13.0, cuda available: False) from pypi"
    with_tests = run_limits(HOST, SourceKind.WHEEL, "a" * 40, None, None)
    assert with_tests[1].startswith(f"code from release wheels, test files from upstream commit {'a' * 40}:")
    assert len(with_tests) == 2
