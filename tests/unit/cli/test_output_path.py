"""One output path (issue #24): every command writes through the CLI's one helper.

Results go to stdout (cli.console.Output, made by cli.base.streams_for; a --json document
through cli.base.emit_json, naming its schema); progress and diagnostics go to stderr; -q
silences progress, -qq results and diagnostics as well (warnings and errors stay).

Every command kvprobe has runs here in process (CliRunner) on cheap inputs, plain, with -q,
with -qq and with --json. The core of `run`, `sweep` and `new` (an env, wheels, git) is
replaced by a stand-in that reports progress through the reporter the command hands it and
returns a real result: what is checked is where the CLI writes, not what the core computes.
A command added without a case here fails the first test.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from kvprobe.cli import main
from kvprobe.sources.treecache import TreeCache
from tests import forge
from tests.attacks.gatelogs import CONTEXT, INCIDENT, RAISED, startup_log

REPO = Path(__file__).resolve().parents[3]
SWEEP_BUNDLE = next((REPO / "bundles").glob("experiment-a-sweep-*"))
STEP_MARKS = ("… ", "✓ ", "✗ ")  # the plain reporter's step lines (stderr is a pipe here)
WARNING_PREFIXES = ("warning: ", "kvprobe: warning: ", "kvprobe: error: ")


class World:
    """Inputs every case draws on, made once per test: a forged run bundle, a signing key,
    gate logs, a cache with one tree, no kept server, and a fresh path per invocation."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bundle = forge.build(root / "bundle")
        self.key = root / "key.pem"
        self.key.write_bytes(
            ed25519.Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        self.logs: list[str] = []
        for role, pool in (("prefill", RAISED), ("decode", INCIDENT)):
            log = root / f"{role}.log"
            log.write_text(startup_log(role, pool, CONTEXT, canary=True))
            self.logs += ["--log", str(log)]
        self.cache = root / "cache"

        def fill(dest: Path) -> None:
            (dest / "pkg").mkdir(parents=True)
            (dest / "pkg" / "__init__.py").write_text("VALUE = 1\n")

        TreeCache(self.cache).ensure("sglang-0.0.0-source", fill)
        self._count = 0

    def fresh(self, name: str) -> str:
        """A path no invocation used yet (an --out or -o target)."""
        self._count += 1
        return str(self.root / f"{name}-{self._count}")


@dataclass(frozen=True)
class Case:
    command: tuple[str, ...]
    args: Callable[[World], list[str]]
    exit: int = 0
    progress: tuple[str, ...] = ()  # what the plain invocation's progress on stderr says

    @property
    def id(self) -> str:
        return " ".join(self.command) + ("" if self.args.__name__ == "<lambda>" else f" ({self.args.__name__})")


def _report_to_file(w: World) -> list[str]:
    return [str(w.bundle), "-o", w.fresh("report.md")]


def _attest_to_file(w: World) -> list[str]:
    return [str(w.bundle), "--key", str(w.key), "-o", w.fresh("envelope.json")]


CASES = [
    Case(("list",), lambda w: []),
    Case(("show",), lambda w: ["model"]),
    Case(
        ("new",),
        lambda w: ["x-probe", "--release-base", "0.5.1", "--release-head", "0.5.2"],
        progress=("looking up the release wheels",),
    ),
    Case(("run",), lambda w: ["experiment-a", "--out", w.fresh("run")], progress=("running checks", "base: 1 probe")),
    Case(("sweep",), lambda w: ["experiment-a", "--out", w.fresh("sweep")], progress=("0.5.13: affected",)),
    Case(("verify",), lambda w: [str(w.bundle)]),
    Case(("report",), lambda w: [str(w.bundle)]),
    Case(("report",), _report_to_file),
    Case(("attest",), lambda w: [str(w.bundle), "--key", str(w.key)]),
    Case(("attest",), _attest_to_file),
    Case(("bundle", "pack"), lambda w: [str(w.bundle), "-o", w.fresh("bundle.tar.gz")]),
    Case(("gates",), lambda w: [*w.logs, "--out", w.fresh("gates")], exit=1),
    Case(("cache", "ls"), lambda w: []),
    Case(("cache", "prune"), lambda w: ["--dry-run"]),
    Case(("cache", "servers"), lambda w: []),
    Case(("cache", "verify"), lambda w: []),
]


def leaf_commands(group: click.Group = main, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


def command_of(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for word in path:
        assert isinstance(command, click.Group)
        command = command.commands[word]
    return command


def has_json(path: tuple[str, ...]) -> bool:
    return any(p.name == "as_json" for p in command_of(path).params)


def _fake_cores(monkeypatch: pytest.MonkeyPatch, world: World) -> None:
    """run, sweep and new without an env, wheels or git: progress through the reporter the
    command passed, then a real result (the forged run bundle, a committed sweep bundle)."""
    import kvprobe.experiments.scaffold as scaffold
    import kvprobe.run.runner as runner
    import kvprobe.run.sweep_runner as sweep
    from kvprobe.model.receipt import Receipt
    from kvprobe.model.sweep_receipt import SweepReceipt
    from kvprobe.run.workspace import SealedBundle

    def run_experiment(exp, opts, reporter):
        with reporter.step("base: running checks"):
            reporter.note("base: 1 probe")
        receipt = Receipt.from_json(json.loads((world.bundle / "receipt.json").read_text()))
        return SealedBundle(world.bundle, receipt, forge.sha((world.bundle / "manifest.json").read_bytes()))

    def sweep_experiment(exp, opts, reporter):
        receipt = SweepReceipt.from_json(json.loads((SWEEP_BUNDLE / "receipt.json").read_text()))
        for release in receipt.releases:
            reporter.note(f"{release.version}: {release.classification.overall}")
        digest = forge.sha((SWEEP_BUNDLE / "manifest.json").read_bytes())
        return SealedBundle(SWEEP_BUNDLE, receipt, digest)

    def create(spec, *, cache_root, reporter=None):
        with reporter.step("looking up the release wheels"):
            pass
        directory = world.root / "probes" / spec.experiment_id
        return scaffold.Created(directory, directory / "experiment.toml", directory / "probe.py", False)

    monkeypatch.setattr(runner, "run_experiment", run_experiment)
    monkeypatch.setattr(sweep, "sweep_experiment", sweep_experiment)
    monkeypatch.setattr(scaffold, "create", create)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("world"))


@pytest.fixture
def invoke(world, monkeypatch, tmp_path) -> Callable[..., Result]:
    monkeypatch.chdir(tmp_path)  # no ./probes
    monkeypatch.delenv("KVPROBE_PROBES_PATH", raising=False)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.setenv("KVPROBE_CACHE_DIR", str(world.cache))
    (tmp_path / "runtime").mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "runtime"))  # no kept server of anyone's
    _fake_cores(monkeypatch, world)

    def run(case: Case, *flags: str) -> Result:
        args = [*case.command, *flags, *case.args(world)]
        return CliRunner().invoke(main, args, catch_exceptions=False)

    return run


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def progress_in(text: str, case: Case) -> list[str]:
    return [line for line in lines(text) if line.startswith(STEP_MARKS) or any(p in line for p in case.progress)]


