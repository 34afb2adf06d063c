"""The pruning targets' pieces that need no pretrained weights: the Spearman correlation used as
MiniLM's metric, and the table of targets the CLI and the benchmark share."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.analysis.head_scores import spearman
from headwise.commands._heads_prune import MODELS
from headwise.commands._prune_targets import TARGETS


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(3, 40))
def test_spearman_is_pearson_of_ranks(seed, n):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    assert abs(spearman(a, a.exp()) - 1) < 1e-12  # any increasing map keeps the ranks
    assert abs(spearman(a, -a) + 1) < 1e-12
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    want = torch.corrcoef(torch.stack([ra, rb]))[0, 1].item()
    assert abs(spearman(a, b) - want) < 1e-9


def test_every_cli_model_has_a_target():
    assert set(TARGETS) == set(MODELS)
