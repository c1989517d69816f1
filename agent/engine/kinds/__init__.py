"""Engine kinds: one module per engine (metric adapter, admin routes, detection, quirks).

:mod:`~kcops.agent.engine.kinds.kind` says what a kind is; ``kcops``, ``vllm``,
``sglang``, ``tgi`` and ``triton`` are the built-in ones. Adding an engine is one
new module that builds an :class:`EngineKind`, plus registering it
(:data:`~kcops.agent.engine.kinds.registry.BUILTIN`, or :meth:`EngineRegistry.register`).
"""

from kcops.agent.engine.kinds.kind import (
    Capabilities,
    EngineKind,
    EvictRoute,
    PauseRoutes,
    Routes,
)
from kcops.agent.engine.kinds.metrics import Adapter, Map
from kcops.agent.engine.kinds.registry import AUTO, EngineRegistry, builtin_kinds

__all__ = [
    "AUTO",
    "Adapter",
    "Capabilities",
    "EngineKind",
    "EngineRegistry",
    "EvictRoute",
    "Map",
    "PauseRoutes",
    "Routes",
    "builtin_kinds",
]
