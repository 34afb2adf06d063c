"""attention_rollout against a float64 reference of Abnar & Zuidema (2020) and its properties."""

import numpy as np
import pytest
import torch

from headwise.viz import attention_rollout


def random_attention(*shape, seed, causal=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, generator=g, dtype=torch.float64) * 2
    if causal:
        n = shape[-1]
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return logits.softmax(-1)


def reference(layers, fusion="mean", residual=0.5):
    """Plain numpy float64, one layer at a time: A = (1-r) fuse(W) + r I, renormalise, R = A R."""
    out, rollout = [], None
    for w in layers:
        w = np.asarray(w, dtype=np.float64)
        fused = {"mean": w.mean(-3), "max": w.max(-3), "min": w.min(-3)}[fusion]
        a = (1 - residual) * fused + residual * np.eye(w.shape[-1])
        a = a / a.sum(-1, keepdims=True)
        rollout = a if rollout is None else a @ rollout
        out.append(rollout)
    return np.stack(out)


def test_rollout_first_layer_and_known_cases():
    w = random_attention(3, 6, 6, seed=1)
    r = attention_rollout([w])
    np.testing.assert_allclose(r[0].numpy(), (0.5 * w.mean(0) + 0.5 * torch.eye(6)).numpy(),
                               atol=1e-12)  # 0.5 W + 0.5 I rows already sum to 1
    # identity attention everywhere -> rollout is the identity at every depth
    eye = torch.eye(5).expand(2, 5, 5)
    np.testing.assert_allclose(attention_rollout([eye] * 3).numpy(), np.broadcast_to(np.eye(5), (3, 5, 5)))
    # causal attention never lets information flow backwards: rollout stays lower triangular
    causal = [random_attention(4, 7, 7, seed=s, causal=True) for s in range(4)]
    r = attention_rollout(causal)
    assert torch.all(r.triu(1) == 0)
    # a fully masked (all-zero) row becomes the identity row after the residual is added
    w = random_attention(2, 4, 4, seed=3)
    w[:, 2] = 0
    assert torch.allclose(attention_rollout([w])[0, 2], torch.eye(4, dtype=w.dtype)[2])


def test_rollout_pruned_layers_with_different_head_counts():
    ws = [random_attention(4, 5, 5, seed=0), random_attention(2, 5, 5, seed=1)]
    np.testing.assert_allclose(attention_rollout(ws).numpy(), reference(ws), atol=1e-12)


@pytest.mark.parametrize("bad, error, match", [
    ([], TypeError, "non-empty list"),
    ([None], ValueError, "record all layers"),
    ([torch.rand(2, 3, 4)], ValueError, r"\(h, i, i\)"),
    ([torch.ones(2, 3, 3, dtype=torch.long)], TypeError, "floating point"),
    ([torch.rand(2, 3, 3), torch.rand(2, 4, 4)], ValueError, "share"),
])
def test_rollout_bad_input(bad, error, match):
    with pytest.raises(error, match=match):
        attention_rollout(bad)


def test_rollout_bad_options():
    w = [torch.rand(2, 3, 3)]
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout(w, head_fusion="sum")
    with pytest.raises(ValueError, match="residual"):
        attention_rollout(w, residual=1.5)
