"""Attention rollout against a float64 reference."""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.viz import attention_rollout
from tests.viz.test_rollout import random_attention, reference


@given(layers=st.integers(1, 4), heads=st.integers(1, 4), n=st.integers(1, 9),
       batch=st.integers(0, 2), seed=st.integers(0, 2**16), causal=st.booleans(),
       fusion=st.sampled_from(["mean", "max", "min"]), residual=st.sampled_from([0.0, 0.3, 0.5]))
def test_rollout_matches_float64_reference(layers, heads, n, batch, seed, causal, fusion,
                                           residual):
    shape = (heads, n, n) if batch == 0 else (batch, heads, n, n)
    ws = [random_attention(*shape, seed=seed + l, causal=causal) for l in range(layers)]
    got = attention_rollout([w.float() for w in ws], head_fusion=fusion, residual=residual)
    want = reference(ws, fusion, residual)
    assert got.shape == (layers, *shape[:-3], n, n) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1).numpy(), 1.0, atol=1e-5)  # rows stay distributions
    got64 = attention_rollout(torch.stack(ws), head_fusion=fusion, residual=residual)
    assert got64.dtype == torch.float64
    np.testing.assert_allclose(got64.numpy(), want, rtol=1e-12, atol=1e-14)
