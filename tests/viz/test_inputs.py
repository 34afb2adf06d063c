"""layer_list: per-layer weights from a list or one stacked tensor/array, each layer's rank
checked and named in the error; None kept or refused with the view's reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.viz.inputs import layer_list


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 5), st.booleans())
def test_a_stack_and_its_list_give_the_same_layers(layers, h, n, as_numpy):
    w = torch.rand(layers, h, n, n)
    stacked = w.numpy() if as_numpy else w
    got = layer_list(stacked, ranks=(3,), shape="(h, i, j)")
    again = layer_list(list(stacked), ranks=(3,), shape="(h, i, j)")
    assert len(got) == len(again) == layers
    for a, b, want in zip(got, again, w, strict=True):
        assert isinstance(a, torch.Tensor) and not a.requires_grad
        assert torch.equal(a, want) and torch.equal(b, want)


def test_none_is_kept_or_refused_with_the_reason():
    w = torch.rand(2, 3, 3)
    assert layer_list([None, w], ranks=(3,), shape="(h, i, j)")[0] is None
    with pytest.raises(ValueError, match=r"layer 0 has no weights \(None\); record them"):
        layer_list([None, w], ranks=(3,), shape="(h, i, j)", none="record them")


@pytest.mark.parametrize("weights, error, match", [
    ("w", TypeError, "non-empty list of per-layer \\(h, i, j\\) tensors"),
    ([], TypeError, "non-empty list"),
    (torch.rand(2, 3, 3), ValueError, r"each layer \(h, i, j\), got shape \(2, 3, 3\)$"),
    (torch.rand(1, 1, 2, 3, 3), ValueError, r"got shape \(1, 1, 2, 3, 3\); pick one"),
    ([torch.rand(2, 3, 3), torch.rand(1, 2, 3, 3)], ValueError,
     r"layer 1 weights must be \(h, i, j\), got shape \(1, 2, 3, 3\); pick one"),
    ([np.ones((3, 3))], ValueError, r"layer 0 weights must be \(h, i, j\), got shape \(3, 3\)$"),
])
def test_wrong_ranks_and_types_name_the_layer_and_the_shape(weights, error, match):
    with pytest.raises(error, match=match):
        layer_list(weights, ranks=(3,), shape="(h, i, j)", hint="; pick one")


def test_several_ranks_are_accepted():
    got = layer_list([torch.rand(2, 3, 3), torch.rand(1, 2, 3, 3)], ranks=(3, 4),
                     shape="(h, i, i) or (b, h, i, i)")
    assert [t.ndim for t in got] == [3, 4]
