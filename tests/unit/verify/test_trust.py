"""What verify trusts (issue #11): kvprobe's installed copy of a known experiment, consent
before a bundle's own code runs, README.md tied to the receipt, and exit 4 for a crash.

The runner is replaced in the rerun cases (no subprocess here): they check what would run
and whether it may, not the run itself (tests/attacks runs it for real).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe import __version__
from kvprobe.cli import main
from kvprobe.evidence.reader import Bundle
from kvprobe.evidence.safetree import Limits, Tree
from kvprobe.model.receipt import Receipt
from kvprobe.resources import builtin_probes_dir, builtin_search_path, experiment_dirs
from kvprobe.run.rerun import RerunOptions, bundle_code, rerun
from kvprobe.verify.anchor import compare_installed, installed_experiment
from kvprobe.verify.steps import VerifyOptions, verify
from tests import forge

MODEL_BUNDLE = Path(__file__).resolve().parents[3] / "bundles" / "model-model-20261201T112733Z"


@pytest.fixture
def model(tmp_path) -> Path:
    return forge.copy(MODEL_BUNDLE, tmp_path / "model-bundle")


def cli_verify(bundle: Path, *args: str) -> tuple[int, dict, str]:
    result = CliRunner().invoke(main, ["verify", str(bundle), "--json", *args], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout), result.stderr


def step(doc: dict, number: int) -> dict:
    return doc["steps"][number - 1]


# --- the installed copy is the trust anchor ------------------------------------------------


def test_an_untouched_known_bundle_is_named_as_the_installed_experiment(model):
    code, doc, err = cli_verify(model)
    assert code == 0
    assert f"probes/model/: same as kvprobe {__version__}'s model" in step(doc, 5)["notes"][0]
    assert "agrees with itself, nothing more" in " ".join(err.split())


@pytest.mark.parametrize("name", ["pd_model.py", "experiment.toml"])
def test_a_swapped_file_differs_from_the_installed_copy(model, name):
    rel = f"probes/model/{name}"
    (model / rel).write_bytes((model / rel).read_bytes() + b"\n# swapped\n")
    forge.recite(model, rel)
    if name == "experiment.toml":
        forge.edit_receipt(model, lambda r: r["experiment"].update(sha256=forge.sha((model / rel).read_bytes())))
    code, doc, _ = cli_verify(model)
    assert code == 1 and step(doc, 4)["status"] == "pass"  # consistent in itself
    [defect] = step(doc, 5)["defects"]
    assert (defect["code"], defect["path"]) == ("differs-from-installed", rel)
    assert f"differs from kvprobe {__version__}'s model" in defect["detail"]


def test_an_extra_file_beside_the_probes_is_named(model):
    (model / "probes/model/sitecustomize.py").write_bytes(b"raise SystemExit\n")
    forge.rehash(model)
    code, doc, _ = cli_verify(model)
    assert code == 1
    assert [(d["code"], d["path"]) for d in step(doc, 5)["defects"]] == [
        ("differs-from-installed", "probes/model/sitecustomize.py")
    ]


def test_the_installed_copy_never_comes_from_the_search_path(tmp_path, monkeypatch):
    shadow = tmp_path / "probes" / "model"
    shadow.mkdir(parents=True)
    (shadow / "experiment.toml").write_text('id = "model"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVPROBE_PROBES_PATH", str(tmp_path / "probes"))
    assert installed_experiment("model") == builtin_probes_dir() / "model"
    assert installed_experiment("forge-exp") is None
    assert installed_experiment("../model") is None
    assert experiment_dirs()[0] == (tmp_path / "probes").resolve()
    with builtin_search_path():
        assert experiment_dirs() == [builtin_probes_dir().resolve()]


def test_an_unknown_experiment_has_no_anchor(bundle):
    report = verify(bundle)
    assert report.outcome == "self-consistent"
    assert any("not an experiment this kvprobe ships" in n for n in report.steps[4].notes)
    with Tree(bundle) as tree:
        loaded = Bundle(tree, Limits(), receipt=report.receipt, manifest=report.manifest)
        assert compare_installed(loaded, Receipt.from_json(report.receipt)) is None


# --- README.md ---------------------------------------------------------------------------


def test_an_edited_readme_is_a_defect(model):
    (model / "README.md").write_text("# experiment-a: reproduced on 8x H100\n")
    forge.rehash(model)
    code, doc, _ = cli_verify(model)
    assert code == 1
    assert [(d["code"], d["path"]) for d in step(doc, 4)["defects"]] == [("readme-mismatch", "README.md")]


def test_a_readme_of_a_claimed_other_kvprobe_version_is_still_checked(bundle):
    """tool.version is the receipt's own claim: it never exempts README.md from the check."""
    forge.edit_receipt(bundle, lambda r: r["tool"].update(version="0.0.9"))
    (bundle / "README.md").write_text("# rendered by 0.0.9\n")
    forge.rehash(bundle)
    code, doc, _ = cli_verify(bundle)
    assert code == 1
    (defect,) = step(doc, 4)["defects"]
    assert (defect["code"], defect["path"]) == ("readme-mismatch", "README.md")
    assert "rendered by kvprobe 0.0.9" in defect["detail"]


# --- step 6: consent before a bundle's own code runs -------------------------------------


def _fake_run(seen: list):
    from kvprobe.model.receipt import Receipt
    from kvprobe.run.workspace import SealedBundle

    def run_experiment(exp, opts, reporter=None):
        seen.append(exp.directory)
        return SealedBundle(opts.out, Receipt.from_json(forge.load(SOURCE[0], "receipt.json")), "0" * 64)

    return run_experiment


SOURCE: list[Path] = []


