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


def test_both_batches_share_one_shard_to_and_len():
    from headwise.data.batches import Batch, LMBatch, Seq2SeqBatch, collate_lm, collate_seq2seq

    for cls in (LMBatch, Seq2SeqBatch):
        assert all(name not in vars(cls) for name in ("shard", "to", "__len__"))
    lm = collate_lm([[1, 2, 3], [4, 5], [6, 7, 8], [9, 10]], pad_id=0)
    s2s = collate_seq2seq([[1, 2], [3], [4, 5, 6], [7]], [[1], [2, 3], [4], [5]], pad_id=0,
                          bos_id=1, eos_id=2)
    for batch in (lm, s2s):
        assert isinstance(batch, Batch) and len(batch) == 4
        half = batch.shard(1, 2)
        assert type(half) is type(batch) and len(half) == 2
        assert type(batch.to("cpu")) is type(batch)
