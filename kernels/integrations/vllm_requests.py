"""vLLM: the request each sampled K(C) row belongs to (issue 25; docs/kc.md, "vLLM").

vLLM's attention metadata holds no request id, but its rows are in the model runner's
batch order: sequence ``i`` of ``query_start_loc``, ``seq_lens`` and ``block_table`` is
request ``GPUModelRunner.input_batch.req_ids[i]`` (the V1 runner of vLLM 0.32; the CPU and
XPU runners subclass it). vLLM adds, removes and reorders that batch
(``_update_states``, ``_may_reorder_batch``) inside ``execute_model``, before the
forward, so the ids are read when a sampled call is measured, not when the step starts.

:func:`install` wraps ``execute_model`` of ``GPUModelRunner`` and of each subclass that
defines its own. Around a step it

- makes :func:`kcops.kernels.attribution.current` resolve, on sampled calls only, to the
  :class:`~kcops.kernels.attribution.RequestKC` of each request of the batch;
- names the served model (``model_config.served_model_name``) once;
- closes the requests the scheduler reports finished (``finished_req_ids``: finished,
  stopped or aborted, sent with the next step, also an empty one, so an idle engine
  closes its last requests): each becomes a :class:`Finished`, with its full context
  (``requests[id].num_tokens``: prompt + generated tokens), read before vLLM drops it.

The tenant: a request's header and OpenAI ``user`` field reach only vLLM's API server
process; the engine core and its worker see a request id and tokens. With kcops' ASGI
middleware in the API server (:mod:`kcops.kernels.integrations.vllm_tenant`) the id
carries the tenant's label and a keyed digest, read back here when the request finishes
(capped here, where only requests that ran are seen: :class:`kcops.tenant.TenantLabels`);
without it, or with a digest that does not check, the tenant is not known (''). The
agent's canary (its signed id kept inside the marker) is closed here and reported to
nobody. The runner V2 (``vllm.v1.worker.gpu.model_runner``) keeps its batch
differently and is not attributed (its rows count, unattributed, as before).

Never raises into vLLM: a runner without the expected attributes leaves the rows
unattributed. Torch-free.

A test-only fault (``KCOPS_TEST_HANG_FILE``, :func:`kcops_test_hang`) hangs the engine core
inside its own Python code, for the incident record's acceptance
(tests/engines/vllm/test_incident.py); without the variable the wrapper has no such check.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from kcops.kernels.attribution import RequestKC, attribute_lazily
from kcops.kernels.integrations.vllm_tenant import tenant_key, tenant_of
from kcops.tenant import TenantLabels, is_canary

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_CLASS = "GPUModelRunner"
WRAPPED_MARK = "__kcops_requests__"
T = TypeVar("T")  # what the wrapped execute_model returns
# Requests kept open at once; past it the oldest is dropped unreported (a finish vLLM
# never sent must not grow this forever). vLLM's max_num_seqs defaults to 256-1024.
MAX_OPEN = 4096
# Finished requests kept for a reader (newest last).
MAX_FINISHED = 4096
# Test-only: a file whose existence hangs every step (see kcops_test_hang).
HANG_FILE_ENV = "KCOPS_TEST_HANG_FILE"
HANG_POLL_S = 0.05


def hang_file() -> str | None:
    """The test fault's file, when ``KCOPS_TEST_HANG_FILE`` names one (read at install)."""
    return os.environ.get(HANG_FILE_ENV) or None


def kcops_test_hang(path: str, poll_s: float = HANG_POLL_S) -> None:
    """Block the step while ``path`` exists: the test-only hang. Its name is the frame a
    stack dump of the hung engine core must show; one ``os.path.exists`` per step when the
    file is absent."""
    while os.path.exists(path):
        time.sleep(poll_s)


@dataclass(frozen=True)
class Finished:
    """A request vLLM finished: its full context, its K(C) samples (none: ``mean``
    None) and its tenant's label ('' when its id carries none)."""

    request_id: str
    context_tokens: int | None
    samples: int
    mean: float | None
    peak: int
    tenant: str = ""


