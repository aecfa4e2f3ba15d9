#!/usr/bin/env python3
"""kvprobe benchmark: does kvprobe's own overhead vanish next to the work it measures?

Run from a checkout with the interpreter kvprobe is installed in::

    python bench/bench.py            # every section, several repetitions (~10 min)
    python bench/bench.py --quick    # fewer repetitions (~4 min)
    python bench/bench.py --only startup,verify --json > figures.json

Sections, goals, floors and how memory is measured: docs/design/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MiB = 1 << 20
GiB = 1 << 30
EXPERIMENT = "experiment-a"
SECTIONS = ("startup", "verify", "memory", "hostile", "cold", "warm", "sweep", "several", "env")
SWEEP_N, SWEEP_N1 = "0.5.22,0.5.23", "0.5.21,0.5.22,0.5.23"  # N and N+1 releases, all served


# --- figures -----------------------------------------------------------------------------


class Figures:
    """Collects figures, prints one line each on stderr, dumps them all as JSON."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(
        self,
        section: str,
        name: str,
        samples: list[float],
        *,
        unit: str = "s",
        floor: list[float] | None = None,
        target: str | None = None,
        met: bool | None = None,
        note: str = "",
    ) -> dict[str, Any]:
        fig = {"section": section, "name": name, "unit": unit, **_stats(samples)}
        if floor:
            fig["floor"] = _stats(floor)
            fig["ratio"] = round(fig["median"] / fig["floor"]["median"], 3)
        fig.update({"target": target, "met": met, "note": note})
        self.items.append(fig)
        _print(fig)
        return fig


def _stats(samples: list[float]) -> dict[str, Any]:
    return {
        "n": len(samples),
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "samples": [round(s, 6) for s in samples],
    }


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "bytes":
        return f"{value / MiB:.2f} MiB" if value >= MiB else f"{value / 1024:.1f} KiB"
    if unit == "MiB/s":
        return f"{value:.0f} MiB/s"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    return f"{value:g} {unit}"


def _print(fig: dict[str, Any]) -> None:
    u = fig["unit"]
    line = (
        f"[{fig['section']}] {fig['name']}: median {_fmt(fig['median'], u)} "
        f"(min {_fmt(fig['min'], u)}, max {_fmt(fig['max'], u)}, n={fig['n']})"
    )
    if "floor" in fig:
        line += f"; floor {_fmt(fig['floor']['median'], u)}; ratio {fig['ratio']:.2f}x"
    if fig["target"]:
        line += f"; target {fig['target']}: {'met' if fig['met'] else 'MISSED'}"
    if fig["note"]:
        line += f"  [{fig['note']}]"
    print(line, file=sys.stderr, flush=True)


def _log(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


# --- processes ---------------------------------------------------------------------------


def kvprobe_argv() -> list[str]:
    """The console script users run (next to this interpreter), else ``python -m kvprobe``."""
    script = Path(sys.executable).parent / "kvprobe"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "kvprobe"]


def wall(argv: list[str], *, ok: tuple[int, ...] = (0,), **kwargs: Any) -> float:
    """Seconds for one run of ``argv`` (output discarded); an unexpected exit is fatal."""
    started = time.perf_counter()
    result = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs)
    elapsed = time.perf_counter() - started
    if result.returncode not in ok:
        raise SystemExit(f"bench: {argv[:4]} exited {result.returncode}: {result.stderr.decode()[-2000:]}")
    return elapsed


def peak_rss_mib(argv: list[str], *, ok: tuple[int, ...] = (0,)) -> float:
    """Peak RSS of one child, in MiB, from wait4 in a tiny launcher: Linux keeps ru_maxrss
    across exec, so a child of this large interpreter would report at least our own RSS.
    """
    if Path("/usr/bin/time").is_file():
        with tempfile.NamedTemporaryFile("r") as out:
            code = subprocess.run(
                ["/usr/bin/time", "-f", "%M", "-o", out.name, *argv],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ).returncode
            kib = float(out.read().strip().splitlines()[-1])
    else:
        launcher = (
            "import os,sys; pid=os.fork()\n"
            "if pid == 0: os.execv(sys.argv[1], sys.argv[1:])\n"
            "_, status, usage = os.wait4(pid, 0); print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)"
        )
        res = subprocess.run([sys.executable, "-S", "-c", launcher, *argv], capture_output=True, text=True)
        code, kib = (int(res.stdout.split()[0]), float(res.stdout.split()[1]))
    if code not in ok:
        raise SystemExit(f"bench: {argv[:4]} exited {code}")
    return kib / 1024


