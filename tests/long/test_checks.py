"""The boundary of headwise.long.profile: the default block, the context, the layer finder,
selections and option ranges, each one line."""

from __future__ import annotations

import pytest
import torch

from headwise.long.checks import attention_layers, context, counts, default_block, plan
from tests.long.test_run import lm


@pytest.mark.parametrize("n, block", [(1, 1), (50, 50), (64, 64), (8192, 64), (8193, 65),
                                      (32768, 256), (131072, 1024)])
def test_default_block(n, block):
    assert default_block(n) == block


def test_layers_heads_and_context_of_a_headwise_model():
    model = lm()
    layers = attention_layers(model)
    assert len(layers) == 2 and counts(layers[0]) == (4, 2) and context(model) == 1024


def test_a_module_without_attention_is_refused():
    with pytest.raises(ValueError, match="no attention layer"):
        attention_layers(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kwargs, words", [
    (dict(sinks=-1), "sinks must be an int >= 0"),
    (dict(window=0), "window must be an int >= 1"),
    (dict(top_k=0), "top_k must be an int >= 1"),
    (dict(block=2.5), "block size 2.5 does not fit"),
    (dict(layers=[0, 9]), "layers 9 out of range for 2 layers"),
])
def test_options_out_of_range(kwargs, words):
    options = dict(block=None, sinks=4, window=64, far=1000, top_k=8, layers=None, heads=None,
                   reductions=()) | kwargs
    with pytest.raises(ValueError, match=words):
        plan(lm(), torch.zeros(1, 10, dtype=torch.long), **options)


@pytest.mark.parametrize("ids, words", [
    (torch.zeros(10, dtype=torch.long), "must be a \\(b, n\\) integer tensor"),
    (torch.zeros(1, 10), "must be a \\(b, n\\) integer tensor"),
    (torch.zeros(1, 0, dtype=torch.long), "no tokens"),
])
def test_bad_ids(ids, words):
    with pytest.raises(ValueError, match=words):
        plan(lm(), ids, None, 4, 64, 1000, 8, None, None, ())


def test_plan_reads_selections_sorted_and_negative():
    p = plan(lm(), torch.zeros(1, 100, dtype=torch.long), None, 4, 64, 1000, 8, [-1], [3, 0],
             ())
    assert p["layers"] == [1] and p["heads"] == [0, 3] and p["block"] == 64
    assert (p["h"], p["g"]) == (4, 2)
