"""KVCache: reorder (beam search) and overflow."""

from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise import limits
from headwise.cache import KVCache


def test_kv_cache_reorder_and_overflow():
    cache = KVCache(2, 3, 1, 4, 5)
    k = torch.randn(3, 1, 2, 4)
    cache.layers[1].self_attn.update(k, k + 1)
    cache.advance(2)
    cache.reorder(torch.tensor([2, 2, 0]))
    torch.testing.assert_close(cache.k[1, :, :, :2], k[[2, 2, 0]])
    torch.testing.assert_close(cache.v[1, :, :, :2], k[[2, 2, 0]] + 1)
    with pytest.raises(ValueError, match="do not fit a cache of max_len=5"):
        cache.layers[0].self_attn.update(torch.randn(3, 1, 4, 4), torch.randn(3, 1, 4, 4))
    with pytest.raises(ValueError, match="batch must be a positive int"):
        KVCache(2, 0, 1, 4, 5)


def test_the_buffers_are_freed_without_the_garbage_collector():
    """No reference cycle: the last reference gone, the buffers go at once (gc switched off),
    and the layers' views follow the cache's length."""
    import gc
    import weakref

    cache = KVCache(3, 2, 2, 4, 6)
    k = torch.randn(2, 2, 3, 4)
    cache.layers[2].self_attn.update(k, -k)
    cache.advance(3)
    assert cache.length == 3 and all(layer.self_attn.offset == 3 for layer in cache.layers)
    buffer = weakref.ref(cache.k)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del cache
        assert buffer() is None
    finally:
        if enabled:
            gc.enable()


@given(memory=st.integers(10**4, 10**7), layers=st.integers(1, 4), batch=st.integers(1, 4),
       heads=st.integers(1, 4), d=st.integers(1, 16),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_a_cache_too_large_for_memory_is_refused_before_allocation(memory, layers, batch, heads,
                                                                   d, dtype):
    """new_cache(1, 10**12) died in the allocator with a raw RuntimeError; now the buffers'
    size (k and v) is checked first and the message says to shorten max_len."""
    per_position = 2 * layers * batch * heads * d * torch.empty((), dtype=dtype).element_size()
    too_long = memory // per_position + 1
    with mock.patch.object(limits, "machine_memory", lambda: memory):
        with pytest.raises(ValueError, match=r"KVCache: .* would need about .*smaller max_len"):
            KVCache(layers, batch, heads, d, too_long, dtype=dtype)
        if too_long > 1:  # the longest that fits is built
            cache = KVCache(layers, batch, heads, d, too_long - 1, dtype=dtype)
            assert cache.max_len == too_long - 1
