"""The cache's TransformerLens indexing, listing, moving and head-result stacking."""

from __future__ import annotations

import pytest
import torch

from headwise.lens import ActivationCache
from headwise.lens import names as N

B, I, H, M, L = 2, 5, 3, 4, 3


def cache() -> ActivationCache:
    g = torch.Generator().manual_seed(0)
    tensors = {N.full("result", l): torch.randn(B, I, H, M, generator=g) for l in range(L)}
    tensors[N.full("pattern", 1)] = torch.rand(B, H, I, I, generator=g)
    return ActivationCache(tensors, L)


def test_indexing_by_name_short_name_and_negative_layer():
    c = cache()
    assert c["pattern", 1] is c["blocks.1.attn.hook_pattern"]
    assert c["result", -1] is c["blocks.2.attn.hook_result"]
    assert ("pattern", 1) in c and ("pattern", 0) not in c and "nonsense" not in c
    assert c.names() == c.keys() == list(c) and len(c) == 4
    assert [v for _, v in c.items()] == c.values()


def test_a_missing_or_wrong_key_is_one_line():
    c = cache()
    with pytest.raises(KeyError, match="was not cached"):
        c["pattern", 0]
    with pytest.raises(KeyError, match="out of range: the model has 3 layers"):
        c["pattern", 3]
    with pytest.raises(ValueError, match="did you mean 'pattern'"):
        c["patern", 1]


def test_stack_head_results_is_layers_times_heads_by_b_i_m_in_layer_order():
    c = cache()
    stacked, labels = c.stack_head_results(return_labels=True)
    assert stacked.shape == (L * H, B, I, M) and labels[:4] == ["L0H0", "L0H1", "L0H2", "L1H0"]
    assert torch.equal(stacked[H + 2], c["result", 1][:, :, 2])
    assert c.stack_head_results(layer=1).shape == (H, B, I, M)  # the layers before 1
    with pytest.raises(ValueError, match="not cached"):
        ActivationCache({}, L).stack_head_results()


def test_to_copies_and_repr_names_the_first_hooks():
    c = cache()
    d = c.to(torch.float64)
    assert d["pattern", 1].dtype == torch.float64 and c["pattern", 1].dtype == torch.float32
    assert repr(c).startswith("ActivationCache(4 hooks of 3 layers: blocks.0.attn.hook_result: "
                              "(2, 5, 3, 4)")
