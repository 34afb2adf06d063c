"""The step table and the structured facts producers record: one line per step, axes from the
table, the weights source able to say how weights were recomputed. The channel: steps and
attention calls go to the innermost observer, per-head outputs through every observer outermost
first; an observer leaves on any exit; with none each report hands back what it got; an edit of
the per-head outputs is an edit of out_proj's input."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

import headwise as hw
from headwise import observe
from headwise.layers import MultiHeadAttention
from headwise.observe import (
    Observer,
    StepKind,
    WeightsSource,
    active,
    attention,
    heads,
    observed,
    observing,
    record,
    recording,
)


def test_weights_source_says_how_weights_were_produced():
    assert WeightsSource("lse", "flash", 256).describe() == \
        "recomputed from the flash LSE, 256-row chunks"
    assert WeightsSource("softmax").describe() == "softmax of the materialised scores"
    assert WeightsSource("lse", "flash", 256).to_dict() == {
        "method": "lse", "kernel": "flash", "chunk_rows": 256,
        "description": "recomputed from the flash LSE, 256-row chunks"}


def test_table_members_carry_key_axes_and_merged_axes():
    assert StepKind.SPLIT_Q == "split heads q" and StepKind.SPLIT_Q.axes == ("b", "h", "i", "d")
    assert StepKind.K_PROJECTION.axes == ("b", "j", "(g d)")
    assert StepKind.OUTPUT_PROJECTION.axes == ("b", "i", "out")


def test_record_passes_the_member_and_facts_only_while_recording():
    seen = []
    record(StepKind.SCORES, None, scale=0.5)  # no recorder: nothing happens
    with recording(lambda step, tensor, **facts: seen.append((step, facts))):
        record(StepKind.SCORES, None, scale=0.5)
    record(StepKind.SCORES, None, scale=0.25)
    assert seen == [(StepKind.SCORES, {"scale": 0.5})]


# ---------------------------------------------------------------------------------- the channel
def _log(name: str, seen: list) -> Observer:
    """An observer of all three reports that logs them under ``name`` (heads: adds 1)."""
    return Observer(step=lambda step, tensor, **facts: seen.append((name, "step", step)),
                    attention=lambda module, *args: seen.append((name, "attention", module)),
                    heads=lambda module, out: seen.append((name, "heads", module)) or out + 1)


def test_nesting_steps_and_calls_go_innermost_heads_through_every_observer_outermost_first():
    seen: list = []
    x = torch.zeros(1, 2, 3, 4)
    with observing(_log("outer", seen)):
        with observing(Observer(heads=lambda m, out: seen.append(("middle", "heads", m))
                                or out * 10)):
            with observing(_log("inner", seen)):
                record(StepKind.SCORES)
                attention("mha", x, x, None, False, None, True)
                got = heads("mha", x)
            assert seen == [("inner", "step", StepKind.SCORES), ("inner", "attention", "mha"),
                            ("outer", "heads", "mha"), ("middle", "heads", "mha"),
                            ("inner", "heads", "mha")]
            assert torch.equal(got, (x + 1) * 10 + 1)  # each got what the one before returned
            seen.clear()
            record(StepKind.SCORES)  # the inner block is gone: the outer observer again
            attention("mha", x, x, None, False, None, True)
            assert torch.equal(heads("mha", x), (x + 1) * 10)
        assert seen == [("outer", "step", StepKind.SCORES), ("outer", "attention", "mha"),
                        ("outer", "heads", "mha"), ("middle", "heads", "mha")]
    assert not observed() and not active()


def test_an_observer_is_removed_on_exception_and_when_blocks_close_out_of_order():
    seen: list = []
    with pytest.raises(RuntimeError, match="boom"):
        with observing(_log("a", seen)):
            assert observed() and active()
            raise RuntimeError("boom")
    assert not observed() and not active() and heads(None, torch.ones(1)) == 1
    a, b = observing(_log("a", seen)), observing(_log("b", seen))
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # a generator may close its block before a later one
    record(StepKind.SCORES)
    assert seen == [("b", "step", StepKind.SCORES)]
    b.__exit__(None, None, None)
    assert not observed()
    with pytest.raises(TypeError, match="expects a headwise.observe.Observer"):
        with observing(lambda *args: None):
            pass


def test_with_no_observer_each_report_hands_back_what_it_got(monkeypatch):
    """The zero-cost path: nothing is installed, the per-head report returns its argument
    itself (no copy, no edit), and the forward is out_proj(merge(attention))."""
    assert (observe._step, observe._attention, observe._heads) == (None, None, None)
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, num_kv_heads=2).eval()
    x = torch.randn(2, 5, 16)
    handed: list = []

    def spy(module, out):
        handed.append((out, real(module, out)))
        return handed[-1][1]
    real = observe.heads
    monkeypatch.setattr(observe, "heads", spy)
    with torch.no_grad():
        got, _ = mha(x, causal=True)
        with recording(lambda *args, **facts: None):  # steps only: heads still pass through
            traced, _ = mha(x, causal=True)
        q, k, v = (rearrange(p(x), "b i (h d) -> b h i d", d=4)
                   for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        by_hand = mha.out_proj(rearrange(hw.attention(q, k, v, causal=True)[0],
                                         "b h i d -> b i (h d)"))
    assert len(handed) == 2 and all(out is back for out, back in handed)
    assert torch.equal(traced, got)
    torch.testing.assert_close(got, by_hand, atol=1e-6, rtol=1e-6)  # (q, k, v: one GEMM there)


def test_editing_heads_through_the_channel_equals_editing_out_proj_input_by_hand():
    """Zeroing, scaling and replacing heads at (b, h, i, d) before the merge is the same as
    editing their d-wide slices of out_proj's input (b, i, h*d); head_mask multiplies first."""
    torch.manual_seed(1)
    mha = MultiHeadAttention(12, 3, head_dim=5, kdim=7, num_kv_heads=1, out_dim=9)
    x, mem = torch.randn(2, 4, 12), torch.randn(2, 6, 7)
    head_mask = torch.tensor([1.0, 0.5, 2.0])
    fill = torch.randn(2, 4, 5)  # (b, i, d): head 2's replacement

    def edit(module, out):  # (b, h, i, d)
        out = out.clone()
        out[:, 0] = 0
        out[:, 1] *= 3
        out[:, 2] = fill
        return out

    def by_hand(module, args):  # (b, i, h*d): head x is columns x*d:(x+1)*d
        merged = args[0].clone()
        merged[..., 0:5] = 0
        merged[..., 5:10] *= 3
        merged[..., 10:15] = fill
        return (merged,)

    with observing(Observer(heads=lambda module, out: edit(module, out) if module is mha
                            else out)):
        got, _ = mha(x, mem, head_mask=head_mask)
    handle = mha.out_proj.register_forward_pre_hook(by_hand)
    try:
        want, _ = mha(x, mem, head_mask=head_mask)
    finally:
        handle.remove()
    assert torch.equal(got, want)
    got.sum().backward()  # gradients flow through the edit


