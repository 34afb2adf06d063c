"""headwise.decode.vouch: a KV cache layer's NaN vouching reads each position once, rechecks the
positions the cache rewrites, and takes the caller's word only for the newest ones."""

import pytest
import torch

from headwise.cache import KVCache
from headwise.decode.vouch import vouched


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_all_finite_reads_each_position_once_and_rechecks_rewritten_ones(bad):
    cache = KVCache(1, 2, 2, 3, 8)
    layer = cache.layers[0].self_attn
    vouch = vouched(layer)
    k, v = torch.randn(2, 2, 3, 3), torch.randn(2, 2, 3, 3)
    layer.update(k, v)
    assert vouch.all_finite(3) and vouch.upto == 3
    cache.advance(3)
    k1 = torch.randn(2, 2, 1, 3)
    k1[1, 0, 0, 2] = bad  # a new position holding a non-finite key: found, never vouched for
    layer.update(k1, torch.randn(2, 2, 1, 3))
    assert not vouch.all_finite(4) and vouch.upto == 3
    assert not vouch.all_finite(4)  # and again on the next call
    cache.filled.n = 1  # the caller rewinds: positions from 1 on are written afresh
    layer.update(torch.randn(2, 2, 2, 3), torch.randn(2, 2, 2, 3))
    assert vouch.upto == 1 and vouch.all_finite(3) and vouch.upto == 3
    layer.v[0, 1, 2, 0] = bad  # written behind the cache's back, at a position already checked:
    assert vouch.all_finite(3)  # the documented limit (only update() writes positions)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_all_finite_takes_the_callers_word_for_the_newest_positions_only(bad):
    cache = KVCache(1, 1, 2, 3, 8)
    layer = cache.layers[0].self_attn
    vouch = vouched(layer)
    k = torch.randn(1, 2, 4, 3)
    k[0, 1, 1, 0] = bad  # position 1: not vouched for, so read and found
    layer.update(k, torch.randn(1, 2, 4, 3))
    assert not vouch.all_finite(4, vouched=2) and vouch.upto == 0
    cache.filled.n = 1
    layer.update(torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3))  # rewritten finite
    layer.k[0, 0, 3, 2] = bad  # position 3: the caller vouches (wrongly) for it; not read
    assert vouch.all_finite(4, vouched=1) and vouch.upto == 4
