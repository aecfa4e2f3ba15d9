"""`kvprobe gates`: check one SGLang PD deployment against the four acceptance gates.

DOMAIN.md: "A version number is not an acceptance". Each gate is decided from what the
deployment itself shows, and says which file or line decided it:

1. pool/context      the startup log of each worker (scheduler + KV allocation lines)
2. reject/admission  experiment A and B probes, head side, run against the operator's SGLang
3. transfer/read     #39500 in the code; checksum / KV canary active on both sides
4. lifetime          #40645 #41402 #41404 #41023 in the code; deferred release on and supported

A gate is ``pass`` only when every deciding check passed; any ``fail`` fails it; anything
not observed is ``unknown`` (never a pass). The bundle never copies the operator's logs or
arguments (they can hold keys): it records their sha256 and the lines that decided.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from kvprobe import __version__, files
from kvprobe.errors import BundleExistsError, UsageError
from kvprobe.evidence import compare, manifest
from kvprobe.evidence.bundle import file_ref, seal_bundle
from kvprobe.evidence.gate_status import RECORDED_EXIT_CODE, Status, combine
from kvprobe.gates import serverlog
from kvprobe.gates.fixmarkers import CodeSettings, Presence, Tree, code_settings, find_all
from kvprobe.progress import Reporter
from kvprobe.run import runner
from kvprobe.run.side import CheckContext, environment, run_probe
from kvprobe.names import GATES_RECEIPT_SCHEMA, LOGS_DIR, PROBES_DIR, RAW_DIR

GATE_EXPERIMENTS = ("experiment-a", "experiment-b")
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?$")


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    evidence: str = "-"
    decides: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail,
                "evidence": self.evidence, "decides": self.decides}


@dataclass(frozen=True)
class Gate:
    number: int
    title: str
    checks: tuple[Check, ...]

    @property
    def status(self) -> Status:
        return combine(c.status for c in self.checks if c.decides)

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "title": self.title, "status": self.status.value,
                "checks": [c.to_json() for c in self.checks]}


@dataclass
class GateOptions:
    logs: list[str] = field(default_factory=list)  # "FILE" or "prefill=FILE" / "decode=FILE"
    server_args: list[str] = field(default_factory=list)
    sglang: str | None = None
    out: Path | None = None
    cache_root: Path = field(default_factory=runner.default_cache_root)
    bundles_dir: Path = field(default_factory=lambda: Path("bundles"))
    torch_index: str | None = None
    timeout_s: float = 900.0


@dataclass(frozen=True)
class GatesResult:
    bundle: Path
    receipt: dict[str, Any]
    manifest_sha256: str

    @property
    def overall(self) -> Status:
        return Status(self.receipt["overall"])


# --- inputs --------------------------------------------------------------------------------

def split_role(spec: str, what: str) -> tuple[str | None, Path]:
    """``prefill=FILE`` / ``decode=FILE`` / ``FILE``; UsageError for a missing file."""
    role, sep, rest = spec.partition("=")
    if sep and role in serverlog.ROLES and rest:
        path = Path(rest)
    else:
        role, path = None, Path(spec)
    if not path.is_file():
        raise UsageError(f"{what} {spec!r}: no such file")
    return role, path


@dataclass(frozen=True)
class InputFile:
    path: Path
    role_flag: str | None
    sha256: str
    size: int

    def to_json(self, role: str | None) -> dict[str, Any]:
        return {"path": str(self.path), "role_flag": self.role_flag, "role": role,
                "sha256": self.sha256, "size": self.size}


def _input(role: str | None, path: Path) -> InputFile:
    return InputFile(path, role, files.sha256_file(path), path.stat().st_size)


def read_logs(specs: list[str]) -> list[tuple[InputFile, serverlog.WorkerLog]]:
    found = []
    for spec in specs:
        role, path = split_role(spec, "--log")
        text = path.read_text(encoding="utf-8", errors="replace")
        found.append((_input(role, path), serverlog.parse_log(text, str(path), role)))
    return found


def read_server_args(specs: list[str]) -> list[tuple[InputFile, str | None, serverlog.ServerArgs]]:
    """(file, role, args) per --server-args; the flag's role wins over the file's own."""
    found = []
    for spec in specs:
        role, path = split_role(spec, "--server-args")
        try:
            args = serverlog.read_args_file(path)
        except ValueError as exc:
            raise UsageError(f"--server-args {spec}: {exc}") from exc
        found.append((_input(role, path), role or args.role, args))
    return found


# --- gate 1: pool / context ----------------------------------------------------------------

def _fmt(n: int) -> str:
    return f"{n:,}"


def _main_kv(log: serverlog.WorkerLog) -> serverlog.KvLine | None:
    """The pool that holds full-attention KV: post-capture size if resized, else the allocation."""
    main = [k for k in log.kv_lines if k.label in (None, "Full")]
    resized = [k for k in main if k.kind == "post-capture"]
    allocated = [k for k in main if k.kind == "allocated"]
    return (resized or allocated or [None])[-1]


def pool_check(log: serverlog.WorkerLog) -> Check:
    name = f"{log.role or 'unknown role'}: {Path(log.path).name}"
    if log.problems and not log.pools:
        return Check(name, Status.UNKNOWN, "; ".join(log.problems), log.path)
    if not log.pools:
        kv = _main_kv(log)
        seen = f" (KV allocation #tokens {_fmt(kv.tokens)} seen, but no context length)" if kv else ""
        return Check(name, Status.UNKNOWN, "no 'max_total_num_tokens=... context_len=...' scheduler line: "
                     f"partial log or not an SGLang startup log{seen}", f"{log.path} ({log.lines} lines)")
    worst = min(log.pools, key=lambda p: p.pool_tokens - p.context_len)
    pool, context, evidence = worst.pool_tokens, worst.context_len, worst.evidence
    kv = _main_kv(log)
    if kv is not None and kv.tokens < pool:
        pool, evidence = kv.tokens, kv.evidence
    numbers = f"pool {_fmt(pool)} tokens, context {_fmt(context)} tokens"
    if kv is not None:
        numbers += f" (KV allocation #tokens {_fmt(kv.tokens)})"
    if log.role is None:
        return Check(name, Status.UNKNOWN, f"{numbers}; role unknown: no disaggregation_mode in the log, "
                     "pass --log prefill=FILE or --log decode=FILE", evidence.cite())
    if log.problems:
        return Check(name, Status.UNKNOWN, f"{numbers}; " + "; ".join(log.problems), evidence.cite())
    if log.role == "null":
        return Check(name, Status.INFO, f"{numbers}; not a PD worker (disaggregation_mode=null): "
                     "not counted for the PD gate", evidence.cite(), decides=False)
    if pool < context:
        return Check(name, Status.FAIL, f"{numbers}: the pool is {_fmt(context - pool)} tokens short of "
                     "the context it declares", evidence.cite())
    return Check(name, Status.PASS, f"{numbers}: the pool covers the context", evidence.cite())


def gate1(logs: list[serverlog.WorkerLog]) -> Gate:
    checks = [pool_check(log) for log in logs]
    for role in ("prefill", "decode"):
        if not any(log.role == role for log in logs):
            checks.append(Check(f"{role}: (no log)", Status.UNKNOWN,
                                f"no {role} worker startup log given: both sides must be checked"))
    return Gate(1, "pool/context: each worker's KV pool covers its context length", tuple(checks))


# --- gate 2: reject / admission (probes) ---------------------------------------------------

@dataclass(frozen=True)
class Target:
    """The operator's SGLang as a directory to put first on PYTHONPATH (it holds ``sglang/``)."""

    spec: str
    kind: str  # "version", "wheel", "path"
    import_root: Path
    code_root: Path
    identity: dict[str, Any]


