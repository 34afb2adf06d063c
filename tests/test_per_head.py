"""The per-head loop form: same parameters, same outputs, and the way back is exact."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import headwise as hw
from headwise.per_head import PerHeadAttention, fuse, unfuse


@settings(max_examples=15, deadline=None)
@given(g=st.integers(1, 3), r=st.integers(1, 3), d=st.integers(1, 5), m=st.integers(1, 9),
       kdim=st.integers(1, 7), vdim=st.integers(1, 7), bias=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_unfused_has_the_same_parameters_and_outputs_and_fuses_back_exactly(
        g, r, d, m, kdim, vdim, bias, seed):
    torch.manual_seed(seed)
    mha = hw.MultiHeadAttention(m, g * r, head_dim=d, kdim=kdim, vdim=vdim, num_kv_heads=g,
                                bias=bias).double()
    loop = unfuse(mha)
    assert isinstance(loop, PerHeadAttention) and loop.num_heads == g * r
    assert sum(p.numel() for p in loop.parameters()) == sum(p.numel() for p in mha.parameters())
    for x in range(g * r):  # head x's projection is row block x of the fused weight
        assert torch.equal(loop.q_heads[x].weight, mha.q_proj.weight[x * d:(x + 1) * d])
    q = torch.randn(2, 4, m, dtype=torch.float64)
    k, v = torch.randn(2, 5, kdim, dtype=torch.float64), torch.randn(2, 5, vdim, dtype=torch.float64)
    mask = torch.rand(2, 1, 4, 5) > 0.3
    want, want_w = mha(q, k, v, mask=mask, return_weights=True)
    got, got_w = loop(q, k, v, mask=mask)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_w, want_w)
    back = fuse(loop)
    assert back.state_dict().keys() == mha.state_dict().keys()
    for name, tensor in mha.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_fuse_keeps_dropout_and_backend_unless_asked():
    mha = hw.MultiHeadAttention(8, 2, dropout=0.25, backend="eager")
    assert (fuse(unfuse(mha)).dropout_p, fuse(unfuse(mha)).backend) == (0.25, "eager")
    assert fuse(unfuse(mha), backend="sdpa").backend == "sdpa"


@settings(max_examples=10, deadline=None)
@given(training=st.booleans(), dropout=st.floats(0.1, 0.9), seed=st.integers(0, 2**31 - 1))
def test_unfuse_and_fuse_keep_the_training_mode(training, dropout, seed):
    """An eval-mode module unfused came back in training mode, so with dropout its outputs
    differed (~0.3); now both directions keep the mode, and eval outputs agree."""
    torch.manual_seed(seed)
    mha = hw.MultiHeadAttention(8, 2, dropout=dropout).double().train(training)
    loop = unfuse(mha)
    back = fuse(loop)
    modes = [m.training for module in (loop, back) for m in module.modules()]
    assert modes == [training] * len(modes)
    if not training:  # no dropout in eval: float64 loop vs fused, ~1e-15 apart
        x = torch.randn(2, 5, 8, dtype=torch.float64)
        torch.testing.assert_close(loop(x, x, x)[0], mha(x)[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(back(x)[0], mha(x)[0], rtol=1e-12, atol=1e-12)


def test_wrong_inputs_are_refused():
    with pytest.raises(TypeError, match="unfuse expects headwise.MultiHeadAttention"):
        unfuse(nn.MultiheadAttention(8, 2))
    with pytest.raises(TypeError, match="fuse expects PerHeadAttention"):
        fuse(hw.MultiHeadAttention(8, 2))
    heads = nn.ModuleList(nn.Linear(4, 2) for _ in range(3))
    with pytest.raises(ValueError, match="need a divisor number of key/value heads"):
        PerHeadAttention(heads, heads[:2], heads[:2], nn.Linear(6, 4))


@given(kind=st.sampled_from(["q_heads", "k_heads", "v_heads"]), width=st.integers(1, 9),
       bias=st.booleans(), in_delta=st.integers(0, 2))
def test_fuse_of_unequal_heads_is_a_value_error_naming_the_head(kind, width, bias, in_delta):
    """A per-head module with one head edited to another shape made fuse fail inside
    torch.cat with a raw size error; now a ValueError names the head, unless the edit keeps
    every shape (then it fuses)."""
    loop = unfuse(hw.MultiHeadAttention(8, 2, head_dim=4))
    getattr(loop, kind)[1] = nn.Linear(8 + in_delta, width, bias=bias)
    if (width, bias, in_delta) == (4, True, 0):
        assert isinstance(fuse(loop), hw.MultiHeadAttention)
        return
    with pytest.raises(ValueError, match=rf"fuse: {kind}\[1\] is Linear"):
        fuse(loop)


def test_fuse_with_heads_or_out_proj_of_another_width_is_a_value_error():
    loop = unfuse(hw.MultiHeadAttention(8, 2, head_dim=4))
    loop.v_heads = nn.ModuleList(nn.Linear(8, 3) for _ in range(2))
    with pytest.raises(ValueError, match="query heads are 4 wide but key/value heads"):
        fuse(loop)
    loop = unfuse(hw.MultiHeadAttention(8, 2, head_dim=4))
    loop.out_proj = nn.Linear(7, 8)
    with pytest.raises(ValueError, match="out_proj reads 7 features but 2 heads of 4 give 8"):
        fuse(loop)
