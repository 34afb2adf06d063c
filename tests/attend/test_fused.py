"""The fused backend: which kernel runs, how causality reaches it, and the NaN policy."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise.attend.fused import _sdpa_inputs, checked, sdpa, sdpa_kernel_name


def test_sdpa_uses_the_fused_kernel_for_causal_plus_padding():
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    pad = hw.masks.from_valid_lens(torch.tensor([64, 40]), 64)
    assert sdpa_kernel_name(q, k, v, pad, 0.0, True) == "FLASH_ATTENTION"
    # and the result is right (checked against the eager reference path)
    a, _ = hw.attention(q, k, v, mask=pad, causal=True, backend="sdpa")
    b, _ = hw.attention(q, k, v, mask=pad, causal=True, backend="eager")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(nq=st.integers(1, 7), nk=st.integers(1, 7), seed=st.integers(0, 2**31 - 1))
def test_causal_reaches_the_kernel_bottom_right(nq, nk, seed):
    """``is_causal`` (top-left in torch) only when i == j; otherwise the bottom-right causal mask
    is folded into the mask, and a single query sees every key."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, nq, 8, generator=gen)
    k, v = (torch.randn(1, 2, nk, 8, generator=gen) for _ in range(2))
    mask, is_causal, in_mask = _sdpa_inputs(q, k, v, None, True, 0.0)
    assert is_causal == (nq == nk and nq > 1)
    assert in_mask == (nq != nk and nq > 1)
    if in_mask:
        assert torch.equal(mask.reshape(nq, nk), hw.masks.causal(nq, nk))
    out, _ = sdpa(q, k, v, causal=True)
    ref, _ = hw.attention(q, k, v, causal=True, backend="eager")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), g=st.integers(1, 3), r=st.integers(1, 3), nq=st.integers(1, 6),
       row=st.integers(0, 5), head=st.integers(0, 2), seed=st.integers(0, 2**31 - 1),
       bad=st.sampled_from([float("nan"), float("inf"), float("-inf")]))
def test_checked_marks_the_bad_query_row_and_without_a_mask_the_bad_kv_head(b, g, r, nq, row,
                                                                          head, seed, bad):
    gen = torch.Generator().manual_seed(seed)
    h, row, head = g * r, row % nq, head % g
    q = torch.randn(b, h, nq, 4, generator=gen)
    k = torch.randn(b, g, 5, 4, generator=gen)
    v = torch.randn(b, g, 5, 3, generator=gen)
    got = checked(q, k, v, None, False)
    assert got[0] is k and got[1] is v and got[2:] == (None, None)  # finite: untouched
    q[0, 0, row, 1] = bad
    k[-1, head, 2, 3] = bad
    k2, v2, bad_w, bad_out = checked(q, k, v, None, False)
    expect = torch.zeros(b, h, nq, 1, dtype=torch.bool)
    expect[0, 0, row] = True
    expect[-1, head * r:(head + 1) * r] = True  # every query head that reads kv head `head`
    assert torch.equal(bad_w, expect) and torch.equal(bad_out, expect)
    assert k2 is k and v2 is v  # without a mask every row of the head is NaN: nothing to clean
    # with a mask that hides key 2 from every row, only the query row is left
    keep = torch.tensor([True, True, False, True, True])
    k3, _, bad_w, _ = checked(q, k, v, keep, False)
    ok = torch.isfinite(k)
    assert torch.isfinite(k3).all() and torch.equal(k3[ok], k[ok]) and not k3[~ok].any()
    only_q = torch.zeros_like(expect)
    only_q[0, 0, row] = True
    assert torch.equal(bad_w, only_q)