def release_pins() -> dict[str, Any]:
    """version -> WheelPin for every sglang wheel the gate-2 experiments pin."""
    from kvprobe.experiments import experiment
    from kvprobe.model.records import SourceKind

    pins: dict[str, Any] = {}
    for exp_id in GATE_EXPERIMENTS:
        for pin_set in experiment.load(exp_id).pin_sets.values():
            if pin_set.kind is SourceKind.WHEEL:
                for pin in (pin_set.base, pin_set.head):
                    pins.setdefault(pin.version, pin)
    return pins


def resolve_target(spec: str, work: Path, cache_root: Path, reporter: Reporter) -> Target:
    """A version (pinned wheel), a wheel file or an installed package path; UsageError otherwise."""
    path = Path(spec)
    if path.is_dir():
        return _target_from_dir(spec, path, work)
    if path.is_file() and path.suffix == ".whl":
        return _target_from_wheel(spec, path, work)
    if VERSION_RE.match(spec):
        pins = release_pins()
        if spec not in pins:
            raise UsageError(f"--sglang {spec}: no pinned wheel for this version (pinned: "
                             f"{', '.join(sorted(pins))}); pass a wheel file or an installed package path")
        from kvprobe.sources.wheel import WheelSource

        tree = work / "target" / "tree"
        tree.parent.mkdir(parents=True)
        with reporter.step(f"materializing {pins[spec].filename}"):
            identity = WheelSource(cache_root, reporter=reporter).materialize(pins[spec], tree)
        return Target(spec, "version", tree, tree, identity)
    raise UsageError(f"--sglang {spec!r}: not a directory holding sglang/, a .whl file or a version like 0.5.22")


