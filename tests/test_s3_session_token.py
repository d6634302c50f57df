"""Temporary S3 credentials: the configuration's ``session_token`` (or AWS_SESSION_TOKEN)
reaches the object store's signer, and is never shown."""

from __future__ import annotations

import pytest

from strataio.config import load_config
from strataio.errors import BackendError
from strataio.storage.s3 import S3Backend
from strataio.tiers.tier import TierSet

TOKEN = "FwoGZXIvYXdzEXAMPLEsessionTOKEN0123456789"

CONFIG = """
[catalog]
url = "cat.db"
[[tiers]]
name = "objects"
kind = "s3"
role = "remotedisk"
bucket = "data"
endpoint = "http://127.0.0.1:9"
credentials = { access_key_id = "AKID", secret_access_key = "s3cr3t", session_token = "${TEST_TOKEN}" }
"""


def test_session_token_from_config_reaches_the_store_and_is_never_shown(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("TEST_TOKEN", TOKEN)
    (tmp_path / "strataio.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "strataio.toml")
    tier = TierSet.from_config(cfg)["objects"]
    be = tier.backend
    assert be._store.config["session_token"] == TOKEN
    assert be._store.config["access_key_id"] == "AKID"
    texts = [repr(be), str(be), be.url, repr(tier), repr(cfg), repr(cfg.tiers[0])]
    assert all(TOKEN not in t and "s3cr3t" not in t for t in texts), texts


def test_session_token_argument_and_environment(monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    kw = dict(endpoint="http://127.0.0.1:9", allow_http=True, access_key="A", secret_key="S")
    assert S3Backend("data", **kw)._store.config["session_token"] == TOKEN
    assert S3Backend("data", session_token="given", **kw)._store.config["session_token"] == (
        "given"
    )
    anon = S3Backend("data", endpoint="http://127.0.0.1:9", allow_http=True, anonymous=True)
    assert "session_token" not in anon._store.config
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    assert "session_token" not in S3Backend("data", **kw)._store.config


def test_session_token_never_in_errors(monkeypatch):
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    be = S3Backend(
        "data",
        endpoint="http://127.0.0.1:9",  # nothing listens: the request fails at once
        allow_http=True,
        access_key="AKID",
        secret_key="s3cr3t",
        session_token=TOKEN,
        retries=0,
        connect_timeout=1.0,
    )
    with pytest.raises(BackendError) as err:
        be.get("absent")
    texts = [str(err.value), repr(err.value)]
    assert all(TOKEN not in t and "s3cr3t" not in t for t in texts), texts
    assert "127.0.0.1:9" in str(err.value)
    assert be._clean(f"signed with {TOKEN}") == "signed with ***"
