"""Batches shard like torch's DistributedSampler."""

import pytest
import torch

from headwise.data import make_task


def test_batches_shard_like_distributed_sampler():
    b = make_task("reverse").batch(0, 8)
    parts = [b.shard(r, 2) for r in range(2)]
    assert torch.equal(parts[0].src, b.src[0::2]) and torch.equal(parts[1].src, b.src[1::2])
    with pytest.raises(ValueError, match="not divisible"):
        b.shard(0, 3)
