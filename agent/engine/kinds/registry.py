"""Where the agent finds every engine kind: one :class:`EngineRegistry`.

The app builds one (:func:`builtin_kinds`) and hands it to the engine object;
configuration and the CLI check ``engine.adapter`` against the same names.
Nothing registers itself. Order is detection order: a kind whose page or probe
another kind also matches comes first (the kcops worker before vLLM, since it
exposes ``vllm:*`` names too; SGLang before vLLM, since its probe is asked first).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from kcops.agent.engine.kinds import kcops, sglang, tgi, triton, vllm
from kcops.agent.engine.kinds.kind import EngineKind
from kcops.errors import ConfigError

AUTO = "auto"  # engine.adapter: detect the kind from /metrics or its probe

# The built-in kinds, in detection order: adding an engine is its module and a line here.
BUILTIN: tuple[EngineKind, ...] = (kcops.KIND, sglang.KIND, vllm.KIND, tgi.KIND, triton.KIND)


class EngineRegistry:
    """The engine kinds the agent knows, by name, in detection order."""

    def __init__(self, kinds: Iterable[EngineKind] = ()) -> None:
        self._kinds: list[EngineKind] = []
        for k in kinds:
            self.register(k)

    def register(self, kind: EngineKind, *, before: str | None = None) -> EngineKind:
        """Add ``kind`` (last, or ahead of kind ``before`` in detection order).

        Raises ValueError for a name already taken, ``auto``, or an unknown ``before``.
        """
        if kind.name == AUTO or not kind.name:
            raise ValueError(f"engine kind name {kind.name!r} is reserved")
        if kind.name in self.names():
            raise ValueError(f"engine kind {kind.name!r} is already registered")
        at = len(self._kinds) if before is None else self.names().index(self.get(before).name)
        self._kinds.insert(at, kind)
        return kind

    def __iter__(self) -> Iterator[EngineKind]:
        return iter(tuple(self._kinds))

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self._kinds)

    def choices(self) -> tuple[str, ...]:
        """What ``engine.adapter`` / ``--engine-adapter`` accept: ``auto`` and every kind."""
        return (AUTO, *self.names())

    def check_choice(self, name: str) -> None:
        """Refuse (ConfigError, exit 2) an ``engine.adapter`` that is not one of
        :meth:`choices`: the configuration's models know no engine kind."""
        if name not in self.choices():
            raise ConfigError(
                f"engine.adapter: unknown engine kind {name!r}; "
                f"allowed: {', '.join(self.choices())}"
            )

    def get(self, name: str) -> EngineKind:
        """The kind called ``name``; ValueError naming the allowed ones otherwise."""
        for k in self._kinds:
            if k.name == name:
                return k
        raise ValueError(f"unknown engine adapter {name!r}; allowed: {', '.join(self.names())}")

    def detect(self, metric_names: Iterable[str]) -> EngineKind | None:
        """The first kind whose marker prefixes appear among ``metric_names``, or None."""
        names = list(metric_names)
        for k in self._kinds:
            if k.adapter.detects(names):
                return k
        return None

    def detect_command(self, argv: Sequence[str]) -> EngineKind | None:
        """The first kind whose program ``argv`` runs (``vllm serve …``,
        ``python -m sglang.launch_server …``), or None (a wrapper script, say)."""
        for k in self._kinds:
            if k.runs_in(argv):
                return k
        return None

    def markers(self) -> tuple[str, ...]:
        """Every kind's marker prefixes (what detection looks for), in order."""
        return tuple(m for k in self._kinds for m in k.adapter.markers)

    def probes(self) -> tuple[tuple[EngineKind, str], ...]:
        """(kind, GET path) to ask, in order, while /metrics has not told the kind."""
        return tuple((k, k.probe) for k in self._kinds if k.probe is not None)

    def sigterm_drain_s(self, argv: Sequence[str]) -> int | None:
        """Seconds an engine run by ``argv`` drains by itself after SIGTERM, where a
        kind's command line says it (vLLM ``--shutdown-timeout``); else None."""
        found = [
            n
            for k in self._kinds
            if k.sigterm_drain_s is not None
            for n in (k.sigterm_drain_s(argv),)
            if n is not None
        ]
        return max(found) if found else None


def builtin_kinds() -> EngineRegistry:
    """A fresh registry of the built-in kinds (a new object each call)."""
    return EngineRegistry(BUILTIN)
