"""API keys: both header forms, constant-time digest comparison, and the config's env-var keys."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from api.config import SecurityConfig
from api.security import KeyCheck, presented_keys


def test_bearer_and_x_api_key_are_both_read():
    headers = Headers({"authorization": "Bearer sk-1", "x-api-key": "sk-2"})
    assert presented_keys(headers) == ["sk-1", "sk-2"]
    assert presented_keys(Headers({"authorization": "bearer  sk-3 "})) == ["sk-3"]
    assert presented_keys(Headers({"authorization": "Basic abc"})) == []
    assert presented_keys(Headers({})) == []


def test_key_check_accepts_configured_keys_only():
    check = KeyCheck(["sk-one", "sk-two"])
    assert check.accepts("sk-one") and check.accepts("sk-two")
    assert not check.accepts("sk-on") and not check.accepts("") and not check.accepts("sk-one ")
    assert not KeyCheck([]).accepts("sk-one")


def test_env_keys_are_added_and_an_unset_variable_is_an_error(monkeypatch):
    monkeypatch.setenv("MRS_TEST_KEYS", "k1, k2,")
    config = SecurityConfig(api_keys=["k0"], api_keys_env="MRS_TEST_KEYS").with_env_keys()
    assert config.api_keys == ["k0", "k1", "k2"] and config.api_keys_env is None
    monkeypatch.delenv("MRS_TEST_KEYS")
    with pytest.raises(ValueError, match="MRS_TEST_KEYS.*unset or empty"):
        SecurityConfig(api_keys_env="MRS_TEST_KEYS").with_env_keys()


def test_a_key_with_spaces_is_refused_by_the_config():
    with pytest.raises(ValueError, match="security.api_keys"):
        SecurityConfig(api_keys=["two words"])
