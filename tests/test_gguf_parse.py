"""``devices.gguf_parsed_once``: a GGUF file parsed once while transformers reads it thrice."""

from __future__ import annotations

import threading

import gguf
import numpy as np

from ragbench.devices import gguf_parsed_once


def _tiny_gguf(path) -> None:
    """A real GGUF file (gguf's own writer): an architecture, a vocabulary, one tensor."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_token_list([f"w{i}" for i in range(50)])
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_file_is_parsed_once_inside_and_every_time_outside(tmp_path):
    path = tmp_path / "tiny.gguf"
    _tiny_gguf(path)
    own_reader, own_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # the one parse, by path
        assert isinstance(first, own_reader)
        assert first.fields["llama.block_count"].contents() == 2
        assert np.array_equal(first.tensors[0].data, np.arange(12, dtype=np.float32).reshape(3, 4))
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 2).get_name("model.layers.1.mlp.up_proj") == (
            "blk.1.ffn_up"
        )
    # gguf's own names are back: each call parses again
    assert gguf.GGUFReader is own_reader and gguf.get_tensor_name_map is own_map
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)


def test_overlapping_blocks_restore_gguf_when_the_last_one_closes(tmp_path):
    path = tmp_path / "tiny.gguf"
    _tiny_gguf(path)
    own_reader = gguf.GGUFReader
    inside, leave = threading.Event(), threading.Event()

    def other_thread() -> None:  # the tokenizer's read beside the model's conversion
        with gguf_parsed_once():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other_thread)
    with gguf_parsed_once():
        first = gguf.GGUFReader(path)
        thread.start()
        assert inside.wait(10)
    # this block closed first: the other is still open, so the parse is still shared
    assert gguf.GGUFReader is not own_reader and gguf.GGUFReader(path) is first
    leave.set()
    thread.join(10)
    assert gguf.GGUFReader is own_reader
