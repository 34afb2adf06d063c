"""Streaming head statistics (headwise.stats) against the same statistics of full eager
weights, and the model-level collector."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
from headwise import observe
from headwise import weights as W
from headwise.models import LMConfig, TransformerLM
from tests.attend.test_init import configs, draw_inputs
from tests.reference import reference_attention


def stats_from_full_weights(w, nq, nk, token_ids=None, top_k=5):
    """The statistics written plainly from a full (b, h, i, j) float64 weight tensor."""
    pos = torch.arange(nq)[:, None] + (nk - nq)  # (i, 1) key position of each query
    keys = torch.arange(nk)[None, :]
    safe = torch.where(w > 0, w, torch.ones_like(w))
    out = {
        "entropy": -(w * safe.log()).sum(-1),
        "max_weight": w.amax(-1),
        "received": w.sum(2),
        "sink": w[..., 0],
        "prev_token": (w * (keys == pos - 1)).sum(-1),
        "distance": (w * (pos - keys).abs()).sum(-1),
        "top_values": w.topk(min(top_k, nk), -1).values,
    }
    if token_ids is not None:
        # key j is a target of query i when token j-1 is query i's token, earlier than i
        # (a query before the first key, nq > nk, has no earlier key: any token will do)
        current = token_ids[:, pos[:, 0].clamp(0, nk - 1)]             # (b, i)
        target = torch.zeros(w.shape[0], nq, nk, dtype=torch.bool)
        target[..., 1:] = (token_ids[:, None, :-1] == current[..., None]) & (keys[:, 1:] - 1
                                                                           < pos)
        out["induction"] = (w * target[:, None]).sum(-1)
    return out


@pytest.mark.parametrize("causal, masked", [(True, False), (False, True), (True, True)])
def test_streaming_stats_equal_the_stats_of_full_eager_weights_at_512(causal, masked):
    gen = torch.Generator().manual_seed(int(causal) * 2 + int(masked))
    b, h, n, d = 2, 2, 512, 16
    q, k = torch.randn(b, h, n, d, generator=gen), torch.randn(b, h, n, d, generator=gen)
    ids = torch.randint(0, 20, (b, n), generator=gen)  # many repeats: induction targets
    mask = hw.masks.from_valid_lens(torch.tensor([n, 300]), n) if masked else None
    _, w = hw.attention(q.double(), k.double(), k.double(), mask=mask, causal=causal,
                        backend="eager", return_weights=True)
    want = stats_from_full_weights(w, n, n, ids)
    got = hw.stats.head_stats(q, k, mask=mask, causal=causal, token_ids=ids, budget=50_000)
    for name, ref in want.items():
        torch.testing.assert_close(getattr(got, name).double(), ref, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
    picked = w.gather(-1, got.top_keys)  # the keys named hold the values named
    torch.testing.assert_close(picked, got.top_values.double(), rtol=1e-5, atol=1e-5)
    assert got.live.all()


@given(cfg=configs, budget=st.sampled_from([1, 7, W.CHUNK_ELEMENTS]),
       shift=st.sampled_from(["max", "lse"]), top_k=st.integers(1, 12))
def test_streaming_stats_equal_float64_reference_over_drawn_configurations(cfg, budget, shift,
                                                                            top_k):
    """Every mask kind, causal with nq != nk (rows that see no key), grouped heads, b > 1, any
    chunk size (causal chunks stop at their last row's key), each row shifted by its max or by
    the LSE, top_k above the keys some rows can reach."""
    q, k, v, mask = draw_inputs(cfg)
    b, nq, nk = q.shape[0], q.shape[2], k.shape[2]
    _, w = reference_attention(q, k, v, mask, cfg["causal"])
    ids = torch.randint(0, 3, (b, nk), generator=torch.Generator().manual_seed(cfg["seed"]))
    want = stats_from_full_weights(w, nq, nk, ids, top_k)
    lse = (W.logsumexp(q, k, mask=mask, causal=cfg["causal"]) if shift == "lse" else None)
    got = hw.stats.head_stats(q, k, mask=mask, causal=cfg["causal"], lse=lse, token_ids=ids,
                              top_k=top_k, budget=budget)
    _assert_matches(got, w, want)


def _assert_matches(got, w, want) -> None:
    """``got`` (HeadStats) against ``want`` (stats_from_full_weights) and the full weights."""
    for name, ref in want.items():
        torch.testing.assert_close(getattr(got, name).double(), ref, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(w.gather(-1, got.top_keys), got.top_values.double(), rtol=1e-5,
                               atol=1e-5)
    assert torch.equal(got.live, w.sum(-1) > 0.5)


def test_fully_masked_rows_are_not_live_and_per_head_means_skip_them():
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 3, 6, 8, generator=gen), torch.randn(1, 3, 4, 8, generator=gen)
    mask = torch.ones(1, 1, 6, 4, dtype=torch.bool)
    mask[..., 2, :] = False
    s = hw.stats.head_stats(q, k, mask=mask, top_k=10)
    assert s.live[..., 2].logical_not().all() and s.live.sum() == 15
    assert (s.entropy[..., 2] == 0).all() and s.top_values.shape == (1, 3, 6, 4)
    mean = s.per_head("max_weight")
    torch.testing.assert_close(mean, s.max_weight.sum(-1) / 5)


def test_collect_gives_every_layer_of_a_model_the_stats_of_its_weights():
    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=11, d_model=16, num_heads=2, num_layers=2, d_ff=32,
                                max_len=32)).eval()
    tokens = torch.randint(0, 11, (2, 12))
    with torch.no_grad(), hw.stats.collect(lm, token_ids=tokens, top_k=3) as found:
        logits, _ = lm(tokens)
        _, att = lm(tokens, return_weights=True)
    assert sorted(found) == ["blocks.0.self_attn", "blocks.1.self_attn"]
    for layer in range(2):
        first, second = found[f"blocks.{layer}.self_attn"]
        want = stats_from_full_weights(att["decoder_self"][layer].double(), 12, 12, tokens)
        for name in ("entropy", "received", "induction", "prev_token"):
            torch.testing.assert_close(getattr(first, name).double(), want[name], rtol=1e-5,
                                       atol=1e-5)
        torch.testing.assert_close(first.entropy, second.entropy)
    assert not observe.observed()  # the block's observer is gone


def test_bad_arguments_are_value_errors():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="top_k must be an int >= 1"):
        hw.stats.head_stats(q, q, top_k=0)
    with pytest.raises(ValueError, match=r"token_ids must be \(b, j\)=\(1, 3\)"):
        hw.stats.head_stats(q, q, token_ids=torch.zeros(1, 4, dtype=torch.long))
    # the CUDA kernels' LSE layouts (gpu-facts.md): cuDNN's (b, h, i, 1), efficient's padded
    for lse in (torch.zeros(1, 2, 3, 1), torch.zeros(1, 2, 32)):
        with pytest.raises(ValueError, match=r"lse must be \(b, h, i\)=\(1, 2, 3\)"):
            hw.stats.head_stats(q, q, lse=lse)
    lse = W.logsumexp(q, q)
    for documented in (lse[..., None], torch.cat([lse, torch.zeros(1, 2, 29)], -1)):
        fixed = documented[..., 0] if documented.dim() == 4 else documented[..., :3]
        torch.testing.assert_close(hw.stats.head_stats(q, q, lse=fixed).entropy,
                                   hw.stats.head_stats(q, q).entropy)


@given(h=st.integers(2, 4), n=st.integers(2, 9),
       bad=st.sampled_from([float("nan"), float("inf"), -float("inf")]), positive=st.booleans(),
       causal=st.booleans(), budget=st.sampled_from([1, 7, W.CHUNK_ELEMENTS]),
       seed=st.integers(0, 2**16))
def test_a_head_whose_queries_are_nan_reports_nan_not_perfect_focus(h, n, bad, positive, causal,
                                                                    budget, seed):
    """NaN/inf queries used to give entropy 0 and max weight 0 (read as a perfectly focused
    head); their statistics are NaN now, as the attention output is, and the clean heads keep
    the numbers they have without the bad one."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, h, n, 8, generator=gen), torch.randn(1, h, n, 8, generator=gen)
    if positive:  # -inf queries on positive keys: every score -inf, like a masked row
        k[:, 0] = k[:, 0].abs()
    clean = hw.stats.head_stats(q, k, causal=causal, budget=budget)
    q[:, 0] = bad
    s = hw.stats.head_stats(q, k, causal=causal, budget=budget)
    for name in ("entropy", "max_weight", "sink", "distance"):
        assert getattr(s, name)[:, 0].isnan().all(), name
        assert s.per_head(name)[:, 0].isnan().all(), name
        # the other heads: same arithmetic on the same rows, float32 rounding at most
        torch.testing.assert_close(getattr(s, name)[:, 1:], getattr(clean, name)[:, 1:])
    assert s.live.all() and s.top_values[:, 0].isnan().all()


def test_float_token_ids_are_refused():
    q = torch.randn(1, 2, 3, 4)
    for ids in (torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool), [[0, 1, 2]]):
        with pytest.raises(TypeError, match="token_ids must be an integer tensor"):
            hw.stats.head_stats(q, q, token_ids=ids)
    lm = TransformerLM(LMConfig(vocab_size=11, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                                max_len=32))
    with pytest.raises(TypeError, match="token_ids must be an integer tensor"):
        with hw.stats.collect(lm, token_ids=torch.zeros(1, 4)):
            pass
    stats = hw.stats.head_stats(q, q, token_ids=torch.zeros(1, 3, dtype=torch.int32))
    assert stats.induction.shape == (1, 2, 3)


