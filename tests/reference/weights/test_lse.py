"""Weights recomputed from the log-sum-exp (headwise.weights) against a float64 reference."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
from headwise import weights as W
from tests.attend.test_init import configs, draw_inputs
from tests.reference import reference_attention


@given(cfg=configs, budget=st.sampled_from([1, 7, W.CHUNK_ELEMENTS]))
def test_weights_from_lse_equal_float64_reference(cfg, budget):
    """Every mask kind, causal with nq != nk, fully masked rows, grouped heads, e != d, b > 1;
    the flash kernel's LSE and the chunked pass (any chunk size) give the same weights."""
    q, k, v, mask = draw_inputs(cfg)
    ref_out, ref_w = reference_attention(q, k, v, mask, cfg["causal"])
    out, w = hw.attention(q, k, v, mask=mask, causal=cfg["causal"], return_weights=True)
    torch.testing.assert_close(w.double(), ref_w, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.double(), ref_out, rtol=0, atol=1e-6)  # weights @ v
    lse = W.logsumexp(q, k, mask=mask, causal=cfg["causal"], budget=budget)
    w2 = W.from_lse(q, k, lse, mask=mask, causal=cfg["causal"], budget=budget)
    torch.testing.assert_close(w2.double(), ref_w, rtol=0, atol=1e-6)


def test_module_weights_with_kdim_vdim_head_dim_and_grouped_heads_match_float64():
    torch.manual_seed(0)
    mha = hw.MultiHeadAttention(12, 4, head_dim=5, kdim=7, vdim=3, num_kv_heads=2)
    x, kin, vin = torch.randn(3, 9, 12), torch.randn(3, 11, 7), torch.randn(3, 11, 3)
    lens = torch.tensor([11, 4, 1])
    _, w = mha(x, kin, vin, valid_lens=lens, causal=True, return_weights=True)
    ref = mha.double()
    ref.backend = "eager"
    _, w64 = ref(x.double(), kin.double(), vin.double(), valid_lens=lens, causal=True,
                 return_weights=True)
    torch.testing.assert_close(w.double(), w64, rtol=0, atol=1e-6)
    mha.float().backend = "auto"
    _, part = mha(x, kin, vin, valid_lens=lens, causal=True,
                  return_weights=hw.Selection(heads=3, rows=slice(-2, None)))
    torch.testing.assert_close(part.double(), w64[:, 3:4, -2:], rtol=0, atol=1e-6)
