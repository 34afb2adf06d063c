"""The decoding step's weight layouts: both give nn.Linear's result."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from headwise import _rows


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 4), n_in=st.integers(1, 9), n_out=st.integers(1, 9), bias=st.booleans(),
       transpose=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_linear_and_residual_match_the_module_in_either_layout(b, n_in, n_out, bias, transpose,
                                                               seed):
    torch.manual_seed(seed)
    layer = nn.Linear(n_in, n_out, bias=bias).double()
    x, res = torch.randn(b, n_in, dtype=torch.float64), torch.randn(b, n_out, dtype=torch.float64)
    w = _rows.of_linear(layer, transpose)
    assert w[2] is transpose and not w[0].requires_grad
    assert w[0].shape == ((n_in, n_out) if transpose else (n_out, n_in))
    with torch.no_grad():
        torch.testing.assert_close(_rows.linear(x, w), layer(x))
        torch.testing.assert_close(_rows.residual(res, x, w), res + layer(x))


def test_the_untransposed_weight_is_the_modules_own_tensor():
    layer = nn.Linear(3, 2)
    assert _rows.of_linear(layer, False)[0].data_ptr() == layer.weight.data_ptr()
    assert _rows.of_linear(layer, True)[0].data_ptr() != layer.weight.data_ptr()