def _target_from_dir(spec: str, path: Path, work: Path) -> Target:
    path = path.resolve()
    if (path / "sglang" / "srt").is_dir():
        root = path
    elif path.name == "sglang" and (path / "srt").is_dir():
        root = path.parent
    else:
        raise UsageError(f"--sglang {spec}: neither {path}/sglang/srt nor {path}/srt exists")
    # Only sglang/ goes on PYTHONPATH: a whole site-packages would shadow the env's torch & co.
    link_root = work / "target" / "import"
    link_root.mkdir(parents=True)
    (link_root / "sglang").symlink_to(root / "sglang", target_is_directory=True)
    identity = {"kind": "path", "path": str(root), "version": _dist_version(root),
                "tree_sha256": _tree_digest(root / "sglang")}
    return Target(spec, "path", link_root, root, identity)


def _target_from_wheel(spec: str, path: Path, work: Path) -> Target:
    from kvprobe.model.records import WheelPin
    from kvprobe.sources.wheel import check_record, safe_unzip

    parts = path.name[:-4].split("-")
    digest = files.sha256_file(path)
    try:
        pin = WheelPin(parts[0], parts[1] if len(parts) > 1 else "", path.name, digest)
    except ValueError as exc:
        raise UsageError(f"--sglang {spec}: {exc}") from exc
    tree = work / "target" / "tree"
    tree.mkdir(parents=True)
    safe_unzip(path, tree)
    check_record(tree, pin)
    if not (tree / "sglang" / "srt").is_dir():
        raise UsageError(f"--sglang {spec}: the wheel holds no sglang/srt package")
    return Target(spec, "wheel", tree, tree, {**pin.identity(), "fetched_via": "local file"})


def _dist_version(root: Path) -> str | None:
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def _tree_digest(package: Path) -> str:
    """sha256 over (relative path, sha256) of every .py file: names the code that ran."""
    lines = [f"{files.sha256_file(p)}  {p.relative_to(package).as_posix()}\n"
             for p in sorted(package.rglob("*.py")) if p.is_file()]
    return manifest.sha256_bytes("".join(lines).encode())


