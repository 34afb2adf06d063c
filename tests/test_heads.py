"""split_heads / merge_heads: inverse, and head x is column block x."""

import pytest
import torch

import headwise as hw


def test_split_and_merge_are_inverse_and_named():
    x = torch.randn(2, 5, 12)
    heads = hw.split_heads(x, 3)
    assert heads.shape == (2, 3, 5, 4)
    assert torch.equal(heads[:, 1], x[..., 4:8])  # head 1 is column block 1
    assert torch.equal(hw.merge_heads(heads), x)
    with pytest.raises(ValueError, match="divisible"):
        hw.split_heads(x, 5)
