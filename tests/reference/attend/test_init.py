"""Attention backends against the independent float64 reference (tests/reference), bf16 included."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
from tests.attend.test_init import BACKENDS, configs, draw_inputs
from tests.reference import reference_attention


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
