"""kcops.kernels: in-engine attention instrumentation.

Importing this package does nothing by itself: no torch, no transformers, no
patching. :func:`install` patches the engine's attention dispatch points and
starts the publisher; :func:`uninstall` undoes it. See docs/probe.md.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from kcops.kernels.config import ProbeConfig, ProbeConfigError

if TYPE_CHECKING:
    from kcops.kernels.probe import Probe

__all__ = ["Probe", "ProbeConfig", "ProbeConfigError", "get_probe", "install", "uninstall"]

_lock = threading.Lock()
_probe: Probe | None = None
_fork_hook = False


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    if _probe is not None:
        _probe.after_fork_in_child()


def install(config: ProbeConfig | None = None) -> Probe:
    """Patch attention in every enabled integration and start publishing.

    Idempotent: a second call returns the probe already installed (its config
    is kept; call :func:`uninstall` first to change it). Integrations whose
    engine is not importable are skipped. torch is imported here, not before.
    """
    global _probe, _fork_hook
    with _lock:
        if _probe is not None:
            return _probe
        from kcops.kernels.probe import Probe

        probe = Probe(config or ProbeConfig())
        probe.start()
        _probe = probe
        if not _fork_hook:  # once per process: hooks cannot be unregistered
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook = True
        return probe


def uninstall() -> None:
    """Remove every patch, flush what is pending and stop the publisher. Safe if not installed."""
    global _probe
    with _lock:
        probe, _probe = _probe, None
    if probe is not None:
        probe.stop()


def get_probe() -> Probe | None:
    """The installed probe, or None."""
    return _probe


def __getattr__(name: str) -> object:
    # ``kcops.kernels.Probe`` for annotations and isinstance checks; imports torch on use only.
    if name == "Probe":
        from kcops.kernels.probe import Probe

        return Probe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
