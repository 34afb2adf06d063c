"""The streaming pass against the float64 dense reference (tests/long/dense.py): every
statistic and map, on hypothesis-drawn shapes, masks, windows, soft-caps and sinks."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise import masks
from headwise.long import reductions as red
from headwise.long.tiles import Call, tiles
from tests.long import dense


def run(q, k, block, *, mask=None, causal=True, softcap=None, sinks=None, sink_keys=2,
        window=5, far=7, top_k=3, budget=1 << 12, dtype=torch.float64):
    b, h, nq, _ = q.shape
    call = Call(b, h, nq, k.shape[2], block, sink_keys, window, dtype, q.device, far, causal)
    todo = [red.BlockMap(), red.Received(), red.TopKeys(top_k), red.Distance(), red.RowMasses(),
            red.MaxLogit()]
    for r in todo:
        r.init(call)
    for tile in tiles(q, k, call, mask=masks.as_4d(mask), causal=causal, scale=None,
                      softcap=softcap, sinks=sinks, budget=budget):
        for r in todo:
            r.update(tile)
    out = {r.name: r.finish() for r in todo}
    rows = out.pop("row_masses")
    out |= {name: rows[:, x] for x, name in enumerate(red.RowMasses.COLUMNS)}
    top = out.pop("topk")
    return out | {"topk_keys": top[:, :, 0].round().long(), "topk_mass": top[:, :, 1]}


def compare(got, want, tol=1e-9):
    for name in ("maps", "received", "distance", "sink", "local", "streaming", "far",
                 "mean_distance", "topk_mass", "max_logit"):
        a, b = got[name].double(), want[name].double()
        assert a.shape == b.shape, (name, a.shape, b.shape)
        scale = 1.0 if name not in ("received", "mean_distance", "max_logit") else \
            max(1.0, b.abs().max().item())
        assert torch.allclose(a, b, atol=tol * scale, rtol=0), (name, (a - b).abs().max())
    # top-k sets equal where the k-th and (k+1)-th mean masses are apart by more than tol
    mass = want["topk_mass"]
    for h in range(mass.shape[0]):
        for i in range(mass.shape[1]):
            assert set(got["topk_keys"][h, i].tolist()) == set(want["topk_keys"][h, i].tolist()) \
                or _tied(want, h, i), (h, i)


def _tied(want, h, i) -> bool:
    m = want["topk_mass"][h, i]
    return bool((m[:-1] - m[1:]).abs().min() <= 1e-6) or bool(m[-1] <= 1e-6)


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 2), g=st.integers(1, 2), per=st.integers(1, 2), n=st.integers(1, 70),
       block=st.integers(1, 16),
       causal=st.booleans(), pad=st.booleans(), window=st.none() | st.integers(1, 20),
       softcap=st.none() | st.floats(0.5, 30), sinks=st.booleans(), seed=st.integers(0, 99),
       budget=st.sampled_from([1, 200, 1 << 16]))
def test_every_statistic_equals_the_dense_reference(b, g, per, n, block, causal, pad, window,
                                                    softcap, sinks, seed, budget):
    h, groups = g * per, g  # grouped-query heads: per query heads share each key head
    g = torch.Generator().manual_seed(seed)
    block = min(block, n)
    q = torch.randn(b, h, n, 8, generator=g, dtype=torch.float64) * 2
    k = torch.randn(b, groups, n, 8, generator=g, dtype=torch.float64) * 2
    mask = None
    if pad:  # right padding of random lengths (keys), as a (b, 1, 1, j) mask
        lens = torch.randint(1, n + 1, (b,), generator=g)
        mask = masks.from_valid_lens(lens, n) if hasattr(masks, "from_valid_lens") else None
        mask = (torch.arange(n)[None, :] < lens[:, None])[:, None, None, :]
    if window is not None:
        w = masks.sliding_window(n, n, window, causal=causal)
        mask = w if mask is None else mask & w
    logits = torch.randn(h, generator=g, dtype=torch.float64) if sinks else None
    got = run(q, k, block, mask=mask, causal=causal, softcap=softcap, sinks=logits,
              budget=budget)
    p, allowed, s = dense.probabilities(q, k.repeat_interleave(per, 1), mask=mask,
                                        causal=causal, softcap=softcap, sinks=logits)
    want = dense.statistics(p, allowed, s, block=block, sinks=2, window=5, far=7, top_k=3)
    compare(got, want)


def test_float32_work_is_within_its_rounding_at_1024():
    """At n = 1024 in float32 (what a float32 model runs): masses within 1e-6 of float64."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 3, 1024, 64, generator=g) * 1.5
    k = torch.randn(1, 3, 1024, 64, generator=g) * 1.5
    got = run(q, k, 64, dtype=torch.float32, budget=1 << 20, far=100, window=64, sink_keys=4)
    p, allowed, s = dense.probabilities(q, k, causal=True)
    want = dense.statistics(p, allowed, s, block=64, sinks=4, window=64, far=100, top_k=3)
    for name in ("maps", "distance", "sink", "local", "streaming", "far", "topk_mass"):
        assert (got[name].double() - want[name]).abs().max() <= 1e-6, name
    rel = ((got["received"].double() - want["received"]).abs() / want["received"].clamp(min=1))
    assert rel.max() <= 1e-5  # a column sum of up to 1024 float32 weights
    # a float32 dot product of 64 terms: a few ulps of the largest partial sums
    assert torch.allclose(got["max_logit"].double(), want["max_logit"], rtol=1e-5, atol=1e-5)


def test_a_tile_never_holds_more_than_its_budget_and_skips_the_upper_triangle():
    q = torch.randn(1, 2, 256, 8)
    call = Call(1, 2, 256, 256, 32, 1, 4, torch.float32, q.device)
    seen = list(tiles(q, q, call, mask=None, causal=True, scale=None, softcap=None, sinks=None,
                      budget=2 * 64 * 256))
    assert max(t.probs.numel() for t in seen) <= 2 * 64 * 256
    assert all(t.kj == t.r1 for t in seen)  # keys stop at the chunk's last row (the diagonal)
    assert sum(t.probs.shape[2] for t in seen) == 256
    assert sum(t.probs.numel() for t in seen) < 0.75 * 2 * 256 * 256


def test_a_nan_query_gives_nan_statistics_for_its_head_and_a_dead_row_zero():
    """The NaN policy: a row whose query holds NaN has NaN masses (its output is NaN); a fully
    masked row (padding) has none, and is not live."""
    q = torch.randn(1, 2, 32, 8, dtype=torch.float64)
    q[0, 1, 20] = float("nan")
    mask = torch.ones(1, 1, 32, 32, dtype=torch.bool)
    mask[..., 5, :] = False  # row 5 sees no key
    got = run(q, q.clone().nan_to_num(0.0), 8, mask=mask, causal=True)
    assert torch.isnan(got["sink"][1]) and not torch.isnan(got["sink"][0])
    assert torch.isfinite(got["maps"][0]).all()


def test_a_block_too_big_for_the_budget_is_cut_into_pieces_within_it():
    q = torch.randn(1, 2, 300, 8)
    call = Call(1, 2, 300, 300, 128, 1, 4, torch.float32, q.device)
    seen = list(tiles(q, q, call, mask=None, causal=True, scale=None, softcap=None, sinks=None,
                      budget=2 * 16 * 300))
    assert max(t.probs.numel() for t in seen) <= 2 * 16 * 300
    assert all(t.r0 // 128 == (t.r1 - 1) // 128 for t in seen)  # no piece straddles blocks
    assert [t.r0 for t in seen] == sorted({t.r0 for t in seen}) and seen[-1].r1 == 300
