"""Engine kinds: one module per engine (metric adapter, admin routes, detection, quirks).

- :mod:`~kcops.agent.engine.kinds.kind`: what a kind is (:class:`EngineKind`);
- :mod:`~kcops.agent.engine.kinds.metrics`: the metric adapter table type;
- :mod:`~kcops.agent.engine.kinds.registry`: where the agent finds them;
- ``kcops``, ``vllm``, ``sglang``, ``tgi``, ``triton``: the built-in kinds.

Adding an engine is one new module that builds an :class:`EngineKind`, plus
registering it (:data:`~kcops.agent.engine.kinds.registry.BUILTIN`, or
:meth:`EngineRegistry.register` at run time).
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
