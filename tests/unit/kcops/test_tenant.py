"""Issue 25: the tenant label is bounded and never a raw secret (kcops.tenant); issue 41:
never one of kcops' own labels."""

from __future__ import annotations

import random
import string

import pytest
from multidict import CIMultiDict

from kcops.tenant import (
    KEY_ENV,
    NONE,
    OTHER,
    OWN,
    TenantLabels,
    canary_id,
    clean,
    looks_secret,
    tenant_key,
)


def test_ten_thousand_distinct_tenants_stay_under_the_cap() -> None:
    t = TenantLabels(cap=50)
    seen = {t.label(f"team-{i}") for i in range(10_000)}
    assert len(seen) == 51 and OTHER in seen  # 50 named + other
    assert len(t.labels) == 50
    # the first fifty keep their names, a later one is other, and a known one stays
    assert t.label("team-0") == "team-0" and t.label("team-49") == "team-49"
    assert t.label("team-50") == OTHER and t.label("brand-new") == OTHER


@pytest.mark.parametrize(
    "raw",
    [
        "sk-proj-abcdEFGH1234ijkl5678",
        "sk-1",
        "SK_live_00000000",
        "Bearer abc",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.x",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "AKIAIOSFODNN7EXAMPLE",
        "hf_abcdefghijklmnopqrstu",
        "5f4dcc3b5aa765d61d8327deb882cf99",  # an md5: a hashed id, or a key
        "550e8400-e29b-41d4-a716-446655440000",
        "q8Zt3LmP0vXc7RkW2nYb5HsJ",  # 24 random-looking characters
        "x" * 65,
        "has space",
        'quo"te',
        "new\nline",
    ],
)
def test_a_value_that_could_be_a_secret_is_other(raw: str) -> None:
    assert TenantLabels().label(raw) == OTHER


@pytest.mark.parametrize(
    "raw", ["acme", "team-search", "globex.eu", "customer_42", "billing-platform-prod-eu-west"]
)
def test_readable_names_are_kept(raw: str) -> None:
    assert not looks_secret(raw)
    assert TenantLabels().label(raw) == raw


def test_secrets_never_spend_the_cap() -> None:
    t = TenantLabels(cap=2)
    rng = random.Random(0)
    for _ in range(100):
        key = "sk-" + "".join(rng.choices(string.ascii_letters + string.digits, k=40))
        assert t.label(key) == OTHER
    assert t.label("acme") == "acme" and t.label("globex") == "globex"


def test_header_first_then_user_then_none() -> None:
    t = TenantLabels(header="X-Tenant")
    assert t.of_request(CIMultiDict({"x-tenant": "acme"}), "bob") == "acme"
    assert t.of_request(CIMultiDict(), "bob") == "bob"
    assert t.of_request(CIMultiDict({"X-Tenant": " "}), None) == NONE
    assert TenantLabels(header=None).of_request(CIMultiDict({"X-Tenant": "acme"}), None) == NONE


def test_the_agents_canary_is_nobodys_and_its_id_cannot_be_borrowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "the-engines-key")  # what the worker reads
    t = TenantLabels()
    own = canary_id(tenant_key())
    assert t.of_request(CIMultiDict({"x-request-id": own, "X-Tenant": "acme"}), None) == OWN
    for rid in (own[:-2] + "zz", canary_id(b"not-the-key"), "kcops-canary-" + "0" * 49):
        assert t.of_request(CIMultiDict({"X-Request-Id": rid}), "acme") == "acme"


@pytest.mark.parametrize("raw", ["other", "none", "unknown", "Other", "NONE", "uNkNoWn"])
def test_a_client_never_gets_a_reserved_label(raw: str) -> None:
    assert clean(raw) == TenantLabels().label(raw) == "_" + raw
    assert clean(clean(raw)) == clean(raw)  # what another process reads back is kept


def test_labels_read_back_keep_kcops_own_and_are_checked_again() -> None:
    t = TenantLabels(cap=1)
    assert t.bound(NONE) == NONE and t.bound(OTHER) == OTHER  # no slot spent
    assert t.bound("unknown") == t.bound("sk-abcdefabcdefabcdef") == t.bound("a b") == OTHER
    assert t.bound("acme") == "acme" and t.bound("globex") == OTHER


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="cap"):
        TenantLabels(cap=0)
    with pytest.raises(ValueError, match="header name"):
        TenantLabels(header="X Tenant")
