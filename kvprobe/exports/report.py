"""Render a bundle's receipt for a security review: Markdown, OpenVEX v0.2.0, in-toto Statement v1.

The renderers are pure: a :class:`BundleView` (the receipt, the manifest and manifest.json's
sha256) in, text or a JSON document out. They restate what the receipt records and never
more: an OpenVEX document says ``affected``/``fixed`` only for a ``reproduced`` verdict, and
every statement cites the receipt's and the bundle's digests, the evidence layer and its
limits. :func:`load` reads a bundle directory strictly; :func:`render` validates the JSON
formats against their vendored schemas (through :mod:`kvprobe.schema`) before returning.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import quote, urlsplit

from kvprobe import __version__, files
from kvprobe.evidence import manifest as manifest_mod
from kvprobe.errors import SchemaError, UsageError, VerificationFailed
from kvprobe.strict_json import load_document
from kvprobe.names import MANIFEST, MANIFEST_SCHEMA, RECEIPT, RECEIPT_SCHEMA, SIDES

FORMATS = ("markdown", "openvex", "intoto")
OPENVEX_CONTEXT = "https://openvex.dev/ns/v0.2.0"
OPENVEX_SCHEMA = "openvex/0.2.0"            # keys of kvprobe.schema.KNOWN
INTOTO_SCHEMA = "in-toto/statement-v1"
INTOTO_STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://kvprobe.dev/attestation/receipt/v1"
_MAX_VALUE = 160  # characters of one observed value shown in a Markdown cell
_GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class BundleView:
    """What the renderers read: the receipt, the manifest and manifest.json's sha256.

    ``name`` is how the verify command in the Markdown names the bundle directory.
    """

    receipt: Mapping[str, Any]
    manifest: Mapping[str, Any]
    manifest_sha256: str
    name: str = "BUNDLE"

    @property
    def receipt_sha256(self) -> str:
        """receipt.json's sha256 as the manifest records it; SchemaError if it is not listed."""
        for entry in self.manifest.get("files", []):
            if entry.get("path") == RECEIPT:
                return entry["sha256"]
        raise SchemaError("manifest.json does not list receipt.json")


# --- reading a bundle ----------------------------------------------------------------------

def load(bundle: Path) -> BundleView:
    """Read ``bundle``'s receipt.json and manifest.json, both schema-checked, and check that the
    files on disk are exactly the ones the manifest lists, byte for byte.

    Raises UsageError (not a bundle directory), SchemaError (malformed or unknown-version JSON)
    and VerificationFailed (files differ from the manifest).
    """
    from kvprobe import schema

    root = Path(bundle)
    if not root.is_dir():
        raise UsageError(f"{bundle}: not a bundle directory",
                         hints=["pass the directory `kvprobe run` wrote (it holds receipt.json and manifest.json)"])
    missing = [n for n in (RECEIPT, MANIFEST) if not (root / n).is_file()]
    if missing:
        raise UsageError(f"{bundle}: not a kvprobe bundle: no {' and no '.join(missing)}")
    manifest_bytes = (root / MANIFEST).read_bytes()
    manifest = load_document(manifest_bytes, f"{bundle}/{MANIFEST}")
    _check_version(manifest, MANIFEST_SCHEMA, f"{bundle}/{MANIFEST}")
    schema.validate(manifest, MANIFEST_SCHEMA, source=f"{bundle}/{MANIFEST}")
    receipt = load_document((root / RECEIPT).read_bytes(), f"{bundle}/{RECEIPT}")
    _check_version(receipt, RECEIPT_SCHEMA, f"{bundle}/{RECEIPT}")
    schema.validate(receipt, RECEIPT_SCHEMA, source=f"{bundle}/{RECEIPT}")
    problems = _differences(manifest, manifest_mod.build(root))
    if problems:
        raise VerificationFailed(
            f"{bundle}: files differ from manifest.json ({len(problems)} problem(s)); not rendering a report",
            hints=[*problems[:20], f"run `kvprobe verify {bundle}` for the full check"])
    return BundleView(receipt, manifest, manifest_mod.sha256_bytes(manifest_bytes), root.resolve().name)


def _check_version(doc: Any, version: str, source: str) -> None:
    found = doc.get("schema") if isinstance(doc, dict) else None
    if found != version:
        raise SchemaError(f"{source}: schema {found!r} is not {version!r}, the version this kvprobe reads",
                          hints=["upgrade kvprobe if the bundle is newer"])


