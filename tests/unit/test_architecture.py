"""The import rules of docs/architecture.md, read from the source with ``ast``.

Every ``import`` counts, including those inside functions: a function-level import is
still a dependency, it only moves the failure to run time. Three rules:

- no cycles between kvprobe modules;
- no module imports another module's ``_private`` name (nor reaches one as ``mod._name``);
- imports point down the layer table below (the same table as docs/architecture.md):
  a module may import its own sub-package or a lower layer, never a layer above or a
  different sub-package of its own layer.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import sources

PACKAGE = Path(__file__).resolve().parents[2] / "kvprobe"

# Lowest first. A "unit" is a sub-package (kvprobe/run/) or a top-level module (kvprobe/proc.py);
# "kvprobe" is the package's own __init__ (its __version__).
LAYERS: list[set[str]] = [
    {"kvprobe", "names", "errors", "resources", "progress", "probe_api", "files", "text", "redaction"},
    {"defects", "proc", "schema", "model"},
    {"strict_json", "rules"},
    {"env", "checks"},
    {"sources"},
    {"experiments", "evidence"},
    {"verify"},
    {"run"},
    {"gates", "exports"},
    {"cli"},
    {"__main__"},
]


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    names: tuple[str, ...]  # names taken from it ("from target import names")
    line: int


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(source: str, tree: ast.AST, known: set[str], is_package: bool = False) -> list[Import]:
    """Every kvprobe import in ``tree``; ``from pkg import mod`` counts as importing ``pkg.mod``."""
    found: list[Import] = []
    for node in sources.nodes(tree):
        if isinstance(node, ast.Import):
            found += [Import(source, a.name, (), node.lineno) for a in node.names if a.name.split(".")[0] == "kvprobe"]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(source, is_package, node)
            if target.split(".")[0] != "kvprobe":
                continue
            plain = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    found.append(Import(source, sub, (), node.lineno))
                else:
                    plain.append(alias.name)
            if plain:
                found.append(Import(source, target, tuple(plain), node.lineno))
    return found


def private_attribute_uses(source: str, tree: ast.AST, known: set[str]) -> list[str]:
    """``mod._name`` where ``mod`` is bound to another kvprobe module by an import."""
    bound: dict[str, str] = {}
    for node in sources.nodes(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvprobe"):
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
    uses = []
    for node in sources.nodes(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and _private(node.attr)
            and bound[node.value.id] != source
        ):
            uses.append(f"{source}:{node.lineno} uses {bound[node.value.id]}.{node.attr}")
    return uses


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def graph(found: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for imp in found:
        edges.setdefault(imp.source, set())
        if imp.target != imp.source:
            edges[imp.source].add(imp.target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    nodes = set(edges) | {t for ts in edges.values() for t in ts}
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kvprobe"


def layer_of(module: str) -> int:
    name = unit(module)
    for number, members in enumerate(LAYERS):
        if name in members:
            return number
    raise KeyError(f"{module}: its unit {name!r} is in no layer of LAYERS (add it, and to docs/architecture.md)")


def layer_violations(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        src, dst = unit(imp.source), unit(imp.target)
        if src == dst:
            continue
        if layer_of(imp.target) >= layer_of(imp.source):
            bad.append(
                f"{imp.source}:{imp.line} imports {imp.target} (layer {layer_of(imp.source)} -> {layer_of(imp.target)})"
            )
    return bad


def private_imports(found: list[Import]) -> list[str]:
    return [
        f"{imp.source}:{imp.line} imports {name} from {imp.target}"
        for imp in found
        if imp.target != imp.source
        for name in imp.names
        if _private(name)
    ]


# What gates may use of run: the check session, one side's checks and the bundle workspace,
# never a pipeline (run.runner, run.sweep_runner): those are run's and sweep's own.
GATES_USE_OF_RUN = {"kvprobe.run.session", "kvprobe.run.side", "kvprobe.run.workspace"}


def gates_pipeline_imports(found: list[Import]) -> list[str]:
    return [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in found
        if unit(imp.source) == "gates" and unit(imp.target) == "run" and imp.target not in GATES_USE_OF_RUN
    ]


def scan(root: Path = PACKAGE) -> tuple[list[Import], list[str]]:
    mods = modules(root)
    known = set(mods)
    found, attrs = [], []
    for name, path in mods.items():
        tree = sources.parse(path)
        found += imports_of(name, tree, known, is_package=path.name == "__init__.py")
        attrs += private_attribute_uses(name, tree, known)
    return found, attrs


@pytest.fixture(scope="module")
def scanned():
    return scan()


def test_no_import_cycles(scanned):
    found, _ = scanned
    assert cycles(graph(found)) == []


def test_no_private_names_across_modules(scanned):
    found, attrs = scanned
    assert private_imports(found) + attrs == []


def test_imports_point_down_the_layers(scanned):
    found, _ = scanned
    assert layer_violations(found) == []


def test_gates_open_the_check_session_not_a_run_pipeline(scanned):
    found, _ = scanned
    assert gates_pipeline_imports(found) == []


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_every_sub_package_says_what_it_is():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(sources.parse(init))
        assert doc and "\n" not in doc.strip(), f"{init}: needs a one-line docstring"


# --- the checks themselves can fail ------------------------------------------------------


def test_cycles_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _scan_source(tmp_path: Path, files: dict[str, str]) -> tuple[list[Import], list[str]]:
    root = tmp_path / "kvprobe"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return scan(root)


def test_scan_sees_function_level_cycles_private_names_and_upward_imports(tmp_path):
    found, attrs = _scan_source(
        tmp_path,
        {
            "__init__.py": "",
            "run/__init__.py": '"""run."""\n',
            "run/runner.py": "def f():\n    from kvprobe.verify.steps import _result\n",
            "verify/__init__.py": '"""verify."""\n',
            "verify/steps.py": "from kvprobe.run import runner\nrunner._secret\n",
        },
    )
    assert cycles(graph(found)) == [["kvprobe.run.runner", "kvprobe.verify.steps"]]
    assert private_imports(found) == ["kvprobe.run.runner:2 imports _result from kvprobe.verify.steps"]
    assert attrs == ["kvprobe.verify.steps:2 uses kvprobe.run.runner._secret"]
    assert layer_violations(found) == ["kvprobe.verify.steps:1 imports kvprobe.run.runner (layer 6 -> 7)"]


def test_scan_sees_gates_borrowing_from_the_run_pipeline(tmp_path):
    found, _ = _scan_source(
        tmp_path,
        {
            "__init__.py": "",
            "run/__init__.py": '"""run."""\n',
            "run/runner.py": "",
            "run/session.py": "",
            "gates/__init__.py": '"""gates."""\n',
            "gates/behaviour.py": "from kvprobe.run.session import CheckSession\nfrom kvprobe.run import runner\n",
            "gates/pipeline.py": "def f():\n    from kvprobe.run.runner import RunOptions\n",
        },
    )
    assert sorted(gates_pipeline_imports(found)) == [
        "kvprobe.gates.behaviour:2 imports kvprobe.run.runner",
        "kvprobe.gates.pipeline:2 imports kvprobe.run.runner",
    ]


def test_relative_imports_resolve(tmp_path):
    found, _ = _scan_source(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "env/__init__.py": '"""env."""\n',
            "env/cache.py": "",
            "env/venv.py": "from . import cache\nfrom ..errors import X\n",
        },
    )
    assert {(i.source, i.target) for i in found} == {
        ("kvprobe.env.venv", "kvprobe.env.cache"),
        ("kvprobe.env.venv", "kvprobe.errors"),
    }


def test_test_module_basenames_are_unique_across_tiers():
    """pytest imports test modules by basename (no packages under tests/): two tiers with the
    same file name fail collection of the whole suite."""
    tests = Path(__file__).resolve().parents[1]
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


# --- one name per thing, and rules that touch no bundle ---------------------------------


def duplicate_names(root: Path = PACKAGE) -> dict[str, list[str]]:
    """Module basenames (``__init__.py`` aside) and sub-package names that occur more than
    once under ``root``: ``run/sweep.py`` next to ``exports/sweep.py``, or ``exports/gates.py``
    next to the ``gates/`` package, are two things under one name."""
    seen: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if path.name != "__init__.py":
            seen.setdefault(path.stem, []).append(str(rel))
    for init in sorted(root.rglob("__init__.py")):
        if init.parent != root:
            seen.setdefault(init.parent.name, []).append(f"{init.parent.relative_to(root)}/")
    return {name: where for name, where in seen.items() if len(where) > 1}


def test_every_module_and_sub_package_has_its_own_name():
    assert duplicate_names() == {}


def test_duplicate_names_finds_a_planted_pair(tmp_path):
    root = tmp_path / "kvprobe"
    for rel in ("__init__.py", "run/__init__.py", "run/sweep.py", "evidence/__init__.py", "evidence/sweep.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    (root / "exports").mkdir()
    (root / "exports/__init__.py").write_text("")
    (root / "exports/run.py").write_text("")
    assert duplicate_names(root) == {
        "sweep": ["evidence/sweep.py", "run/sweep.py"],
        "run": ["exports/run.py", "run/"],
    }


# What the pure rules (rules/) may import: kvprobe's records and names, and computation
# from the standard library and packaging; nothing that reads or writes a file, a process
# or a bundle, so verify recomputes with exactly what the writers decided with.
RULES_MAY_IMPORT = {"kvprobe.names", "kvprobe.errors", "kvprobe.model", "kvprobe.rules"}
RULES_MAY_IMPORT_OUTSIDE = {
    "__future__",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "itertools",
    "math",
    "packaging",
    "re",
    "typing",
}


def rule_import_violations(root: Path = PACKAGE) -> list[str]:
    bad = []
    for path in sorted((root / "rules").glob("*.py")):
        source = module_name(path, root)
        for node in ast.walk(sources.parse(path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = [_resolve(source, path.name == "__init__.py", node)]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                allowed = (
                    any(target == m or target.startswith(m + ".") for m in RULES_MAY_IMPORT)
                    if top == "kvprobe"
                    else top in RULES_MAY_IMPORT_OUTSIDE
                )
                if not allowed:
                    bad.append(f"{source}:{node.lineno} imports {target}")
    return bad


def test_the_rules_import_no_file_process_or_bundle_code():
    assert rule_import_violations() == []


def test_rule_import_violations_finds_planted_imports(tmp_path):
    root = tmp_path / "kvprobe"
    (root / "rules").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "rules/__init__.py").write_text('"""rules."""\n')
    (root / "rules/verdict.py").write_text(
        "import json\nfrom pathlib import Path\nfrom kvprobe.evidence import manifest\n"
        "from kvprobe.model.records import Verdict\nfrom . import other\nfrom collections.abc import Mapping\n"
    )
    assert rule_import_violations(root) == [
        "kvprobe.rules.verdict:1 imports json",
        "kvprobe.rules.verdict:2 imports pathlib",
        "kvprobe.rules.verdict:3 imports kvprobe.evidence",
    ]
