"""Repeats in the audit log: a record that repeats while its cause lasts is written once.

The runner names a *stream* for a record that may repeat (an action on a target for
an alert) and a *key* (what was decided: its outcome and refusal code). The first
record of a key on a stream is written; the same key again is counted, not written.
When the stream gets another record (the cause changed: a different refusal, the
run that finally started) or goes quiet for ``quiet_s`` (the cause ended), a
``kind: repeated`` record says how many times it repeated and over which span; a
repeat that lasts past ``span_s`` is summed up then, and counted on again.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from kcops.agent.remediation.records import JSONObject, RepeatedRecord

Stream = tuple[Hashable, ...]
Key = tuple[Hashable, ...]

QUIET_S = 60.0  # no repeat for this long: the cause ended
SPAN_S = 600.0  # a repeat that lasts longer is summed up at least this often
MAX_STREAMS = 1000  # the oldest stream past this is summed up and forgotten


@dataclass
class _Repeat:
    key: Key
    of: JSONObject  # what repeats (the record's identifying fields)
    first_ts: float  # the first repeat not yet summed up
    last_ts: float
    seen_ts: float  # the record that was written (or the last summary)
    count: int = 0  # repeats not written since the record or the last summary
    last_error: str | None = None


class Repeats:
    def __init__(self, quiet_s: float = QUIET_S, span_s: float = SPAN_S) -> None:
        self.quiet_s = quiet_s
        self.span_s = span_s
        self._streams: dict[Stream, _Repeat] = {}
        self.suppressed = 0  # records counted instead of written, in all

    def note(
        self,
        stream: Stream,
        key: Key | None,
        of: JSONObject,
        ts: float,
        error: str | None = None,
    ) -> tuple[list[RepeatedRecord], bool]:
        """(summaries to write first, whether to write this record itself).

        ``key`` None: a record that never repeats (a run that started); it ends the
        stream's repeat.
        """
        out: list[RepeatedRecord] = []
        cur = self._streams.get(stream)
        if cur is not None and key is not None and cur.key == key:
            if cur.count and ts - cur.first_ts >= self.span_s:
                out.append(self._summary(cur, "ongoing"))
                cur.count = 0
            if not cur.count:
                cur.first_ts = ts
            cur.count += 1
            cur.last_ts = ts
            cur.last_error = error
            self.suppressed += 1
            return out, False
        if cur is not None:
            del self._streams[stream]
            if cur.count:
                out.append(self._summary(cur, "changed"))
        if key is not None:
            self._streams[stream] = _Repeat(key, of, ts, ts, ts)
            if len(self._streams) > MAX_STREAMS:
                oldest = min(self._streams, key=lambda s: self._streams[s].last_ts)
                old = self._streams.pop(oldest)
                if old.count:
                    out.append(self._summary(old, "forgotten"))
        return out, True

    def due(self, now: float) -> list[RepeatedRecord]:
        """Summaries of repeats whose cause ended (quiet for ``quiet_s``)."""
        out = []
        for stream, cur in list(self._streams.items()):
            if now - cur.last_ts >= self.quiet_s:
                del self._streams[stream]
                if cur.count:
                    out.append(self._summary(cur, "ended"))
        return out

    def flush(self) -> list[RepeatedRecord]:
        """Every pending summary (the agent stops)."""
        out = [self._summary(c, "stopping") for c in self._streams.values() if c.count]
        self._streams.clear()
        return out

    @property
    def pending(self) -> int:
        return sum(c.count for c in self._streams.values())

    @staticmethod
    def _summary(cur: _Repeat, why: str) -> RepeatedRecord:
        return RepeatedRecord(
            ts=cur.last_ts,
            of=cur.of,
            count=cur.count,
            first_ts=cur.first_ts,
            last_ts=cur.last_ts,
            since=cur.seen_ts,
            why=why,
            error=cur.last_error,
        )
