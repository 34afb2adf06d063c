"""Attention backends against the independent float64 reference (tests/reference), bf16 included."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
from tests.reference import reference_attention
from tests.test_attend import BACKENDS, configs, draw_inputs


@given(cfg=configs)
def test_backends_match_float64_reference(cfg):
    q, k, v, mask = draw_inputs(cfg)
    ref_out, ref_w = reference_attention(q, k, v, mask, cfg["causal"])
    for backend in BACKENDS:
        out, w = hw.attention(q, k, v, mask=mask, causal=cfg["causal"], backend=backend)
        assert w is None
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
        out_w, w = hw.attention(q, k, v, mask=mask, causal=cfg["causal"], backend=backend,
                                return_weights=True)
        torch.testing.assert_close(out_w.double(), ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)

def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-12)).item()

@given(cfg=configs.filter(lambda c: c["mask"] != "full_bool"))
def test_bf16_training_on_cpu_runs_a_float32_backward_close_to_float64(cfg):
    """bf16 with autograd on the CPU: flash forward, float32 backward (headwise._flash_cpu). The
    gradients match the float64 reference of the same bf16 values, at least as well as torch's
    own bf16 backward does."""
    from headwise import _flash_cpu
    cfg = {**cfg, "e": cfg["d"], "nq": cfg["nq"] + 8, "nk": cfg["nk"] + 8}  # flash-eligible
    q, k, v, mask = draw_inputs(cfg)
    q, k, v = (t.bfloat16().requires_grad_() for t in (q, k, v))
    causal = cfg["causal"]
    calls = []
    original = _flash_cpu.FlashUpcastBackward.apply

    def spy(*args):
        calls.append(1)
        return original(*args)
    _flash_cpu.FlashUpcastBackward.apply = spy
    try:
        out, _ = hw.attention(q, k, v, mask=mask, causal=causal, backend="sdpa")
    finally:
        _flash_cpu.FlashUpcastBackward.apply = original
    assert calls, "the float32-backward path was not taken"
    grad_out = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, _ = reference_attention(q64, k64, v64, mask, causal)
    refs = torch.autograd.grad(ref_out, (q64, k64, v64), grad_out.double())
    assert _rel(out, ref_out) < 1e-2
    # torch's bf16 path on the same inputs (its flash backward runs in bf16)
    h, g = q.shape[1], k.shape[1]
    sdpa_mask = None if mask is None else (mask if mask.dtype == torch.bool
                                           else mask.bfloat16())
    if causal:
        allowed = hw.masks.causal(q.shape[2], k.shape[2])
        sdpa_mask = allowed if sdpa_mask is None else (
            sdpa_mask & allowed if sdpa_mask.dtype == torch.bool
            else sdpa_mask.masked_fill(~allowed, float("-inf")))
    theirs_out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=sdpa_mask, enable_gqa=h != g)
    theirs = torch.autograd.grad(theirs_out, (q, k, v), grad_out)
    for mine, torchs, ref in zip(ours, theirs, refs, strict=True):
        assert torch.isfinite(mine).all()
        if ref.norm() > 0 and torch.isfinite(torchs).all():
            assert _rel(mine, ref) <= _rel(torchs, ref) + 5e-3
            assert _rel(mine, ref) < 3e-2


@given(cfg=configs, softcap=st.sampled_from([None, 0.5, 3.0]), sinks=st.booleans(),
       backend=st.sampled_from(BACKENDS))
def test_softcap_and_sinks_match_float64_reference(cfg, softcap, sinks, backend):
    """Soft-capping (Gemma 2) and learned sinks (gpt-oss) take the eager path whatever the
    backend, and equal the float64 reference: rows sum to 1 minus the sink's share."""
    q, k, v, mask = draw_inputs(cfg)
    sink = torch.randn(q.shape[1]) if sinks else None
    if softcap is None and sink is None:
        return
    ref_out, ref_w = reference_attention(q, k, v, mask, cfg["causal"], softcap=softcap,
                                         sinks=sink)
    out, w = hw.attention(q, k, v, mask=mask, causal=cfg["causal"], backend=backend,
                          softcap=softcap, sinks=sink, return_weights=True)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)
    if sink is not None:
        assert (w.sum(-1) < 1).all()


@given(cfg=configs, window=st.integers(1, 10), backend=st.sampled_from(BACKENDS))
def test_sliding_window_matches_float64_reference(cfg, window, backend):
    """A banded bool mask from masks.sliding_window (with causal, the kernel's is_causal) equals
    the reference's window rule."""
    q, k, v, mask = draw_inputs(cfg)
    nq, nk = q.shape[2], k.shape[2]
    band = hw.masks.sliding_window(nq, nk, window)
    ref_out, ref_w = reference_attention(q, k, v, mask, True, window=window)
    full = hw.masks.combine(mask, band)
    out, _ = hw.attention(q, k, v, mask=full, causal=True, backend=backend)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    _, w = hw.attention(q, k, v, mask=full, causal=True, backend=backend, return_weights=True)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)