class TreeMemory:
    """Peak memory of a process tree, sampled from /proc every ``interval_s`` in a thread: summed
    PSS, so pages a preloading parent shares with its children count once (docs/design/benchmarks.md).
    """

    def __init__(self, root_pid: int, *, include_root: bool = True, interval_s: float = 0.1) -> None:
        self.root_pid, self.include_root, self.interval_s = root_pid, include_root, interval_s
        self.peak_mib = self.largest_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            pids = self._tree()
            sizes = [self._kib(pid) for pid in pids]
            self.peak_mib = max(self.peak_mib, sum(p for p, _ in sizes) / 1024)
            self.largest_mib = max([self.largest_mib, *(r / 1024 for _, r in sizes)])
            if self._stop.wait(self.interval_s):
                return

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as handle:
                        ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        found, todo = [], [self.root_pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found if self.include_root else found[1:]

    @staticmethod
    def _kib(pid: int) -> tuple[float, float]:
        """(PSS, RSS) in KiB; (0, 0) for a process that is gone."""
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
                fields = {line.split(b":")[0]: line.split()[1] for line in handle if line[:4] in (b"Rss:", b"Pss:")}
            return float(fields[b"Pss"]), float(fields[b"Rss"])
        except (OSError, KeyError, IndexError):
            try:
                with open(f"/proc/{pid}/statm", "rb") as handle:
                    rss = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024
                return rss, rss
            except (OSError, IndexError, ValueError):
                return 0.0, 0.0


def repeat(n: int, func: Callable[[], float]) -> list[float]:
    return [func() for _ in range(n)]


# --- startup -----------------------------------------------------------------------------


def bench_startup(figs: Figures, work: Path, reps: int) -> None:
    """As installed (pip writes bytecode at install): kvprobe's .pyc kept in a scratch prefix,
    written by one warm-up run; and, without target, from source (PYTHONDONTWRITEBYTECODE=1,
    as an editable checkout in this machine's environment runs: every module compiled each start)."""
    kv = kvprobe_argv()
    installed = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    installed["PYTHONPYCACHEPREFIX"] = str(work / "pyc")
    source = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    source.pop("PYTHONPYCACHEPREFIX", None)
    for args in (["--help"], ["list"], ["list", "--json"], ["-V"]):
        wall([*kv, *args], env=installed)  # writes the bytecode
    floor = repeat(reps, lambda: wall([sys.executable, "-c", "pass"], env=installed))
    figs.add("startup", "python -c pass", floor)
    for args in (["--help"], ["list"], ["list", "--json"], ["-V"]):
        samples = repeat(reps, lambda args=args: wall([*kv, *args], env=installed))
        median = statistics.median(samples)
        figs.add("startup", f"kvprobe {' '.join(args)}", samples, floor=floor, target="< 150 ms", met=median < 0.150)
    for args in (["--help"], ["list"]):
        samples = repeat(reps, lambda args=args: wall([*kv, *args], env=source))
        name = f"kvprobe {' '.join(args)} (no bytecode)"
        figs.add("startup", name, samples, floor=floor, note="kvprobe's modules compiled at every start")


# --- verify and memory -------------------------------------------------------------------


def make_file(path: Path, size: int) -> Path:
    """``size`` bytes of incompressible data (a 16 MiB random block repeated)."""
    if path.is_file() and path.stat().st_size == size:
        return path
    block = os.urandom(min(size, 16 * MiB))
    with open(path, "wb") as handle:
        written = 0
        while written < size:
            written += handle.write(block[: size - written])
    return path


def _hash_child(path: Path) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from kvprobe.files import sha256_file; print(sha256_file(sys.argv[1]))",
        str(path),
    ]


def bench_hashing(figs: Figures, work: Path, reps: int) -> Path:
    from kvprobe.files import sha256_file

    big = make_file(work / "big.bin", GiB)
    subprocess.run(["sha256sum", str(big)], stdout=subprocess.DEVNULL, check=True)  # warm page cache
    floor = repeat(reps, lambda: wall(["sha256sum", str(big)]))

    def ours() -> float:
        started = time.perf_counter()
        sha256_file(big)
        return time.perf_counter() - started

    samples = repeat(reps, ours)
    fig = figs.add(
        "verify",
        "sha256_file 1 GiB",
        samples,
        floor=floor,
        target="<= 1.2x sha256sum",
        met=statistics.median(samples) <= 1.2 * statistics.median(floor),
    )
    figs.add(
        "verify",
        "sha256_file throughput",
        [GiB / MiB / s for s in samples],
        unit="MiB/s",
        note=f"sha256sum: {GiB / MiB / fig['floor']['median']:.0f} MiB/s",
    )
    return big


def bundle_with_blob(bundle: Path, blob: Path, dest: Path) -> Path:
    """A copy of ``bundle`` with ``blob`` hard-linked in as raw/base/blob.bin, manifest rewritten."""
    from kvprobe.evidence import manifest

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(bundle, dest)
    target = dest / "raw" / "base" / "blob.bin"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.link(blob, target)
    manifest.write(dest)
    return dest


_BIG_LIMITS = ["--max-file-bytes", str(4 * GiB), "--max-bytes", str(8 * GiB)]


def bench_verify(figs: Figures, work: Path, bundle: Path | None, big: Path, reps: int) -> None:
    kv = kvprobe_argv()
    if bundle is None:
        _log("no bundle (warm section skipped or failed): kvprobe verify not timed")
        return
    samples = repeat(reps, lambda: wall([*kv, "verify", str(bundle)], ok=(0, 1)))
    code = subprocess.run([*kv, "verify", str(bundle)], capture_output=True).returncode
    figs.add(
        "verify",
        "kvprobe verify (normal bundle)",
        samples,
        target="< 0.3 s",
        met=statistics.median(samples) < 0.3,
        note=f"exit {code}",
    )
    heavy = bundle_with_blob(bundle, big, work / "bundle-1g")
    floor = repeat(reps, lambda: wall(["sha256sum", str(big)]))
    samples = repeat(reps, lambda: wall([*kv, "verify", str(heavy), *_BIG_LIMITS], ok=(0, 1)))
    code = subprocess.run([*kv, "verify", str(heavy), *_BIG_LIMITS], capture_output=True).returncode
    figs.add(
        "verify",
        "kvprobe verify (bundle + 1 GiB raw file)",
        samples,
        floor=floor,
        note=f"exit {code} (the extra file is not cited by the receipt); floor = sha256sum of the file",
    )


