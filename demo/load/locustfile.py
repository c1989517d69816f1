"""Locust users for an OpenAI-compatible completions endpoint (``/v1/completions``).

A mix of short and long prompts cut from CPython's reference documentation
(``pydoc_data.topics``, real English, shipped with Python), drawn from a small
pool so the prefix cache sees reuse as real traffic does. Most requests
stream; for those, Locust's entry is the whole stream's latency and a second
entry, type ``TTFT``, is the time to the first token. One request in
``KCOPS_LOAD_PLAIN_EVERY`` (3) is not streamed, so the engine's answer names
the route it took: those entries are named ``short→base`` / ``long→topn``, which
makes the reference worker's short→base / long→optimized split visible in
Locust's own table. Environment: ``KCOPS_LOAD_MAX_TOKENS`` (16),
``KCOPS_LOAD_MODEL`` (the engine's default model when empty), and
``KCOPS_LOAD_MODE_FILE``: a file read before each request whose content shifts
the traffic while Locust runs (the demo's drills): ``mixed`` (default),
``unique`` (every prompt starts differently: no prefix reuse), ``long``
(long prompts only: K(C) rises), ``short`` (short prompts only) or ``hot``
(one long prompt for everyone: its cached segments are read back each time).

    locust -f bench/locustfile.py --host http://127.0.0.1:8000
"""

from __future__ import annotations

import json
import os
import random
import time

from locust import HttpUser, between, task
from locust.clients import ResponseContextManager

from kcops.demo.load.prompts import load_mode, prompt

MAX_TOKENS = int(os.environ.get("KCOPS_LOAD_MAX_TOKENS", "16"))
MODEL = os.environ.get("KCOPS_LOAD_MODEL", "")
PLAIN_EVERY = max(1, int(os.environ.get("KCOPS_LOAD_PLAIN_EVERY", "3")))


def _refused(resp: ResponseContextManager) -> bool:
    """A failed answer, marked so; after no answer at all (status 0: the engine is down or
    restarting) a user waits a second instead of counting hundreds of refused
    connections, as a client with retry would."""
    if resp.status_code == 200:
        return False
    resp.failure(f"HTTP {resp.status_code}")
    if resp.status_code == 0:
        time.sleep(1.0)
    return True


class CompletionsUser(HttpUser):
    """Two short requests for each long one, as chat traffic mixes them."""

    wait_time = between(0.05, 0.3)

    def on_start(self) -> None:
        self.rng = random.Random()
        self.n = 0

    def _body(self, kind: str, stream: bool) -> dict[str, object]:
        body: dict[str, object] = {
            "prompt": prompt(kind, self.rng, load_mode()),
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": stream,
        }
        if MODEL:
            body["model"] = MODEL
        return body

    @task(2)
    def short(self) -> None:
        self._complete("short")

    @task(1)
    def long(self) -> None:
        self._complete("long")

    def _complete(self, kind: str) -> None:
        self.n += 1
        if self.n % PLAIN_EVERY == 0:
            self._plain(kind)
        else:
            self._stream(kind)

    def _plain(self, kind: str) -> None:
        with self.client.post(
            "/v1/completions", json=self._body(kind, False), name=kind, catch_response=True
        ) as resp:
            if _refused(resp):
                return
            try:
                route = resp.json().get("kcops", {}).get("route")
            except ValueError:
                resp.failure("answer is not JSON")
                return
            # The reference worker names its route; another engine's answer does not.
            resp.request_meta["name"] = f"{kind}→{route}" if route else kind
            resp.success()

    def _stream(self, kind: str) -> None:
        t0 = time.perf_counter()
        ttft_s = None
        with self.client.post(
            "/v1/completions",
            json=self._body(kind, True),
            name=f"{kind} stream",
            stream=True,
            catch_response=True,
        ) as resp:
            if _refused(resp):
                return
            error = None
            try:
                for line in resp.iter_lines():
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        error = str(chunk["error"])[:200]
                        break
                    if ttft_s is None and chunk["choices"][0].get("text"):
                        ttft_s = time.perf_counter() - t0
            except (OSError, ValueError, KeyError, IndexError) as exc:
                # A stream cut mid-way (engine restarted) or garbled: a failed request.
                error = f"{type(exc).__name__}: {str(exc)[:160]}"
            # Locust timed the headers; the user waits for the whole stream.
            resp.request_meta["response_time"] = (time.perf_counter() - t0) * 1000
            if error:
                resp.failure(error)
                return
            resp.success()
        if ttft_s is not None:
            self.environment.events.request.fire(
                request_type="TTFT",
                name=kind,
                response_time=ttft_s * 1000,
                response_length=0,
                exception=None,
                context={},
            )
