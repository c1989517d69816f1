"""Typed errors raised at the agent's boundaries.

Each carries what was wrong and, where it helps, what is allowed, so the CLI
can print it as is and exit with its code (kcops.cli.common).
"""

from __future__ import annotations


class KcopsError(Exception):
    """Base class of every error kcops raises on purpose."""

    exit_code = 1


class ConfigError(KcopsError):
    """A configuration file or flag is invalid. Exit code 2."""

    exit_code = 2


class CollectorUnavailable(KcopsError):
    """A collector cannot read its source this tick (no driver, engine down, ...).

    ``reason`` is a short label value for ``kcops_collector_errors_total``.
    """

    def __init__(self, message: str, reason: str = "unavailable") -> None:
        super().__init__(message)
        self.reason = reason


class Unreachable(KcopsError):
    """The agent or the engine could not be reached. Exit code 3."""

    exit_code = 3
