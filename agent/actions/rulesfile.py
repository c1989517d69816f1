"""Escalation ladders from the rule file's ``remediation:`` blocks.

Local transitions carry their ladder; alerts that arrive from Alertmanager
do not, so the ladder of a cluster alert is looked up here by alert name in
the same rule file the local engine evaluates.
"""

from __future__ import annotations

import logging
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kcops.agent.events import RemediationStep

log = logging.getLogger("kcops.agent.actions")

_DUR = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(value: Any, default: float) -> float:
    """Prometheus durations ("1m30s", "500ms") or plain seconds; None gives ``default``."""
    if value is None:
        return default
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    pos, total = 0, 0.0
    for m in _DUR.finditer(text):
        if m.start() != pos:
            raise ValueError(f"bad duration {value!r}")
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"bad duration {value!r}")
    return total


def steps_from(raw: Any, default_verify_s: float) -> tuple[RemediationStep, ...]:
    out = []
    for item in raw or []:
        if not isinstance(item, dict) or "action" not in item:
            raise ValueError(f"remediation step needs an action: {item!r}")
        out.append(
            RemediationStep(
                action=str(item["action"]),
                params=dict(item.get("params") or {}),
                verify_s=parse_duration_s(item.get("verify"), default_verify_s),
            )
        )
    return tuple(out)


def _rules_text(path: Path | None) -> str | None:
    if path is not None:
        return Path(path).read_text()
    try:
        return (resources.files("kcops.alerts") / "rules.yaml").read_text()
    except (FileNotFoundError, ModuleNotFoundError, OSError):
        return None


class RuleLadders:
    """Alert name -> ladder, read from the rule file (re-read when it changes)."""

    def __init__(self, path: Path | None, default_verify_s: float) -> None:
        self.path = path
        self.default_verify_s = default_verify_s
        self._mtime: float | None = None
        self._ladders: dict[str, tuple[RemediationStep, ...]] = {}
        self._names: set[str] = set()
        self._loaded = False

    def _load(self) -> None:
        mtime = None
        if self.path is not None:
            try:
                mtime = Path(self.path).stat().st_mtime
            except OSError:
                mtime = None
        if self._loaded and mtime == self._mtime:
            return
        self._loaded, self._mtime = True, mtime
        try:
            text = _rules_text(self.path)
            data = yaml.safe_load(text) if text else None
        except (OSError, yaml.YAMLError) as exc:
            log.warning("cannot read ladders from rule file %s: %s", self.path, exc)
            return
        ladders: dict[str, tuple[RemediationStep, ...]] = {}
        names: set[str] = set()
        for group in (data or {}).get("groups", []) or []:
            for rule in group.get("rules", []) or []:
                name = rule.get("alert")
                if not name:
                    continue
                names.add(name)
                try:
                    steps = steps_from(rule.get("remediation"), self.default_verify_s)
                except ValueError as exc:
                    log.warning("rule %s: %s", name, exc)
                    continue
                if steps and name not in ladders:
                    ladders[name] = steps
        self._ladders, self._names = ladders, names

    def ladder(self, alertname: str) -> tuple[RemediationStep, ...]:
        self._load()
        return self._ladders.get(alertname, ())

    def names(self) -> set[str]:
        self._load()
        return set(self._names)