def gate2_checks(exp, docs: dict[str, Any], problems: list[str]) -> list[Check]:
    """Head-side expectations of one experiment against the probe output from the target."""
    head_expect = exp.expectations.get("head", {})
    table = compare.case_table(docs)
    rows = compare.observation_rows({"head": head_expect}, {"base": {}, "head": table})
    label = f"{exp.id} (#{', #'.join(map(str, exp.fix.prs))})"
    if problems:
        return [Check(label, Status.UNKNOWN, "probe did not run to the end: " + "; ".join(problems))]
    if not table:
        return [Check(label, Status.UNKNOWN, "nothing ran: the probe reported no case")]
    checks = []
    for case in sorted(head_expect):
        case_rows = [r for r in rows if r["case"] == case and r["expected_head_declared"]]
        bad = [r for r in case_rows if not r["head_ok"]]
        if not bad:
            checks.append(Check(f"{exp.id}: {case}", Status.PASS,
                                f"{len(case_rows)}/{len(case_rows)} observations as fixed"))
            continue
        got = [f"{r['observation']} expected {r['expected_head']!r}, got "
               f"{r['head']!r}" if r["head_recorded"] else f"{r['observation']} not recorded" for r in bad]
        checks.append(Check(f"{exp.id}: {case}", Status.FAIL,
                            f"{len(case_rows) - len(bad)}/{len(case_rows)} as fixed; " + "; ".join(got[:4])))
    return checks


@dataclass
class _ProbeOutcome:
    checks: list[Check]
    refs: list[dict[str, Any]]


def run_gate2(target: Target | None, opts: GateOptions, staging: Path, work: Path, reporter: Reporter,
              held: contextlib.ExitStack | None = None) -> tuple[Gate, list[dict[str, Any]], dict[str, Any] | None]:
    """Gate 2, the probe references for the receipt and the env block (None when nothing ran)."""
    title = "reject/admission: fixes #38935 and #36988 behave as fixed on this SGLang"
    if target is None:
        return Gate(2, title, (Check("probes", Status.UNKNOWN,
                                     "no SGLang given: pass --sglang PATH|WHEEL|VERSION"),)), [], None
    from kvprobe.experiments import experiment

    run_opts = runner.RunOptions(cache_root=opts.cache_root, torch_index=opts.torch_index)
    checks, refs, env = [], [], None
    for exp in (experiment.load(i) for i in GATE_EXPERIMENTS):
        # any non-synthetic pin set: it only selects the experiment's dependency profile
        pin_set = next(p for p in exp.pin_sets.values() if p.kind.value != "synthetic")
        env, python, env_vars = environment(exp, pin_set, run_opts, reporter, held)
        outcome = _probe_experiment(exp, pin_set, target, python, env_vars, staging, work, opts, reporter)
        checks += outcome.checks
        refs += outcome.refs
    return Gate(2, title, tuple(checks)), refs, env


def _probe_experiment(exp, pin_set, target, python, env_vars, staging, work, opts, reporter) -> _ProbeOutcome:
    from kvprobe.model.records import Side

    probe_dir = staging / PROBES_DIR / exp.id
    probe_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(exp.directory / "experiment.toml", probe_dir / "experiment.toml")
    ctx = CheckContext(exp, pin_set, python, env_vars, staging, work, opts.timeout_s)
    scratch = work / "home" / exp.id
    scratch.mkdir(parents=True, exist_ok=True)
    docs, problems, refs = {}, [], []
    for check in exp.probes:
        shutil.copy2(exp.directory / check.path, probe_dir / check.path)
        with reporter.step(f"gate 2: {exp.id} probe {check.name} against {target.spec}"):
            ran = run_probe(ctx, Side.HEAD, [target.import_root], check,
                                    staging / RAW_DIR / "gate2" / exp.id, staging / LOGS_DIR / "gate2" / exp.id, scratch)
        run = ran["run"]
        if run.ok:
            docs[check.name] = run.output
        else:
            problems.append(run.problem)
        refs.append({"experiment": exp.id, "name": check.name,
                     "source": file_ref(probe_dir / check.path, staging),
                     "raw": file_ref(ran["raw"], staging), "exit_code": run.exit_code,
                     "problem": run.problem, "duration_s": round(run.duration_s, 3)})
    return _ProbeOutcome(gate2_checks(exp, docs, problems), refs)


# --- gates 3 and 4: settings and fix markers -----------------------------------------------

