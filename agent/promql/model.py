"""Values the evaluator passes around, and the errors it raises.

A label set is a sorted tuple of (name, value) pairs and includes
``__name__`` while a series still has its metric name, as in Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import NamedTuple

from kcops.errors import ConfigError, KcopsError

Labels = tuple[tuple[str, str], ...]
NAME = "__name__"


class Elem(NamedTuple):
    """One element of an instant vector."""

    labels: Labels
    value: float


Vector = list[Elem]
Value = float | str | Vector


class RuleError(ConfigError):
    """A rule file or expression was refused at load (exit code 2)."""


class UnsupportedExpr(RuleError):
    """An expression uses PromQL outside the subset kcops evaluates."""


class EvalError(KcopsError):
    """An expression failed at evaluation time (as Prometheus would fail it)."""


def labels_of(mapping: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return tuple(sorted((k, v) for k, v in items if v != ""))


def drop_name(labels: Labels) -> Labels:
    if labels and any(k == NAME for k, _ in labels):
        return tuple(p for p in labels if p[0] != NAME)
    return labels


def get_label(labels: Labels, name: str) -> str:
    for k, v in labels:
        if k == name:
            return v
    return ""


def check_unique(vec: Vector, what: str) -> Vector:
    """Prometheus refuses a vector in which two elements share a label set."""
    seen: set[Labels] = set()
    for e in vec:
        if e.labels in seen:
            raise EvalError(f"{what}: vector cannot contain metrics with the same labelset")
        seen.add(e.labels)
    return vec


def duration_ms(d: timedelta | None) -> int:
    """A parsed PromQL duration in integer milliseconds (absent: 0)."""
    return round(d.total_seconds() * 1000) if d is not None else 0
