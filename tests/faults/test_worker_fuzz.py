"""Every route of the reference worker, fuzzed: no 5xx, JSON errors, and it still answers.

Bodies are hypothesis-generated per route (the OpenAI requests with their keys holding
values of the wrong type, admin bodies, arbitrary JSON, raw bytes, hostile literals).
Generation is kept to a token or two, so a valid request costs milliseconds.
"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.conftest import TOKEN, RealWorker
from tests.faults.fuzzing import Req, bodies, check_answer, json_values, send

pytestmark = pytest.mark.slow

# Always present, never None: a valid body without it would generate up to the context.
_max_tokens = {"max_tokens": st.sampled_from([1, 2, 0, -1, 10**30, "3", True, 2.5, [1]])}
_sampling = {
    "model": st.sampled_from(["tiny", "other", ""]),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "n": st.sampled_from([1, 2]),
    "seed": st.integers(0, 2**63),
    "stop": st.text(max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=5),
    "stream": st.booleans(),
    "logprobs": st.integers(-1, 6),
}
_prompt = st.text(max_size=30) | st.lists(st.integers(-1, 70_000), max_size=4) | json_values
_messages = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
            "content": st.text(max_size=20) | json_values,
            "name": st.text(max_size=5),
        },
    ),
    max_size=3,
)


def _post(
    path: str,
    keys: dict[str, st.SearchStrategy[object]],
    required: dict[str, st.SearchStrategy[object]] | None = None,
) -> st.SearchStrategy[Req]:
    return bodies(keys, required).map(lambda b: Req("POST", path, b))


WORKER_REQUESTS = st.one_of(
    [
        st.just(Req("GET", "/health")),
        st.just(Req("GET", "/version")),
        st.just(Req("GET", "/metrics")),
        st.just(Req("GET", "/v1/models")),
        st.just(Req("GET", "/admin/state")),
        _post("/v1/completions", {"prompt": _prompt, **_sampling}, _max_tokens),
        _post("/v1/chat/completions", {"messages": _messages, **_sampling}, _max_tokens),
        _post("/reset_prefix_cache", {}),
        _post(
            "/admin/cache/evict",
            {"policy": st.sampled_from(["lru", "expired", "x"]), "fraction": st.floats(0, 1)},
        ),
        _post("/admin/route", {"mode": st.sampled_from(["normal", "fallback", "x"])}),
        _post("/admin/attention", {"top_n": st.integers(0, 2048)}),
        _post("/admin/drain", {"admit": st.booleans()}),
        _post("/admin/faults", {"kind": st.text(max_size=8)}),
    ]
)
ADMIN = ("/reset_prefix_cache", "/admin/", "/admin/faults")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(req=WORKER_REQUESTS)
def test_fuzz_every_worker_route(real_worker: RealWorker, req: Req) -> None:
    if req.path.startswith(ADMIN):
        req.headers["Authorization"] = f"Bearer {TOKEN}"  # past the token: fuzz the body
    with httpx.Client(timeout=30) as client:
        check_answer(send(client, real_worker.url, req), req)
        # a fuzzed drain may have stopped admission: admit again (draining answers 503)
        client.post(
            real_worker.url + "/admin/drain",
            json={"admit": True},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert client.get(real_worker.url + "/health", timeout=1.0).status_code == 200