@dataclass(frozen=True)
class Sources:
    """Every place a worker's settings were read, by role."""

    args: dict[str, list[serverlog.ServerArgs]]
    logs: dict[str, list[serverlog.WorkerLog]]
    unassigned: list[serverlog.ServerArgs]


def collect_sources(logs: list[serverlog.WorkerLog],
                    files: list[tuple[InputFile, str | None, serverlog.ServerArgs]]) -> Sources:
    args: dict[str, list[serverlog.ServerArgs]] = {"prefill": [], "decode": []}
    by_role: dict[str, list[serverlog.WorkerLog]] = {"prefill": [], "decode": []}
    unassigned = []
    for log in logs:
        if log.role in by_role:
            by_role[log.role].append(log)
            if log.args is not None:
                args[log.role].append(log.args)
    for _file, role, parsed in files:
        if role in args:
            args[role].append(parsed)
        elif role is None:
            unassigned.append(parsed)
    return Sources(args, by_role, unassigned)


def marker_checks(tree: Tree | None, gate: int, findings_out: list) -> list[Check]:
    from kvprobe.gates.fixmarkers import MARKERS

    if tree is None:
        return [Check(f"#{m.pr} in code", Status.UNKNOWN, f"{m.title}: no code to read (pass --sglang)")
                for m in MARKERS if m.gate == gate]
    checks = []
    for finding in find_all(tree, gate):
        findings_out.append(finding)
        status = {Presence.PRESENT: Status.PASS, Presence.ABSENT: Status.FAIL}.get(finding.presence, Status.UNKNOWN)
        checks.append(Check(f"#{finding.marker.pr} in code", status,
                            f"{finding.marker.title}: {finding.presence.value}", finding.evidence))
    return checks


def checksum_state(args: serverlog.ServerArgs, code: CodeSettings | None) -> tuple[Status, str]:
    value = args.values.get("disaggregation_enable_kv_checksum")
    if code is not None and not code.has_checksum_flag:
        return Status.FAIL, "not present in this release (--disaggregation-enable-kv-checksum does not exist)"
    if value is None:
        if args.full_dump:
            return Status.FAIL, "not present in this release (the resolved server_args have no such field)"
        if code is not None:
            return Status.FAIL, "off (flag not given; its default is False)"
        return Status.UNKNOWN, "not in these arguments, and the release is unknown (no --sglang)"
    if not serverlog.as_bool(value):
        return Status.FAIL, "off"
    device = args.values.get("device")
    if device not in (None, "cuda"):
        return Status.FAIL, (f"on, but device={device!r}: the checksum kernels run on CUDA only "
                             "(KvChecksumComputer): does not count as a defence")
    if args.values.get("disaggregation_transfer_backend") == "fake":
        return Status.FAIL, "on, but transfer backend 'fake' moves no KV: does not count as a defence"
    return Status.PASS, "on"


def canary_state(role: str, sources: Sources) -> tuple[Status, str, str]:
    """Active only when the worker's log shows install_canary (DOMAIN: logs must show it)."""
    logs = sources.logs[role]
    modes = {str(a.values["kv_canary"]) for a in sources.args[role] if "kv_canary" in a.values}
    configured = bool(modes - {"none"})
    if logs and all(log.canary is not None for log in logs):
        return Status.PASS, "active: install_canary logged", logs[0].canary.cite()
    if logs and any(log.pools for log in logs):  # a complete startup that never installed it
        missing = next(log for log in logs if log.canary is None)
        why = (f"configured (kv_canary={'/'.join(sorted(modes))}) but" if configured else "off:")
        return Status.FAIL, f"{why} no install_canary line in the startup log", missing.path
    if modes and not configured:
        return Status.FAIL, "off (kv_canary=none)", sources.args[role][0].evidence.cite()
    if configured:
        return Status.UNKNOWN, "configured, but no startup log shows it installed", "-"
    return Status.UNKNOWN, "no log or arguments for this worker", "-"


