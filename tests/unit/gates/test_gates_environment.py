"""Gate 4 and what a log cannot tell (issue #27): the worker's environment as an input, a
release without the feature, verify's recomputation of the deferred checks, and the stderr
summary that names each check's own status (issue #25)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from kvprobe.cli import main
from kvprobe.cli.console import print_gate_diagnostics
from kvprobe.errors import UsageError
from kvprobe.files import json_bytes
from kvprobe.gates import environment, inputs, settings
from kvprobe.gates.fixmarkers import CodeTree, Presence, code_settings, find_all
from kvprobe.model.gates_receipt import (
    DeploymentScope,
    Gate4Basis,
    GateRecord,
    GatesReceipt,
    Inputs,
    TargetRecord,
    WorkerFacts,
)
from kvprobe.model.load import load
from kvprobe.model.receipt import Tool
from kvprobe.model.records import GateStatus
from kvprobe.rules import gate4 as gate4_rule
from kvprobe.rules.gate_status import Status
from tests.unit.gates.test_gates_logs import (
    GLM_CONTEXT,
    RAISED_POOL,
    _rewrite_receipt,
    fake_tree,
    server_args_dict,
    startup_log,
    write,
)

KEY = gate4_rule.ENV_KEY
D = "sglang/srt/disaggregation"


def pre_feature_tree(root: Path) -> Path:
    """An SGLang tree as 0.5.13 and 0.5.16 are: the disaggregation queues, no deferred release
    (none of its code, no such variable in environ.py), no checksum."""
    files = {
        "sglang/version.py": '__version__ = "0.5.13"\n',
        f"{D}/decode.py": "class DecodePreallocQueue:\n    pass\n",
        f"{D}/common/conn.py": "class CommonKVManager:\n    pass\n",
        f"{D}/base/conn.py": "class BaseKVManager:\n    pass\n",
        "sglang/srt/environ.py": "class Envs:\n    SGLANG_USE_MODELSCOPE = EnvBool(False)\n",
        "sglang/srt/server_args.py": "class ServerArgs:\n    kv_canary: str = 'none'\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# --- a release without the feature ----------------------------------------------------------------


def test_a_release_before_the_fix_has_it_absent_not_unknown(tmp_path):
    """Today the four gate-4 markers read unknown ("anchor not found") on 0.5.13."""
    tree = CodeTree(pre_feature_tree(tmp_path / "t"), release="0.5.13")
    found = {f.marker.pr: f for f in find_all(tree, 4)}
    assert {pr: f.presence for pr, f in found.items()} == {pr: Presence.ABSENT for pr in (40645, 41402, 41404, 41023)}
    assert "first ships in 0.5.21, this code is sglang 0.5.13" in found[40645].evidence
    unknown_version = CodeTree(tree.root, release=None)
    assert {f.presence for f in find_all(unknown_version, 4)} == {Presence.UNKNOWN}  # no version: no claim
    later = CodeTree(tree.root, release="0.5.22")  # should have the code: a refactor, not absence
    assert {f.presence for f in find_all(later, 4)} == {Presence.UNKNOWN}


def test_gate_4_fails_on_a_release_without_deferred_release(tmp_path):
    tree = CodeTree(pre_feature_tree(tmp_path / "t"), release="0.5.13")
    code = code_settings(tree)
    assert code.deferred_declared is False
    logs = [
        serverlog_of(startup_log("0.5.20", mode, RAISED_POOL, GLM_CONTEXT), f"{mode}.log")
        for mode in ("prefill", "decode")
    ]
    env = tmp_path / "env"
    env.write_text(f"{KEY}=1\n")  # set, but this release has no such thing
    sources = settings.collect_sources(logs, [], inputs.read_env([str(env)]))
    gate, _basis = settings.gate4(sources, tree, code, [])
    assert gate.status is Status.FAIL
    deferred = next(c for c in gate.checks if c.name == "decode: deferred KV release")
    assert deferred.status is Status.FAIL and "not in this release" in deferred.detail
    assert all(c.status is Status.FAIL for c in gate.checks if c.name.startswith("#"))
    gate3 = settings.gate3(sources, tree, code, [])
    assert gate3.status is Status.FAIL  # the checksum does not exist there either
    marker = next(c for c in gate3.checks if c.name == "#39500 in code")
    assert marker.status is Status.FAIL and "first ships in 0.5.21, this code is sglang 0.5.13" in marker.evidence


def serverlog_of(text: str, name: str):
    from kvprobe.gates import serverlog

    return serverlog.parse_log(text, name)


# --- the environment as an input ----------------------------------------------------------------


def test_an_env_file_is_read_and_only_the_gate_keys_kept(tmp_path):
    path = write(
        tmp_path,
        "decode.env",
        "# deployment env\nexport HF_TOKEN=hf_SECRET\n"
        f'{KEY}="true"\nSGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT=30 # seconds\nOTHER=x\n',
    )
    env = environment.read_env_file(path)
    assert env.values == {KEY: "true", "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "30"}
    assert env.where[KEY] == "decode.env:3" and env.secrets == {"hf_token"}


def pod(env: list[dict], name: str = "sglang-decode") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "decode-0"},
        "spec": {"containers": [{"name": name, "image": "lmsysorg/sglang:v0.5.21", "env": env}]},
    }


@pytest.mark.parametrize(
    "doc",
    [
        pod([{"name": KEY, "value": "1"}, {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "s"}}}]),
        {"kind": "List", "items": [pod([{"name": KEY, "value": "1"}])]},
        {"spec": {"template": {"spec": pod([{"name": KEY, "value": "1"}])["spec"]}}},
        [{"Id": "abc", "Config": {"Env": [f"{KEY}=1", "PATH=/usr/bin"]}}],  # docker inspect
    ],
    ids=["pod", "list", "deployment", "docker-inspect"],
)
def test_container_and_pod_specs_as_json_are_read(tmp_path, doc):
    env = environment.read_env_file(write(tmp_path, "spec.json", json.dumps(doc)))
    assert env.values == {KEY: "1"}


def test_what_a_spec_cannot_tell_is_said_and_disagreement_refused(tmp_path):
    from_secret = pod([{"name": KEY, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}])
    env = environment.read_env_file(write(tmp_path, "s.json", json.dumps(from_secret)))
    assert env.values == {} and "its value is not in the spec" in env.notes[0]
    two = pod([{"name": KEY, "value": "1"}])
    two["spec"]["containers"].append({"name": "sidecar", "env": [{"name": KEY, "value": "0"}]})
    with pytest.raises(ValueError, match="containers disagree"):
        environment.read_env_file(write(tmp_path, "two.json", json.dumps(two)))


def test_yaml_is_refused_with_the_reason(tmp_path):
    path = write(
        tmp_path, "pod.yaml", f"apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - env:\n    - name: {KEY}\n"
    )
    with pytest.raises(ValueError, match=r"looks like YAML.*no YAML parser among its dependencies"):
        environment.read_env_file(path)
    with pytest.raises(UsageError, match="--env"):
        inputs.read_env([str(path)])


def _sources(tmp_path: Path, env_text: str | None, role: str | None = "decode", backend: str = "mooncake"):
    logs = [
        serverlog_of(
            startup_log(
                "0.5.22",
                mode,
                RAISED_POOL,
                GLM_CONTEXT,
                args=server_args_dict("0.5.22", mode, disaggregation_transfer_backend=backend),
            ),
            f"{mode}.log",
        )
        for mode in ("prefill", "decode")
    ]
    envs = []
    if env_text is not None:
        path = write(tmp_path, "worker.env", env_text)
        envs = inputs.read_env([f"{role}={path}" if role else str(path)])
    return settings.collect_sources(logs, [], envs)


def test_gate_4_decides_from_the_given_environment(tmp_path):
    tree = CodeTree(fake_tree(tmp_path / "t", fixed=True), release="0.5.22")
    code = code_settings(tree)
    gate, basis = settings.gate4(_sources(tmp_path, None), tree, code, [])
    decode = next(c for c in gate.checks if c.name == "decode: deferred KV release")
    assert decode.status is Status.UNKNOWN
    assert "a log alone cannot decide this" in decode.detail and "--env" in decode.detail
    on, basis = settings.gate4(_sources(tmp_path, f"{KEY}=1\n", role=None), tree, code, [])
    assert on.status is Status.PASS
    assert basis.workers.decode[0].env_source == "worker.env:1"
    assert "taken for every worker" in next(c for c in on.checks if c.name == "decode: deferred KV release").detail
    off, _ = settings.gate4(_sources(tmp_path, f"{KEY}=0\n"), tree, code, [])
    check = next(c for c in off.checks if c.name == "decode: deferred KV release")
    assert check.status is Status.FAIL and "worker.env:1" in check.detail
    unsupported, _ = settings.gate4(_sources(tmp_path, f"{KEY}=1\n", role=None, backend="ascend"), tree, code, [])
    assert unsupported.status is Status.FAIL
    # the rule verify runs gives the same checks from the recorded basis
    assert gate4_rule.checks_from_basis(basis) == [c for c in on.checks if c.name.endswith("deferred KV release")]


def _bundle(tmp_path: Path, *extra: str) -> Path:
    logs = []
    for mode in ("prefill", "decode"):
        logs += ["--log", str(write(tmp_path, f"{mode}.log", startup_log("0.5.22", mode, RAISED_POOL, GLM_CONTEXT)))]
    out = tmp_path / "bundle"
    result = CliRunner().invoke(main, ["gates", *logs, *extra, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code in (1, 3), result.output
    return out


def test_the_cli_takes_env_and_records_it_by_name_and_digest(tmp_path):
    env = write(tmp_path, "decode.env", f"{KEY}=0\nHF_TOKEN=hf_SECRET\n")
    out = _bundle(tmp_path, "--env", f"decode={env}")
    receipt = json.loads((out / "receipt.json").read_text())
    [entry] = receipt["inputs"]["env"]
    assert entry["name"] == "decode.env" and entry["role_flag"] == "decode" and entry["redacted_keys"] == ["hf_token"]
    assert receipt["gate4"]["workers"]["decode"][0]["env_value"] == "0"
    assert "hf_SECRET" not in (out / "receipt.json").read_text()
    decode = next(c for c in receipt["gates"][3]["checks"] if c["name"] == "decode: deferred KV release")
    assert decode["status"] == "fail"  # off decides without --sglang
    assert receipt["gates"][3]["status"] == "fail"


def test_the_gate4_basis_is_read_as_typed_parts_and_written_back_byte_for_byte(tmp_path):
    """The receipt's ``gate4`` is a Gate4Basis of typed workers (no mapping past the reader), and
    the bytes on disk are what the model writes back."""
    env = write(tmp_path, "decode.env", f"{KEY}=0\n")
    data = (_bundle(tmp_path, "--env", f"decode={env}") / "receipt.json").read_bytes()
    typed = load(json.loads(data))
    assert isinstance(typed, GatesReceipt) and isinstance(typed.gate4, Gate4Basis)
    assert typed.gate4.release is None and [w.env_value for w in typed.gate4.workers.prefill] == [None]
    [decode] = typed.gate4.workers.decode
    assert isinstance(decode, WorkerFacts) and (decode.env_value, decode.env_source) == ("0", "decode.env:1")
    assert json_bytes(typed.to_json()) == data


def test_verify_recomputes_the_deferred_checks_from_the_recorded_basis(tmp_path):
    env = write(tmp_path, "decode.env", f"{KEY}=0\n")
    out = _bundle(tmp_path, "--env", f"decode={env}")

    def forged_on(receipt: dict) -> None:
        """The deferred check and gate 4 stated as passing over a basis that says off."""
        for check in receipt["gates"][3]["checks"]:
            if check["name"] == "decode: deferred KV release":
                check["status"], check["detail"] = "pass", "on, backend 'mooncake' supports it"

    assert _rewrite_receipt(out, forged_on) == "failed"


def test_verify_refuses_a_basis_edited_to_match_a_forged_check(tmp_path):
    """The basis itself rewritten to 'on' and the check to its detail: the check's status no
    longer follows (no --sglang: unknown), so the pass is still refused."""
    env = write(tmp_path, "decode.env", f"{KEY}=0\n")
    out = _bundle(tmp_path, "--env", f"decode={env}")

    def forged(receipt: dict) -> None:
        receipt["gate4"]["workers"]["decode"][0]["env_value"] = "1"
        for check in receipt["gates"][3]["checks"]:
            if check["name"] == "decode: deferred KV release":
                check["status"] = "pass"

    assert _rewrite_receipt(out, forged) == "failed"


# --- the stderr summary ---------------------------------------------------------------------------


def _gates_receipt(gates: list[dict]) -> GatesReceipt:
    """A gates receipt of these gates (what the summary reads), its other parts empty."""
    checks = [{"evidence": "-", **c} for g in gates for c in g["checks"]]
    assert all(set(c) == {"name", "status", "detail", "decides", "evidence"} for c in checks)
    typed = tuple(GateRecord.from_json({**g, "checks": [{"evidence": "-", **c} for c in g["checks"]]}) for g in gates)
    return GatesReceipt(
        "kvprobe.gates-receipt/4",
        Tool("0"),
        "r",
        "2026-01-01T00:00:00Z",
        "deployment",
        GateStatus.FAIL,
        1,
        typed,
        Inputs((), (), ()),
        (),
        None,
        (),
        None,
        {},
        DeploymentScope("s", (), (), "deployment"),
        {},
    )


def test_the_summary_prints_each_checks_own_status():
    receipt = {
        "gates": [
            {
                "number": 3,
                "status": "fail",
                "title": "t",
                "checks": [
                    {"name": "#39500 in code", "status": "unknown", "detail": "no code", "decides": True},
                    {"name": "read-integrity defence", "status": "fail", "detail": "neither", "decides": True},
                ],
            }
        ]
    }
    console = Console(record=True, width=200, color_system=None)
    print_gate_diagnostics(console, _gates_receipt(receipt["gates"]))
    lines = console.export_text().splitlines()
    assert lines == [
        "gate 3: fail — t",
        "gate 3, #39500 in code: unknown — no code",
        "gate 3, read-integrity defence: fail — neither",
    ]
    assert not [line for line in lines if "gate 3: fail" in line and "#39500" in line]


# --- verify holds the marker checks to their records --------------------------------------------


def test_a_marker_check_forged_to_pass_without_code_is_refused(tmp_path):
    out = _bundle(tmp_path)

    def forged(receipt: dict) -> None:
        for check in receipt["gates"][3]["checks"]:
            if check["name"] == "#41023 in code":
                check["status"], check["detail"] = "pass", "found"

    assert _rewrite_receipt(out, forged) == "failed"


def _marker_receipt(version: str, presence: str, evidence: str, status: str) -> tuple[TargetRecord, list[GateRecord]]:
    """A target with one marker record and gate 4 with its marker check (what the marker rule reads)."""
    record = {
        "pr": 41023,
        "gate": 4,
        "title": "t",
        "presence": presence,
        "evidence": evidence,
        "first_release": "0.5.21",
        "basis": "domain",
    }
    check = {"name": "#41023 in code", "status": status, "detail": "d", "evidence": evidence, "decides": True}
    target = {"spec": "s", "kind": "version", "identity": {"version": version}, "markers": [record], "settings": None}
    gate = {"number": 4, "title": "t", "status": status, "checks": [check]}
    return TargetRecord.from_json(target), [GateRecord.from_json(gate)]


@pytest.mark.parametrize(
    ("version", "presence", "status", "defect"),
    [
        ("0.5.13", "absent", "fail", None),
        ("0.5.13", "absent", "pass", "forged-verdict"),
        ("0.5.22", "absent", "fail", "record-mismatch"),  # 'predates the fix' on a release that does not
        (None, "absent", "fail", "record-mismatch"),
    ],
)
def test_absent_because_the_release_predates_the_fix_follows_from_its_version(version, presence, status, defect):
    from kvprobe.rules.markers import not_in_release
    from kvprobe.verify.gates_consistency import marker_check_defects

    target, gates = _marker_receipt(version, presence, not_in_release("0.5.21", version), status)
    found = marker_check_defects(target, gates)
    assert [d.code for d in found] == ([] if defect is None else [defect])
