"""The one redaction every stored or shown text goes through (ragbench.secrets)."""

from __future__ import annotations

import logging

import pytest

from ragbench import secrets


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True),
        ("X-Api-Key", True),
        ("OPENAI_API_KEY", True),
        ("accessToken", True),
        ("HF_TOKEN", True),
        ("password", True),
        ("Authorization", True),
        ("apikey", True),
        ("max_new_tokens", False),
        ("tokenizer", False),
        ("keywords", False),
        ("top_k", False),
        ("num_keys", False),
        ("base_url", False),
        ("PWD", False),
        ("OLDPWD", False),
    ],
)
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


def test_a_placeholder_key_is_not_remembered_so_later_words_stay():
    # seen: a sweep given api_key "none" made every later "none" in the process print as ***
    secrets.collect({"params": {"api_key": "none", "token": "EMPTY", "password": "pw-77-real"}})
    clean = secrets.redact_text("none of them; EMPTY answers; pw-77-real", environ={})
    assert clean == "none of them; EMPTY answers; ***"


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


def test_a_credential_named_field_is_masked_whatever_its_type():
    clean = secrets.redact(
        {
            "api_key": {"k": "v-1"},
            "token": [7, 8],
            "password": 31415926,
            "eos_token_id": 2,
            "num_key_value_heads": 8,
            "auth": None,
        }
    )
    assert clean == {
        "api_key": "***",
        "token": "***",
        "password": "***",
        "eos_token_id": 2,
        "num_key_value_heads": 8,
        "auth": None,
    }


@pytest.mark.parametrize(
    ("code", "clean"),
    [
        ('api_key = "plainword"', 'api_key = "***"'),
        ("OpenAI(api_key='abc')", "OpenAI(api_key='***')"),
        ('{"X-Api-Key": "k"}', '{"X-Api-Key": "***"}'),
        ('os.environ["HF_TOKEN"] = "x"', 'os.environ["HF_TOKEN"] = "***"'),
        ('api_key: str = ""  # help', 'api_key: str = ""  # help'),
        (
            'tokenizer = "whitespace"; max_new_tokens = 32',
            'tokenizer = "whitespace"; max_new_tokens = 32',
        ),
    ],
)
def test_code_masks_quoted_credentials_whatever_they_look_like(code, clean):
    assert secrets.redact_text(secrets.mask_code_literals(code), environ={}) == clean


def test_userinfo_of_a_malformed_url_is_masked_and_remembered():
    text = "base_url must look like http://host:port/v1, got 'http//user:pw-MAL-1@h:9/v1'"
    assert secrets.redact_text(text, environ={}).endswith("got 'http//***@h:9/v1'")
    secrets.collect({"base_url": "http//user:pw-MAL-2@h:9/v1"})
    assert secrets.redact_text("quoted pw-MAL-2", environ={}) == "quoted ***"


def test_a_masked_url_is_filled_from_the_environment(monkeypatch):
    shown = "http://***@h:8000/v1?token=***&api-version=2"
    monkeypatch.delenv("FILL_URL", raising=False)
    with pytest.raises(ValueError, match=r"^model.params.base_url: http://\*\*\*@h:8000.*FILL_URL"):
        secrets.fill_masked_url(shown, "FILL_URL", "model.params.base_url")
    monkeypatch.setenv("FILL_URL", "http://u:pw-FILL-3@other:1/v1")
    with pytest.raises(ValueError, match=r"holds another URL \(http://\*\*\*@other:1/v1\)") as info:
        secrets.fill_masked_url(shown, "FILL_URL", "model.params.base_url")
    assert "pw-FILL-3" not in str(info.value)
    full = "http://u:pw-FILL-4@h:8000/v1?token=t-FILL-4&api-version=2"
    monkeypatch.setenv("FILL_URL", full)
    assert secrets.fill_masked_url(shown, "FILL_URL", "k") == full
    assert (
        secrets.fill_masked_url("http://h/v1", "FILL_URL", "k") == "http://h/v1"
    )  # nothing masked
