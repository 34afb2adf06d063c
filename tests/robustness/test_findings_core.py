"""Regression tests for issue 16's findings in the core: each was a hang, a traceback or a
silently wrong number; each is now a clear error or a documented correct result."""

from __future__ import annotations

import math
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
from headwise import limits, masks
from headwise.models import LMConfig, TransformerConfig, build


def _qkv(b=1, h=2, i=3, j=3, d=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g, dtype=dtype) for n in (i, j, j))


def _fast(fn, seconds=10.0):
    start = time.perf_counter()
    fn()
    assert time.perf_counter() - start < seconds


# ------------------------------------------------------------------------- sizes and hints
@pytest.mark.parametrize("embed_dim", [10**9 + 1, 99999999999999999999999])
def test_absurd_embed_dim_is_refused_at_once(embed_dim):
    def build_it():
        with pytest.raises(ValueError, match="over the maximum 131,072"):
            hw.MultiHeadAttention(embed_dim, 2)
    _fast(build_it)


def test_divisor_hint_costs_no_more_than_the_check():
    # 131071 = 2**17 - 1 is prime: the hint scans 1..2h only, not every divisor of embed_dim
    _fast(lambda: pytest.raises(ValueError, hw.MultiHeadAttention, 131071, 2)
          .match(r"use num_heads=1\b"))
    with pytest.raises(ValueError, match=r"use num_heads=5\b"):
        hw.MultiHeadAttention(10, 4)


def test_mha_memory_estimate_refuses_with_the_number():
    with pytest.raises(ValueError, match=r"parameters would need about [\d,.]+ GB"):
        hw.MultiHeadAttention(limits.MAX["dim"], 1)


@pytest.mark.parametrize("field, value", [("num_layers", 10**6), ("d_model", 10**6),
                                          ("vocab_size", 10**9), ("max_len", 10**8),
                                          ("num_heads", 10**5)])
def test_config_sizes_are_bounded(field, value):
    kwargs = {"vocab_size": 10, "d_model": 8, "num_heads": 2, field: value}
    if field == "num_heads":
        kwargs["head_dim"] = 4
    _fast(lambda: pytest.raises(ValueError, LMConfig, **kwargs).match("over the maximum"))


def test_build_refuses_a_model_larger_than_memory_before_building():
    config = LMConfig(vocab_size=10, d_model=65536, num_heads=2, num_layers=1000, d_ff=8)
    _fast(lambda: pytest.raises(ValueError, build, config).match("more than this machine's"))
    seq2seq = TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=131072, num_heads=1,
                                num_layers=100, d_ff=131072)
    _fast(lambda: pytest.raises(ValueError, build, seq2seq).match("GB of memory"))


# ------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype, match", [(torch.long, "floating point"),
                                          (torch.half, "parameters are torch.float32"),
                                          (torch.double, "parameters are torch.float32"),
                                          (torch.bfloat16, "parameters are torch.float32")])
def test_mha_input_dtype_is_checked(dtype, match):
    mha = hw.MultiHeadAttention(4, 2)
    with pytest.raises(TypeError, match=match):
        mha(torch.randn(2, 3, 4).to(dtype))


def test_mha_under_autocast_accepts_lower_precision_inputs():
    mha = hw.MultiHeadAttention(4, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = mha(torch.randn(2, 3, 4).bfloat16())
    assert out.isfinite().all()


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_fp64_additive_mask_on_fp32_is_cast_like_sdpa(backend):
    q, k, v = _qkv()
    bias = torch.tensor([0.0, float("-inf"), 0.0], dtype=torch.float64)
    out, _ = hw.attention(q, k, v, mask=bias.view(1, 1, 1, 3), backend=backend)
    ref, _ = hw.attention(q, k, v, mask=torch.tensor([True, False, True]).view(1, 1, 1, 3),
                          backend="eager")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref)


def test_attention_rejects_mixed_qkv_dtypes():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="share one dtype"):
        hw.attention(q, k.double(), v)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.bool])
def test_small_integer_tokens_are_a_clear_error(dtype):
    lm = build(LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                        max_len=8)).eval()
    with pytest.raises(TypeError, match=r"\.long\(\)"):
        lm(torch.tensor([[1, 2]]).to(dtype))


def test_int32_tokens_still_work():
    lm = build(LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                        max_len=8)).eval()
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(lm(ids.int())[0], lm(ids)[0])


def test_as_bias_rejects_an_integer_mask():
    with pytest.raises(TypeError, match="mask.bool()"):
        masks.as_bias(torch.tensor([1, 0]), torch.float32)
    with pytest.raises(TypeError, match="floating torch.dtype"):
        masks.as_bias(torch.tensor([True]), torch.long)