def test_attention_reports_each_call_with_its_queries_keys_and_mask():
    torch.manual_seed(2)
    mha = MultiHeadAttention(8, 4, num_kv_heads=2)
    x, mem = torch.randn(3, 5, 8), torch.randn(3, 7, 8)
    calls: list = []
    with observing(Observer(attention=lambda *args: calls.append(args))):
        mha(x, causal=True)
        mha(x, mem, valid_lens=torch.tensor([7, 2, 5]))
    (m1, q1, k1, mask1, causal1, scale1, self1), (m2, q2, k2, mask2, causal2, _, self2) = calls
    assert m1 is mha and m2 is mha and scale1 is None
    assert q1.shape == (3, 4, 5, 2) and k1.shape == (3, 2, 5, 2) and k2.shape == (3, 2, 7, 2)
    assert (mask1, causal1, self1) == (None, True, True)
    assert mask2.shape[-1] == 7 and not causal2 and not self2


def test_softmax_observers_see_every_call_plain_ones_only_plain_softmax():
    """A soft-capped or sink call reaches ``softmax`` observers with its cap and sinks, and
    never the ``attention`` observers (their statistics model neither)."""
    import torch

    from headwise import observe

    plain, full = [], []
    q = torch.zeros(1, 2, 3, 4)
    sinks = torch.zeros(2)
    with observe.observing(observe.Observer(attention=lambda *a: plain.append(a))), \
            observe.observing(observe.Observer(softmax=lambda *a: full.append(a))):
        observe.attention(None, q, q, None, True, None, True)
        observe.attention(None, q, q, None, True, None, True, softcap=5.0)
        observe.attention(None, q, q, None, True, None, True, sinks=sinks)
    assert len(plain) == 1 and [a[-2:] for a in full][:2] == [(None, None), (5.0, None)]
    assert full[2][-1] is sinks
