"""The bearer-token check: no token configured means refused, never open."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from kcops.auth import TokenCheck, load_token
from kcops.errors import ConfigError


def test_no_token_configured_refuses_everything() -> None:
    chk = TokenCheck(None)
    assert not chk.configured
    assert not chk.check("Bearer ")
    assert not chk.check("Bearer anything")
    assert not chk.check(None)


def test_bearer_token() -> None:
    chk = TokenCheck("s3cret")
    assert chk.check("Bearer s3cret")
    assert chk.check("bearer   s3cret ")
    assert not chk.check("Bearer s3cre")
    assert not chk.check("Bearer s3cret2")
    assert not chk.check("Token s3cret")
    assert not chk.check("")


def test_basic_auth_password_is_the_token() -> None:
    chk = TokenCheck("s3cret")
    good = base64.b64encode(b"alertmanager:s3cret").decode()
    bad = base64.b64encode(b"alertmanager:nope").decode()
    assert chk.check(f"Basic {good}")
    assert not chk.check(f"Basic {bad}")
    assert not chk.check("Basic !!!notbase64")


def test_load_token_env_and_file(tmp_path: Path) -> None:
    assert load_token(None, env={}) is None
    assert load_token(None, env={"KCOPS_TOKEN": " abc \n"}) == "abc"
    f = tmp_path / "tok"
    f.write_text("fromfile\n")
    assert load_token(f, env={"KCOPS_TOKEN": "env"}) == "fromfile"
    f.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        load_token(f, env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_token(tmp_path / "missing", env={})