# --- the GPU's paths, checked on the CPU ---------------------------------------------------

def off_the_host():
    """headwise.fast.host answers False, as for CUDA tensors: the device's rules run."""
    from unittest import mock

    from headwise import fast
    return mock.patch.object(fast, "host", lambda *tensors: False)


@given(cfg=configs, budget=st.sampled_from([None, 40, 300]), shift=st.sampled_from(["max", "lse"]),
       top_k=st.integers(1, 12))
def test_the_device_path_run_on_the_cpu_equals_float64_reference(cfg, budget, shift, top_k):
    """Off the host (forced here: headwise.fast.host says False, as for a CUDA tensor) the
    torch path sizes blocks for device memory, gives causal blocks of short rows more rows, and
    always applies the NaN masks (no host read): the same numbers as the float64 reference."""
    q, k, v, mask = draw_inputs(cfg)
    b, nq, nk = q.shape[0], q.shape[2], k.shape[2]
    _, w = reference_attention(q, k, v, mask, cfg["causal"])
    ids = torch.randint(0, 3, (b, nk), generator=torch.Generator().manual_seed(cfg["seed"]))
    lse = (W.logsumexp(q, k, mask=mask, causal=cfg["causal"]) if shift == "lse" else None)
    with off_the_host():
        got = hw.stats.head_stats(q, k, mask=mask, causal=cfg["causal"], lse=lse,
                                  token_ids=ids, top_k=top_k, budget=budget)
    _assert_matches(got, w, stats_from_full_weights(w, nq, nk, ids, top_k))


