"""The masked-NaN rule (docs/design.md#the-nan-policy): a NaN or inf at a key/value position a
row may not attend (padding by ``valid_lens``, a bool mask's False, a float mask's ``-inf``, the
causal future, a sliding window, transformers' padded positions) leaves that row's output and
weights as if the position held 0, on every backend and path: eager, the fused kernel, all
weights, a selection of rows, a key range (weights from the LSE), head statistics, the Hugging
Face attention function and the decoding step. A row that may attend such a position is NaN,
and without a mask a NaN still makes its whole head NaN (the positive control).

Each case is checked against a float64 reference on the same inputs with the non-finite
values put to 0; hypothesis draws the shapes, the mask and where the bad values go."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise.stats import head_stats
from tests.reference import reference_attention

EXAMPLES = int(os.environ.get("HEADWISE_EQUIVALENCE_EXAMPLES", 40))
harness = settings(max_examples=EXAMPLES, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BAD = (float("nan"), float("inf"), float("-inf"))


def _randn(seed: int, *shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).float()


@st.composite
def masked_inputs(draw):
    """``(q, k, v, mask, causal, allowed (b, h, i, j), planted (b, g, j))``: NaN / inf planted in
    k and v at positions drawn mostly among those no row may attend."""
    b, g = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    h = g * draw(st.integers(1, 2))
    i, j = draw(st.integers(1, 6)), draw(st.integers(2, 7))
    d, e = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    q, k, v = (_randn(seed + n, *s) for n, s in enumerate(((b, h, i, d), (b, g, j, d),
                                                            (b, g, j, e))))
    kind = draw(st.sampled_from(["valid_lens", "bool", "float", "causal", "window", "both"]))
    mask, causal = None, kind in ("causal", "both")
    if kind in ("valid_lens", "both"):
        lens = torch.tensor([draw(st.integers(0, j)) for _ in range(b)])
        mask = hw.masks.from_valid_lens(lens, j)
    elif kind in ("bool", "float"):
        shape = tuple(n if draw(st.booleans()) else 1 for n in (b, h, i)) + (j,)
        keep = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.4
        mask = keep if kind == "bool" else torch.where(keep, 0.0, float("-inf"))
    elif kind == "window":
        mask = hw.masks.sliding_window(i, j, draw(st.integers(1, j)))
    allowed = _allowed(mask, causal, b, h, i, j)
    reach = allowed.reshape(b, g, h // g, i, j).any(2).any(2)             # (b, g, j)
    planted = torch.zeros(b, g, j, dtype=torch.bool)
    for _ in range(draw(st.integers(1, 4))):
        unseen = (~reach).nonzero().tolist()
        if unseen and draw(st.integers(0, 4)) > 0:  # mostly where no row looks
            x, y, z = draw(st.sampled_from(unseen))
        else:
            x, y, z = (draw(st.integers(0, n - 1)) for n in (b, g, j))
        t = k if draw(st.booleans()) else v
        t[x, y, z, draw(st.integers(0, t.shape[-1] - 1))] = draw(st.sampled_from(BAD))
        planted[x, y, z] = True
    return q, k, v, mask, causal, allowed, planted


def _allowed(mask, causal, b, h, i, j) -> torch.Tensor:
    """``(b, h, i, j)``: which key each row may attend, read from the mask independently."""
    allowed = torch.ones(b, h, i, j, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & (mask if mask.dtype == torch.bool else ~torch.isneginf(mask))
    if causal:
        allowed = allowed & torch.ones(i, j, dtype=torch.bool).tril(j - i)
    return allowed


def _zeroed(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, 0.0)


def _bad(t: torch.Tensor) -> torch.Tensor:
    """``(b, g, j)``: the positions of ``t (b, g, j, d)`` holding NaN or inf."""
    return ~torch.isfinite(t).all(-1)


def _nan_rows(allowed, planted, h) -> torch.Tensor:
    """``(b, h, i)``: the rows that may attend a planted position (the NaN policy's rows)."""
    per_head = planted.repeat_interleave(h // planted.shape[1], dim=1)      # (b, h, j)
    return (allowed & per_head[:, :, None, :]).any(-1)


def _check(got: torch.Tensor, want: torch.Tensor, nan: torch.Tensor, atol=1e-5) -> None:
    """Rows ``nan (b, h', i')`` all NaN, every other row finite and equal to ``want``."""
    assert torch.equal(got.isnan().all(-1), nan) and torch.equal(got.isnan().any(-1), nan)
    torch.testing.assert_close(got[~nan].double(), want[~nan], atol=atol, rtol=1e-5)


@harness
@given(masked_inputs())
def test_masked_bad_values_leave_every_backend_as_if_they_were_zero(inputs):
    q, k, v, mask, causal, allowed, _ = inputs
    h = q.shape[1]
    nan, nan_w = _nan_rows(allowed, _bad(k) | _bad(v), h), _nan_rows(allowed, _bad(k), h)
    ref, ref_w = reference_attention(q, _zeroed(k), _zeroed(v), mask=mask, causal=causal)
    picked = hw.Selection(heads=[h - 1], rows=[0])
    keys = hw.Selection(keys=slice(0, k.shape[2] - 1))
    with torch.no_grad():
        for backend in ("eager", "sdpa"):
            out, w = hw.attention(q, k, v, mask=mask, causal=causal, backend=backend,
                                  return_weights=True)
            _check(out, ref, nan)
            _check(w, ref_w, nan_w, atol=1e-6)
            out, _ = hw.attention(q, k, v, mask=mask, causal=causal, backend=backend)
            _check(out, ref, nan)
            _, w = hw.attention(q, k, v, mask=mask, causal=causal, backend=backend,
                                return_weights=picked)
            _check(w, ref_w[:, [h - 1]][:, :, [0]], nan_w[:, [h - 1]][:, :, [0]], atol=1e-6)
        _, w = hw.attention(q, k, v, mask=mask, causal=causal, return_weights=keys)
        _check(w, ref_w[..., :-1], nan_w, atol=1e-6)
    # with gradients the fused kernel keeps the output and its weights come as whole rows
    qg = q.clone().requires_grad_()
    out, w = hw.attention(qg, k, v, mask=mask, causal=causal, return_weights=True)
    _check(out.detach(), ref, nan)
    _check(w.detach(), ref_w, nan_w, atol=1e-6)


@harness
@given(masked_inputs())
def test_masked_bad_keys_leave_head_statistics_as_if_they_were_zero(inputs):
    q, k, _, mask, causal, allowed, _ = inputs
    nan = _nan_rows(allowed, _bad(k), q.shape[1])
    got = head_stats(q, k, mask=mask, causal=causal)
    want = head_stats(q, _zeroed(k), mask=mask, causal=causal)
    for name in ("entropy", "max_weight"):
        a, b = getattr(got, name), getattr(want, name)
        assert torch.equal(a.isnan(), nan), name
        torch.testing.assert_close(a[~nan], b[~nan], atol=1e-5, rtol=1e-5)


@harness
@given(masked_inputs())
def test_masked_bad_values_through_the_hugging_face_attention_function(inputs):
    pytest.importorskip("transformers")
    from headwise.hf.interface import attention_forward

    q, k, v, mask, causal, allowed, planted = inputs
    nan = _nan_rows(allowed, planted, q.shape[1])  # (planted: where k or v is not finite)
    ref, _ = reference_attention(q, _zeroed(k), _zeroed(v), mask=mask, causal=causal)
    # transformers hands over one mask, bool (b, 1, i, j) or additive (its lowest value where
    # masked), causality inside it
    if not torch.equal(allowed, allowed[:, :1].expand_as(allowed)):
        return  # (a per-head mask has no (b, 1, i, j) form)
    keep = allowed[:, :1]
    lowest = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    with torch.no_grad():
        out, _ = attention_forward(torch.nn.Module(), q, k, v, keep)
        _check(out.transpose(1, 2), ref, nan)
        # additive: a fully masked row averages every value (HF's rule); as with zeros there
        out, _ = attention_forward(torch.nn.Module(), q, k, v, lowest)
        zero, _ = attention_forward(torch.nn.Module(), q, _zeroed(k), _zeroed(v), lowest)
        _check(out.transpose(1, 2), zero.transpose(1, 2).double(), nan)
        # gpt-oss sinks: the fused output rescaled by the row log-sum-exp of the same keys
        sinks = _randn(3, q.shape[1])
        out, _ = attention_forward(torch.nn.Module(), q, k, v, lowest, s_aux=sinks)
        zero, _ = attention_forward(torch.nn.Module(), q, _zeroed(k), _zeroed(v), lowest,
                                    s_aux=sinks)
        _check(out.transpose(1, 2), zero.transpose(1, 2).double(), nan)


def test_an_unmasked_nan_still_makes_its_whole_head_nan():
    """The positive control: the rule changes nothing where no mask excludes the position."""
    q, k, v = _randn(0, 2, 4, 5, 8), _randn(1, 2, 2, 5, 8), _randn(2, 2, 2, 5, 8)
    k[1, 0, 3, 2] = float("nan")
    v[0, 1, 0, 0] = float("inf")
    want = torch.zeros(2, 4, 5, dtype=torch.bool)
    want[1, 0:2] = want[0, 2:4] = True
    for backend in ("eager", "sdpa"):
        for weights in (False, True):
            out, w = hw.attention(q, k, v, backend=backend, return_weights=weights)
            assert torch.equal(out.isnan().all(-1), want) and torch.equal(out.isnan().any(-1), want)
            if weights:
                assert torch.equal(w[1, 0:2].isnan().all(-1), want[1, 0:2])
    # a padding mask that lets every row see position 3 of batch 1: the same answer
    lens = torch.tensor([5, 4])
    out, _ = hw.attention(q, k, v, mask=hw.masks.from_valid_lens(lens, 5))
    assert torch.equal(out.isnan().all(-1), want)


def test_a_nan_in_the_causal_future_reaches_only_the_rows_that_see_it():
    q, k, v = _randn(0, 1, 2, 6, 4), _randn(1, 1, 2, 6, 4), _randn(2, 1, 2, 6, 4)
    k[0, 1, 4, 0] = float("nan")
    ref, _ = reference_attention(q, _zeroed(k), v, causal=True)
    for backend in ("eager", "sdpa"):
        out, _ = hw.attention(q, k, v, causal=True, backend=backend)
        assert out[0, 1].isnan().all(-1).tolist() == [False] * 4 + [True] * 2
        assert not out[0, 0].isnan().any()
        torch.testing.assert_close(out[0, 1, :4].double(), ref[0, 1, :4], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_decoding_step_ignores_bad_values_at_padded_source_positions(rows):
    """A padded batch of sources: NaN and inf in the cross-attention cache's padded positions
    (the encoder's output there is garbage a mask excludes) leave every step's logits as with
    zeros there."""
    from headwise.models import Transformer, TransformerConfig
    from headwise.step import DecodeStep

    torch.manual_seed(rows)
    model = Transformer(TransformerConfig(src_vocab_size=19, tgt_vocab_size=23, d_model=24,
                                          num_heads=4, num_layers=2, d_ff=40, max_len=32,
                                          dropout=0.0, num_kv_heads=2)).eval()
    src = torch.randint(1, 19, (rows, 9))
    lens = torch.tensor([9, 4, 6][:rows]) if rows > 1 else torch.tensor([5])
    tgt = torch.randint(0, 23, (rows, 5))
    logits = []
    with torch.inference_mode():
        memory, mask = model.encode(src, lens)
        for fill in (0.0, float("nan"), float("inf")):
            cache = model.new_cache(rows, 16)
            model.decoder(tgt[:, :1], memory, memory_mask=mask, cache=cache)
            for layer in cache.layers:
                for t in (layer.cross_attn.k, layer.cross_attn.v):
                    for r in range(rows):
                        t[r, :, int(lens[r]):] = fill
            step = DecodeStep(model, cache, mask)
            logits.append(torch.stack([step(tgt[:, t]) for t in range(1, 5)], 1))
    assert torch.isfinite(logits[0]).all()
    for got in logits[1:]:
        torch.testing.assert_close(got, logits[0], atol=1e-5, rtol=0)


def test_the_decoding_step_never_reads_unfilled_or_out_of_window_cache_slots():
    """The self-attention step attends over the filled positions (the last ``window`` of them):
    NaN in the slots after them, or before the window, changes no logit (the C kernels and the
    torch path alike)."""
    from headwise.models import LMConfig, TransformerLM
    from headwise.step import DecodeStep

    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=37, d_model=24, num_heads=4, num_layers=2,
                                   d_ff=40, max_len=40, dropout=0.0, num_kv_heads=2,
                                   positional="rope", sliding_window=3)).eval()
    prompt, nxt = torch.randint(0, 37, (2, 6)), torch.randint(0, 37, (2, 4))
    logits = []
    with torch.inference_mode():
        for fill in (0.0, float("nan")):
            cache = model.new_cache(2, 16)
            model(prompt, cache=cache)
            cache.k[:, :, :, 6:] = fill   # unfilled slots: (layers, b, g, L, d)
            cache.v[:, :, :, 6:] = fill
            cache.k[:, :, :, :2] = fill   # before every later step's window of 3
            cache.v[:, :, :, :2] = fill
            step = DecodeStep(model, cache)
            logits.append(torch.stack([step(nxt[:, t]) for t in range(4)], 1))
    assert torch.isfinite(logits[0]).all()
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=0)
