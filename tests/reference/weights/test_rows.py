"""Whole rows of weights as their softmax, with the output from the same blocks
(headwise.weights.rows), against a float64 reference: every mask kind, causal with nq != nk,
grouped heads, selections of heads and rows in any order, any block size."""

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from headwise.weights import Selection, softmax_rows
from tests.attend.test_init import configs, draw_inputs
from tests.reference import reference_attention


@st.composite
def picks(draw, n):
    """None (all), a contiguous slice, or indices in any order (an index tensor)."""
    kind = draw(st.sampled_from(["all", "slice", "list"]))
    if kind == "all":
        return None
    if kind == "slice":
        start = draw(st.integers(0, n - 1))
        return slice(start, draw(st.integers(start + 1, n)))
    return draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n + 1))


@given(cfg=configs, budget=st.sampled_from([1, 7, 1 << 20]), data=st.data())
def test_softmax_rows_equal_float64_reference(cfg, budget, data):
    q, k, v, mask = draw_inputs(cfg)
    h, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    heads, rows = data.draw(picks(h)), data.draw(picks(nq))
    ref_out, ref_w = reference_attention(q, k, v, mask, cfg["causal"])
    hs, rs, _ = Selection(heads=heads, rows=rows).resolve(h, nq, nk, "cpu")
    w, out = softmax_rows(q, k, v, mask=mask, causal=cfg["causal"], heads=hs, rows=rs,
                          budget=budget)
    pick = (slice(None), torch.arange(h)[hs], torch.arange(nq)[rs])
    want_w = ref_w[pick[0]][:, pick[1]][:, :, pick[2]]
    want_out = ref_out[:, pick[1]][:, :, pick[2]]
    torch.testing.assert_close(w.double(), want_w, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.double(), want_out, rtol=0, atol=1e-6)


@given(b=st.integers(1, 2), r=st.integers(1, 3), n=st.integers(64, 160),
       seed=st.integers(0, 2**16))
def test_bfloat16_rows_equal_float64_to_bfloat16_rounding(b, r, n, seed):
    """Scores and softmax in float32, weights and output rounded once to bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, x, n, 16, generator=gen).bfloat16() for x in (2 * r, 2, 2))
    ref_out, ref_w = reference_attention(q, k, v, causal=True)
    w, out = softmax_rows(q, k, v, causal=True, budget=4 * 2 * r * n)
    assert w.dtype == out.dtype == torch.bfloat16
    torch.testing.assert_close(w.double(), ref_w, rtol=2**-8, atol=1e-6)
    torch.testing.assert_close(out.double(), ref_out, rtol=2**-7, atol=2**-7)


def _flops(causal: bool, nq: int, nk: int, budget: int) -> int:
    q, k, v = torch.randn(1, 4, nq, 16), torch.randn(1, 2, nk, 16), torch.randn(1, 2, nk, 16)
    with FlopCounterMode(display=False) as count:
        softmax_rows(q, k, v, causal=causal, budget=budget)
    return count.get_total_flops()


def test_causal_rows_multiply_no_block_above_the_diagonal():
    """Square causal attention in blocks of c rows: the products cover the lower triangle and
    the diagonal blocks only, (n + c) / 2n of the full ones (c = 32 of n = 512: 53%)."""
    n, c = 512, 32
    full, causal = _flops(False, n, n, 4 * n * c), _flops(True, n, n, 4 * n * c)
    assert full == 2 * (2 * 4 * n * n * 16)  # q k^T and weights @ v, 2 flops per product
    assert causal == full * (n + c) // (2 * n)
    # bottom-right with more keys than queries: the extra keys are seen by every row
    more = _flops(True, 128, 384, 4 * 384 * c)
    assert more == 2 * 2 * 4 * 16 * sum(min(384, r1 + 256) * c for r1 in range(c, 129, c))
