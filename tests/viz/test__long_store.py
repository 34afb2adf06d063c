"""The long view's storage: the log scale's error bound, exact re-blocking of block maps, and
sparse exact rows that keep what they say they keep."""

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from headwise.viz import _long_store as store


@given(st.integers(0, 2**32 - 1), st.floats(1e-3, 1e4))
def test_log_scale_relative_error_within_its_bound(seed, top):
    g = np.random.default_rng(seed)
    x = top * 10.0 ** g.uniform(-store.DECADES, 0, size=500)
    back = store.log_value(store.log_quantise(x, top), top)
    bound = 10 ** (store.DECADES / 508) - 1
    np.testing.assert_array_less(np.abs(back / x - 1), bound + 1e-9)
    # below the scale's floor is stored as 0 and read back as 0
    tiny = top * 10.0 ** -(store.DECADES + 0.5)
    assert store.log_quantise(np.array([tiny, 0.0]), top).tolist() == [0, 0]
    assert store.log_quantise(np.array([top]), top).tolist() == [255]


def test_log_scale_of_an_all_zero_input_is_zero():
    assert store.log_quantise(np.ones(3), 0.0).tolist() == [0, 0, 0]


@given(st.integers(0, 2**32 - 1), st.integers(5, 70), st.integers(1, 9), st.integers(2, 4))
def test_pooled_maps_equal_maps_of_the_larger_blocks(seed, n, block, factor):
    g = np.random.default_rng(seed)
    w = g.random((n, n)) * np.tril(np.ones((n, n)))
    w /= w.sum(1, keepdims=True)

    def block_map(b):
        nb = math.ceil(n / b)
        return np.array([[w[i * b:(i + 1) * b, j * b:(j + 1) * b].sum(1).mean()
                          for j in range(nb)] for i in range(nb)])

    got = store.pool_maps(block_map(block)[None], n, block, factor)[0]
    want = block_map(block * factor)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-12)  # each row is still a distribution


@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 300), st.integers(1, 64))
def test_sparse_rows_keep_the_largest_weights_until_cover_or_cap(seed, r, n, cap):
    g = np.random.default_rng(seed)
    w = g.exponential(size=(r, n)) ** 4
    w /= w.sum(1, keepdims=True)
    s = store.sparse_rows(w, cap, cover=0.9)
    assert s["counts"].min() >= 1 and s["counts"].max() <= min(cap, n)
    dense = np.zeros_like(w)
    start = 0
    for row, c in enumerate(s["counts"].tolist()):
        keys = s["keys"][start:start + c]
        dense[row, keys] = s["values"][start:start + c] / 65535 * s["rowmax"][row]
        # the kept keys are the row's largest
        assert w[row, keys].min() >= np.delete(w[row], keys).max(initial=0.0)
        start += c
    kept = np.where(dense > 0, w, 0.0)
    np.testing.assert_allclose(dense, kept, atol=float(s["rowmax"].max()) / 131070 + 1e-7)
    np.testing.assert_allclose(s["rest"], w.sum(1) - np.where(dense > 0, w, 0).sum(1), atol=1e-4)
    full = s["counts"] < min(cap, n)  # stopped by cover, not by the cap
    assert (w.sum(1) - s["rest"])[full].min(initial=1.0) >= 0.9 - 1e-6


def test_sparse_rows_index_width_follows_the_key_count():
    assert store.sparse_rows(np.ones((1, 10)), 4)["keys"].dtype == np.uint16
    assert store.sparse_rows(np.ones((1, 70000)), 4)["keys"].dtype == np.uint32
