"""The one YAML loader: configuration, rule files, promtool test files and ``--param`` values.

A YAML file is input from outside, so the loader bounds what it costs before
anything else sees it: at most :data:`MAX_BYTES` bytes, strict UTF-8, no
anchors or aliases (an alias bomb expands into exponential work in whatever
walks or prints the result), nesting at most :data:`MAX_DEPTH` deep, at most
:data:`MAX_NODES` nodes, and no scalar YAML cannot construct. Every refusal is a
:class:`~kcops.errors.ConfigError` (or the subclass the caller names) with one
line: the file, the line and column, what is wrong, and a short excerpt.

It is strict where YAML 1.1 is loose: a key repeated in one mapping is refused
(PyYAML keeps the last silently), and only ``true`` and ``false`` are booleans
(YAML 1.2's core schema): ``yes``/``no``/``on``/``off`` load as strings, which a
typed field then refuses or takes as the text written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from yaml.events import Event
from yaml.nodes import MappingNode, Node, ScalarNode

from kcops.errors import ConfigError

MAX_BYTES = 4 << 20
MAX_DEPTH = 64
MAX_NODES = 200_000
EXCERPT_CHARS = 60
# An integer beyond a float's range (hex is not bounded by Python's 4300-digit
# limit) means nothing to any field, and printing it would be slow or fail.
MAX_INT_BITS = 1024
BOOL_TAG = "tag:yaml.org,2002:bool"


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr`` of at most ``limit`` characters, for an error message."""
    if isinstance(value, str | bytes):
        text = repr(value[: limit + 1])
    elif isinstance(value, int) and value.bit_length() > 64:
        text = f"<integer of {value.bit_length()} bits>"
    elif isinstance(value, dict | list | tuple | set):
        text = f"<{type(value).__name__} of {len(value)} items>"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class _Refused(yaml.YAMLError):
    def __init__(self, message: str, node_or_event: Node | Event | None) -> None:
        super().__init__(message)
        self.message = message
        self.mark = getattr(node_or_event, "start_mark", None)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and anchors, and bounds depth and node count."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused("anchors and aliases are not allowed", event)
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", event)
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} nodes", event)
        try:
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1

    def construct_object(self, node: Node, deep: bool = False) -> object:
        # A constructor's own failures (a timestamp like 2001-13-45, an integer
        # past Python's digit limit, !!timestamp on text) are input errors too.
        try:
            data = super().construct_object(node, deep)
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
            why = (str(exc).splitlines() or [type(exc).__name__])[0][:100]
            if why.startswith("Exceeds the limit"):
                why = "an integer of more than 4300 digits"
            value = f" {excerpt(node.value)}" if isinstance(node.value, str) else ""
            raise _Refused(f"not a valid {tag}{value}: {why}", node) from None
        if isinstance(data, int) and data.bit_length() > MAX_INT_BITS:
            raise _Refused(f"integer out of range ({data.bit_length()} bits; at most 1e308)", node)
        return data

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # A repeated key is a mistake (which of the two did the author mean?), never
        # "the last one wins" as PyYAML and YAML 1.1 parsers do.
        self.flatten_mapping(node)
        first: dict[object, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                continue  # a complex key: unhashable, refused by PyYAML itself
            key = self.construct_object(key_node)
            try:
                seen = key in first
            except TypeError:
                continue
            if seen:
                raise _Refused(
                    f"duplicate key {excerpt(key)} (first at line {first[key]})", key_node
                )
            first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)  # type: ignore[no-any-return]


# Booleans are `true` and `false` only (YAML 1.2's core schema, lower case): YAML 1.1's
# yes/no/on/off/y/n and the capitalised forms resolve to strings.
_BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_BoundedLoader.add_implicit_resolver(BOOL_TAG, re.compile(r"^(?:true|false)$"), list("tf"))


def _one_line(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if isinstance(exc, _Refused):
        what = exc.message
    else:
        what = str(getattr(exc, "problem", None) or exc).splitlines()[0]
        context = getattr(exc, "context", None)
        if context:
            what = f"{context.splitlines()[0]}, {what}"
    return f"{where}{what[:200]}"


def parse_yaml(text: str, source: str, error: type[ConfigError] = ConfigError) -> Any:
    """Parse one YAML document from ``text`` with the bounds of this module.

    Any failure, a value YAML cannot construct included (``2001-13-45``, an
    integer of 5000 digits), is ``error`` with one line naming ``source``.
    """
    if len(text) > MAX_BYTES:
        raise error(f"{source}: larger than {MAX_BYTES} bytes")
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:
        # Constructors' own failures are caught per node (with the line); this is the
        # net for the rest of PyYAML, so a bad file is always one line, never a traceback.
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise error(f"{source}: not valid YAML: {why}") from None


def load_yaml_file(path: Path | str, error: type[ConfigError] = ConfigError) -> Any:
    """Read and parse a YAML file; any problem is ``error`` with one line naming the file."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise error(f"{p}: larger than {MAX_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 4]
        raise error(f"{p}: not UTF-8 at byte {exc.start} ({excerpt(bad)})") from None
    return parse_yaml(text, str(p), error)
