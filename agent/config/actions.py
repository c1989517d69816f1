"""The ``actions:`` section: remediation mode and guards."""

from __future__ import annotations

from typing import Literal

from kcops.agent.config.base import Section

Mode = Literal["enforce", "dry-run", "off"]


class ActionsSection(Section):
    mode: Mode = "dry-run"