def test_device_blocks_fit_the_budget_and_cover_every_row_once():
    """The device's row spans: contiguous, every row once, each within the budget (or one
    row), and under causal attention fewer blocks than fixed-height chunks would need."""
    from headwise.stats import _spans
    for nq, nk, causal in [(4096, 4096, True), (100, 37, True), (37, 100, True), (7, 9, False)]:
        reach = (lambda r1, nq=nq, nk=nk: min(nk, r1 + nk - nq)) if causal else \
            (lambda r1, nk=nk: nk)
        for budget in (1, 7, 1000, 1 << 25):
            spans = _spans(nq, reach, 16, budget)
            assert spans[0][0] == 0 and spans[-1][1] == nq
            assert all(r0 < r1 for r0, r1 in spans)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
            assert all(16 * (r1 - r0) * max(1, reach(r1)) <= budget or r1 - r0 == 1
                       for r0, r1 in spans)
    fixed = -(-16384 // W.chunk_rows(16 * 16384, 1 << 25))
    assert len(_spans(16384, lambda r1: r1, 16, 1 << 25)) < 0.6 * fixed


def test_the_device_path_marks_nan_rows_without_a_host_check():
    gen = torch.Generator().manual_seed(11)
    q, k = torch.randn(1, 3, 20, 8, generator=gen), torch.randn(1, 3, 20, 8, generator=gen)
    q[0, 1, 4] = float("nan")
    k[0, 2, 7] = float("inf")
    with off_the_host():
        s = hw.stats.head_stats(q, k, causal=True, budget=50)
    # key 7 reaches the causal rows 7 on; the rows before it see it masked: as if 0
    assert s.entropy[0, 1, 4].isnan() and s.entropy[0, 2, 7:].isnan().all()
    assert s.entropy[0, 0].isfinite().all() and s.entropy[0, 1, :4].isfinite().all()
    assert s.entropy[0, 2, :7].isfinite().all()
    assert s.live.all()


def test_a_collected_result_prints_a_short_table_per_layer_and_keeps_the_raw_tensors():
    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=11, d_model=32, num_heads=4, num_layers=3, d_ff=32,
                                max_len=64)).eval()
    tokens = torch.randint(0, 11, (2, 40))
    with torch.no_grad(), hw.stats.collect(lm, token_ids=tokens) as found:
        lm(tokens)
        lm(tokens[:, :20])
    text = repr(found)
    assert str(found) == text
    lines = text.splitlines()
    assert len(lines) == 1 + 3 * (2 + 4)  # a note, then per layer: title, header, 4 heads
    assert max(map(len, lines)) <= 100 and "tensor(" not in text
    for layer in range(3):
        path = f"blocks.{layer}.self_attn"
        title = lines.index(f"[{path!r}][0] of 2 call(s): b=2 h=4 i=40 j=40")
        assert lines[title + 1].split() == ["head", *hw.stats.COLUMNS]
        rows = [line.split() for line in lines[title + 2:title + 6]]
        assert [r[0] for r in rows] == ["0", "1", "2", "3"]
        first = found[path][0]  # the raw tensors, one attribute away
        assert first.entropy.shape == (2, 4, 40) and found[path][1].entropy.shape == (2, 4, 20)
        for column, name in enumerate(hw.stats.COLUMNS, start=1):
            want = first.per_head(name).double().mean(0)
            got = torch.tensor([float(r[column]) for r in rows], dtype=torch.float64)
            digits = len(hw.stats.COLUMNS[name].split(".")[1]) - 2  # "{:.3f}" -> 3
            torch.testing.assert_close(got, want, atol=0.51 * 10 ** -digits, rtol=0)
    assert isinstance(found, dict) and sorted(found) == [f"blocks.{n}.self_attn" for n in range(3)]


@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 9), st.booleans())
def test_a_head_stats_repr_has_a_row_per_head_without_induction_unless_given(b, h, n, ids):
    q = torch.randn(b, h, n, 8)
    tokens = torch.randint(0, 3, (b, n)) if ids else None
    s = hw.stats.head_stats(q, q, causal=True, token_ids=tokens)
    lines = repr(s).splitlines()
    assert lines[1] == f"HeadStats b={b} h={h} i={n} j={n}" and len(lines) == 3 + h
    assert ("induction" in lines[2]) is ids
    assert [line.split()[0] for line in lines[3:]] == [str(x) for x in range(h)]


def test_nothing_collected_says_so():
    lm = TransformerLM(LMConfig(vocab_size=11, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                                max_len=8))
    with hw.stats.collect(lm) as found:
        pass
    assert repr(found) == "Collected({}): no call seen" and found == {}