def _differences(recorded: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    want = {f["path"]: f for f in recorded["files"]}
    have = {f["path"]: f for f in actual["files"]}
    problems = [f"{p}: listed in manifest.json, missing on disk" for p in sorted(want.keys() - have.keys())]
    problems += [f"{p}: on disk, not listed in manifest.json" for p in sorted(have.keys() - want.keys())]
    problems += [f"{p}: sha256 {have[p]['sha256']} on disk, manifest.json says {want[p]['sha256']}"
                 for p in sorted(want.keys() & have.keys()) if want[p]["sha256"] != have[p]["sha256"]
                 or want[p]["size"] != have[p]["size"]]
    return problems


# --- shared facts --------------------------------------------------------------------------

def vulnerability_name(receipt: Mapping[str, Any]) -> str:
    """A stable name for the defect, after its fix: ``SGLANG-PD-KV-38935`` (no CVE is recorded)."""
    project = _project(receipt) or receipt["experiment"]["id"]
    prs = receipt["experiment"]["fix"]["prs"]
    suffix = "-".join(str(n) for n in prs) if prs else receipt["experiment"]["id"]
    return re.sub(r"[^A-Za-z0-9]+", "-", f"{project}-PD-KV-{suffix}").strip("-").upper()


def _project(receipt: Mapping[str, Any]) -> str | None:
    for side in SIDES:
        pin = receipt["sides"][side]["pin"]
        if pin.get("kind") == "wheel":
            return pin["package"]
    upstream = receipt["experiment"].get("upstream")
    if upstream:
        return urlsplit(upstream).path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or None
    return None


def _pr_url(receipt: Mapping[str, Any], number: int) -> str | None:
    upstream = receipt["experiment"].get("upstream") or ""
    return f"{upstream.rstrip('/').removesuffix('.git')}/pull/{number}" if _GITHUB.match(upstream) else None


def _prs_text(receipt: Mapping[str, Any], *, links: bool) -> str:
    parts = []
    for n in receipt["experiment"]["fix"]["prs"]:
        url = _pr_url(receipt, n)
        parts.append(f"[#{n}]({url})" if links and url else f"#{n}" + (f" ({url})" if url else ""))
    return ", ".join(parts) or "no PR recorded"


def purl(receipt: Mapping[str, Any], side: str) -> str:
    """The package URL of one side's pin; UsageError for a synthetic pin or an unnamed repo."""
    pin = receipt["sides"][side]["pin"]
    if pin["kind"] == "wheel":
        name = re.sub(r"[-_.]+", "-", pin["package"]).lower()
        return f"pkg:pypi/{name}@{quote(pin['version'], safe='.-_~')}"
    if pin["kind"] == "git":
        upstream = receipt["experiment"].get("upstream") or ""
        match = _GITHUB.match(upstream)
        if match:
            return f"pkg:github/{match.group(1).lower()}/{match.group(2).lower()}@{pin['commit']}"
        if upstream:
            name = _project(receipt) or "upstream"
            vcs = quote(f"git+{upstream}@{pin['commit']}", safe="")
            return f"pkg:generic/{quote(name.lower(), safe='.-_~')}@{pin['commit']}?vcs_url={vcs}"
        raise UsageError(f"{side} pin is commit {pin['commit']} but the receipt names no upstream "
                         "repository, so there is no product to name")
    raise UsageError(f"the {side} side is a synthetic model (switches {pin.get('switches')!r}), "
                     "not an SGLang release or commit: there is no product to make a VEX statement about")


def _pin_text(receipt: Mapping[str, Any], side: str) -> str:
    pin = receipt["sides"][side]["pin"]
    if pin["kind"] == "wheel":
        return f"{pin['filename']} (sha256 {pin['sha256']})"
    if pin["kind"] == "git":
        return f"commit {pin['commit']}"
    return f"synthetic model switches {json.dumps(pin.get('switches'), sort_keys=True)}"


def _counts_text(receipt: Mapping[str, Any]) -> str:
    c = receipt["comparison"]["counts"]
    return (f"{c['observations_matched']}/{c['observations_expected']} expected observations matched, "
            f"{c['observations_changed']} observations changed from base to head, "
            f"{c['tests']} upstream test results ({c['fail_to_pass']} fail-to-pass)")


def verify_command(view: BundleView) -> str:
    return f"kvprobe verify {view.name} --expect-manifest-sha256 {view.manifest_sha256}"


def failure_kinds_text(kinds: Mapping[str, int]) -> str:
    """``{"assertion": 0, "AttributeError": 6, "ValueError": 1}`` ->
    ``6 AttributeError + 1 ValueError, 0 assertion failures``."""
    assertion = kinds.get("assertion", 0)
    others = sorted(((n, k) for k, n in kinds.items() if k != "assertion" and n), key=lambda t: (-t[0], t[1]))
    words = {"collection": "collection error", "infrastructure": "infrastructure error",
             "timeout": "timeout", "exception": "exception"}
    parts = []
    for n, kind in others:
        label = words.get(kind, kind)
        parts.append(f"{n} {label}{'s' if n != 1 and kind in words else ''}")
    tail = f"{assertion} assertion failure{'' if assertion == 1 else 's'}"
    return f"{' + '.join(parts)}, {tail}" if parts else tail


# --- Markdown ------------------------------------------------------------------------------

def _oneline(text: Any) -> str:
    """Prose outside tables: whitespace (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def _code(text: str) -> str:
    """An inline code span that survives backticks in ``text``."""
    text = _oneline(text)
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: Any) -> str:
    """Prose in a table cell: HTML-special characters as entities, backslashes doubled, every
    pipe escaped and line breaks as <br>, so no value can add, drop or split a cell."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    lines = [line.strip() for line in re.split(r"\r\n|\r|\n", text)]
    return "<br>".join(lines)


def code_cell(text: str) -> str:
    """A code span in a table cell when that is safe (no backslash, backtick or line break);
    otherwise the same text as escaped prose."""
    if re.search(r"[\\`\r\n]", text) or not text.strip():
        return cell(text)
    return "`" + text.replace("|", "\\|") + "`"


def _value(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    if len(text) > _MAX_VALUE:
        text = text[:_MAX_VALUE - 1] + "…"
    return code_cell(text)


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _case_outcome(case: Mapping[str, Any] | None) -> str:
    if case is None:
        return "not run"
    if case["status"] == "raised":
        root = case.get("root_type")
        extra = f" (root {code_cell(root)})" if root and root != case.get("error_type") else ""
        return f"raised {code_cell(case.get('error_type') or 'an exception')}{extra}"
    return "behaviour"


def _check(row: Mapping[str, Any]) -> str:
    declared = row["expected_base_declared"] or row["expected_head_declared"]
    if not declared:
        return "changed (no expectation)"
    bad = [s for s in SIDES if not row[f"{s}_ok"]]
    return f"**mismatch**: {', '.join(bad)}" if bad else "ok"


def _observed(row: Mapping[str, Any], side: str, case: Mapping[str, Any] | None) -> str:
    if row[f"{side}_recorded"]:
        return _value(row[side])
    if case is None:
        return "(case not run)"
    return "(not recorded: case raised)" if case["status"] == "raised" else "(not recorded)"


def _expected(row: Mapping[str, Any], side: str) -> str:
    return _value(row[f"expected_{side}"]) if row[f"expected_{side}_declared"] else "—"


def _side_tests(summary: Mapping[str, Any]) -> str:
    tests = summary.get("tests") or {}
    total = sum(tests.values())
    text = f"{tests.get('passed', 0)}/{total} passed"
    subtests = summary.get("subtests") or {}
    if subtests:
        text += f" (+{sum(subtests.values())} subtests, {subtests.get('passed', 0)} passed)"
    text += "; " + failure_kinds_text(summary.get("failure_kinds") or {})
    if summary.get("problem"):
        text += f"; problem: {summary['problem']}"
    return text


def _test_outcome(row: Mapping[str, Any], side: str) -> str:
    outcome = row.get(side)
    if outcome is None:
        return "not run"
    detail = row.get(f"{side}_exc_type") or row.get(f"{side}_kind")
    return f"{outcome} ({detail})" if outcome in ("failed", "error") and detail else outcome


def markdown(view: BundleView) -> str:
    """A block to paste into a security review; tables hold any value without breaking."""
    r = view.receipt
    exp, comp, ev = r["experiment"], r["comparison"], r["evidence"]
    fix = exp["fix"]
    env, host = r.get("env") or {}, r.get("host") or {}
    out = [f"## kvprobe evidence: {_oneline(exp['id'])}: {_oneline(exp['title'])}", ""]
    release = f", first released in {_oneline(fix['release'])}" if fix.get("release") else ""
    out += [
        f"- **Verdict:** **{r['verdict']}**: {_counts_text(r)}",
        f"- **Evidence layer:** {_code(ev['layer'])}",
        f"- **Fix:** {_prs_text(r, links=True)}{release}. {_oneline(fix['summary'])}",
        f"- **Upstream:** {_oneline(exp.get('upstream') or 'not recorded')}",
        f"- **Experiment:** {_code(exp['id'])} ({_code(exp['file'])}, sha256 {_code(exp['sha256'])})",
        f"- **Run:** {_code(r['run_id'])} at {r['created_utc']} by kvprobe {r['tool']['version']}; "
        f"pin set {_code(r['pin_set']['name'])} ({r['pin_set']['kind']})",
    ]
    if env:
        torch = env.get("torch") or {}
        torch_text = f", torch {torch.get('version')} from {env.get('torch_index')}" if torch else ""
        out.append(f"- **Environment:** Python {env.get('python')} on {host.get('system', '?')} "
                   f"{host.get('machine', '?')}, profile {_code(env.get('profile', '?'))}, lock "
                   f"{_code(env.get('lock_name') or '-')} sha256 {_code(env.get('lock_sha256') or '-')}{torch_text}")
    out += ["", "### Pins", ""]
    out += _table(["side", "kind", "pin", "digest"], [_pin_row(r, side) for side in SIDES])

    if comp["reasons"]:
        out += [f"### Why the verdict is {r['verdict']}", ""]
        out += [f"- {_oneline(reason)}" for reason in comp["reasons"]] + [""]

    out += _cases_section(r)
    out += _tests_section(r)
    out += _mocks_section(ev)
    out += ["### Scope", "", f"**What this shows:** {_oneline(ev['shows'])}", "", "**What this does not show:**", ""]
    out += [f"- {_oneline(item)}" for item in ev["does_not_show"]] + [""]
    if ev.get("limits"):
        out += ["**Limits:**", ""] + [f"- {_oneline(item)}" for item in ev["limits"]] + [""]
    out += [
        "### Integrity", "",
        f"- **Bundle manifest sha256:** {_code(view.manifest_sha256)} (sha256 of the bundle's manifest.json, "
        "which lists every other file with its sha256)",
        f"- **Receipt sha256:** {_code(view.receipt_sha256)}",
        "- **Verify:**", "",
        "```sh", verify_command(view), "```", "",
    ]
    return "\n".join(out)


def _pin_row(r: Mapping[str, Any], side: str) -> list[str]:
    pin = r["sides"][side]["pin"]
    if pin["kind"] == "wheel":
        return [side, "wheel", f"{code_cell(pin['filename'])} ({cell(pin['package'])} {cell(pin['version'])})",
                f"sha256 {code_cell(pin['sha256'])}"]
    if pin["kind"] == "git":
        note = ""
        if side == "head" and r["pin_set"].get("pr"):
            note = f" (PR head, fetch via refs/pull/{r['pin_set']['pr']}/head)"
        return [side, "git", f"commit {code_cell(pin['commit'])}{note}", f"gitCommit {code_cell(pin['commit'])}"]
    switches = json.dumps(pin.get("switches"), sort_keys=True)
    return [side, cell(pin["kind"]), f"model switches {code_cell(switches)}", "—"]


def _cases_section(r: Mapping[str, Any]) -> list[str]:
    comp = r["comparison"]
    cases = comp["cases"]
    by_case: dict[str, list[dict]] = {}
    for row in comp["observations"]:
        by_case.setdefault(row["case"], []).append(row)
    keys = sorted(set(by_case) | set(cases.get("base", {})) | set(cases.get("head", {})))
    if not keys:
        return ["### Probe cases", "", "No probe case ran.", ""]
    out = ["### Probe cases", "",
           "\"behaviour\": the case ran to its end and recorded what the code did; \"raised\": the code "
           "under test raised, and the exception type is itself an observation.", ""]
    summary = []
    for key in keys:
        rows = by_case.get(key, [])
        declared = [x for x in rows if x["expected_base_declared"] or x["expected_head_declared"]]
        ok = sum(1 for x in declared if x["base_ok"] and x["head_ok"])
        summary.append([code_cell(key), _case_outcome(cases.get("base", {}).get(key)),
                        _case_outcome(cases.get("head", {}).get(key)),
                        f"{ok}/{len(declared)}" + ("" if ok == len(declared) else " **mismatch**"),
                        str(sum(1 for x in rows if x["changed"]))])
    out += _table(["case", "base", "head", "expected matched", "changed"], summary)
    out += ["Per case, every observation with a declared expectation or a base/head difference "
            "(\"—\": no expectation declared; unchanged, undeclared observations are only in receipt.json).", ""]
    for key in keys:
        shown = [x for x in by_case.get(key, [])
                 if x["expected_base_declared"] or x["expected_head_declared"] or x["changed"]]
        if not shown:
            continue
        out += [f"#### {_code(key)}", ""]
        out += _table(["observation", "base", "expected base", "head", "expected head", "check"],
                      [[code_cell(x["observation"]), _observed(x, "base", cases.get("base", {}).get(key)),
                        _expected(x, "base"), _observed(x, "head", cases.get("head", {}).get(key)),
                        _expected(x, "head"), _check(x)] for x in shown])
    return out


def _tests_section(r: Mapping[str, Any]) -> list[str]:
    comp = r["comparison"]
    out = ["### Upstream tests", ""]
    if not comp["test_summary"]:
        return out + ["No upstream test ran on these pins (see the limits below).", ""]
    rows = []
    for path, s in sorted(comp["test_summary"].items()):
        moves = ", ".join(f"{n} {t}" for t, n in sorted(s.get("transitions", {}).items())) or "none"
        rows.append([code_cell(path), cell(moves), cell(_side_tests(s["base"])), cell(_side_tests(s["head"]))])
    out += _table(["file", "transitions", "base", "head"], rows)
    if comp["tests"]:
        out += _table(["test", "base", "head", "transition"],
                      [[code_cell(t["test"]), cell(_test_outcome(t, "base")), cell(_test_outcome(t, "head")),
                        cell(t["transition"])] for t in comp["tests"]])
    return out


def _mocks_section(ev: Mapping[str, Any]) -> list[str]:
    out = ["### Mock boundary", ""]
    if not ev.get("mocks"):
        return out + ["No probe declared mocks.", ""]
    out += ["What each probe replaced, as the probe declares it (receipt.evidence.mocks).", ""]
    rows = [[code_cell(probe), code_cell(target), cell(what)]
            for probe, mocks in sorted(ev["mocks"].items()) for target, what in sorted(mocks.items())]
    return out + _table(["probe", "replaced", "with"], rows)


# --- OpenVEX -------------------------------------------------------------------------------

def _product(r: Mapping[str, Any], side: str) -> dict[str, Any]:
    pin = r["sides"][side]["pin"]
    ident = purl(r, side)
    product: dict[str, Any] = {"@id": ident, "identifiers": {"purl": ident}}
    if pin["kind"] == "wheel":
        product["hashes"] = {"sha-256": pin["sha256"]}
    # A git pin's identity is the commit in its purl: OpenVEX's hash names are for artifact
    # bytes and its identifier keys are closed (purl, cpe22, cpe23), so no "gitCommit" field.
    return product


def _evidence_note(view: BundleView, side: str) -> str:
    r = view.receipt
    ev = r["evidence"]
    parts = [
        f"Determined by kvprobe from receipt sha256 {view.receipt_sha256} (receipt.json of the bundle "
        f"whose manifest.json sha256 is {view.manifest_sha256}; check it with `kvprobe verify BUNDLE "
        f"--expect-manifest-sha256 {view.manifest_sha256}`), experiment {r['experiment']['id']}, "
        f"run {r['run_id']}.",
        f"Verdict {r['verdict']}: {_counts_text(r)}.",
        f"Tested {side}: {_pin_text(r, side)}.",
        f"Evidence layer {ev['layer']}: {_oneline(ev['shows'])}",
        "It does not show: " + "; ".join(_oneline(x) for x in ev["does_not_show"]) + ".",
    ]
    if ev.get("limits"):
        parts.append("Limits: " + "; ".join(_oneline(x) for x in ev["limits"]) + ".")
    return " ".join(parts)


def _action(r: Mapping[str, Any]) -> str:
    fix = r["experiment"]["fix"]
    head = r["sides"]["head"]["pin"]
    prs = _prs_text(r, links=False)
    if head["kind"] == "wheel":
        tested = "the release kvprobe tested as fixed"
        if fix.get("release") and fix["release"] != head["version"]:
            tested += f"; {fix['release']} is the first release with the fix"
        return f"Upgrade {head['package']} to {head['version']} or later ({tested}), or backport {prs}."
    release = f" (first released in {fix['release']})" if fix.get("release") else ""
    return (f"Backport {prs} or move to a version that contains it{release}; kvprobe tested "
            f"commit {head['commit']} as fixed.")


def openvex(view: BundleView, *, author: str = "kvprobe") -> dict[str, Any]:
    """An OpenVEX v0.2.0 document. ``affected`` (base) and ``fixed`` (head) only when the
    receipt's verdict is ``reproduced``; otherwise both sides are ``under_investigation``.
    Raises UsageError for a synthetic-model receipt (it names no product)."""
    r = view.receipt
    exp = r["experiment"]
    prs = _prs_text(r, links=False)
    release = f", first released in {exp['fix']['release']}" if exp["fix"].get("release") else ""
    vulnerability = {
        "name": vulnerability_name(r),
        "description": (f"{_oneline(exp['title'])}. The receipt names no CVE; this name stands for the defect "
                        f"fixed upstream by {prs}{release}. {_oneline(exp['fix']['summary'])}"),
    }
    products = {side: _product(r, side) for side in SIDES}
    stamp = r["created_utc"]
    if r["verdict"] == "reproduced":
        statements = [
            {"vulnerability": vulnerability, "products": [products["base"]], "status": "affected",
             "action_statement": _action(r), "timestamp": stamp,
             "status_notes": _evidence_note(view, "base")},
            {"vulnerability": vulnerability, "products": [products["head"]], "status": "fixed",
             "timestamp": stamp, "status_notes": _evidence_note(view, "head")},
        ]
    else:
        reasons = r["comparison"]["reasons"]
        why = (f"The receipt's verdict is {r['verdict']!r}, not 'reproduced', so kvprobe claims neither "
               f"affected nor fixed for this product.")
        if reasons:
            why += f" Reasons ({len(reasons)}): " + "; ".join(_oneline(x) for x in reasons[:5])
            why += "; ..." if len(reasons) > 5 else "."
        statements = [{"vulnerability": vulnerability, "products": [products[side]],
                       "status": "under_investigation", "timestamp": stamp,
                       "status_notes": f"{why} {_evidence_note(view, side)}"} for side in SIDES]
    return {
        "@context": OPENVEX_CONTEXT,
        "@id": f"urn:kvprobe:openvex:{exp['id']}:{view.manifest_sha256}",
        "author": author,
        "timestamp": stamp,
        "version": 1,
        "tooling": f"kvprobe {__version__} (report --format openvex) from a kvprobe {r['tool']['version']} receipt",
        "statements": statements,
    }


# --- in-toto -------------------------------------------------------------------------------

def intoto(view: BundleView) -> dict[str, Any]:
    """An in-toto Statement v1: every bundle file (and manifest.json itself) by sha256, the
    pinned commits by gitCommit or wheels by sha256, the receipt as predicate."""
    r = view.receipt
    subjects = [{"name": f["path"], "digest": {"sha256": f["sha256"]}} for f in view.manifest["files"]]
    subjects.append({"name": MANIFEST, "digest": {"sha256": view.manifest_sha256}})
    upstream = (r["experiment"].get("upstream") or "").rstrip("/")
    for side in SIDES:
        pin = r["sides"][side]["pin"]
        if pin["kind"] == "git":
            subject = {"name": f"{_project(r) or 'upstream'}@{pin['commit']}", "digest": {"gitCommit": pin["commit"]}}
            if upstream:
                subject["uri"] = f"git+{upstream}@{pin['commit']}"
        elif pin["kind"] == "wheel":
            subject = {"name": pin["filename"], "uri": purl(r, side), "digest": {"sha256": pin["sha256"]}}
        else:
            continue  # a synthetic side has no artifact to name
        subject["annotations"] = {"kvprobeSide": side}
        subjects.append(subject)
    return {"_type": INTOTO_STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE,
            "predicate": json.loads(json.dumps(r))}


# --- entry point ---------------------------------------------------------------------------

def render(view: BundleView, fmt: str, *, author: str = "kvprobe") -> str:
    """The text to write for ``fmt``; JSON formats pass their schema first (SchemaError if not)."""
    from kvprobe import schema

    if fmt == "markdown":
        return markdown(view)
    if fmt == "openvex":
        doc, version = openvex(view, author=author), OPENVEX_SCHEMA
    elif fmt == "intoto":
        doc, version = intoto(view), INTOTO_SCHEMA
    else:
        raise UsageError(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    schema.validate(doc, version, source=f"{fmt} document")
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; UsageError when its directory does not exist."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"{path}: directory {directory} does not exist")
    files.write_atomic(path, text.encode("utf-8"))
