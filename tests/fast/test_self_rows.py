"""headwise.fast.native.self_rows: RoPE, the cache write and the new queries' attention in one C
call give what the three separate kernels give, bit for bit, in float32 and bfloat16, and say
when the rows are not finite or when it did not attend."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.fast import native as _native
from headwise.rope import RotaryEmbedding
from tests.fast.conftest import torch_threads

pytestmark = pytest.mark.skipif(_native.status() != "ready",
                                reason="headwise's kernel is not built here")


def _case(b, g, per, d, length, pos, rope, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    h = g * per
    rows = torch.randn(b, (h + 2 * g) * d, generator=gen).to(dtype)
    k, v = (torch.randn(b, g, length, d, generator=gen).to(dtype) for _ in range(2))
    rot = None
    if rope:
        rot = RotaryEmbedding(d, rotary_dim=rope).angles(pos, 1, rows)
    return h, rows, k, v, rot


@settings(deadline=None, max_examples=40)
@given(b=st.integers(1, 4), g=st.integers(1, 3), per=st.integers(1, 3),
       d=st.sampled_from([8, 16, 64, 72]), pos=st.integers(0, 40), extra=st.integers(0, 5),
       window=st.one_of(st.none(), st.integers(1, 12)), rope=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1))
def test_self_rows_is_rope_cache_write_and_attend_rows_bit_for_bit(b, g, per, d, pos, extra,
                                                                   window, rope, dtype,
                                                                   threads, seed):
    r = d // 2 if rope and d % 4 == 0 else d if rope else 0
    h, rows, k, v, rot = _case(b, g, per, d, pos + 1 + extra, pos, r, dtype, seed)
    start = 0 if window is None else max(0, pos + 1 - window)
    # the separate kernels, on copies
    rows2, k2, v2 = rows.clone(), k.clone(), v.clone()
    if r:
        assert _native.rope_rows(rows2, *rot, h + g, d, r) is True
    qk, vn = rows2[:, :(h + g) * d], rows2[:, (h + g) * d:]
    k2[:, :, pos] = qk[:, h * d:].view(b, g, d)
    v2[:, :, pos] = vn.view(b, g, d)
    q = rows2[:, :h * d].view(b, h, 1, d)
    with torch_threads(threads):
        want = _native.attend_rows(q, k2[:, :, start:pos + 1], v2[:, :, start:pos + 1])
        status, got = _native.self_rows(rows, rot, k, v, pos, start, h, r, True)
    assert status == 2 and got.dtype == dtype and got.shape == (b, h * d)
    assert torch.equal(got, want)
    assert torch.equal(rows, rows2) and torch.equal(k, k2) and torch.equal(v, v2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_self_rows_says_when_it_did_not_attend_and_still_writes_the_cache(dtype):
    h, rows, k, v, rot = _case(2, 2, 2, 16, 10, 4, 8, dtype, 0)
    rows[1, -1] = float("nan")  # a value: not finite, the caller's policy attends
    status, out = _native.self_rows(rows.clone(), rot, k, v, 4, 0, h, 8, True)
    assert (status, out) == (0, None)
    assert torch.isnan(v[1, 1, 4, -1]) and torch.equal(v[0, :, 4], rows[0, -32:].view(2, 16))
    _, rows, k, v, _ = _case(1, 1, 2, 16, 6, 5, 0, dtype, 1)
    assert _native.self_rows(rows, None, k, v, 5, 0, 2, 0, False) == (1, None)  # asked not to
    assert torch.equal(k[0, 0, 5], rows[0, 32:48])


def test_self_rows_declines_what_it_cannot_take():
    h, rows, k, v, rot = _case(1, 2, 2, 16, 8, 3, 8, torch.float32, 0)
    assert _native.self_rows(rows, rot, k, v, 8, 0, h, 8, True) is None  # past the cache
    assert _native.self_rows(rows, rot, k, v, 3, 4, h, 8, True) is None  # window after pos
    assert _native.self_rows(rows[:, :-1], rot, k, v, 3, 0, h, 8, True) is None  # width
    assert _native.self_rows(rows, rot, k.double(), v, 3, 0, h, 8, True) is None  # dtypes
    assert _native.self_rows(rows, None, k, v, 3, 0, h, 8, True) is None  # r without tables
    assert _native.self_rows(rows, rot, k, v.transpose(2, 3), 3, 0, h, 8, True) is None