def _rerun(bundle: Path, consent) -> tuple[dict, list]:
    with Tree(bundle) as tree:
        report = verify(bundle)
        loaded = Bundle(tree, Limits(), receipt=report.receipt, manifest=report.manifest)
        result = rerun(loaded, RerunOptions(consent=consent))
    return result.to_json(), bundle_code(loaded)


def test_bundle_code_runs_only_with_consent_and_its_digests_are_shown(bundle, monkeypatch):
    SOURCE[:] = [bundle]
    seen: list = []
    monkeypatch.setattr("kvprobe.run.runner.run_experiment", _fake_run(seen))
    asked: list = []

    result, files = _rerun(bundle, None)
    assert result["status"] == "could-not-run" and "--trust-bundle-code" in result["notes"][0] and seen == []
    result, _ = _rerun(bundle, lambda shown: asked.append(shown) or False)
    assert result["status"] == "could-not-run" and seen == []
    assert asked[0][: len(files)] == [(rel, f"sha256 {digest}") for rel, digest in files]
    assert files == [(rel, forge.sha((bundle / rel).read_bytes())) for rel, _ in files]
    listed = forge.load(bundle, "manifest.json")["files"]
    assert [rel for rel, _ in files] == [f["path"] for f in listed if f["path"].startswith("probes/forge-exp/")]
    result, _ = _rerun(bundle, lambda shown: True)
    assert result["status"] == "pass" and len(seen) == 1 and seen[0] != bundle / "probes" / forge.EXP_ID


def test_consent_is_shown_the_upstream_commits_whose_tests_run_too(bundle, monkeypatch):
    """--trust-bundle-code listed only probes/<id>/, yet the bundle's experiment file also
    decides which upstream's tests and conftest.py pytest imports, at which commits (#28)."""
    SOURCE[:] = [bundle]
    monkeypatch.setattr("kvprobe.run.runner.run_experiment", _fake_run([]))
    asked: list = []
    _rerun(bundle, lambda shown: asked.append(shown) or False)
    extra = [(what, identity) for what, identity in asked[0] if not what.startswith("probes/")]
    assert [identity for _, identity in extra] == [f"commit {forge.BASE_SHA}", f"commit {forge.HEAD_SHA}"]
    assert all("https://example.invalid/upstream" in what and "conftest.py" in what for what, _ in extra)


def test_the_rerun_runs_the_verified_bytes_not_a_second_read(bundle, monkeypatch):
    """A probe file rewritten after verification (between the hash and the copy) is not run:
    the private copy is hashed as it is made and must be what was verified and shown."""
    SOURCE[:] = [bundle]
    seen: list = []
    monkeypatch.setattr("kvprobe.run.runner.run_experiment", _fake_run(seen))
    with Tree(bundle) as tree:
        report = verify(bundle)
        loaded = Bundle(tree, Limits(), receipt=report.receipt, manifest=report.manifest)
        (rel, _digest), *_ = [f for f in bundle_code(loaded) if f[0].endswith(".py")]
        (bundle / rel).write_bytes((bundle / rel).read_bytes() + b"\nprint('swapped after verify')\n")
        result = rerun(loaded, RerunOptions(consent=lambda shown: True)).to_json()
    assert result["status"] == "fail" and seen == []
    assert "changed after it was verified" in json.dumps(result)


def test_a_known_experiment_reruns_the_installed_copy_without_asking(model, monkeypatch):
    SOURCE[:] = [model]
    seen: list = []
    monkeypatch.setattr("kvprobe.run.runner.run_experiment", _fake_run(seen))
    result, _ = _rerun(model, lambda shown: pytest.fail("asked for consent"))
    assert result["status"] == "pass", result
    assert seen == [builtin_probes_dir() / "model"]


def test_no_rerun_after_a_wrong_published_digest(model, monkeypatch):
    monkeypatch.setattr("kvprobe.run.runner.run_experiment", lambda *a, **k: pytest.fail("rerun started"))
    code, doc, _ = cli_verify(model, "--rerun", "--expect-manifest-sha256", "f" * 64)
    assert code == 1 and [s["status"] for s in doc["steps"]][4:] == ["fail", "skipped"]


def test_a_pipe_is_never_consent(bundle, monkeypatch):
    monkeypatch.setattr("kvprobe.run.runner.run_experiment", lambda *a, **k: pytest.fail("bundle code ran"))
    result = CliRunner().invoke(main, ["verify", str(bundle), "--rerun"], input="y\ny\n", catch_exceptions=False)
    assert result.exit_code == 3
    assert "--trust-bundle-code" in result.stderr


def test_verify_options_can_leave_out_the_installed_copy(model):
    (model / "probes/model/pd_model.py").write_bytes(b"# a project's own edit\n")
    forge.rehash(model)
    assert verify(model).outcome == "failed"
    assert verify(model, VerifyOptions(check_installed=False)).outcome == "self-consistent"


# --- exit codes --------------------------------------------------------------------------


def test_a_crash_is_exit_4_with_one_line(monkeypatch):
    def crash() -> list[str]:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr("kvprobe.experiments.experiment.list_ids", crash)
    result = CliRunner().invoke(main, ["list"])
    assert result.exit_code == 4
    assert result.stderr.splitlines()[0] == "kvprobe: internal error: RuntimeError: boom second line"
    assert "Traceback" not in result.stderr
    debug = CliRunner().invoke(main, ["--debug", "list"])
    assert debug.exit_code == 4 and "Traceback" in debug.stderr


def test_the_internal_error_code_is_documented():
    result = CliRunner().invoke(main, ["--help"])
    assert "4 internal error" in " ".join(result.output.split())