def _role_args_state(role: str, sources: Sources, fn) -> tuple[Status, str, str]:
    """Decide per worker of ``role``; every worker must pass. Logs are the workers' own record."""
    workers = worker_args(role, sources)
    if not workers:
        return Status.UNKNOWN, f"no server arguments for the {role} worker (log line or --server-args)", "-"
    states = [(fn(args), args, notes) for args, notes in workers]
    status = combine(s for (s, _d), _a, _n in states)
    (_, detail), args, notes = next((x for x in states if x[0][0] is status), states[0])
    return status, detail + "".join(f"; {n}" for n in notes), args.evidence.cite()


def worker_args(role: str, sources: Sources) -> list[tuple[serverlog.ServerArgs, list[str]]]:
    """Each worker's arguments: its log line, completed by the --server-args files for the role.

    Files add what a log cannot show (the environment); where both name a key the log wins,
    because it is what the process printed, and the disagreement is noted.
    """
    from_logs = [log.args for log in sources.logs[role] if log.args is not None]
    files = [a for a in sources.args[role] if a not in from_logs]
    extra_values: dict[str, Any] = {}
    extra_env: dict[str, str] = {}
    for args in files:
        extra_values.update(args.values)
        extra_env.update(args.env)
    if not from_logs:
        return [(a, []) for a in files]
    merged = []
    for args in from_logs:
        notes = [f"--server-args says {k}={v!r}, the log {args.values[k]!r}: the log wins"
                 for k, v in extra_values.items() if k in args.values and args.values[k] != v]
        merged.append((serverlog.ServerArgs({**extra_values, **args.values}, {**extra_env, **args.env},
                                            args.full_dump, args.evidence), notes))
    return merged


def gate3(sources: Sources, tree: Tree | None, code: CodeSettings | None, findings: list) -> Gate:
    checks = marker_checks(tree, 3, findings)
    per_role = {}
    for role in ("prefill", "decode"):
        cs = _role_args_state(role, sources, lambda a: checksum_state(a, code))
        cn = canary_state(role, sources)
        per_role[role] = (cs[0], cn[0])
        checks.append(Check(f"{role}: KV checksum", cs[0], cs[1], cs[2], decides=False))
        checks.append(Check(f"{role}: KV canary", cn[0], cn[1], cn[2], decides=False))
    checks += _unassigned(sources)
    checksum_both = combine(per_role[r][0] for r in per_role)
    canary_both = combine(per_role[r][1] for r in per_role)
    if Status.PASS in (checksum_both, canary_both):
        which = "checksum" if checksum_both is Status.PASS else "KV canary"
        defence = Check("read-integrity defence", Status.PASS, f"{which} active on prefill and decode")
    elif checksum_both is Status.FAIL and canary_both is Status.FAIL:
        defence = Check("read-integrity defence", Status.FAIL, "neither the handoff checksum nor the KV canary "
                        "is active on both sides: HTTP 200 or transfer-complete is no proof of what decode read")
    else:
        defence = Check("read-integrity defence", Status.UNKNOWN,
                        "could not establish that a checksum or canary is active on both sides")
    return Gate(3, "transfer/read: what decode reads is verified (#39500; checksum or canary active)",
                (*checks, defence))


def deferred_state(args: serverlog.ServerArgs, code: CodeSettings | None) -> tuple[Status, str]:
    raw = args.env.get("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE")
    if raw is None:
        default = "unknown" if code is None or code.deferred_default is None else (
            "on" if code.deferred_default else "off")
        return Status.UNKNOWN, (f"not observed: SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE not given "
                                f"(release default: {default}); add an \"env\" object to the --server-args JSON")
    if not serverlog.as_bool(raw):
        return Status.FAIL, f"off (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE={raw})"
    backend = args.values.get("disaggregation_transfer_backend", "mooncake" if args.full_dump else None)
    if code is None:
        return Status.UNKNOWN, f"on; whether backend {backend!r} supports it is unknown without --sglang"
    if not code.deferred_capability_flag:
        return Status.UNKNOWN, (f"on; this release declares no per-backend support, so whether backend "
                                f"{backend!r} acks drains cannot be read from the code")
    if backend not in code.deferred_backends:
        return Status.FAIL, (f"on, but backend {backend!r} does not support it in this release (supported: "
                             f"{', '.join(code.deferred_backends) or 'none'}): does not count as a defence")
    return Status.PASS, f"on, backend {backend!r} supports it"


