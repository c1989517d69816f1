"""What the probe receiver keeps: sums per (engine, process), within cardinality bounds.

Frames carry DELTAS; these are the agent's cumulative sums of them, so they stay
monotonic across an engine restart. Bounds: one connection's peer (its pid, from
``SO_PEERCRED``) holds at most ``per_peer`` process slots: a new process name of a peer
at its bound takes the slot of that peer's own quietest one if it went quiet, else folds.
Past ``max_processes`` distinct (engine, process) pairs, a new process takes the slot of
one gone quiet (no frame for ``QUIET_S``), else of the one holding the most series when it
holds more than its share (``share``, the store's series over the process slots), else,
for a process of the engine the agent knows (``engine_pids``: the supervised engine's
process tree), of one whose peer holds the most slots; else its frames fold into
``engine="other", process="other"`` (counted by process, ``folded``); past
``max_layers`` distinct layers of a process, its call counts into ``layer="other"``,
and past ``max_kc_layers`` its K(C) histograms (``kcops_kc_tokens{layer}``, 30 series
a layer) likewise. A process that sent nothing for ``idle_s`` is forgotten.

The request histograms (a probe that attributes K(C) to requests, vLLM's plugin) are
exported under the names the reference worker's series map to, with ``model`` (the
frame's, ``unknown`` when it names none) and ``tenant`` (the frame's: what kcops' ASGI
middleware put in vLLM's request id, kcops.kernels.integrations.vllm_tenant; ``unknown``
when it names none), at most ``kcops.tenant.DEFAULT_CAP`` tenants per (engine, model),
whatever the processes, then ``other``; the priced histogram only as its sum, the counter
``kcops_request_priced_effective_tokens_total``. Each process's K(C) mass p (the frame's)
is ``kcops_probe_kc_mass``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from operator import add
from typing import TypeVar

from kcops.agent.collectors.probe_bulk import FOLD_AFTER_FRAMES, Pending, Shape
from kcops.agent.samples import LabelPairs, Sample, histogram_samples
from kcops.histogram import BUCKETS, KC_TOKENS, Histogram
from kcops.kernels import wire
from kcops.tenant import TenantLabels

OTHER = "other"
QUIET_S = 3.0  # a process with no frame this long gives its slot (probes flush each 1 s)
MAX_FOLDED = 256  # processes named in `folded`; the rest count under "other"
MAX_LABEL = 64  # characters kept of a process or layer name sent by a probe
PER_PEER = 4  # process slots of one peer (a process renames itself once: vLLM's workers)
MAX_TENANT_SETS = 16  # (engine, model) pairs with tenant labels; later ones' are "other"
K = TypeVar("K", str, int)
KC_BOUNDS = BUCKETS[KC_TOKENS]
UNKNOWN = "unknown"  # the model, or the tenant, of a frame that names none
PRICED_TOTAL = wire.REQUEST_PRICED + "_total"


class Process:
    """Sums for one (``engine``, ``process``) label pair, and when its last frame came
    (monotonic s)."""

    def __init__(self, key: tuple[str, str], now: float, peer: int | None = None) -> None:
        self.key = key
        self.peer = peer  # the connection's peer that made it (None: fed, not received)
        self.lp: LabelPairs = (("engine", key[0]), ("process", key[1]))
        self.calls: dict[str, int] = {}
        self.errors: dict[str, int] = dict.fromkeys(wire.ERROR_KINDS, 0)
        self.internal = 0
        self.hist: dict[str, Histogram] = {}
        self.topn: dict[int, Histogram] = {}
        self.kc: dict[str, Histogram] = {}  # kcops_kc_tokens by layer
        self.dropped = 0
        self.model = ""  # the served model its frames name (the request histograms' label)
        self.requests: dict[str, dict[str, Histogram]] = {}  # request histograms by tenant
        self.p: float | None = None  # the mass p its K(C) values are K_p of
        self.seen = now
        self.out: list[Sample] | None = None  # its samples, until its next frame
        # Frames summed in bulk but not yet folded into the dicts above, by shape.
        self.pending: dict[Shape, Pending] = {}

    def series(self) -> int:
        """How many series its samples make (what it holds of the store)."""
        hists = [*self.hist.values(), *self.topn.values()]  # a few; kc: one a layer
        hists += [h for by in self.requests.values() for h in by.values()]
        n = len(self.calls) + len(self.errors) + 2 + len(self.kc) * (len(KC_BOUNDS) + 3)
        return n + sum(len(h.counts) + 2 for h in hists)


class ProbeSums:
    def __init__(
        self,
        *,
        max_processes: int,
        max_layers: int,
        max_kc_layers: int,
        idle_s: float,
        clock: Callable[[], float],
        share: int = 1 << 62,
        engine_pids: Callable[[], set[int]] = set,
    ) -> None:
        self.max_processes = max_processes
        self.per_peer = max(1, min(PER_PEER, max_processes // 2))
        self.engine_pids = engine_pids
        self.peer: int | None = None  # the peer of the frames being added (the receiver's)
        self.share = share
        self.max_layers = max_layers
        self.max_kc_layers = max_kc_layers
        self.idle_s = idle_s
        self.clock = clock
        self.procs: dict[tuple[str, str], Process] = {}  # by (engine, process)
        self.folded: dict[str, int] = {}  # frames folded into "other", by process (bounded)
        self.replaced = 0  # processes that gave their slot to a new one
        # One label set per (engine, model), whatever the processes: rotating process names
        # cannot spend it again. A forged frame's tenants are checked again (bound).
        self.tenants: dict[tuple[str, str], TenantLabels] = {}

    def proc_for(self, key: tuple[str, str], now: float) -> Process:
        p = self.procs.get(key)
        if p is None:
            if not self._room(now):
                name = f"probe:{key[0]}/{key[1]}"  # as the store names the source
                if name not in self.folded and len(self.folded) >= MAX_FOLDED:
                    name = OTHER
                self.folded[name] = self.folded.get(name, 0) + 1
                key = (OTHER, OTHER)
                p = self.procs.get(key)
            if p is None:
                p = self.procs[key] = Process(key, now, self.peer)
        p.seen = now
        p.out = None  # a frame for it: its samples change
        return p

    def _full(self) -> bool:
        return len(self.procs) - ((OTHER, OTHER) in self.procs) >= self.max_processes

    def _room(self, now: float) -> bool:
        """Whether a new process of the current peer gets a slot (freed for it if need be)."""
        peer = self.peer
        engine = peer is not None and peer in self.engine_pids()
        if peer is not None and not engine:
            mine = [p for k, p in self.procs.items() if p.peer == peer and k != (OTHER, OTHER)]
            if len(mine) >= self.per_peer:
                p = min(mine, key=lambda p: p.seen)
                return now - p.seen > QUIET_S and self._give(p)
        if self._full():
            self.forget_idle(now)
        if not self._full():
            return True
        gone = self._slot(now, engine)
        return gone is not None and self._give(gone)

    def _give(self, p: Process) -> bool:
        del self.procs[p.key]
        self.replaced += 1
        return True

    def _slot(self, now: float, engine: bool) -> Process | None:
        """The process whose slot a new one takes, or None: one gone quiet, else the one
        holding the most series, when that is more than its share: processes of a flood
        push out each other, never one that stays within its share. For the engine's own
        process, else the quietest of the peer holding the most slots (not the engine's):
        the supervised engine always has a slot."""
        held = [p for k, p in self.procs.items() if k != (OTHER, OTHER)]
        if not held:
            return None
        p = min(held, key=lambda p: p.seen)
        if now - p.seen > QUIET_S:
            return p
        n, key = max((p.series(), p.key) for p in held)
        if n > self.share:
            return self.procs[key]
        pids = self.engine_pids()
        others = [p for p in held if p.peer not in pids]
        if not (engine and others):
            return None
        slots = Counter(p.peer for p in others)
        return max(others, key=lambda p: (slots[p.peer], -p.seen))

    def forget_idle(self, now: float) -> None:
        for key in [k for k, p in self.procs.items() if now - p.seen > self.idle_s]:
            del self.procs[key]

    # -- adding --------------------------------------------------------------

    def add(self, f: wire.Frame) -> None:
        """A decoded frame."""
        p = self.proc_for((f.engine, f.process[:MAX_LABEL] or "unknown"), self.clock())
        if f.model:
            p.model = f.model
        p.p = f.p
        self.add_calls(p, f.calls_by_layer.items())
        for kind, n in f.errors.items():
            p.errors[kind] = p.errors.get(kind, 0) + n
        p.internal += f.internal_errors
        for name, h in f.histograms.items():
            self.add_plain(p, name, h, f.tenant)
        for n, h in f.topn_mass.items():
            self.add_hist(p.topn, n, h)
        for layer, h in f.kc_by_layer.items():
            self.add_kc(p, layer, h)
        p.dropped += f.dropped

    def add_calls(self, p: Process, items: Iterable[tuple[str, int]]) -> None:
        calls = p.calls
        for layer, n in items:
            layer = layer[:MAX_LABEL]
            if layer in calls:
                calls[layer] += n
            elif len(calls) < self.max_layers:
                calls[layer] = n
            else:
                calls[OTHER] = calls.get(OTHER, 0) + n

    def add_kc(self, p: Process, layer: str, h: Histogram) -> None:
        """K(C) of one layer. A layer gets its series (30 of them) with its first
        observation, not before: frames list every layer, most with zeros."""
        kc = p.kc
        layer = layer[:MAX_LABEL]
        acc = kc.get(layer)
        if acc is None:
            if not (h.sum or any(h.counts)):
                return
            if len(kc) >= self.max_kc_layers:
                layer, acc = OTHER, kc.get(OTHER)
        if acc is None:
            kc[layer] = Histogram(h.bounds, list(h.counts), h.sum)
        else:
            acc.merge(h)

    def add_plain(self, p: Process, name: str, h: Histogram, tenant: str) -> None:
        """A histogram without labels; K(C) sent without its layer (mask bit 1, which
        the probe does not set) is K(C) of layer ``unknown``; a request histogram is the
        frame's ``tenant``'s."""
        if name == KC_TOKENS:
            self.add_kc(p, wire.UNKNOWN_LAYER, h)
        elif name in wire.REQUEST_HISTOGRAMS:
            self.add_hist(p.requests.setdefault(self.tenant(p, tenant), {}), name, h)
        else:
            self.add_hist(p.hist, name, h)

    def tenant(self, p: Process, raw: str) -> str:
        """The label of a frame's tenant, within its (engine, model)'s cap; a folded
        frame's is ``other``, as its engine and process are."""
        if not raw:
            return UNKNOWN
        if p.key == (OTHER, OTHER):
            return OTHER
        key = (p.lp[0][1], p.model)
        labels = self.tenants.get(key)
        if labels is None:
            if len(self.tenants) >= MAX_TENANT_SETS:
                return OTHER
            labels = self.tenants[key] = TenantLabels(header=None)
        return labels.bound(raw)

    @staticmethod
    def add_hist(into: dict[K, Histogram], key: K, h: Histogram) -> None:
        acc = into.get(key)
        if acc is None:
            # A short fixed list (histograms, top-N entries); more is a bad probe.
            if len(into) < wire.MAX_TOPN:
                into[key] = Histogram(h.bounds, list(h.counts), h.sum)
        else:
            acc.merge(h)

    def commit(self, shape: Shape, a: int, b: int, sums: list[float], frames: int) -> None:
        """Frames of one shape, summed in bulk (``probe_bulk``)."""
        p = self.proc_for(shape.label, self.clock())
        if shape.model:
            p.model = shape.model
        p.p = shape.p
        acc = p.pending.get(shape)
        if acc is None:
            acc = p.pending[shape] = Pending(shape)
        acc.a += a
        acc.b += b
        acc.sums = list(map(add, acc.sums, sums))
        acc.frames += frames
        if acc.frames >= FOLD_AFTER_FRAMES:
            self.fold(p)

    # -- folding ---------------------------------------------------------------

    def fold(self, p: Process) -> None:
        """Move the pending sums of ``p`` into its counters and histograms."""
        pending, p.pending = p.pending, {}
        for acc in pending.values():
            self._fold(p, acc)

    def _fold(self, p: Process, acc: Pending) -> None:
        shape, c, sums = acc.shape, acc.counters(), acc.sums
        lay, names = shape.layout, shape.names
        errors = p.errors
        errors["nan"] += c[0]
        errors["inf"] += c[1]
        errors["exception"] += c[2]
        p.internal += c[3]
        p.dropped += c[4]
        self.add_calls(p, zip(names, c[wire.LEADING_LANES :], strict=False))
        for i, buckets in enumerate(lay.kc):
            self.add_kc(p, names[i], Histogram(KC_BOUNDS, c[buckets], sums[i]))
        for j, (name, buckets, at) in enumerate(lay.hists):
            h = Histogram(wire.BUCKETS[name], c[buckets], sums[at - 1])
            if j < lay.plain:
                self.add_plain(p, name, h, shape.tenant)
            else:
                self.add_hist(p.topn, shape.ns[j - lay.plain], h)

    # -- output ------------------------------------------------------------------

    def samples(self, out: list[Sample]) -> None:
        """Every process's samples; a process with no frame since the last call gives the
        same list again (a tick of 32 processes of 4,000 series each, all quiet, cost
        0.3 s of building the same samples)."""
        for p in self.procs.values():
            if p.out is None:
                p.out = []
                self.process_samples(p, p.out)
            out.extend(p.out)

    def process_samples(self, p: Process, out: list[Sample]) -> None:
        if p.pending:
            self.fold(p)
        lp = p.lp
        eng, proc = lp  # labels stay sorted: engine < kind < layer < n < process
        for layer, n in p.calls.items():
            lp3 = (eng, ("layer", layer), proc)
            out.append(Sample("kcops_attention_calls_total", lp3, float(n)))
        for kind, n in p.errors.items():
            lp3 = (eng, ("kind", kind), proc)
            out.append(Sample("kcops_attention_errors_total", lp3, float(n)))
        for name, h in p.hist.items():
            histogram_samples(name, h, lp, out)
        for tenant, by_name in p.requests.items():
            # labels sorted: engine < model < process < tenant
            rlp = (eng, ("model", p.model or UNKNOWN), proc, ("tenant", tenant))
            for name, h in by_name.items():
                if name == wire.REQUEST_PRICED:
                    out.append(Sample(PRICED_TOTAL, rlp, h.sum))
                else:
                    histogram_samples(name, h, rlp, out)
        if p.p is not None:
            out.append(Sample("kcops_probe_kc_mass", lp, p.p))
        for layer, h in p.kc.items():
            histogram_samples(wire.KC_TOKENS, h, (eng, ("layer", layer), proc), out)
        for n, h in p.topn.items():
            histogram_samples(wire.TOPN_MASS, h, (eng, ("n", str(n)), proc), out)
        out.append(Sample("kcops_probe_dropped_total", lp, float(p.dropped)))
        out.append(Sample("kcops_probe_internal_errors_total", lp, float(p.internal)))
