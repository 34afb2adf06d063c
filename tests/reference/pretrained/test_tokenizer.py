"""headwise's CheckpointTokenizer against the reference tokenizer of sentence-transformers."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st


def test_tokenizer_matches_the_reference_tokenizer(minilm, st_model, sentences):
    st = st_model
    ref = st.tokenizer(sentences, padding=True, return_tensors="pt")
    ours = minilm.tokenizer.batch(sentences)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(ours[key], ref[key]), key
    pair = minilm.tokenizer.batch(["who is there?"], ["the heads are."])
    ref_pair = st.tokenizer(["who is there?"], ["the heads are."], return_tensors="pt")
    assert torch.equal(pair["token_type_ids"], ref_pair["token_type_ids"])
    assert pair["token_type_ids"].sum() > 0
    ids = minilm.tokenizer.encode("Hello world")
    assert minilm.tokenizer.tokens(ids) == ["[CLS]", "hello", "world", "[SEP]"]
    assert minilm.tokenizer.decode(ids) == "hello world"
    assert minilm.tokenizer.max_length == st.max_seq_length == 256


@settings(max_examples=10, deadline=None)
@given(words=st.lists(st.integers(0, 400), min_size=1, max_size=3), pair=st.booleans())
def test_truncated_says_which_texts_batch_cuts(minilm, words, pair):
    """truncated() is True exactly for the inputs whose tokens (special ones included) exceed
    max_length, counted by an untruncated copy of the same tokenizer."""
    from tokenizers import Tokenizer

    tok = minilm.tokenizer
    whole = Tokenizer.from_str(tok.tokenizer.to_str())
    whole.no_truncation()
    texts = ["word " * n for n in words]
    pairs = ["pair"] * len(texts) if pair else None
    full = [len(whole.encode(t, p).ids)
            for t, p in zip(texts, pairs or [None] * len(texts), strict=True)]
    kept = tok.batch(texts, pairs)["attention_mask"].sum(1).tolist()
    assert tok.truncated(texts, pairs) == [n > tok.max_length for n in full]
    assert kept == [min(n, tok.max_length) for n in full]
