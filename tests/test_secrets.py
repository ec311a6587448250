"""The one redaction every stored or shown text goes through (ragbench.secrets)."""

from __future__ import annotations

import logging

import pytest

from ragbench import secrets


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True), ("X-Api-Key", True), ("OPENAI_API_KEY", True), ("accessToken", True),
        ("HF_TOKEN", True), ("password", True), ("Authorization", True), ("apikey", True),
        ("max_new_tokens", False), ("tokenizer", False), ("keywords", False), ("top_k", False),
        ("num_keys", False), ("base_url", False), ("PWD", False), ("OLDPWD", False),
    ],
)  # fmt: skip
def test_names_are_judged_by_their_words(name, secret):
    assert secrets.is_secret_name(name) is secret


def test_redact_masks_every_way_a_credential_arrives():
    cfg = {
        "model": {
            "max_new_tokens": 32,
            "params": {
                "base_url": "http://bob:pw-AAAA1111@h:8000/v1?api_key=q-BBBB2222&api-version=2",
                "api_key": "k-CCCC3333",
                "headers": {"X-Custom": "h-DDDD4444"},
                "tokenizer": "smollm2-135m-instruct",
            },
        }
    }
    clean = secrets.redact(cfg)
    text = repr(clean)
    for planted in ("pw-AAAA1111", "q-BBBB2222", "k-CCCC3333", "h-DDDD4444"):
        assert planted not in text
    params = clean["model"]["params"]
    assert params["base_url"] == "http://***@h:8000/v1?api_key=***&api-version=2"
    assert params["tokenizer"] == "smollm2-135m-instruct" and clean["model"]["max_new_tokens"] == 32
    assert cfg["model"]["params"]["api_key"] == "k-CCCC3333"  # a copy: the input is untouched


def test_redact_text_catches_remembered_values_pairs_and_bearer_tokens():
    secrets.collect({"params": {"api_key": "zz-remembered-9"}})
    text = (
        "failed with key zz-remembered-9 (quoted: %22zz-remembered-9%22); "
        'api_key = "typed-in-cell-1"; {\\"password\\": \\"in-ipynb-json\\"}; '
        "Authorization: Bearer abcdef123456; a 1000-token context window; max_new_tokens: 32"
    )
    clean = secrets.redact_text(text, environ={})
    for planted in ("zz-remembered-9", "typed-in-cell-1", "in-ipynb-json", "abcdef123456"):
        assert planted not in clean
    assert "a 1000-token context window; max_new_tokens: 32" in clean


def test_environment_credentials_are_masked_but_short_values_are_not():
    env = {"MY_SERVICE_TOKEN": "env-secret-value", "HOME_KEY": "abc"}
    clean = secrets.redact_text("env-secret-value and abc", environ=env)
    assert clean == "*** and abc"


def test_log_lines_pass_through_the_filter(caplog):
    secrets.remember("log-secret-77")
    handler = logging.Handler()
    handler.addFilter(secrets.RedactingFilter())
    seen = []
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("ragbench.test_secrets")
    logger.addHandler(handler)
    try:
        logger.warning("POST %s failed", "http://u:log-secret-77@host/v1")
    finally:
        logger.removeHandler(handler)
    assert seen == ["POST http://***@host/v1 failed"]
