"""The default importance method, greedy (lazy iterative zero ablation), against brute force:
its recorded losses are the loss with its first heads zeroed, measured directly; where heads'
effects add up (so lazy and exhaustive greedy must agree) it removes heads in the order of an
exhaustive greedy search that re-measures every remaining head at every step; stopped after k
steps it removes the same first k heads, in the same order, for fewer passes; its first round
is single-head zero ablation, returned with the scores (``details["alone"]``, ``agreement``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise.analysis.head_scores import spearman
from headwise.analysis.run import default_loss
from headwise.data.synthetic import SyntheticSeq2Seq
from headwise.models.heads import attention_layers
from tests.models.test_heads import lm, seq2seq


def lm_batches(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 29, (3, 9), generator=gen) for _ in range(2)]


def order(scores) -> list[tuple[str, int, int]]:
    """The heads in the order greedy removes them (score = the step a head goes at)."""
    return [(kind, layer, head) for kind, layer, head, _ in scores.ranked(descending=False)]


def loss_without(model, cells, batches, loss=default_loss) -> float:
    """The mean loss over ``batches`` with ``cells`` zeroed, in float64 (the reference)."""
    heads: dict = {}
    for kind, layer, head in cells:
        heads.setdefault(kind, {}).setdefault(layer, []).append(head)
    with hw.ablate(model, heads), torch.no_grad():
        return sum(float(loss(model, b)) for b in batches) / len(batches)


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16), llama=st.booleans())
def test_the_recorded_losses_are_the_loss_with_the_first_heads_zeroed(seed, llama):
    model, batches = lm(seed, llama=llama), lm_batches(seed)
    got = hw.importance(model, batches)
    gone = order(got)
    losses = got.details["losses"]
    assert len(losses) == got.details["steps"] == 4  # half of 2 x 4 heads
    for step, value in enumerate(losses):
        assert value == pytest.approx(loss_without(model, gone[:step + 1], batches), rel=1e-6)
    assert got.details["baseline_loss"] == pytest.approx(loss_without(model, [], batches),
                                                         rel=1e-6)


def additive_loss(model, batch) -> torch.Tensor:
    """A loss linear in every head's output: each attention module applied alone to a fixed
    input, its output dotted with a fixed direction. Zeroing a set of heads then changes it by
    the sum of their single-head changes, so lazy greedy is exact greedy here."""
    gen = torch.Generator().manual_seed(int(batch.sum()))
    total = torch.zeros(())
    for mods in attention_layers(model).values():
        for mha in mods:
            x = torch.randn(2, 5, mha.embed_dim, generator=gen)
            out, _ = mha(x)
            total = total + (out * torch.randn(out.shape, generator=gen)).sum()
    return total


def exhaustive_greedy(model, batches, loss, steps: int) -> list[tuple[str, int, int]]:
    """The brute-force reference: at every step, measure every remaining head with the heads
    gone so far and remove the cheapest."""
    left = [(kind, layer, head) for kind, mods in attention_layers(model).items()
            for layer, mha in enumerate(mods) for head in range(mha.num_heads)]
    gone: list = []
    for _ in range(steps):
        cell = min(left, key=lambda c: loss_without(model, [*gone, c], batches, loss))
        left.remove(cell)
        gone.append(cell)
    return gone


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_where_heads_add_up_lazy_greedy_is_exhaustive_greedy(seed):
    model, batches = lm(seed), lm_batches(seed)
    got = hw.importance(model, batches, loss=additive_loss, steps=6)
    assert order(got)[:6] == exhaustive_greedy(model, batches, additive_loss, 6)
    # every step after the first re-measures at least its head (stale since the first round);
    # when the heads gone so far raised the loss, stale heads below the re-measured one are
    # measured too, but never more than the exhaustive search's 8 + 7 + 6 + 5 + 4 + 3
    assert 8 + 5 <= got.details["passes"] <= 8 + 7 + 6 + 5 + 4 + 3


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.integers(1, 12))
def test_stopped_after_k_steps_it_removes_the_same_first_k_heads(seed, k):
    """Cross-attention and both self-attention kinds: 24 heads; the full search goes to 12."""
    model = seq2seq(seed)
    task = SyntheticSeq2Seq("reverse", min_len=3, max_len=6, num_symbols=8, seed=seed)
    batches = [task.batch(0, 4), task.batch(1, 3)]
    full = hw.importance(model, batches)
    early = hw.importance(model, batches, steps=k)
    assert order(early)[:k] == order(full)[:k]
    assert early.details["losses"] == full.details["losses"][:k]
    assert early.details["steps"] == k and full.details["steps"] == 12
    assert early.details["passes"] <= full.details["passes"]
    assert sorted(early.flat().tolist()) == list(range(24))


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_the_first_round_is_single_head_ablation_and_gives_the_agreement(seed):
    model, batches = lm(seed, llama=True), lm_batches(seed)
    got = hw.importance(model, batches, steps=2)
    alone = hw.HeadScores("ablation", got.details["alone"])
    reference = hw.importance(model, batches, method="ablation")
    torch.testing.assert_close(alone["decoder_self"], reference["decoder_self"],
                               rtol=0, atol=1e-12)
    assert got.agreement == pytest.approx(spearman(got.flat(), reference.flat()))
    assert "agreement with single-head zero ablation" in got.describe()
    mean = hw.importance(model, batches, ablation="mean", steps=2)
    assert mean.agreement is None  # its first round is mean ablation, not the reference


def test_steps_errors():
    model, batches = lm(0), lm_batches(0)
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="steps is for method 'greedy', an int >= 1"):
            hw.importance(model, batches, steps=bad)
    with pytest.raises(ValueError, match="steps is for method 'greedy'"):
        hw.importance(model, batches, method="ablation", steps=2)
    assert hw.importance(model, batches, steps=100).details["steps"] == 8  # at most every head
