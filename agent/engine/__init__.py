"""The engine object: one per configured engine (its kind, routes, capabilities, lifecycle)."""

from kcops.agent.engine.engine import Engine, EngineFailed
from kcops.agent.engine.kinds.kind import Capabilities
from kcops.agent.engine.lifecycle import EngineState

__all__ = ["Capabilities", "Engine", "EngineFailed", "EngineState"]
