"""The models' boundary checks: token ids, lengths, batch sizes, key masks, caches, memory."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.models import LMConfig, TransformerLM, _checks


@given(b=st.integers(1, 3), n=st.integers(1, 6), vocab=st.integers(2, 50),
       seed=st.integers(0, 2**31 - 1))
def test_tokens_in_the_vocabulary_pass_and_one_outside_is_named(b, n, vocab, seed):
    ids = torch.randint(0, vocab, (b, n), generator=torch.Generator().manual_seed(seed))
    _checks.tokens(ids, vocab, "ids", "f")
    _checks.tokens(ids.int(), vocab, "ids", "f")
    bad = ids.clone()
    bad[-1, -1] = vocab
    with pytest.raises(ValueError, match=f"f: ids contains id {vocab}, outside the vocabulary "
                                         rf"\[0, {vocab}\)"):
        _checks.tokens(bad, vocab, "ids", "f")


@pytest.mark.parametrize("ids, error, match", [
    ([[1, 2]], TypeError, "must be a torch.Tensor of token ids"),
    (torch.ones(1, 2), TypeError, "must hold integer token ids"),
    (torch.ones(1, 2, dtype=torch.int16), TypeError, "embeddings take int64 or int32"),
    (torch.ones(3, dtype=torch.long), ValueError, "add a batch axis with .unsqueeze"),
    (torch.ones(1, 0, dtype=torch.long), ValueError, "is empty"),
])
def test_bad_token_tensors_are_clear_errors(ids, error, match):
    with pytest.raises(error, match=match):
        _checks.tokens(ids, 10, "ids", "f")


def test_lengths_batches_and_valid_lens():
    _checks.length(4, 2, 6, "tgt", "f")
    with pytest.raises(ValueError, match="2 cached \\+ 5 new positions, more than max_len=6"):
        _checks.length(5, 2, 6, "tgt", "f")
    _checks.same_batch("f", src=2, tgt=2)
    with pytest.raises(ValueError, match="batch sizes differ \\(src 2, tgt 3\\)"):
        _checks.same_batch("f", src=2, tgt=3)
    assert _checks.valid_lens(None, 2, "lens", "f", "cpu") is None
    assert _checks.valid_lens([3, 1], 2, "lens", "f", "cpu").tolist() == [3, 1]
    for lens, match in (([1.5, 2.0], "integer lengths"), ([1], "shape \\(b,\\)=\\(2,\\)"),
                        ([-1, 2], ">= 0")):
        with pytest.raises((TypeError, ValueError), match=match):
            _checks.valid_lens(torch.tensor(lens), 2, "lens", "f", "cpu")


@given(lens=st.lists(st.integers(0, 5), min_size=1, max_size=3), pad_at=st.integers(0, 4))
def test_key_mask_allows_what_both_lengths_and_padding_allow(lens, pad_at):
    b, n, pad = len(lens), 5, 0
    ids = torch.ones(b, n, dtype=torch.long)
    ids[:, pad_at] = pad
    mask = _checks.key_mask(ids, torch.tensor(lens), n, pad)
    assert mask.shape == (b, 1, 1, n)
    for row, length in enumerate(lens):
        want = [j < length and j != pad_at for j in range(n)]
        assert mask[row, 0, 0].tolist() == want
    assert _checks.key_mask(None, None, n, pad) is None


def test_a_cache_of_another_model_and_a_model_too_large_are_refused():
    small = LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_len=8)
    other = LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=2, d_ff=8, max_len=8)
    kv = TransformerLM(other).new_cache(1)
    _checks.cache(kv, other, 2, "f", cross=False)
    with pytest.raises(ValueError, match="this cache was made for another model"):
        _checks.cache(kv, small, 1, "f", cross=False)
    with pytest.raises(TypeError, match="cache must be a headwise.KVCache"):
        _checks.cache({}, small, 1, "f", cross=False)
    huge = LMConfig(vocab_size=10, d_model=65536, num_heads=1, num_layers=1000, d_ff=8,
                    max_len=8)
    with pytest.raises(ValueError, match="^build: a LMConfig of about .* parameters would need"):
        _checks.model_memory(huge)
    _checks.model_memory(small)
