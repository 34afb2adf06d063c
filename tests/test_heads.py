"""split_heads / merge_heads: inverse, and head x is column block x."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw


def test_split_and_merge_are_inverse_and_named():
    x = torch.randn(2, 5, 12)
    heads = hw.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])  # head 1 is column block 1
    assert torch.equal(hw.merge_heads(heads), x)
    with pytest.raises(ValueError, match="divisible"):
        hw.split_heads(x, 5)


@given(b=st.integers(1, 3), g=st.integers(1, 3), r=st.integers(1, 4), j=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_expand_kv_gives_query_head_x_the_kv_head_x_div_r(b, g, r, j, seed):
    from headwise.heads import expand_kv
    x = torch.randn(b, g, j, 3, generator=torch.Generator().manual_seed(seed))
    out = expand_kv(x, g * r)
    assert out.shape == (b, g * r, j, 3)
    for head in range(g * r):
        assert torch.equal(out[:, head], x[:, head // r])
    assert expand_kv(x, g) is x