def test_every_command_has_a_case():
    assert sorted(leaf_commands()) == sorted({case.command for case in CASES})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_results_on_stdout_progress_on_stderr_and_q_honoured(invoke, case):
    plain = invoke(case)
    assert plain.exit_code == case.exit, plain.output
    assert lines(plain.stdout), f"no result on stdout\nstderr:\n{plain.stderr}"
    assert not progress_in(plain.stdout, case), "progress on stdout"
    for said in case.progress:  # the check below can see progress where there is some
        assert said in plain.stderr, f"{said!r} not in the progress on stderr:\n{plain.stderr}"

    quiet = invoke(case, "-q")
    assert quiet.exit_code == case.exit, quiet.output
    assert len(lines(quiet.stdout)) == len(lines(plain.stdout)), "-q took results away"
    assert progress_in(quiet.stderr, case) == [], "-q left progress on stderr"
    assert set(lines(quiet.stderr)) <= set(lines(plain.stderr)), "-q wrote something the plain run did not"

    silent = invoke(case, "-qq")
    assert silent.exit_code == case.exit, silent.output
    assert silent.stdout == "", "-qq left results on stdout"
    assert [line for line in lines(silent.stderr) if not line.startswith(WARNING_PREFIXES)] == [], (
        "-qq left more than warnings and errors on stderr"
    )


@pytest.mark.parametrize("case", [c for c in CASES if has_json(c.command)], ids=lambda c: c.id)
def test_json_is_one_document_naming_its_schema_and_nothing_else_on_stdout(invoke, case):
    plain = invoke(case)
    result = invoke(case, "--json")
    assert result.exit_code == case.exit, result.output
    doc = json.loads(result.stdout)
    assert isinstance(doc, dict) and doc["schema"] == f"kvprobe.cli.{'-'.join(case.command)}/1"
    assert set(lines(result.stderr)) <= set(lines(plain.stderr)), "--json moved a result to stderr"


def test_the_commands_without_json_are_the_ones_whose_result_is_a_document_or_a_scaffold():
    assert sorted(c for c in leaf_commands() if not has_json(c)) == [("attest",), ("new",), ("report",)]


# --- the command modules write only through the helper (read from the source) -------------

CLI = REPO / "kvprobe" / "cli"
_CONSOLES = {"stdout_console", "stderr_console", "make_console"}


def writes_outside_the_helper(source: str) -> list[str]:
    """Calls that write to a stream directly (print, click.echo/secho, a console of its own)
    and uses of sys.stdout/sys.stderr other than asking ``isatty()``."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in {"print", "echo", "secho"} | _CONSOLES:
                found.append((node.lineno, f"{func.id}()"))
            elif isinstance(func, ast.Attribute) and func.attr in {"echo", "secho"} | _CONSOLES:
                found.append((node.lineno, f"{func.attr}()"))
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("stdout", "stderr")
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            parent = parents.get(node)
            if not (isinstance(parent, ast.Attribute) and parent.attr == "isatty"):
                found.append((node.lineno, f"sys.{node.attr}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_command_modules_write_only_through_the_helper():
    modules = sorted(CLI.glob("*_cmds.py"))
    assert len(modules) >= 6
    found = {p.name: writes_outside_the_helper(p.read_text(encoding="utf-8")) for p in modules}
    assert {name: where for name, where in found.items() if where} == {}


def test_the_source_check_finds_each_way_around_the_helper():
    source = (
        "import sys, click\n"
        "def f(console):\n"
        "    click.echo('x', err=True)\n"
        "    print('y')\n"
        "    sys.stderr.write('z')\n"
        "    stdout_console().print('w')\n"
        "    if sys.stdin.isatty() and sys.stderr.isatty():\n"
        "        console.print('fine')\n"
    )
    assert writes_outside_the_helper(source) == [
        "line 3: echo()",
        "line 4: print()",
        "line 5: sys.stderr",
        "line 6: stdout_console()",
    ]
