"""ProbeConfig: what the probe measures and where it sends it. Torch-free."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kcops.kernels.wire import UNKNOWN_ENGINE, WireError, check_engine, default_socket_path

INTEGRATIONS: tuple[str, ...] = ("transformers", "torch_sdpa", "vllm")
ROW_MODES: tuple[str, ...] = ("last", "all")


class ProbeConfigError(ValueError):
    """A ProbeConfig field is invalid; the message names the field and what is allowed."""


@dataclass(frozen=True)
class ProbeConfig:
    """Probe settings. Every field has a default; see docs/probe.md.

    - ``sample_rate``: share of attention calls (0..1) that get timing and K(C). The
      default, 0.003, samples about one call in 11 decode steps of a 30-layer model.
      Measured on a CPU decode step of SmolLM2 at 512 tokens (docs/benchmarks.md,
      "Probe decode ratio"): the probe cost 1.027x on average at 0.003 (1.039x at
      0.01), of which sampling is about 0.3 points; the rest is the per-call path, which
      issue 26 cut from 39 to 21 Python-level calls per attention call.
    - ``rows``: query rows recomputed per sampled call: ``"last"`` (the decode
      row), ``"all"`` (every row; for ``kc measure`` only, costs a full
      attention matrix) or an int N (N rows spread evenly, the last included).
    - ``p_values``: attention-mass levels of K_p.
    - ``topn``: N values of the top-N mass histograms.
    - ``flush_interval_ms``: how often the aggregate goes to the agent.
    - ``kc_layers_interval_ms``: how often K(C) by layer goes with it (in the frame of
      every ``round(kc_layers_interval_ms / flush_interval_ms)``-th flush, at least every
      flush): a histogram per layer makes a frame several times larger.
    - ``socket_path``: the agent's stream socket, where the probe connects
      (``kcops.kernels.wire.default_socket_path``).
    - ``integrations``: which engines to patch (``transformers``, ``torch_sdpa``, ``vllm``).
    - ``nvtx``: push an NVTX range per call.
    - ``check_every_call``: NaN/Inf check on every call (True) or only on sampled calls.
    - ``max_batch_rows``: at most this many batch entries are recomputed per sampled call.
    - ``record``: keep every K(C) row in memory (``Probe.records``) — for ``kc measure``
      and tests, not for serving.
    - ``publish``: send frames to the socket (off for ``kc measure``).
    - ``seed``: seed of the sampling RNG.
    - ``engine``: which engine this probe runs in, sent with every frame and exported by
      the agent as the ``engine`` label (``kcops.kernels.wire.check_engine``: 1..16 of
      ``a-z 0-9 _ -``). The vLLM plugin sets ``vllm`` and the reference worker ``kcops``
      whatever this says; a bare probe sends ``unknown``.
    """

    sample_rate: float = 0.003
    rows: str | int = "last"
    p_values: tuple[float, ...] = (0.9,)
    topn: tuple[int, ...] = (16, 32, 64)
    flush_interval_ms: int = 1000
    kc_layers_interval_ms: int = 10_000
    socket_path: str = field(default_factory=default_socket_path)
    integrations: tuple[str, ...] = INTEGRATIONS
    nvtx: bool = True
    check_every_call: bool = True
    max_batch_rows: int = 4
    record: bool = False
    publish: bool = True
    seed: int = 0
    engine: str = UNKNOWN_ENGINE

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ProbeConfigError(f"sample_rate={self.sample_rate!r}: allowed 0..1")
        if isinstance(self.rows, bool) or (isinstance(self.rows, int) and self.rows < 1):
            raise ProbeConfigError(f"rows={self.rows!r}: allowed 'last', 'all' or an int >= 1")
        if isinstance(self.rows, str) and self.rows not in ROW_MODES:
            raise ProbeConfigError(f"rows={self.rows!r}: allowed 'last', 'all' or an int >= 1")
        if not self.p_values or not all(0.0 < p <= 1.0 for p in self.p_values):
            raise ProbeConfigError(f"p_values={self.p_values!r}: allowed values in (0, 1]")
        if not all(isinstance(n, int) and n >= 1 for n in self.topn):
            raise ProbeConfigError(f"topn={self.topn!r}: allowed ints >= 1")
        if self.flush_interval_ms < 10:
            raise ProbeConfigError(f"flush_interval_ms={self.flush_interval_ms!r}: allowed >= 10")
        if not 10 <= self.kc_layers_interval_ms <= 3_600_000:
            raise ProbeConfigError(
                f"kc_layers_interval_ms={self.kc_layers_interval_ms!r}: allowed 10..3600000"
            )
        unknown = set(self.integrations) - set(INTEGRATIONS)
        if unknown:
            raise ProbeConfigError(
                f"integrations: unknown {sorted(unknown)}, allowed {list(INTEGRATIONS)}"
            )
        if self.max_batch_rows < 1:
            raise ProbeConfigError(f"max_batch_rows={self.max_batch_rows!r}: allowed >= 1")
        try:
            check_engine(self.engine)
        except WireError as exc:
            raise ProbeConfigError(str(exc)) from None

    @classmethod
    def from_env(cls) -> ProbeConfig:
        """Defaults overridden by ``KCOPS_PROBE_*`` variables (used by ``kcops.kernels.run``
        and the vLLM plugin): SAMPLE_RATE, ROWS, P, TOPN, FLUSH_MS, KC_LAYERS_MS, SOCKET,
        INTEGRATIONS, ENGINE."""
        env = os.environ
        kw: dict[str, object] = {}
        try:
            if "KCOPS_PROBE_SAMPLE_RATE" in env:
                kw["sample_rate"] = float(env["KCOPS_PROBE_SAMPLE_RATE"])
            if "KCOPS_PROBE_ROWS" in env:
                rows = env["KCOPS_PROBE_ROWS"].strip()
                kw["rows"] = int(rows) if rows.isdigit() else rows
            if "KCOPS_PROBE_P" in env:
                kw["p_values"] = tuple(float(x) for x in env["KCOPS_PROBE_P"].split(","))
            if "KCOPS_PROBE_TOPN" in env:
                kw["topn"] = tuple(int(x) for x in env["KCOPS_PROBE_TOPN"].split(","))
            if "KCOPS_PROBE_FLUSH_MS" in env:
                kw["flush_interval_ms"] = int(env["KCOPS_PROBE_FLUSH_MS"])
            if "KCOPS_PROBE_KC_LAYERS_MS" in env:
                kw["kc_layers_interval_ms"] = int(env["KCOPS_PROBE_KC_LAYERS_MS"])
            if "KCOPS_PROBE_INTEGRATIONS" in env:
                kw["integrations"] = tuple(
                    x.strip() for x in env["KCOPS_PROBE_INTEGRATIONS"].split(",") if x.strip()
                )
            if "KCOPS_PROBE_ENGINE" in env:
                kw["engine"] = env["KCOPS_PROBE_ENGINE"].strip()
        except ValueError as exc:
            raise ProbeConfigError(f"bad KCOPS_PROBE_* variable: {exc}") from None
        return cls(**kw)  # type: ignore[arg-type]