class Requests:
    """The open requests of one worker process, and the last ones finished."""

    def __init__(
        self,
        max_open: int = MAX_OPEN,
        max_finished: int = MAX_FINISHED,
        on_finish: Callable[[Finished], None] | None = None,
        key: bytes | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self.max_open = max_open
        self.open: OrderedDict[str, RequestKC] = OrderedDict()
        self.finished: deque[Finished] = deque(maxlen=max_finished)
        self.finished_total = 0
        self.dropped = 0  # opened past max_open: the oldest open one went unreported
        self.errors = 0  # steps whose bookkeeping failed (the step itself ran)
        self.on_finish = on_finish
        # The served model (``model_config.served_model_name``), read at the first step;
        # ``on_model`` hears it once.
        self.model: str | None = None
        self.on_model: Callable[[str], None] | None = None
        # Labels read from the request ids: the cap applies here, to requests that ran.
        self.tenants = TenantLabels(header=None)
        self.key = tenant_key() if key is None else key  # the middleware's (vllm_tenant)

    def set_model(self, model: str) -> None:
        self.model = model
        if self.on_model is not None and model:
            self.on_model(model)

    def owners(self, req_ids: Iterable[str | None]) -> tuple[RequestKC | None, ...]:
        """The :class:`RequestKC` of each batch entry (opened on first sight)."""
        out: list[RequestKC | None] = []
        with self._lock:
            for rid in req_ids:
                if rid is None:
                    out.append(None)
                    continue
                kc = self.open.get(rid)
                if kc is None:
                    kc = self.open[rid] = RequestKC()
                    if len(self.open) > self.max_open:
                        self.open.popitem(last=False)
                        self.dropped += 1
                out.append(kc)
        return tuple(out)

    def finish(self, rid: str, context_tokens: int | None) -> Finished | None:
        """The request closed and reported; None for the agent's canary (served, billed to
        nobody: :func:`kcops.tenant.is_canary`)."""
        with self._lock:
            kc = self.open.pop(rid, None) or RequestKC()
            if is_canary(rid, self.key):
                return None
            raw = tenant_of(rid, self.key)
            tenant = self.tenants.bound(raw) if raw else ""
            done = Finished(rid, context_tokens, kc.count, kc.mean, kc.peak, tenant)
            self.finished.append(done)
            self.finished_total += 1
        if self.on_finish is not None:
            self.on_finish(done)
        return done


def _batch_ids(runner: object) -> list[str | None] | None:
    batch = getattr(runner, "input_batch", None)
    ids = getattr(batch, "req_ids", None)
    return list(ids) if isinstance(ids, list) else None


def _context_tokens(runner: object, rid: str) -> int | None:
    states = getattr(runner, "requests", None)
    state = states.get(rid) if isinstance(states, dict) else None
    n = getattr(state, "num_tokens", None)
    return n if isinstance(n, int) else None


def served_model(runner: object) -> str:
    """The name vLLM serves the model under (its metrics' ``model_name``): the first of
    ``--served-model-name``, else the model path; '' when the runner does not say."""
    name = getattr(getattr(runner, "model_config", None), "served_model_name", None)
    if isinstance(name, list):
        name = name[0] if name else None
    return name if isinstance(name, str) else ""


def wrap_execute_model(
    requests: Requests, fn: Callable[..., T], hang: str | None = None
) -> Callable[..., T]:
    """``execute_model(self, scheduler_output, …)`` that closes finished requests and
    attributes the step's sampled K(C) rows; with ``hang`` (a path: the test fault), each
    step first waits in :func:`kcops_test_hang` while that file exists."""
    if getattr(fn, WRAPPED_MARK, False):
        return fn

    @functools.wraps(fn)
    def execute_model(self: object, scheduler_output: object, *args: object, **kwargs: object) -> T:
        if hang is not None:
            kcops_test_hang(hang)
        try:
            if requests.model is None:
                requests.set_model(served_model(self))
            for rid in getattr(scheduler_output, "finished_req_ids", None) or ():
                if isinstance(rid, str):
                    requests.finish(rid, _context_tokens(self, rid))
        except Exception:  # never into vLLM: the step runs, its requests go uncounted
            requests.errors += 1

        def resolve() -> tuple[RequestKC | None, ...] | None:
            ids = _batch_ids(self)
            return None if ids is None else requests.owners(ids)

        with attribute_lazily(resolve):
            return fn(self, scheduler_output, *args, **kwargs)

    setattr(execute_model, WRAPPED_MARK, True)
    execute_model.__kcops_original__ = fn  # type: ignore[attr-defined]
    return execute_model


def classes(base: type) -> list[type]:
    """``base`` and every subclass of it, at any depth (the vLLM plugin's too)."""
    out: list[type] = [base]
    stack: list[type] = list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        out.append(cls)
        stack.extend(cls.__subclasses__())
    return out


def install(requests: Requests, module: str = RUNNER_MODULE, hang: str | None = None) -> list[type]:
    """Wrap ``execute_model`` of the runner class and of its subclasses that define it,
    if vLLM's runner module is imported in this process (it is in a worker once attention
    runs); never imports it. Idempotent. Returns the classes wrapped now. ``hang``: the
    test fault's file (:func:`wrap_execute_model`)."""
    mod = sys.modules.get(module)
    base = getattr(mod, RUNNER_CLASS, None)
    if not isinstance(base, type):
        return []
    wrapped = []
    for cls in classes(base):
        fn = cls.__dict__.get("execute_model")
        if fn is None or getattr(fn, WRAPPED_MARK, False):
            continue
        cls.execute_model = wrap_execute_model(requests, fn, hang)  # type: ignore[attr-defined]
        wrapped.append(cls)
    return wrapped


def uninstall(module: str = RUNNER_MODULE) -> None:
    """Undo :func:`install` (tests)."""
    base = getattr(sys.modules.get(module), RUNNER_CLASS, None)
    if not isinstance(base, type):
        return
    for cls in classes(base):
        fn = cls.__dict__.get("execute_model")
        original = getattr(fn, "__kcops_original__", None)
        if original is not None:
            cls.execute_model = original  # type: ignore[attr-defined]
