"""The head view's stored weights: per-row quantisation within its bound, blocks that decode
back, max-pooled thumbnails."""

import base64
import re
import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.viz._blocks import LEVELS, block, quantise, thumbnail


def _decode(data: bytes, n_i: int, n_j: int, levels: int) -> np.ndarray:
    rowmax = np.frombuffer(data[:4 * n_i], dtype=np.float32)
    q = np.frombuffer(data[4 * n_i:], dtype=np.uint8).reshape(n_i, n_j)
    return q / levels * rowmax[:, None]


@settings(max_examples=30, deadline=None)
@given(n_i=st.integers(1, 9), n_j=st.integers(1, 9), levels=st.sampled_from(LEVELS),
       seed=st.integers(0, 2**31 - 1))
def test_quantised_rows_are_within_half_a_step_and_the_block_decodes(n_i, n_j, levels, seed):
    rng = np.random.default_rng(seed)
    m = rng.random((n_i, n_j)).astype(np.float32)
    m[rng.integers(n_i)] = 0.0  # an all-zero row (a fully masked query) stays zero
    back = _decode(quantise(m, levels), n_i, n_j, levels)
    bound = m.max(axis=1, keepdims=True) / (2 * levels) + 1e-7
    assert (np.abs(back - m) <= bound).all()
    html = block("w/cross/0/1/2", m, levels, 6)
    key, data = re.fullmatch(r'<script type="application/octet-stream" data-key="([^"]+)">'
                             r'([A-Za-z0-9+/=]+)</script>', html).groups()
    assert key == "w/cross/0/1/2"
    assert zlib.decompress(base64.b64decode(data)) == quantise(m, levels)


def test_thumbnails_are_max_pooled_and_scaled_to_their_maximum():
    m = np.zeros((100, 7), dtype=np.float32)
    m[63, 3] = 0.5
    shape, top, data = thumbnail(m, 10).split(":")
    assert shape == "10x7" and float(top) == 0.5
    q = np.frombuffer(base64.b64decode(data), dtype=np.uint8).reshape(10, 7)
    assert q[6, 3] == 255 and q.sum() == 255  # the one peak survives pooling, nowhere else
    assert thumbnail(np.zeros((3, 3), dtype=np.float32), 8).startswith("3x3:0:")