def gate4(sources: Sources, tree: Tree | None, code: CodeSettings | None, findings: list) -> Gate:
    checks = marker_checks(tree, 4, findings)
    for role in ("prefill", "decode"):
        status, detail, evidence = _role_args_state(role, sources, lambda a: deferred_state(a, code))
        checks.append(Check(f"{role}: deferred KV release", status, detail, evidence))
    checks += _unassigned(sources)
    return Gate(4, "lifetime/ownership: pages outlive in-flight writes (#40645 #41402 #41404 #41023; deferred release)",
                tuple(checks))


def _unassigned(sources: Sources) -> list[Check]:
    return [Check("server args (role?)", Status.INFO, "no disaggregation_mode in these arguments: "
                  "use --server-args prefill=FILE or decode=FILE", a.evidence.cite(), decides=False)
            for a in sources.unassigned]


# --- orchestration and bundle --------------------------------------------------------------

def run_gates(opts: GateOptions, reporter: Reporter | None = None) -> GatesResult:
    """Decide all four gates and write the bundle; raises only on bad input or a broken env."""
    reporter = reporter or Reporter()
    if not (opts.logs or opts.server_args or opts.sglang):
        raise UsageError("nothing to check: give --log, --server-args and/or --sglang")
    started = datetime.now(timezone.utc)
    clock = time.monotonic()
    logs = read_logs(opts.logs)
    files = read_server_args(opts.server_args)
    final = _final_path(opts, started)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    work = Path(tempfile.mkdtemp(prefix="kvprobe-gates-"))
    timings: dict[str, float] = {"read_inputs_s": time.monotonic() - clock}
    held = contextlib.ExitStack()  # the env's lease: `cache prune` leaves it alone until we end
    try:
        clock = time.monotonic()
        target = resolve_target(opts.sglang, work, opts.cache_root, reporter) if opts.sglang else None
        tree = Tree(target.code_root) if target else None
        code = code_settings(tree) if tree else None
        timings["materialize_s"] = time.monotonic() - clock
        clock = time.monotonic()
        gate2, probe_refs, env = run_gate2(target, opts, staging, work, reporter, held)
        timings["gate2_s"] = time.monotonic() - clock
        worker_logs = [log for _f, log in logs]
        sources = collect_sources(worker_logs, files)
        findings: list = []
        gates = (gate1(worker_logs), gate2, gate3(sources, tree, code, findings), gate4(sources, tree, code, findings))
        receipt = build_receipt(started, gates, logs, files, target, findings, code, probe_refs, env, timings)
        digest = seal_bundle(receipt, GATES_RECEIPT_SCHEMA, render_readme(receipt), staging, final)
        return GatesResult(final, receipt, digest)
    finally:
        held.close()
        shutil.rmtree(work, ignore_errors=True)
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _final_path(opts: GateOptions, started: datetime) -> Path:
    if opts.out is not None:
        if opts.out.exists() and (not opts.out.is_dir() or any(opts.out.iterdir())):
            raise BundleExistsError(f"--out {opts.out} exists and is not empty; refusing to overwrite")
        return opts.out.resolve()
    return (opts.bundles_dir / f"gates-{started.strftime('%Y%m%dT%H%M%SZ')}").resolve()


def overall(gates: Iterable[Gate]) -> Status:
    return combine(g.status for g in gates)


