"""The engine object: one per configured engine (adapter, routes, capabilities, lifecycle)."""

from kcops.agent.engine.capabilities import Capabilities
from kcops.agent.engine.engine import Engine, EngineFailed
from kcops.agent.engine.lifecycle import EngineState

__all__ = ["Capabilities", "Engine", "EngineFailed", "EngineState"]
