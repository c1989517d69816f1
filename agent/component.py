"""The small interface every part of the running agent implements.

The app owns a list of components and drives them in order on each tick:
collectors first, then rules, then remediation. A component may add routes to
the control API and report its health in ``/api/v1/status``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kcops.agent.clock import Clock

if TYPE_CHECKING:
    from aiohttp import web
    from opentelemetry.trace import Tracer

    from kcops.agent.config import Config
    from kcops.agent.events import EventBus
    from kcops.agent.store import Store
    from kcops.auth import TokenCheck


@dataclass
class AgentContext:
    """What the app builds once and hands to every component."""

    config: Config
    store: Store
    clock: Clock
    bus: EventBus
    tracer: Tracer
    auth: TokenCheck
    state_dir: Path


class Component(Protocol):
    """A part of the agent. All methods run on the agent's event loop."""

    name: str

    async def start(self) -> None:
        """Open sockets, files, clients. Raise to refuse to start."""

    async def tick(self, now: float) -> None:
        """One unit of work per agent tick. Must not block the loop."""

    async def stop(self) -> None:
        """Release everything; called once, under the shutdown deadline."""

    def status(self) -> Mapping[str, object]:
        """Health for ``/api/v1/status``: at least ``{"healthy": bool}``."""
        ...

    def routes(self) -> list[web.RouteDef]:
        """Control API routes this component serves."""
        ...