def _add_flat_rss(figs: Figures, title: str, rss: list[float]) -> None:
    """Peak RSS over growing inputs: streaming holds it flat (within 8 MiB), whatever the size."""
    figs.add(
        "memory",
        title,
        rss,
        unit="MiB",
        target="flat (max - min < 8 MiB)",
        met=max(rss) - min(rss) < 8,
        note=" / ".join(f"{r:.1f}" for r in rss),
    )


def bench_memory(figs: Figures, work: Path, bundle: Path | None, big: Path) -> None:
    sizes = {"64 MiB": 64 * MiB, "256 MiB": 256 * MiB, "1 GiB": GiB}
    files = {label: big if size == GiB else make_file(work / f"f{size}.bin", size) for label, size in sizes.items()}
    rss = [peak_rss_mib(_hash_child(path)) for path in files.values()]
    _add_flat_rss(figs, "peak RSS hashing 64 MiB / 256 MiB / 1 GiB", rss)
    if bundle is None:
        return
    kv = kvprobe_argv()
    rss = []
    for label, path in files.items():
        heavy = bundle_with_blob(bundle, path, work / f"bundle-mem-{sizes[label]}")
        rss.append(peak_rss_mib([*kv, "verify", str(heavy), *_BIG_LIMITS], ok=(0, 1)))
    rss.insert(0, peak_rss_mib([*kv, "verify", str(bundle)], ok=(0, 1)))
    _add_flat_rss(figs, "peak RSS kvprobe verify: bundle / +64 MiB / +256 MiB / +1 GiB", rss)


# --- hostile bundles ---------------------------------------------------------------------


