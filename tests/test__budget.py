"""The machine's budget: parameter counts from a config alone equal the built model's."""

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise import _budget
from headwise.models import LMConfig, TransformerConfig, build


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["lm", "transformer"]), heads=st.integers(1, 4),
       head_dim=st.integers(1, 8), layers=st.integers(1, 3), d_ff=st.integers(1, 40),
       vocab=st.integers(4, 50), tie=st.booleans(),
       positional=st.sampled_from(["sinusoidal", "learned"]), kv=st.booleans(),
       pre=st.booleans())
def test_parameter_count_equals_the_built_model(kind, heads, head_dim, layers, d_ff, vocab, tie,
                                                positional, kv, pre):
    common = dict(d_model=heads * head_dim, num_heads=heads, num_layers=layers, d_ff=d_ff,
                  max_len=12, tie_embeddings=tie, positional=positional,
                  num_kv_heads=1 if kv else None, dropout=0.0, norm_first=pre)
    cfg = (LMConfig(vocab_size=vocab, **common) if kind == "lm"
           else TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab + 1, **common))
    model = build(cfg)
    real = len(torch.nn.utils.parameters_to_vector(model.parameters()))
    assert _budget.parameter_count(kind, cfg.to_dict()) == real


def test_absurd_sizes_are_counted_at_once_and_refused_with_the_number():
    start = time.perf_counter()
    n = _budget.parameter_count("lm", dict(vocab_size=100, d_model=1_000_000, num_heads=1,
                                           num_layers=1_000_000, d_ff=4_000_000))
    assert n > 10**18 and time.perf_counter() - start < 0.1
    with pytest.raises(ValueError, match=r"needs about .* of memory; this machine has"):
        _budget.check_fits("a model", 4 * n, "use smaller sizes")
    assert 1 <= _budget.cpu_count() and _budget.available_memory() > 0