def build_receipt(started, gates, logs, files, target, findings, code, probe_refs, env, timings) -> dict[str, Any]:
    verdict = overall(gates)
    return {
        "schema": GATES_RECEIPT_SCHEMA,
        "tool": {"name": "kvprobe", "version": __version__},
        "run_id": f"gates-{started.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:6]}",
        "created_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "layer": "deployment",
        "overall": verdict.value,
        "exit_code": RECORDED_EXIT_CODE[verdict],
        "gates": [g.to_json() for g in gates],
        "inputs": {"logs": [f.to_json(log.role) for f, log in logs],
                   "server_args": [f.to_json(role) for f, role, _a in files]},
        "workers": [_worker_json(log) for _f, log in logs],
        "target": None if target is None else {
            "spec": target.spec, "kind": target.kind, "identity": target.identity,
            "markers": [{"pr": f.marker.pr, "gate": f.marker.gate, "title": f.marker.title,
                         "presence": f.presence.value, "evidence": f.evidence,
                         "first_release": f.marker.first_release, "basis": f.marker.basis} for f in findings],
            "settings": None if code is None else {
                "checksum_flag": code.has_checksum_flag, "checksum_evidence": code.checksum_evidence,
                "canary_flag": code.has_canary_flag, "deferred_default": code.deferred_default,
                "deferred_evidence": code.deferred_evidence,
                "deferred_backends": list(code.deferred_backends) if code.deferred_capability_flag else None},
        },
        "probes": probe_refs,
        "env": env,
        "host": {"system": platform.system(), "machine": platform.machine(), "release": platform.release(),
                 "python": platform.python_version(), "cpus": os.cpu_count() or 0},
        "evidence": {
            "layer": "deployment",
            "shows": ("What this deployment's own startup logs, server arguments and SGLang code say about the "
                      "four acceptance gates, and how the experiment A/B probes behave on that code (CPU, mocked "
                      "transport)."),
            "does_not_show": [
                "that no cross-request KV exposure happened or can happen: nothing here serves a request",
                "GPU, RDMA or transport behaviour: gate 2 probes mock the KV transport, pools and scheduler",
                "settings the process really ran with beyond what its log and the given files show "
                "(environment variables are seen only when given)",
            ],
            "limits": [f"host: {platform.system()} {platform.machine()}, CPU only",
                       "fix markers are code patterns measured on 0.5.19..0.5.22; a refactor may read as unknown",
                       "operator logs and argument files are not copied into the bundle: their sha256 and the "
                       "deciding lines are"],
        },
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }


def _worker_json(log: serverlog.WorkerLog) -> dict[str, Any]:
    kv = _main_kv(log)
    return {
        "log": log.path, "role": log.role, "role_flag": log.role_flag, "role_from_log": log.role_from_log,
        "pools": [{"pool_tokens": p.pool_tokens, "context_len": p.context_len, "ranks": p.ranks,
                   "evidence": p.evidence.cite()} for p in log.pools],
        "kv_allocations": [{"label": k.label, "kind": k.kind, "tokens": k.tokens, "evidence": k.evidence.cite()}
                           for k in log.kv_lines],
        "main_kv_tokens": kv.tokens if kv else None,
        "canary": log.canary.cite() if log.canary else None,
        "args": serverlog.redacted(log.args.values) if log.args else None,
        "problems": list(log.problems), "lines": log.lines,
    }


def render_readme(receipt: dict[str, Any]) -> str:
    lines = [f"# kvprobe gates: {receipt['overall']}", "",
             "Layer: deployment. Exit code: " + str(receipt["exit_code"]) + " (0 all pass, 1 a gate failed, "
             "3 could not decide).", ""]
    for gate in receipt["gates"]:
        lines += [f"## Gate {gate['number']}: {gate['status']}", "", gate["title"], "",
                  "| check | status | detail | evidence |", "| --- | --- | --- | --- |"]
        for c in gate["checks"]:
            status = c["status"] if c["decides"] else f"{c['status']} (info)"
            lines.append(f"| {_md(c['name'])} | {status} | {_md(c['detail'])} | {_md(c['evidence'])} |")
        lines.append("")
    lines += ["What this does not show:", *[f"- {x}" for x in receipt["evidence"]["does_not_show"]], "",
              "Check the files: `sha256sum -c --strict SHA256SUMS`.", ""]
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