def _hostile_inputs(work: Path) -> dict[str, Path]:
    """name -> a bundle directory or archive a hostile publisher could hand a reviewer."""
    from tests import forge

    def bundle(name: str, change: Callable[[Path], None] | None = None) -> Path:
        root = forge.build(work / "hostile" / name)
        if change:
            change(root)
        return root

    def pad_receipt(root: Path, mib: int) -> None:
        pad = b"[" + b",".join([b"[]"] * ((mib * MiB) // 3)) + b"]"
        path = root / "receipt.json"
        path.write_bytes(path.read_bytes().replace(b'"cpus": 2', b'"cpus": 2, "pad": ' + pad, 1))
        forge.rehash(root)

    def pad_sums(root: Path) -> None:
        with open(root / "SHA256SUMS", "a") as sums:
            sums.write(("0" * 64 + "  raw/x\n") * ((60 * MiB) // 73))

    def pad_toml(root: Path) -> None:
        rel = f"probes/{forge.EXP_ID}/experiment.toml"
        path = root / rel
        path.write_bytes(path.read_bytes() + b"\n[pad]\nx = [" + b",".join([b"[]"] * ((16 * MiB) // 3)) + b"]\n")
        forge.edit_receipt(root, lambda r: r["experiment"].update(sha256=forge.sha(path.read_bytes())))
        forge.recite(root, rel)

    inputs = {
        "normal bundle": bundle("normal"),
        "57 MiB receipt": bundle("receipt57", lambda r: pad_receipt(r, 57)),
        "7 MiB receipt of []": bundle("receipt7", lambda r: pad_receipt(r, 7)),
        "60 MiB SHA256SUMS": bundle("sums", pad_sums),
        "16 MiB experiment.toml": bundle("toml", pad_toml),
    }
    inputs["1 GiB PAX header .tar.gz"] = _pax_bomb(work / "hostile" / "pax.tar.gz", GiB)
    return inputs


def _pax_bomb(path: Path, declared: int) -> Path:
    import tarfile
    import zlib

    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, declared
    gz = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as out:
        out.write(gz.compress(info.tobuf(tarfile.USTAR_FORMAT) + f"{declared} path=".encode()))
        chunk = b"a" * MiB
        for _ in range(declared // MiB):
            out.write(gz.compress(chunk))
        out.write(gz.compress(b"\0" * 1024) + gz.flush())
    return path


def bench_hostile(figs: Figures, work: Path) -> None:
    kv = kvprobe_argv()
    inputs = _hostile_inputs(work)
    for command in (["verify"], ["report", "--format", "openvex"]):
        rss = [peak_rss_mib([*kv, command[0], str(path), *command[1:]], ok=(0, 1, 2)) for path in inputs.values()]
        figs.add(
            "hostile",
            f"peak RSS kvprobe {command[0]}: " + " / ".join(inputs),
            rss,
            unit="MiB",
            target="< 64 MiB each",
            met=max(rss) < 64,
            note=" / ".join(f"{r:.1f}" for r in rss),
        )


# --- cold path ---------------------------------------------------------------------------

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "HOME": tempfile.gettempdir(),
    "PATH": os.environ.get("PATH", os.defpath),
    "LANG": "C.UTF-8",
}


def git(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, env=_GIT_ENV)
    if result.returncode != 0:
        raise SystemExit(f"bench: git {' '.join(args[:3])} failed: {result.stderr.decode()[-500:]}")
    return result.stdout.decode().strip()


def fast_import_stream(commits: int, big_files: int, big_size: int) -> bytes:
    """A long main history; big files arrive early, are rewritten, and are gone at the tip."""
    out: list[bytes] = []
    date = 1_600_000_000
    big_blocks = [os.urandom(big_size) for _ in range(big_files * 2)]

    def commit(ref: str, n: int, changes: list[bytes], parent: str | None) -> None:
        msg = f"commit {n}\n".encode()
        out.append(f"commit {ref}\nmark :{n}\n".encode())
        out.append(f"author Fake <fake@example.invalid> {date + n} +0000\n".encode())
        out.append(f"committer Fake <fake@example.invalid> {date + n} +0000\n".encode())
        out.append(f"data {len(msg)}\n".encode() + msg)
        if parent:
            out.append(f"from {parent}\n".encode())
        out.extend(changes)
        out.append(b"\n")

    def blob_change(path: str, data: bytes) -> bytes:
        return f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n"

    for n in range(1, commits + 1):
        changes = [
            blob_change(f"src/mod{n % 50}.py", f"VALUE = {n}\n".encode() * 40),
            blob_change("CHANGELOG", f"release {n}\n".encode() * (n % 200 + 1)),
        ]
        if n == commits // 10 or n == commits // 3:
            gen = 0 if n == commits // 10 else 1
            changes += [blob_change(f"assets/big{i}.bin", big_blocks[gen * big_files + i]) for i in range(big_files)]
        if n == commits // 2:
            changes += [f"D assets/big{i}.bin\n".encode() for i in range(big_files)]
        commit("refs/heads/main", n, changes, f":{n - 1}" if n > 1 else None)
    commit("refs/pull/1/head", commits + 1, [blob_change("src/fix.py", b"FIXED = True\n")], f":{commits}")
    return b"".join(out)


def make_upstream(work: Path, commits: int) -> tuple[Path, str, str]:
    repo = work / "upstream.git"
    if repo.exists():
        shutil.rmtree(repo)
    git("init", "--bare", "--quiet", str(repo))
    git("fast-import", "--quiet", cwd=repo, stdin=fast_import_stream(commits, 4, 8 * MiB))
    git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=repo)
    git("repack", "-a", "-d", "--quiet", cwd=repo)
    return repo, git("rev-parse", "refs/heads/main", cwd=repo), git("rev-parse", "refs/pull/1/head", cwd=repo)


def dir_size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def bench_git(figs: Figures, work: Path, commits: int) -> None:
    from kvprobe.model.records import GitPin
    from kvprobe.sources.git import GitSource

    _log(f"building a fake upstream: {commits} commits, 2 x 4 x 8 MiB files that left the tree")
    repo, base, head = make_upstream(work, commits)
    url = f"file://{repo}"
    full = work / "full-clone.git"
    started = time.perf_counter()
    git("clone", "--mirror", "--no-local", "--quiet", url, str(full))
    full_s = time.perf_counter() - started
    full_bytes = dir_size(full / "objects")
    cache_root = work / "git-cache"
    source = GitSource(url, cache_root)
    started = time.perf_counter()
    ids = [source.materialize(GitPin(sha), work / f"tree-{i}", pr=1) for i, sha in enumerate((base, head))]
    pin_s = time.perf_counter() - started
    pin_bytes = sum(i["fetch_bytes"] for i in ids)
    store_bytes = dir_size(source.store / "objects")
    figs.add(
        "cold",
        "git: bytes stored for base+head pins (shallow fetch by SHA)",
        [store_bytes],
        unit="bytes",
        floor=[full_bytes],
        target="far below a full clone",
        met=store_bytes < full_bytes / 10,
        note=f"fetched {pin_bytes / 1024:.1f} KiB via {[i['fetched_via'] for i in ids]} in {pin_s:.2f} s; "
        f"full mirror clone {full_bytes / MiB:.1f} MiB in {full_s:.2f} s; upstream history {commits} commits",
    )
    started = time.perf_counter()
    again = source.materialize(GitPin(head), work / "tree-again", pr=1)
    figs.add(
        "cold",
        "git: second materialize of a fetched pin",
        [time.perf_counter() - started],
        target="no fetch",
        met=again["fetched_via"] == "cache" and again["fetch_bytes"] == 0,
        note=f"fetched_via={again['fetched_via']}",
    )


def _recorder():
    """A Reporter that records steps and notes (a build is a step; a cache hit a note)."""
    from kvprobe.progress import Reporter

    class Recorder(Reporter):
        def __init__(self) -> None:
            self.notes: list[str] = []
            self.steps: list[str] = []

        def note(self, text: str) -> None:
            self.notes.append(text)

        def step(self, title: str):
            self.steps.append(title)
            return super().step(title)

    return Recorder()


def bench_reuse(figs: Figures, work: Path, reps: int) -> None:
    from kvprobe.env.cache import default_cache_root
    from kvprobe.env.venv import EnvManager, find_python, load_profile
    from kvprobe.errors import KvprobeError
    from kvprobe.experiments import experiment
    from kvprobe.sources.wheel import WheelSource

    root = default_cache_root()
    exp = experiment.load(EXPERIMENT)
    profiles = {}
    for exp_id in experiment.list_ids():
        try:
            profiles[exp_id] = load_profile(experiment.load(exp_id).profile)
        except KvprobeError:
            continue  # a synthetic experiment runs in kvprobe's own interpreter: no env
    rec = _recorder()
    manager = EnvManager(root, reporter=rec)
    keys = {e: manager.key(p, find_python(p.python), None) for e, p in profiles.items()}
    marker = root / "envs" / f"{profiles[EXPERIMENT].name}-{keys[EXPERIMENT]}" / "kvprobe-env.json"
    before = marker.stat().st_ino if marker.exists() else None

    def ensure() -> float:
        started = time.perf_counter()
        manager.ensure(profiles[EXPERIMENT])
        return time.perf_counter() - started

    samples = repeat(reps, ensure)
    hit = not rec.steps and before is not None and marker.stat().st_ino == before
    sharing = [e for e, p in profiles.items() if p.name == profiles[EXPERIMENT].name]
    figs.add(
        "cold",
        "env: ensure() on a built env",
        samples,
        target="cache hit, no build",
        met=hit,
        note=f"builds started: {len(rec.steps)}; experiments on this lock: {', '.join(sharing)} "
        f"-> {len({keys[e] for e in sharing})} env key",
    )
    source = WheelSource(root)
    pin_set = exp.pin_sets[exp.default_pin_set]
    vias, samples = [], []
    for _ in range(reps):
        started = time.perf_counter()
        vias += [source.fetch(getattr(pin_set, side))[1] for side in ("base", "head")]
        samples.append(time.perf_counter() - started)
    figs.add(
        "cold",
        "wheel: fetch of base+head pins already cached",
        samples,
        target="no download",
        met=set(vias) == {"cache"},
        note=f"via {sorted(set(vias))}; the time is the sha256 re-check of ~55 MiB of wheels",
    )


# --- env builds --------------------------------------------------------------------------


def timed_build(profile, cache_root: Path, installer: str) -> tuple[float, dict]:
    """Seconds for EnvManager.ensure() of ``profile`` in ``cache_root`` with one installer, and
    the CPU seconds it used, its processes included (what the build costs when every core is busy)."""
    from kvprobe.env.venv import EnvManager

    saved = {k: os.environ.get(k) for k in ("KVPROBE_INSTALLER", "PIP_CACHE_DIR")}
    os.environ["KVPROBE_INSTALLER"] = installer
    os.environ["PIP_CACHE_DIR"] = str(cache_root / "pip-cache")  # pip's own cache starts empty too
    try:
        cpu, started = _cpu(), time.perf_counter()
        info = EnvManager(cache_root).ensure(profile)
        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
        return seconds, {"packages": info.packages, "installer": info.build["installer"], "cpu": cpu}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _cpu() -> float:
    """CPU seconds of this process and the children it waited for, user and system."""
    return sum(
        u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def bench_env(figs: Figures, work: Path, full: bool, pairs: int) -> None:
    """Cold builds in pairs, pip then uv, each into empty caches: on a shared machine, load
    that comes and goes falls on both installers alike; the medians are compared."""
    from kvprobe.env.installer import find_uv
    from kvprobe.env.venv import load_profile

    if find_uv() is None:
        _log("uv not found: env section skipped")
        return
    for name in ("pytest-minimal", "sglang-cpu") if full else ("pytest-minimal",):
        profile = load_profile(name)
        roots = {label: work / f"env-{name}-{label}" for label in ("pip", "uv")}
        n = pairs if name == "pytest-minimal" else 1
        _log(f"building the {name} env cold with pip, then with uv (empty caches), {n}x")
        pip_s: list[float] = []
        uv_s: list[float] = []
        cpu: dict[str, list[float]] = {"pip": [], "uv": []}
        for _ in range(n):
            seconds, pip_env = timed_build(profile, roots["pip"], "pip")
            pip_s.append(seconds)
            cpu["pip"].append(pip_env["cpu"])
            shutil.rmtree(roots["pip"], ignore_errors=True)
            shutil.rmtree(roots["uv"], ignore_errors=True)
            seconds, uv_env = timed_build(profile, roots["uv"], "uv")
            uv_s.append(seconds)
            cpu["uv"].append(uv_env["cpu"])
        shutil.rmtree(roots["uv"] / "envs")  # keep uv's download cache: the next lock's view
        again_s, _ = timed_build(profile, roots["uv"], "uv")
        shutil.rmtree(roots["uv"], ignore_errors=True)
        same = pip_env["packages"] == uv_env["packages"]
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        figs.add(
            "env",
            f"cold env build, lock {name}: uv vs pip",
            uv_s,
            floor=pip_s,
            target="<= 0.5x pip",
            met=statistics.median(uv_s) <= 0.5 * statistics.median(pip_s)
            and same
            and uv_env["installer"]["tool"] == "uv",
            note=f"same packages and versions: {same} ({len(uv_env['packages'])}); built by {uv_env['installer']}; "
            f"CPU s (median) uv {statistics.median(cpu['uv']):.2f}, pip {statistics.median(cpu['pip']):.2f}; "
            f"load average after: {load}",
        )
        figs.add(
            "env",
            f"env build, lock {name}, downloads already in uv's cache",
            [again_s],
            floor=pip_s,
            note="what a second profile's lock pays for files it shares",
        )


# --- warm run ----------------------------------------------------------------------------


def prepare_trees(exp, pin_set, work: Path, *, compiled: bool) -> dict[str, Path]:
    """Each side's tree through kvprobe's own sources (cache hits): byte-compiled as a run's
    (``compiled``), or as every run's tree was when #15 was filed, source without bytecode."""
    from kvprobe.env.cache import default_cache_root
    from kvprobe.model.records import SourceKind

    python = None
    if compiled:
        from kvprobe.env.venv import find_python, load_profile

        python = find_python(load_profile(exp.profile).python)
    trees = {}
    for side in ("base", "head"):
        tree = work / ("floor" if compiled else "floor-source") / side / "tree"
        if tree.exists():
            shutil.rmtree(tree.parent)
        tree.parent.mkdir(parents=True)
        pin = getattr(pin_set, side)
        if pin_set.kind is SourceKind.WHEEL:
            from kvprobe.sources.wheel import WheelSource

            WheelSource(default_cache_root()).materialize(pin, tree, python=python)
        elif pin_set.kind is SourceKind.GIT:
            from kvprobe.sources.git import GitSource

            GitSource(exp.upstream, default_cache_root()).materialize(pin, tree, pr=pin_set.pr, python=python)
        else:
            tree.mkdir()
        trees[side] = tree
    return trees


def floor_side(exp, pin_set, python: str, env_vars: dict[str, str], tree: Path, side: str, out: Path) -> None:
    """The side's checks run directly with the env's python: what kvprobe cannot avoid."""
    from kvprobe.resources import probe_api_dir

    scratch = out / side
    scratch.mkdir(parents=True, exist_ok=True)
    paths = [str(tree / p) for p in pin_set.python_path]
    for test in exp.tests_for(pin_set.name):
        subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", test.path],
            cwd=tree,
            env={"PATH": os.environ["PATH"], "HOME": str(scratch), "PYTHONPATH": ":".join(paths), **env_vars},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    for check in exp.probes:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(scratch),
            "LANG": "C.UTF-8",
            "PYTHONPATH": ":".join([*paths, str(exp.directory), str(probe_api_dir())]),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "KVPROBE_SIDE_CONFIG": json.dumps({"side": side}),
            **env_vars,
        }
        result = subprocess.run(
            [python, str(exp.directory / check.path), "--out", str(scratch / f"{check.name}.json")],
            cwd=scratch,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if result.returncode != 0:
            raise SystemExit(f"bench: floor probe {check.name} ({side}) failed: {result.stderr.decode()[-1500:]}")


def floor_run(exp, pin_set, python, env_vars, trees, work: Path, jobs: int) -> float:
    out = Path(tempfile.mkdtemp(dir=work, prefix="floor-"))
    started = time.perf_counter()
    if jobs == 2:
        threads = [
            threading.Thread(target=floor_side, args=(exp, pin_set, python, env_vars, trees[s], s, out))
            for s in ("base", "head")
        ]
        [t.start() for t in threads]
        [t.join() for t in threads]
    else:
        for side in ("base", "head"):
            floor_side(exp, pin_set, python, env_vars, trees[side], side, out)
    elapsed = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    return elapsed


def kvprobe_run(work: Path, jobs: int, keep: list[Path], *flags: str) -> float:
    out = Path(tempfile.mkdtemp(dir=work, prefix=f"run-j{jobs}-")) / "bundle"
    argv = [*kvprobe_argv(), "run", EXPERIMENT, "--jobs", str(jobs), "--out", str(out), *flags]
    elapsed = wall(argv, ok=(0, 1))
    keep.append(out)
    return elapsed


def bench_warm(figs: Figures, work: Path, reps: int) -> Path | None:
    """Goals 1 and 3 of #15, each against its own floor (docs/design/benchmarks.md)."""
    runtime = Path(tempfile.mkdtemp(prefix="kvb-"))  # short: a socket path has 107 bytes
    saved = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # the kept servers are the bench's own
    try:
        return _bench_warm(figs, work, reps)
    finally:
        subprocess.run([*kvprobe_argv(), "cache", "servers", "--stop"], capture_output=True, timeout=120)
        if saved is None:
            os.environ.pop("XDG_RUNTIME_DIR")
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved
        shutil.rmtree(runtime, ignore_errors=True)


def _bench_warm(figs: Figures, work: Path, reps: int) -> Path | None:
    from kvprobe.env.cache import default_cache_root
    from kvprobe.env.venv import EnvManager, load_profile
    from kvprobe.experiments import experiment

    exp = experiment.load(EXPERIMENT)
    pin_set = exp.pin_sets[exp.default_pin_set]
    _log(f"preparing: one warm-up `kvprobe run {EXPERIMENT}` (builds the env if it is missing)")
    bundles: list[Path] = []
    kvprobe_run(work, 2, bundles)
    kvprobe_run(work, 2, bundles, "--keep-server")  # starts the kept server the samples fork from
    profile = load_profile(exp.profile)
    info = EnvManager(default_cache_root()).ensure(profile)
    python, env_vars = str(info.path / "bin" / "python"), dict(profile.env)
    trees = {kind: prepare_trees(exp, pin_set, work, compiled=kind == "cached") for kind in ("cached", "today")}
    for kind_trees in trees.values():  # warm the page cache for the floors too
        floor_run(exp, pin_set, python, env_vars, kind_trees, work, 2)
    for jobs in (2, 1):
        runs: dict[str, list[float]] = {"": [], "--keep-server": [], "--no-preload": []}
        floors: dict[str, list[float]] = {"cached": [], "today": []}
        receipts = {}
        for _ in range(reps):  # interleaved, so drift hits all alike
            for flag, samples in runs.items():
                samples.append(kvprobe_run(work, jobs, bundles, *filter(None, [flag])))
                receipts[flag] = json.loads((bundles[-1] / "receipt.json").read_text())
            for kind, samples in floors.items():
                samples.append(floor_run(exp, pin_set, python, env_vars, trees[kind], work, jobs))
        name = f"kvprobe run {EXPERIMENT} --jobs {jobs}"
        goals = (
            ("", "today", 0.6, "goal 1, vs today's floor (source trees)"),
            ("--keep-server", "today", 0.6, "goal 1 with a server kept from an earlier run, vs today's floor"),
            ("", "cached", 1.05 if jobs == 2 else 1.1, "goal 3, vs the floor with the same caches"),
            ("--no-preload", "cached", 1.3, "vs the floor with the same caches"),
        )
        for flag, kind, ratio, against in goals:
            t = receipts[flag].get("timings", {})
            figs.add(
                "warm",
                f"{name} {flag}".rstrip() + f" ({against})",
                runs[flag],
                floor=floors[kind],
                target=f"<= {ratio}x floor",
                met=statistics.median(runs[flag]) <= ratio * statistics.median(floors[kind]),
                note="receipt timings: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(t.items())),
            )
    bench_run_memory(figs, work, lambda: floor_run(exp, pin_set, python, env_vars, trees["cached"], work, 2), bundles)
    return bundles[0]


def bench_run_memory(figs: Figures, work: Path, floor: Callable[[], float], bundles: list[Path]) -> None:
    """Peak memory of one warm `kvprobe run --jobs 2` (its whole process tree) and of the floor."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="run-mem-")) / "bundle"
    argv = [*kvprobe_argv(), "run", EXPERIMENT, "--jobs", "2", "--out", str(out)]
    with tempfile.NamedTemporaryFile("r") as maxrss:
        child = subprocess.Popen(
            ["/usr/bin/time", "-f", "%M", "-o", maxrss.name, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with TreeMemory(child.pid) as run_mem:
            code = child.wait()
        largest_exact = float(maxrss.read().strip().splitlines()[-1]) / 1024
    if code not in (0, 1):
        raise SystemExit(f"bench: kvprobe run for the memory figure exited {code}")
    bundles.append(out)
    with TreeMemory(os.getpid(), include_root=False) as floor_mem:
        floor()
    figs.add(
        "warm",
        f"peak memory of kvprobe run {EXPERIMENT} --jobs 2 (process tree, summed PSS)",
        [run_mem.peak_mib],
        unit="MiB",
        floor=[floor_mem.peak_mib],
        target="reported; <= 1.25x floor",
        met=run_mem.peak_mib <= 1.25 * floor_mem.peak_mib,
        note=f"sampled every 0.1 s; largest single process {largest_exact:.0f} MiB RSS (exact: wait4 via "
        f"/usr/bin/time), floor's largest {floor_mem.largest_mib:.0f} MiB (sampled)",
    )


# --- sweep ------------------------------------------------------------------------------


def kvprobe_sweep(work: Path, releases: str) -> tuple[float, Path, dict]:
    """Wall seconds of one warm sweep, its bundle and receipt."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="sweep-")) / "bundle"
    argv = [*kvprobe_argv(), "sweep", EXPERIMENT, "--releases", releases, "--jobs", "2", "--out", str(out)]
    elapsed = wall(argv, ok=(0, 1))
    return elapsed, out, json.loads((out / "receipt.json").read_text())


def bench_sweep(figs: Figures, work: Path, reps: int) -> None:
    """Goal 4: one more release in a warm sweep costs at most the per-release floor / cores
    (a sweep of N+1 releases minus one of N, against bench/sweep.py's floor_once).
    """
    from sweep import floor_once  # bench/sweep.py, beside this script

    _log(f"warming: one `kvprobe sweep {EXPERIMENT} --releases {SWEEP_N1}` (fetches what is missing)")
    _, bundle, receipt = kvprobe_sweep(work, SWEEP_N1)
    ran = [r for r in receipt["releases"] if r["wheel"] is not None]
    if len(ran) != len(SWEEP_N1.split(",")):
        raise SystemExit(f"bench: the warm-up sweep ran {len(ran)} releases, not {len(SWEEP_N1.split(','))}")
    small, large, per_unit = [], [], []
    for _ in range(reps):
        small.append(kvprobe_sweep(work, SWEEP_N)[0])
        seconds, _, receipt = kvprobe_sweep(work, SWEEP_N1)
        large.append(seconds)
        per_unit.append(receipt["timings"]["units_s"] / len(ran))
    cores = os.cpu_count() or 1
    floors = []
    for _ in range(reps):
        scratch = Path(tempfile.mkdtemp(dir=work, prefix="sweep-floor-"))
        floors.append(floor_once(receipt, bundle, ran[-1], scratch) / cores)
        shutil.rmtree(scratch, ignore_errors=True)
    marginal = [b - a for a, b in zip(small, large, strict=True)]
    figs.add(
        "sweep",
        f"marginal cost of one more release, warm sweep of {EXPERIMENT} --jobs 2",
        marginal,
        floor=floors,
        target="<= 1.0x (per-release floor / cores)",
        met=statistics.median(marginal) <= statistics.median(floors),
        note=f"N={len(SWEEP_N.split(','))}: {', '.join(f'{x:.1f}' for x in small)} s; "
        f"N+1: {', '.join(f'{x:.1f}' for x in large)} s; floor = {EXPERIMENT}'s probes on {ran[-1]['version']} "
        f"/ {cores} cores",
    )
    figs.add(
        "sweep",
        f"units_s / releases from the N+1 sweep's receipt ({EXPERIMENT})",
        per_unit,
        floor=floors,
        note="the sweep's release phase per release (excludes start-up and env check)",
    )


SEVERAL = ("experiment-c", "experiment-d", "experiment-e")
SEVERAL_RELEASES = "0.5.20,0.5.21"


def bench_several(figs: Figures, work: Path) -> None:
    """Several experiments in one invocation against the same ones one after the other, warm:
    `run C D E` and `sweep C D E --releases 0.5.20,0.5.21` (one sample each: minutes)."""
    for command, extra in (("run", []), ("sweep", ["--releases", SEVERAL_RELEASES])):
        if command == "run":  # the sweeps' releases are the runs' pins: warmed here too
            _log(f"warming: one `kvprobe {command} {' '.join(SEVERAL)}` (fetches what is missing)")
            wall([*kvprobe_argv(), command, *SEVERAL, *extra, "--out", tempfile.mkdtemp(dir=work)], ok=(0, 1, 3))
        apart, waits = [], []
        for exp in SEVERAL:
            out = Path(tempfile.mkdtemp(dir=work)) / "bundle"
            apart.append(wall([*kvprobe_argv(), command, exp, *extra, "--out", str(out)], ok=(0, 1, 3)))
            waits.append(json.loads((out / "receipt.json").read_text())["timings"].get("preload_s", 0.0))
        out = Path(tempfile.mkdtemp(dir=work))
        together = wall([*kvprobe_argv(), command, *SEVERAL, *extra, "--out", str(out)], ok=(0, 1, 3))
        shown = f"{command} {' '.join(SEVERAL)}{' --releases ' + SEVERAL_RELEASES if extra else ''}"
        figs.add(
            "several",
            f"kvprobe {shown}: one command vs the {command}s one after the other",
            [together],
            floor=[sum(apart)],
            note=f"apart: {', '.join(f'{x:.1f}' for x in apart)} s"
            + (f"; preload waits apart: {', '.join(f'{x:.1f}' for x in waits)} s" if command == "run" else ""),
        )


# --- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a few minutes in all)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--full", action="store_true", help="env section: also the sglang-cpu lock (~6 GB, minutes)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    reps = {
        "env": 3 if args.quick else 5,
        "warm": 2 if args.quick else 3,
        "fast": 3 if args.quick else 7,
        "startup": 7 if args.quick else 20,
    }
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kvprobe-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    figs = Figures()
    started = time.perf_counter()
    try:
        bundle = None
        if "startup" in only:
            bench_startup(figs, work, reps["startup"])
        if "warm" in only or {"verify", "memory"} & set(only):
            bundle = bench_warm(figs, work, reps["warm"]) if "warm" in only else _one_bundle(work)
        if {"verify", "memory"} & set(only):
            big = bench_hashing(figs, work, reps["fast"]) if "verify" in only else make_file(work / "big.bin", GiB)
            if "verify" in only:
                bench_verify(figs, work, bundle, big, reps["fast"])
            if "memory" in only:
                bench_memory(figs, work, bundle, big)
        if "hostile" in only:
            bench_hostile(figs, work)
        if "cold" in only:
            bench_git(figs, work, 400 if args.quick else 2000)
            bench_reuse(figs, work, reps["fast"])
        if "sweep" in only:
            bench_sweep(figs, work, 1 if args.quick else 2)
        if "several" in only:
            bench_several(figs, work)
        if "env" in only:
            bench_env(figs, work, args.full, reps["env"])
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    doc = {
        "schema": "kvprobe.bench/1",
        "quick": args.quick,
        "seconds": round(time.perf_counter() - started, 1),
        "machine": _machine(),
        "figures": figs.items,
    }
    print_goals(figs.items)
    missed = [f["name"] for f in figs.items if f["met"] is False]
    print(f"done in {doc['seconds']} s; targets missed: {', '.join(missed) or 'none'}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=2))
    return 0


def goal_line(fig: dict[str, Any]) -> str:
    """One goal: figure, floor, ratio, target, met or missed."""
    u = fig["unit"]
    floor = _fmt(fig["floor"]["median"], u) if "floor" in fig else "-"
    ratio = f"{fig['ratio']:.2f}x" if "ratio" in fig else "-"
    verdict = "met" if fig["met"] else "MISSED"
    figure = _fmt(fig["median"], u)
    return f"{fig['name']}: figure {figure}; floor {floor}; ratio {ratio}; target {fig['target']}; {verdict}"


def print_goals(items: list[dict[str, Any]]) -> None:
    goals = [f for f in items if f["target"]]
    if goals:
        print("goals:", file=sys.stderr)
        for fig in goals:
            print(f"  [{fig['section']}] {goal_line(fig)}", file=sys.stderr)


def _one_bundle(work: Path) -> Path:
    _log(f"making one bundle with `kvprobe run {EXPERIMENT}` for the verify/memory sections")
    keep: list[Path] = []
    kvprobe_run(work, 2, keep)
    return keep[0]


def _machine() -> dict[str, Any]:
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem / GiB, 1),
        "python": platform.python_version(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


if __name__ == "__main__":
    sys.exit(main())
