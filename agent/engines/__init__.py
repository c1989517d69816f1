"""Engine kinds: one module per engine (metric adapter, admin routes, detection, quirks).

- :mod:`~kcops.agent.engines.kind`: what a kind is (:class:`EngineKind`);
- :mod:`~kcops.agent.engines.metrics`: the metric adapter table type;
- :mod:`~kcops.agent.engines.registry`: where the agent finds them;
- ``kcops``, ``vllm``, ``sglang``, ``tgi``, ``triton``: the built-in kinds.

Adding an engine is one new module that builds an :class:`EngineKind`, plus
registering it (:data:`~kcops.agent.engines.registry.BUILTIN`, or
:meth:`EngineRegistry.register` at run time).
"""

from kcops.agent.engines.kind import (
    Capabilities,
    EngineKind,
    EvictRoute,
    PauseRoutes,
    Routes,
)
from kcops.agent.engines.metrics import Adapter, Map
from kcops.agent.engines.registry import AUTO, EngineRegistry, default_registry

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
    "default_registry",
]
