"""Which coverage (mass p, call quantile) the live recommendation sizes the budget for.

With a calibration configured for the served model (``recommendation.calibration``), the
sweep's: the call quantile at which the live-style N equals the N its accuracy table
recommended (``kc sweep`` writes it as ``kc_coverage`` in recommendation.json). Without
one, the configured ``quantile`` at the probe's ``p``, and the document says
``uncalibrated``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kcops.agent.config.kcrec import Calibration, RecommendationSection
from kcops.agent.kcrec.compute import DEFAULT_P, Coverage
from kcops.errors import ConfigError

REC_FILE = "recommendation.json"


def read_sweep(path: Path, context: int | None = None) -> dict[str, Any]:
    """One context's recommendation of a ``kc sweep --out`` folder (or its
    recommendation.json): the given context's, else the largest context's. Raises
    ConfigError naming the file and what is wrong."""
    f = path / REC_FILE if path.is_dir() else path
    try:
        doc: Any = json.loads(f.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{f}: cannot read the sweep's recommendation: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{f}: not JSON: {exc}") from None
    if not isinstance(doc, list) or not all(isinstance(x, dict) for x in doc):
        raise ConfigError(f"{f}: not a kc sweep recommendation.json (a list of contexts)")
    lines: list[dict[str, Any]] = doc
    items = [x for x in lines if x.get("n") is not None]
    if context is not None:
        items = [x for x in items if x.get("context") == context]
    if not items:
        which = f" for context {context}" if context is not None else ""
        raise ConfigError(f"{f}: the sweep recommends no N{which}")
    best: dict[str, Any] = max(items, key=lambda x: int(x.get("context") or 0))
    return dict(best)


def _for_layers(
    cov: dict[str, Any], over: str | None, dense: frozenset[int] | None
) -> tuple[dict[str, Any], list[str]]:
    """The sweep's ``by_p`` matched over the layer set ``over`` (the live uniform N's), when
    the sweep recorded it (``by_layers``), else its policy's; and notes on a mismatch."""
    notes: list[str] = []
    sets = cov.get("by_layers") or {}
    got = sets.get(over) if over is not None else None
    if isinstance(got, dict):
        want = sorted(dense or ())
        if over == "non_dense" and dense is not None and got.get("dense_layers") != want:
            notes.append(
                f"the sweep's non-dense layers leave out {got.get('dense_layers')}, "
                f"the engine keeps {want} dense"
            )
        return dict(got.get("by_p") or {}), notes
    if over is not None and cov.get("layers") not in (None, over):
        notes.append(
            f"the sweep matched its N over {cov.get('layers')} layers, the live uniform N "
            f"covers {over} layers (rerun kc sweep with this version)"
        )
    return dict(cov.get("by_p") or {}), notes


def from_entry(
    entry: Calibration,
    probe_p: float,
    over: str | None = None,
    dense: frozenset[int] | None = None,
) -> Coverage:
    """A configured calibration as a Coverage, for a live uniform N over ``over`` (``all``,
    ``non_dense``; None: the sweep's own set); raises ConfigError for an unusable file."""
    if entry.file is None:
        assert entry.p is not None and entry.quantile is not None  # the model validator
        notes: tuple[str, ...] = ()
        if abs(entry.p - probe_p) > 1e-9:
            notes = (f"calibrated at p={entry.p:g}, the probe measures p={probe_p:g}",)
        return Coverage(entry.p, entry.quantile, True, "config", notes)
    rec = read_sweep(entry.file, entry.context)
    cov = rec.get("kc_coverage")
    if not isinstance(cov, dict):
        raise ConfigError(
            f"{entry.file}: the sweep's recommendation has no kc_coverage "
            "(rerun kc sweep with this version)"
        )
    by_p, caveats = _for_layers(cov, over, dense)
    got = by_p.get(f"{probe_p:g}")
    if not isinstance(got, dict) or got.get("quantile") is None:
        raise ConfigError(f"{entry.file}: no coverage at the probe's p={probe_p:g}")
    if got.get("match") != "exact":
        caveats.append(
            f"the sweep's N={rec.get('n')} is {got.get('match')} of its calls' K_{probe_p:g}: "
            "the coverage is a bound, not a match"
        )
    layers = over if over in (cov.get("by_layers") or {}) else cov.get("layers")
    source = (
        f"{entry.file} (context {rec.get('context')}, N={rec.get('n')}, {rec.get('policy')}, "
        f"matched over {layers} layers)"
    )
    return Coverage(probe_p, float(got["quantile"]), True, source, tuple(caveats))


def coverage_for(
    cfg: RecommendationSection,
    model: str | None,
    over: str | None = None,
    dense: frozenset[int] | None = None,
    p: float = DEFAULT_P,
) -> Coverage:
    """The coverage for ``model`` under ``cfg`` for a uniform N over ``over``, at the
    probe's mass ``p``; uncalibrated when none is configured."""
    entry = cfg.calibration.get(model) if model is not None else None
    if entry is None:
        notes: tuple[str, ...] = ()
        if cfg.calibration:
            notes = (f"no calibration for model {model!r} (configured: {sorted(cfg.calibration)})",)
        return Coverage(p, cfg.quantile, False, "default", notes)
    return from_entry(entry, p, over, dense)