# ------------------------------------------------------------------------- masks and heads
@pytest.mark.parametrize("shape", [(3,), (3, 3), (2, 3, 3), (1, 1, 3)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_low_rank_masks_broadcast_the_same_on_every_backend(shape, kind):
    """Decision: masks of rank < 4 are accepted and broadcast from the right, as torch does."""
    q, k, v = _qkv(i=3, j=3)
    g = torch.Generator().manual_seed(1)
    allowed = torch.rand(shape, generator=g) > 0.3
    allowed[..., 0] = True
    mask = allowed if kind == "bool" else masks.as_bias(allowed, torch.float32)
    full = allowed.expand(1, 2, 3, 3)
    ref, _ = hw.attention(q.double(), k.double(), v.double(), mask=full, backend="eager")
    for backend in ("eager", "sdpa"):
        out, _ = hw.attention(q, k, v, mask=mask, backend=backend)
        torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)


def test_mask_of_too_high_rank_is_rejected():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="expected at most 4"):
        hw.attention(q, k, v, mask=torch.ones(1, 1, 1, 3, 3, dtype=torch.bool))


def test_split_heads_zero_heads():
    with pytest.raises(ValueError, match="num_heads must be >= 1, got 0"):
        hw.split_heads(torch.randn(1, 2, 4), 0)


def test_padding_from_a_list_and_from_valid_lens_with_negative_nk():
    with pytest.raises(TypeError, match="torch.tensor"):
        masks.padding([[1]], 0)
    with pytest.raises(ValueError, match="nk must be >= 0, got -1"):
        masks.from_valid_lens(torch.tensor([1]), -1)


def test_fuse_unfuse_keeps_dropout_and_backend():
    mha = hw.MultiHeadAttention(4, 2, dropout=0.25, backend="eager")
    again = hw.fuse(hw.unfuse(mha))
    assert (again.dropout_p, again.backend) == (0.25, "eager")
    assert hw.fuse(hw.unfuse(mha), backend="sdpa").backend == "sdpa"


def test_kv_cache_from_another_model_is_a_clear_error():
    small = build(LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                           max_len=8)).eval()
    deep = build(LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=2, d_ff=8,
                          max_len=8)).eval()
    with pytest.raises(ValueError, match="made for another model"):
        deep(torch.tensor([[1, 2]]), cache=small.new_cache(1))
    with pytest.raises(TypeError, match="headwise.KVCache"):
        deep(torch.tensor([[1, 2]]), cache=object())


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0, 0.0])
def test_generate_temperature_must_be_finite_and_positive(temperature):
    lm = build(LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                        max_len=8)).eval()
    with pytest.raises(ValueError, match="temperature must be > 0 and finite"):
        hw.generate(lm, torch.tensor([[1, 2]]), max_new_tokens=2, strategy="sample",
                    temperature=temperature)


# ------------------------------------------------------------------------- NaN / inf policy
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), "0.5"])
def test_scale_that_is_not_finite_is_an_error(scale):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="scale must be a finite number"):
        hw.attention(q, k, v, scale=scale)


@given(row=st.integers(0, 2), col=st.integers(0, 3), seed=st.integers(0, 2**16),
       bad=st.sampled_from([float("nan"), float("inf")]))
def test_nan_query_row_is_nan_on_every_backend(row, col, seed, bad):
    q, k, v = _qkv(seed=seed)
    q[0, 1, row, col] = bad
    for backend in ("eager", "sdpa"):
        out, _ = hw.attention(q, k, v, backend=backend)
        assert out[0, 1, row].isnan().all(), backend
        others = [r for r in range(3) if r != row]
        assert out[0, 1, others].isfinite().all() and out[0, 0].isfinite().all(), backend


def test_fully_masked_row_is_zero_even_with_nan_free_inputs():
    q, k, v = _qkv()
    mask = torch.tensor([[True, True, True], [False, False, False], [True, False, True]])
    for backend in ("eager", "sdpa"):
        out, _ = hw.attention(q, k, v, mask=mask, backend=backend)
        assert (out[:, :, 1] == 0).all()


@given(scale=st.floats(1.0, 64.0), seed=st.integers(0, 2**16))
def test_fp16_eager_weights_do_not_overflow_where_fused_is_finite(scale, seed):
    """q.k of fp16 vectors of norm ~300 is ~9e4 > 65504: scaling q first keeps it finite."""
    mha = hw.MultiHeadAttention(8, 2, backend="eager").half()
    x = (torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(seed)) * 300 * scale
         / 8).half()
    fused = hw.MultiHeadAttention(8, 2, backend="sdpa").half()
    fused.load_state_dict(mha.state_dict())
    out_fused, _ = fused(x)
    if not out_fused.isfinite().all():  # the inputs themselves overflow the projections
        return
    out, weights = mha(x, return_weights=True)
    assert weights.isfinite().all() and out.isfinite().all()
    assert not math.isnan(float(weights.sum()))
