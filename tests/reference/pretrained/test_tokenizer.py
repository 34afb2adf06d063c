"""headwise's CheckpointTokenizer against the reference tokenizer of sentence-transformers."""

from __future__ import annotations

import torch


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
