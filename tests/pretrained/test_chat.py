"""The GGUF chat tokenizer: the template's system prompt, streamed decoding that never splits a
character, and clear errors for templates and messages it cannot use."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwise.errors import CheckpointError


def test_system_argument_replaces_the_default_system_prompt(smollm2_tokenizer):
    default = smollm2_tokenizer.render("Hi")
    assert "You are a helpful AI assistant named SmolLM" in default
    custom = smollm2_tokenizer.render("Hi", system="Be terse.")
    assert custom.startswith("<|im_start|>system\nBe terse.<|im_end|>\n")
    assert "SmolLM" not in custom


@given(st.text(min_size=1, max_size=40))
def test_streamed_pieces_join_to_the_decoded_text(smollm2_tokenizer, text):
    ids = smollm2_tokenizer.encode(text)
    stream = smollm2_tokenizer.stream()
    pieces = [stream.push(i) for i in ids]
    assert not any(p.endswith("\ufffd") for p in pieces)  # never half a character
    assert "".join(pieces) + stream.flush() == smollm2_tokenizer.decode(ids)


def test_unknown_special_token_in_the_template_is_an_error(smollm2_file):
    from headwise.pretrained.chat import ChatTokenizer

    meta = dict(smollm2_file.metadata)
    meta["tokenizer.chat_template"] = meta["tokenizer.chat_template"].replace(
        "<|im_end|>", "<|im_sep|>")
    with pytest.raises(CheckpointError, match=r"<\|im_sep\|>.*does not have as special"):
        ChatTokenizer.from_metadata(meta)


def test_bad_messages_and_missing_template_are_clear_errors(smollm2_file, smollm2_tokenizer):
    from headwise.pretrained.chat import ChatTokenizer

    with pytest.raises(TypeError, match="role"):
        smollm2_tokenizer.chat([{"content": "no role"}])
    meta = dict(smollm2_file.metadata)
    del meta["tokenizer.chat_template"]
    with pytest.raises(CheckpointError, match="no tokenizer.chat_template"):
        ChatTokenizer.from_metadata(meta).chat("hi")
    meta = dict(smollm2_file.metadata, **{"tokenizer.ggml.model": "llama"})
    with pytest.raises(CheckpointError, match="'llama'.*byte-level BPE"):
        ChatTokenizer.from_metadata(meta)


def test_a_prompt_longer_than_the_context_is_an_error():
    from headwise.pretrained.chat import check_length

    check_length(6, 2, 8, "tiny")  # exactly fits
    with pytest.raises(ValueError, match=r"prompt is 10 tokens.*tiny's context is 8 tokens: "
                                         r"shorten the prompt by 3 tokens"):
        check_length(10, 0, 8, "tiny")
    with pytest.raises(ValueError, match="ask for at most 2 new tokens"):
        check_length(6, 3, 8, "tiny")


@given(left=st.sampled_from(["Ġ", "h", "Ġt", "XY", "\u2603"]),
       right=st.sampled_from(["t", "e", "he", "QQ", ""]), at=st.integers(0, 2))
def test_a_merge_naming_a_token_outside_the_vocabulary_is_a_checkpoint_error(left, right, at):
    """A GGUF whose BPE merges name a token missing from its vocabulary raised the tokenizers
    library's bare 'Exception: Error while initializing BPE'; now a CheckpointError names the
    merge and the token (unless the merge is valid: then the tokenizer builds)."""
    pytest.importorskip("tokenizers")
    from headwise.pretrained.chat import ChatTokenizer
    from tests.pretrained import tiny_gguf

    tokens, merges, types = tiny_gguf.vocabulary()
    line = f"{left} {right}" if right else left
    merges = [*merges[:at], line, *merges[at:]]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": types}
    parts = [left, right, left + right] if right else [None]
    if all(p in tokens for p in parts):
        assert ChatTokenizer.from_metadata(meta).vocab_size == len(tokens)
        return
    with pytest.raises(CheckpointError, match=rf"GGUF: BPE merge {at} \(.*\) names .*, which "
                                              r"is not in the file's vocabulary"):
        ChatTokenizer.from_metadata(meta)
