"""headwise.fast.roof: the read bandwidth is a plausible reading of memory, the bytes a step
reads are its weights' bytes (codes for 4-bit matrices) and its cache's over the positions it
attends, the CPU line names the features."""

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from headwise.fast import int4 as _int4
from headwise.fast import roof


def test_read_bandwidth_reads_the_buffer_and_refuses_nonsense():
    bw = roof.read_bandwidth(repeats=2, nbytes=64 * 2**20)
    assert 1e8 < bw < 1e13  # 0.1 GB/s .. 10 TB/s: a read of RAM or cache, not a missed loop
    with pytest.raises(ValueError, match="repeats >= 1 and nbytes >= 1 MiB"):
        roof.read_bandwidth(repeats=0)


def test_step_bytes_counts_each_weight_once_and_codes_for_4bit_matrices():
    tied = nn.Linear(8, 6, bias=False)
    model = nn.Sequential(tied, nn.Linear(6, 8).to(torch.bfloat16))
    model.append(model[0])  # tied: counted once
    assert roof.step_bytes(model) == 8 * 6 * 4 + (6 * 8 + 8) * 2
    codes = torch.randint(0, 16, (4, 64))
    coded = nn.Sequential(_int4.Int4Linear(_int4.Int4(codes, torch.ones(4, 2), torch.zeros(4, 2)),
                                           torch.zeros(4), torch.float32))
    assert roof.step_bytes(coded) == 4 * 4 + coded[0].int4.nbytes() == 16 + 128 + 32


def test_step_bytes_counts_8bit_codes_for_a_head_and_no_lookup_table():
    """A tied embedding/head with Q8 codes: the step reads the codes (where the kernel is
    built), not the float32 table; an embedding no product reads is looked up, not counted."""
    from headwise.fast import native
    from headwise.fast import q8 as _q8
    from tests.fast.test_q8 import random_q8

    codes, scales, w = random_q8(48, 2, 3)
    embed, head, other = nn.Embedding(48, 64), nn.Linear(64, 48, bias=False), nn.Embedding(9, 4)
    head.weight = embed.weight = nn.Parameter(w)
    model = nn.ModuleList([embed, head, other])
    assert roof.step_bytes(model) == 48 * 64 * 4  # the head reads the table as float32
    head.q8 = _q8.Q8(codes, scales, head.weight)
    coded = 48 * 64 + 48 * 2 * 2
    assert roof.step_bytes(model) == (coded if native.isa() else 48 * 64 * 4)


def test_cpu_names_the_features_the_paths_need():
    name, _, features = roof.cpu().partition("; ")
    assert name and features
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for feature in ("avx2", "avx512_bf16"):
        assert (feature in features.split()) is (f" {feature}" in flags), (feature, features)


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(1, 3), heads=st.sampled_from([(4, 4), (4, 2), (6, 3), (2, 1)]),
       rows=st.integers(1, 4), keys=st.integers(1, 40),
       window=st.none() | st.integers(1, 30), bf16=st.booleans())
def test_cache_bytes_are_the_cache_positions_a_step_attends(layers, heads, rows, keys, window,
                                                            bf16):
    """What the step reads of its cache: the buffers new_cache allocates for ``keys`` positions
    (the window's where it is shorter), in the cache's own dtype."""
    from headwise.models import LMConfig, TransformerLM

    h, g = heads
    model = TransformerLM(LMConfig(vocab_size=11, d_model=8 * h, num_heads=h, num_kv_heads=g,
                                   num_layers=layers, d_ff=16, max_len=64, norm="rms",
                                   ffn="glu", sliding_window=window))
    if bf16:
        model = model.to(torch.bfloat16)
    seen = keys if window is None else min(keys, window)
    assert roof.cache_bytes(model, rows, keys) == model.new_cache(rows, seen).nbytes()


def test_cache_bytes_refuses_what_it_does_not_count():
    from headwise.models import LMConfig, TransformerLM

    model = TransformerLM(LMConfig(vocab_size=11, d_model=8, num_heads=2, num_layers=1, d_ff=8))
    with pytest.raises(TypeError, match="decoder-only TransformerLM"):
        roof.cache_bytes(nn.Linear(2, 2), 1, 1)
    from headwise.models import Transformer, TransformerConfig
    seq2seq = Transformer(TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=8,
                                            num_heads=2, num_layers=1, d_ff=8))
    with pytest.raises(TypeError, match="decoder-only TransformerLM .*got Transformer"):
        roof.cache_bytes(seq2seq, 1, 1)  # it has a cache too, but a cross-attention beside it
    with pytest.raises(ValueError, match="keys must be a positive int, got 0"):
        roof.cache_bytes(model, 1, 0)
