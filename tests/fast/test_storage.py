"""headwise.fast.storage: layers that read one input are one matrix without a copy only when
their weights (and biases) are consecutive blocks of one storage; W^T storage is told apart from
a plain (out, in) matrix."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from headwise.fast.storage import joined, joined_any, stored_transposed


def _consecutive(outs, n_in, bias, transposed):
    """``nn.Linear`` layers whose weights are blocks of one buffer, as lay_out stores them."""
    total = sum(outs)
    buf = torch.randn(n_in, total) if transposed else torch.randn(total, n_in)
    biases = torch.randn(total)
    layers, at = [], 0
    for n in outs:
        layer = nn.Linear(n_in, n, bias=bias)
        layer.weight.data = buf[:, at:at + n].t() if transposed else buf[at:at + n]
        if bias:
            layer.bias.data = biases[at:at + n]
        layers.append(layer)
        at += n
    return layers, (buf.t() if transposed else buf), biases if bias else None


@settings(max_examples=30, deadline=None)
@given(outs=st.lists(st.integers(1, 6), min_size=2, max_size=3), n_in=st.integers(2, 6),
       bias=st.booleans(), transposed=st.booleans())
def test_consecutive_blocks_are_one_view_and_separate_weights_are_not(outs, n_in, bias,
                                                                      transposed):
    layers, whole, biases = _consecutive(outs, n_in, bias, transposed)
    with torch.no_grad():
        w, b = joined(layers)
    assert torch.equal(w, whole) and w.data_ptr() == whole.data_ptr()
    assert (b is None) is (not bias) and (b is None or torch.equal(b, biases))
    assert stored_transposed(w) is transposed
    assert joined(list(reversed(layers))) is None  # not in storage order
    separate = [nn.Linear(n_in, n, bias=bias) for n in outs]
    assert joined_any(separate) is None
    assert joined(layers) is None  # autograd would train none of them through the view
    assert joined_any(layers) is not None
