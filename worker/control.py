"""Routing and attention control: base vs optimized path, fallback mode, the top-N budget.

Short requests (below ``long_threshold`` tokens) take the *base* path (full
attention); longer ones the *optimized* path (top-N attention under the current
budget). ``fallback`` mode sends everything to base. The budget changes at run
time through the admin API, within ``[topn_min, topn_max]``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from kcops.kernels.topn import DENSE, TopNPolicy

BASE = "base"
OPTIMIZED = "optimized"
ROUTE_MODES = ("normal", "fallback")


class BadSetting(ValueError):
    """A requested setting is outside what is allowed; the message says what is."""


@dataclass(frozen=True)
class TopNBudget:
    top_n: int
    top_n_by_layer: Mapping[int, int]
    dense_layers: frozenset[int]

    def as_json(self) -> dict[str, object]:
        return {
            "top_n": self.top_n,
            "top_n_by_layer": {str(k): v for k, v in sorted(self.top_n_by_layer.items())},
            "dense_layers": sorted(self.dense_layers),
        }


class Control:
    """Thread-safe route mode and attention budget (read by the model thread)."""

    def __init__(
        self,
        *,
        long_threshold: int = 4096,
        top_n: int = 64,
        dense_layers: frozenset[int] = frozenset({0, 1}),
        topn_min: int = 16,
        topn_max: int = 1024,
        num_layers: int | None = None,
    ) -> None:
        if not topn_min <= top_n <= topn_max:
            raise BadSetting(f"--top-n {top_n} outside [{topn_min}, {topn_max}]")
        self.long_threshold = long_threshold
        self.topn_min, self.topn_max = topn_min, topn_max
        self.num_layers = num_layers
        self._lock = threading.Lock()
        self._mode = "normal"
        self._budget = TopNBudget(top_n, {}, frozenset(dense_layers))

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def budget(self) -> TopNBudget:
        return self._budget

    def set_mode(self, mode: str) -> tuple[str, str]:
        if mode not in ROUTE_MODES:
            raise BadSetting(f"mode {mode!r}: use one of {', '.join(ROUTE_MODES)}")
        with self._lock:
            before, self._mode = self._mode, mode
        return before, mode

    def route(self, prompt_tokens: int) -> str:
        if self._mode == "fallback" or prompt_tokens < self.long_threshold:
            return BASE
        return OPTIMIZED

    def policy(self, route: str, *, inject_nan: bool = False) -> TopNPolicy:
        if route == BASE:
            return TopNPolicy(inject_nan=True) if inject_nan else DENSE
        b = self._budget
        return TopNPolicy(
            top_n=b.top_n,
            top_n_by_layer=dict(b.top_n_by_layer),
            dense_layers=b.dense_layers,
            inject_nan=inject_nan,
        )

    def _check_n(self, n: object, what: str) -> int:
        if isinstance(n, bool) or not isinstance(n, int):
            raise BadSetting(f"{what} must be an integer, got {n!r}")
        if not self.topn_min <= n <= self.topn_max:
            raise BadSetting(
                f"{what}={n} outside the configured bounds "
                f"[{self.topn_min}, {self.topn_max}] (--topn-min/--topn-max)"
            )
        return n

    def _check_layer(self, layer: object) -> int:
        try:
            if not isinstance(layer, int | float | str):
                raise TypeError(layer)
            idx = int(layer)
        except (TypeError, ValueError):
            raise BadSetting(f"layer {layer!r} is not an integer") from None
        if idx < 0 or (self.num_layers is not None and idx >= self.num_layers):
            raise BadSetting(f"layer {idx} outside [0, {(self.num_layers or 1) - 1}]")
        return idx

    def set_budget(
        self, *, top_n: object = None, top_n_by_layer: object = None, dense_layers: object = None
    ) -> tuple[TopNBudget, TopNBudget]:
        """Validate and apply; fields left None keep their value. Returns (before, after)."""
        if top_n is None and top_n_by_layer is None and dense_layers is None:
            raise BadSetting("give top_n, top_n_by_layer and/or dense_layers")
        with self._lock:
            before = self._budget
            n = before.top_n if top_n is None else self._check_n(top_n, "top_n")
            by_layer = dict(before.top_n_by_layer)
            if top_n_by_layer is not None:
                if not isinstance(top_n_by_layer, dict):
                    raise BadSetting("top_n_by_layer must be an object {layer: N}")
                by_layer = {
                    self._check_layer(k): self._check_n(v, f"top_n_by_layer[{k}]")
                    for k, v in top_n_by_layer.items()
                }
            dense = before.dense_layers
            if dense_layers is not None:
                if not isinstance(dense_layers, list):
                    raise BadSetting("dense_layers must be a list of layer indices")
                dense = frozenset(self._check_layer(x) for x in dense_layers)
            self._budget = TopNBudget(n, by_layer, dense)
            return before, self._budget


def parse_layers(text: str) -> frozenset[int]:
    """``"0,1"`` → {0, 1}; empty → no dense layers."""
    text = text.strip()
    if not text:
        return frozenset()
    try:
        return frozenset(int(x) for x in text.split(","))
    except ValueError:
        raise BadSetting(f"--dense-layers {text!r}: expected comma-separated integers") from None
