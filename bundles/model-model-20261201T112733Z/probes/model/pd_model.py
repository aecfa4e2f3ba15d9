"""A small synthetic model of a prefill/decode (PD) disaggregated KV handoff.

It reproduces the *mechanism* of the 2026 cross-request KV exposure, not SGLang:
nothing from SGLang is imported, and every name below is the model's own (some
mirror SGLang's so the story can be followed). What it can prove is how the
model's guards behave; it proves nothing about SGLang's runtime.

The model, in one breath:
- A paged KV pool per worker. Releasing pages does NOT clear them: the next
  owner sees the old contents until it overwrites them (as on a real GPU pool).
- Every request writes its tenant's canary into each page it fills, so a read
  of a page tells whose data it is.
- The seven-step path: bootstrap (decode reserves pages for the ORIGINAL prompt
  length), prefill admission, prefill forward (a rejected request runs as a
  1-token placeholder), KV transfer of only the pages prefill wrote, decode
  admission, decode attention over all reserved pages, response.
- Four switches mirror the upstream history (see ``Switches``).

Stdlib only: the probe files run it inside kvprobe's own interpreter.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable

# ---------------------------------------------------------------- geometry

INCIDENT_CONTEXT_TOKENS = 1_048_576   # declared context length of the deployment
INCIDENT_PREFILL_POOL_TOKENS = 681_280  # what the prefill KV pool actually held
INCIDENT_RAISED_POOL_TOKENS = 2_040_000  # "about 2.04 M" after the fix
SCALE = 1024  # every token count is divided by this; the pool/context ratio is kept
DECODE_TIMEOUT_S = 300  # decode's bootstrap/transfer wait before it gives up


@dataclass(frozen=True)
class Geometry:
    """Pool capacities and context length, in tokens, plus the page size."""

    context_tokens: int
    prefill_pool_tokens: int
    decode_pool_tokens: int
    page_size: int

    @classmethod
    def scaled(cls, prefill_pool_tokens: int = INCIDENT_PREFILL_POOL_TOKENS,
               page_size: int = 16) -> "Geometry":
        """The incident's numbers divided by SCALE (1,048,576 -> 1,024; 681,280 -> 665).

        Ratio pool/context: 665/1024 = 0.6494 here vs 681,280/1,048,576 = 0.6497.
        Decode's pool is the model's choice (2x context): in the incident decode
        could reserve the full prompt, so its pool was not the limit.
        """
        context = INCIDENT_CONTEXT_TOKENS // SCALE
        return cls(context, prefill_pool_tokens // SCALE, 2 * context, page_size)

    def pages_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.page_size)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- switches

DOORS = ("finished", "pending_reject")
CLEANUPS = ("pre_36988", "post_36988")


@dataclass(frozen=True)
class Switches:
    """The behaviours that changed upstream, one field per record.

    door: "finished" = admission asks ``req.finished()`` (pre-#38935), which is
        False while a rejection still sits in ``to_finish``; "pending_reject" =
        the #38935 door: also retire a pending, never-admitted rejection, but
        keep a re-entering request (it still owes a release).
    result_cleanup: "pre_36988" = an aborted prefill result is requeued as if
        unfinished (its KV is sent, metadata freed twice, Mamba state never),
        and late results of aborted requests still act; "post_36988" = retire
        the aborted result once, send nothing, late results are inert.
    kv_checksum: #39500's optional handoff checksum (here it covers the range
        decode will read; the model claims nothing about the real one's range).
    deferred_release: #41404/#41023: decode pages of an aborted request with
        RDMA writes still in flight are not reused until those writes land.
    """

    door: str
    result_cleanup: str
    kv_checksum: bool
    deferred_release: bool

    def __post_init__(self) -> None:
        if self.door not in DOORS:
            raise ValueError(f"door must be one of {DOORS}, not {self.door!r}")
        if self.result_cleanup not in CLEANUPS:
            raise ValueError(f"result_cleanup must be one of {CLEANUPS}, not {self.result_cleanup!r}")
        for name in ("kv_checksum", "deferred_release"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Switches":
        """Strict: every field present, nothing else (a missing switch is an error, not buggy-by-default)."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing, unknown = names - set(data), set(data) - names
        if missing or unknown:
            raise ValueError(f"switches: missing {sorted(missing)}, unknown {sorted(unknown)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Switches":
        return dataclasses.replace(self, **changes)


BASE = Switches(door="finished", result_cleanup="pre_36988", kv_checksum=False, deferred_release=False)
# Head: every fix that changes behaviour by default. The checksum stays off: it is
# opt-in upstream, and the head must be safe without relying on a detector.
HEAD = Switches(door="pending_reject", result_cleanup="post_36988", kv_checksum=False, deferred_release=True)


def switches_from_side(config: dict[str, Any]) -> Switches:
    """The side's switches from kvprobe_probe.side_config(); no side is an error."""
    if "switches" not in config:
        raise RuntimeError("no side switches: run with KVPROBE_SIDE_CONFIG='{\"side\": ..., \"switches\": {...}}'")
    return Switches.from_dict(config["switches"])


def case_registry(probe: Any, kp: Any) -> tuple[dict[str, Callable], Callable]:
    """(cases, decorator): ``@case(name)`` registers ``fn(switches) -> observations`` both as a
    plain function (tests call it with any switches) and as a probe case run with the side's."""
    cases: dict[str, Callable] = {}

    def case(name: str) -> Callable:
        def register(fn: Callable[[Switches], dict[str, Any]]) -> Callable:
            cases[name] = fn

            @probe.case(name, (fn.__doc__ or "").strip())
            def run(obs: Any) -> None:
                for key, value in fn(switches_from_side(kp.side_config())).items():
                    obs.record(key, value)
            return fn
        return register

    return cases, case


# ---------------------------------------------------------------- requests

ABORT_TOO_LONG = "FINISH_ABORT: input is longer than the KV pool"


@dataclass
class Req:
    """The fields of a request the bug lives in (names follow schedule_batch.Req)."""

    rid: str
    tenant: str
    origin_input_ids: list[int]
    to_finish: str | None = None
    finished_reason: str | None = None
    # resources a re-entering request may still hold (the queue owes their release)
    metadata_buffer_index: int = -1
    kv_retraction_backup: bool = False
    holds_kv: bool = False
    holds_mamba: bool = False
    session: "Session | None" = None

    @property
    def canary(self) -> str:
        return f"{self.tenant}/{self.rid}"

    def finished(self) -> bool:
        return self.finished_reason is not None

    def set_finish_with_abort(self, message: str) -> None:
        """As upstream: the prompt becomes one token and the abort waits in to_finish."""
        self.origin_input_ids = [0]
        self.to_finish = message

    def update_finish_state(self) -> None:
        """Later (after a forward pass) the pending finish becomes the real one."""
        if self.to_finish is not None and self.finished_reason is None:
            self.finished_reason, self.to_finish = self.to_finish, None

    def holds_resources(self) -> bool:
        return (self.metadata_buffer_index >= 0 or self.kv_retraction_backup
                or self.holds_kv or self.holds_mamba)


def is_unadmitted_reject(req: Req, *, is_retracted: bool = False, is_rebootstrap: bool = False) -> bool:
    """The model's #38935 predicate: a pending abort on a request that was never admitted.

    A request re-entering a queue (retracted, rebootstrapped, or still holding a
    metadata buffer, KV, a retraction backup or Mamba state) is NOT retired here:
    its queue still owes a release. (Upstream checks the metadata buffer and the
    retraction backup on prefill and the caller's flags on decode; the model
    treats any held resource as re-entry, a superset.)
    """
    if req.to_finish is None or req.finished():
        return False
    return not (is_retracted or is_rebootstrap or req.holds_resources())


def door_admits(req: Req, door: str, *, is_retracted: bool = False, is_rebootstrap: bool = False) -> bool:
    """Admission at a prefill or decode queue: True = enqueue, False = retire now."""
    if req.finished():
        return False
    if door == "finished":  # pre-#38935: blind to a rejection still in to_finish
        return True
    return not is_unadmitted_reject(req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)


@dataclass
class Session:
    """A streaming session: one request attached at a time."""

    sid: str
    attached: str | None = None


# ---------------------------------------------------------------- accounting

class Ledger:
    """Every resource handed out, and how many times it was freed.

    A handle is "kind:owner" (one of each kind per request). Freeing counts,
    it never refuses: a double free is recorded, not prevented.
    """

    def __init__(self) -> None:
        self.frees: dict[str, int] = {}

    def allocate(self, kind: str, owner: str) -> str:
        handle = f"{kind}:{owner}"
        if handle in self.frees:
            raise AssertionError(f"model bug: {handle} allocated twice")
        self.frees[handle] = 0
        return handle

    def held(self, handle: str) -> bool:
        return self.frees.get(handle) == 0

    def free(self, handle: str) -> None:
        self.frees[handle] += 1

    def owned_by(self, owner: str) -> dict[str, int]:
        return {h: n for h, n in self.frees.items() if h.endswith(f":{owner}")}

    def double_frees(self, owner: str | None = None) -> list[str]:
        return sorted(h for h, n in self._scope(owner).items() if n > 1)

    def leaks(self, owner: str | None = None) -> list[str]:
        return sorted(h for h, n in self._scope(owner).items() if n == 0)

    def freed_once(self, owner: str | None = None) -> list[str]:
        return sorted(h for h, n in self._scope(owner).items() if n == 1)

    def _scope(self, owner: str | None) -> dict[str, int]:
        return self.frees if owner is None else self.owned_by(owner)


def release_aborted(ledger: Ledger, handles: list[str], cleanup: str) -> list[str]:
    """Release what an aborted request holds; returns the log of what happened.

    post_36988: every handle once. pre_36988 (a model of "release may be skipped
    or doubled"): the abort path frees the metadata buffer, the result is then
    requeued and the inflight queue frees KV, sender and the metadata buffer
    again; Mamba/HiCache state is never freed.
    """
    held = [h for h in handles if ledger.held(h)]
    if cleanup == "post_36988":
        for h in held:
            ledger.free(h)
        return ["aborted result retired once: " + ", ".join(held)]
    log = []
    for h in held:
        if h.startswith("metadata_buffer:"):
            ledger.free(h)
            log.append(f"abort path frees {h}")
    for h in held:
        if h.startswith(("mamba:", "hicache:")):
            log.append(f"requeued result never frees {h}")
        else:
            ledger.free(h)
            log.append(f"inflight queue frees {h}")
    return log


# ---------------------------------------------------------------- KV pool

@dataclass
class Page:
    index: int
    writer: str | None = None  # rid of the request that last wrote it
    canary: str | None = None  # what it holds: "<tenant>/<rid>", or None if never written


class PagePool:
    """A fixed set of pages. Release does not clear; reuse is lowest index first.

    The free list is naive, like a tensor of free indices: a double release puts a
    page on it twice (the Ledger is what notices).
    """

    def __init__(self, name: str, capacity_tokens: int, page_size: int) -> None:
        self.name = name
        self.pages = [Page(i) for i in range(math.ceil(capacity_tokens / page_size))]
        self.free_list = list(range(len(self.pages)))

    def reserve(self, count: int) -> list[int] | None:
        if count > len(self.free_list):
            return None
        return [heapq.heappop(self.free_list) for _ in range(count)]

    def release(self, indices: list[int]) -> None:
        for i in indices:
            heapq.heappush(self.free_list, i)

    def write(self, index: int, req: Req) -> None:
        self.pages[index].writer, self.pages[index].canary = req.rid, req.canary


def digest(canaries: list[str | None]) -> str:
    return hashlib.sha256(repr(canaries).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the PD pair

@dataclass(eq=False)  # identity: flows are tracked in sets and lists
class Flow:
    """One client request's journey through prefill and decode."""

    req: Req           # prefill's copy
    dreq: Req          # decode's copy (each worker runs the same length check)
    prompt_len: int    # the ORIGINAL length the router tells decode at bootstrap
    rejected: bool     # the length check put an abort in to_finish
    handles: dict[str, str] = field(default_factory=dict)  # kind -> ledger handle
    decode_pages: list[int] = field(default_factory=list)
    prefill_pages: list[int] = field(default_factory=list)
    forwarded: bool = False
    inflight_writes: int = 0
    transfer_complete: bool = False
    prefill_released: bool = False
    prefill_retired: bool = False  # post-#36988: aborted result retired, no KV coming
    sent_checksum: str | None = None
    checksum_mismatch: bool = False
    client_aborted: bool = False
    parked: bool = False  # decode pages held back until in-flight writes land
    response: "Response | None" = None

    @property
    def rid(self) -> str:
        return self.req.rid

    def __repr__(self) -> str:  # short, for hypothesis' step printing
        return f"Flow({self.rid})"

    @property
    def done(self) -> bool:
        return self.response is not None


@dataclass
class Response:
    status: int
    outcome: str
    pages_read: int = 0
    read_writers: list[str | None] = field(default_factory=list)
    read_canaries: list[str | None] = field(default_factory=list)
    waited_s: int = 0


HANDOFF_KINDS = ("sender", "receiver", "metadata_buffer")
RETIRED_AT_DOOR = "retired at the admission door"


class Cluster:
    """One prefill worker and one decode worker sharing nothing but the transfer."""

    def __init__(self, switches: Switches, geometry: Geometry | None = None) -> None:
        self.sw = switches
        self.geo = geometry or Geometry.scaled()
        self.prefill = PagePool("prefill", self.geo.prefill_pool_tokens, self.geo.page_size)
        self.decode = PagePool("decode", self.geo.decode_pool_tokens, self.geo.page_size)
        self.ledger = Ledger()
        self.flows: dict[str, Flow] = {}
        self.pending_writes: list[tuple[Flow, int]] = []  # (source flow, decode page)
        self.log: list[str] = []
        self.violations: list[str] = []  # "a rejected request created a handoff object", ...

    # -- helpers
    def _hold(self, flow: Flow, kind: str) -> None:
        flow.handles[kind] = self.ledger.allocate(kind, flow.rid)

    def _free(self, flow: Flow, kind: str) -> None:
        """Free one resource (a second call is a double free, and KV goes back twice)."""
        if kind not in flow.handles:
            return
        self.ledger.free(flow.handles[kind])
        if kind == "decode_kv":
            self.decode.release(flow.decode_pages)
        elif kind == "prefill_kv":
            self.prefill.release(flow.prefill_pages)

    def _free_if_held(self, flow: Flow, *kinds: str) -> None:
        for kind in kinds:
            if kind in flow.handles and self.ledger.held(flow.handles[kind]):
                self._free(flow, kind)

    def handoff_objects(self, flow: Flow) -> list[str]:
        return [k for k in (*HANDOFF_KINDS, "decode_kv") if k in flow.handles]

    def _finish(self, flow: Flow, status: int, outcome: str, **kw: Any) -> Flow:
        flow.response = Response(status, outcome, **kw)
        self.log.append(f"{flow.rid}: {status} {outcome}")
        return flow

    # -- steps 1..5
    def submit(self, tenant: str, prompt_len: int, *, slow_transfer: bool = False) -> Flow:
        """A client request: length check, doors, bootstrap, prefill forward, transfer."""
        if not 0 < prompt_len <= self.geo.context_tokens:
            raise ValueError(f"prompt_len must be in 1..{self.geo.context_tokens}")
        rid = f"r{len(self.flows)}"
        req = Req(rid, tenant, list(range(1, prompt_len + 1)))
        rejected = prompt_len > self.geo.prefill_pool_tokens
        if rejected:  # fits the context, not the pool: rejected, but only in to_finish
            req.set_finish_with_abort(ABORT_TOO_LONG)
        flow = Flow(req, dataclasses.replace(req, origin_input_ids=list(req.origin_input_ids)),
                    prompt_len, rejected)
        self.flows[rid] = flow

        # the doors come before any handoff object (that is where #38935 retires)
        if not door_admits(req, self.sw.door) or not door_admits(flow.dreq, self.sw.door):
            return self._finish(flow, 400, RETIRED_AT_DOOR)

        # 1. bootstrap: decode reserves pages for the ORIGINAL prompt length
        pages = self.decode.reserve(self.geo.pages_for(prompt_len))
        if pages is None:
            return self._finish(flow, 503, "decode pool full")
        flow.decode_pages = pages
        for kind in ("decode_kv", *HANDOFF_KINDS):
            self._hold(flow, kind)
        if rejected:
            self.violations.append(f"rejected request {rid} created handoff objects "
                                   f"{self.handoff_objects(flow)}")

        # 2. prefill admission happened at the door; 3. forward of origin_input_ids
        ppages = self.prefill.reserve(self.geo.pages_for(len(req.origin_input_ids)))
        if ppages is None:
            self._free_if_held(flow, "decode_kv", *HANDOFF_KINDS)
            return self._finish(flow, 503, "prefill pool full")  # the model does not queue
        flow.prefill_pages = ppages
        self._hold(flow, "prefill_kv")
        for i in ppages:
            self.prefill.write(i, req)
        flow.forwarded = True

        # 4. transfer, or (post-#36988) retire an aborted result without sending
        if req.to_finish is not None and self.sw.result_cleanup == "post_36988":
            self.log.extend(release_aborted(self.ledger, self._prefill_handles(flow), "post_36988"))
            self._release_pool_pages(flow)
            flow.prefill_released = flow.prefill_retired = True
            self.log.append(f"{rid}: aborted result retired, no KV sent")
        else:  # normal, or pre-#36988 requeue of the aborted result as if unfinished
            self._send(flow, slow_transfer)
        req.update_finish_state()
        return flow

    def _prefill_handles(self, flow: Flow) -> list[str]:
        return [flow.handles[k] for k in ("metadata_buffer", "prefill_kv", "sender")
                if k in flow.handles]

    def _release_pool_pages(self, flow: Flow) -> None:
        self.prefill.release(flow.prefill_pages)

    def _send(self, flow: Flow, slow: bool) -> None:
        """Send only the pages prefill wrote, into decode's first reserved pages."""
        sent = [self.prefill.pages[i].canary for i in flow.prefill_pages]
        flow.sent_checksum = digest(sent)
        targets = flow.decode_pages[: len(flow.prefill_pages)]
        flow.inflight_writes = len(targets)
        self.pending_writes.extend((flow, t) for t in targets)
        if not slow:
            self.land_writes(only=flow)

    def land_writes(self, only: Flow | None = None) -> None:
        """In-flight RDMA writes land on their target pages, whoever owns them now."""
        landing = [w for w in self.pending_writes if only is None or w[0] is only]
        self.pending_writes = [w for w in self.pending_writes if w not in landing]
        for source, page in landing:
            self.decode.write(page, source.req)
            source.inflight_writes -= 1
        for source in dict.fromkeys(f for f, _ in landing):
            if source.inflight_writes == 0:
                self._transfer_done(source)

    def _transfer_done(self, flow: Flow) -> None:
        """Transfer-complete: decode verifies (if on), prefill's inflight queue releases."""
        if not flow.client_aborted:
            flow.transfer_complete = True
            if self.sw.kv_checksum:  # decode checks the range it is about to read
                seen = [self.decode.pages[i].canary for i in flow.decode_pages]
                flow.checksum_mismatch = digest(seen) != flow.sent_checksum
        if flow.rejected:  # only pre-#36988 sends an aborted result, and releases it its way
            self.log.extend(release_aborted(self.ledger, self._prefill_handles(flow),
                                            self.sw.result_cleanup))
            self._release_pool_pages(flow)
        else:
            self._free_if_held(flow, "metadata_buffer", "prefill_kv", "sender")
        flow.prefill_released = True
        if flow.parked:
            self._free_if_held(flow, "decode_kv", "receiver")
            self.log.append(f"{flow.rid}: parked decode pages released after the writes landed")

    # -- steps 5..7
    def decode_step(self, flow: Flow) -> Response | None:
        """Decode admission, (checksum), attention over every reserved page, response."""
        if flow.done or flow.client_aborted:
            return flow.response
        decode_owned = ("decode_kv", "receiver")
        if not flow.transfer_complete:
            if flow.prefill_retired:  # nothing will ever arrive
                self._free_if_held(flow, *decode_owned)
                self._finish(flow, 504, "decode timed out waiting for the KV transfer",
                             waited_s=DECODE_TIMEOUT_S)
            return flow.response
        # 5. decode admission
        if not door_admits(flow.dreq, self.sw.door):
            self._free_if_held(flow, *decode_owned)
            return self._finish(flow, 400, "retired at decode admission").response
        if self.sw.kv_checksum and flow.checksum_mismatch:
            self._free_if_held(flow, *decode_owned)
            return self._finish(flow, 500, "handoff checksum mismatch").response
        # 6. attention reads every reserved page, written or not
        read = [self.decode.pages[i] for i in flow.decode_pages]
        flow.dreq.update_finish_state()
        self._free_if_held(flow, *decode_owned)
        # 7. output was produced, so the client gets 200
        return self._finish(flow, 200, "decoded", pages_read=len(read),
                            read_writers=[p.writer for p in read],
                            read_canaries=[p.canary for p in read]).response

    def serve(self, tenant: str, prompt_len: int, **kw: Any) -> Flow:
        flow = self.submit(tenant, prompt_len, **kw)
        self.decode_step(flow)
        return flow

    # -- lifetime events
    def abort(self, flow: Flow) -> None:
        """The client goes away before decode answered (writes may still be in flight)."""
        if flow.done:
            return
        flow.client_aborted = True
        if flow.inflight_writes and self.sw.deferred_release:
            flow.parked = True  # decode pages wait for the writes to land
            self._free_if_held(flow, "receiver")
        else:
            self._free_if_held(flow, "decode_kv", "receiver")
        self._finish(flow, 499, "client aborted")

    def late_result(self, flow: Flow) -> str:
        """A result of an aborted request arrives late: "acted", "ignored" or "not applicable"."""
        aborted = flow.client_aborted or flow.rejected
        if not (aborted and flow.forwarded and flow.prefill_released):
            return "not applicable"  # not (yet) a retired request
        if self.sw.result_cleanup == "post_36988":
            self.log.append(f"{flow.rid}: late result ignored")
            return "ignored"
        # pre-#36988: it acts as a live result: sends a KV chunk and releases again
        if flow.decode_pages:
            self.decode.write(flow.decode_pages[0], flow.req)
        self._free(flow, "prefill_kv")
        self.log.append(f"{flow.rid}: late result sent a KV chunk and freed prefill KV again")
        return "acted"

    def quiescent(self) -> bool:
        return not self.pending_writes and all(f.done and (f.prefill_released or not f.forwarded)
                                               for f in self.flows.values())


# ---------------------------------------------------------------- observations

def foreign(flow: Flow, canaries: list[str | None]) -> list[str]:
    """Tenants other than the flow's own whose canaries appear in ``canaries``."""
    tenants = {c.split("/")[0] for c in canaries if c}
    return sorted(tenants - {flow.req.tenant})


def handoff_observations(cluster: Cluster, flow: Flow) -> dict[str, Any]:
    """The concrete facts one handoff case records."""
    r = flow.response
    returned = r.read_canaries if r and r.status == 200 else []
    return {
        "status": r.status if r else None,
        "outcome": r.outcome if r else "pending",
        "rejected_by_length_check": flow.rejected,
        "retired_at_door": bool(r and r.outcome == RETIRED_AT_DOOR),
        "handoff_objects": len(cluster.handoff_objects(flow)),
        "handoff_object_kinds": sorted(cluster.handoff_objects(flow)),
        "decode_pages_reserved": len(flow.decode_pages),
        "pages_written_by_prefill": len(flow.prefill_pages),
        "pages_read": r.pages_read if r else 0,
        "pages_written_by_self": sum(1 for w in (r.read_writers if r else []) if w == flow.rid),
        "stale_pages_read": sum(1 for w in (r.read_writers if r else []) if w != flow.rid),
        "foreign_canary_seen": bool(foreign(flow, returned)),
        "foreign_tenants": foreign(flow, returned),
        "checksum_mismatch_detected": flow.checksum_mismatch,
        "decode_waited_s": r.waited_s if r else 0,
        # whole cluster, so effects on other requests show too
        "double_frees": cluster.ledger.double_frees(),
        "leaks": cluster.ledger.leaks() if cluster.quiescent() else "not quiescent",
    }


# ---------------------------------------------------------------- admission queues

@dataclass
class Admission:
    """What a queue's door did with one request, and what its release did later."""

    retired_at_door: bool = False
    enqueued: bool = False
    handoff_created: bool = False
    stub_forward_passes: int = 0
    status: int | None = None  # 400 if the request ended here; None = passed on
    session_detached_at_door: bool = False
    release_log: list[str] = field(default_factory=list)


class AdmissionQueue:
    """A prefill bootstrap queue or decode prealloc queue, or NULL (non-PD) mode.

    Only the door and the release the queue owes are modelled; what happens to an
    admitted request afterwards is the handoff model's business.
    """

    def __init__(self, worker: str, switches: Switches, ledger: Ledger | None = None) -> None:
        if worker not in ("prefill", "decode", "null"):
            raise ValueError(worker)
        self.worker, self.sw = worker, switches
        self.ledger = ledger or Ledger()
        self.handles: dict[str, list[str]] = {}

    def hold(self, req: Req, kind: str) -> None:
        """Give a (re-entering) request a resource it carries to the door."""
        self.handles.setdefault(req.rid, []).append(self.ledger.allocate(kind, req.rid))
        if kind == "metadata_buffer":
            req.metadata_buffer_index = 0
        elif kind == "kv_retraction_backup":
            req.kv_retraction_backup = True
        elif kind == "kv":
            req.holds_kv = True
        elif kind == "mamba":
            req.holds_mamba = True

    def add(self, req: Req, *, is_retracted: bool = False, is_rebootstrap: bool = False) -> Admission:
        out = Admission()
        if self.worker == "null":
            # deliberately no door: one cheap stub forward, the batch boundary says 400
            out.enqueued = True
            if req.to_finish is not None:
                out.stub_forward_passes = 1
                req.update_finish_state()
                out.status = 400
            return out
        if not door_admits(req, self.sw.door, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap):
            out.retired_at_door, out.status = True, 400
            req.update_finish_state()
            if req.session is not None and req.session.attached == req.rid:
                req.session.attached = None
                out.session_detached_at_door = True
            return out
        out.enqueued = out.handoff_created = True
        self.handles.setdefault(req.rid, []).append(
            self.ledger.allocate("sender" if self.worker == "prefill" else "receiver", req.rid))
        if req.metadata_buffer_index < 0:
            self.hold(req, "metadata_buffer")
        return out

    def finish(self, req: Req, out: Admission) -> None:
        """The queue finishes an admitted request and releases what it owes."""
        handles = self.handles.get(req.rid, [])
        if req.to_finish is not None:  # an abort rode along: the aborted-result path
            if self.worker == "prefill" and req.origin_input_ids == [0]:
                out.stub_forward_passes = 1  # a rejected request runs as a 1-token placeholder
            # #36988 changed prefill's aborted-result path; decode releases once either way
            cleanup = self.sw.result_cleanup if self.worker == "prefill" else "post_36988"
            out.release_log = release_aborted(self.ledger, handles, cleanup)
            req.update_finish_state()
        else:
            for h in handles:
                if self.ledger.held(h):
                    self.ledger.free(h)
            out.release_log = [f"normal release: {', '.join(handles)}"]
        if req.session is not None and req.session.attached == req.rid:
            req.session.attached = None
