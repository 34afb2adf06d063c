"""Ablation passes that replay the blocks before the first changed one
(:class:`headwise.analysis.replay.Replay`) against full passes: every loss equals the loss of
the same heads zeroed by :func:`headwise.ablate` with every block computed; greedy's order,
losses and first round, and single-head ablation's scores, equal those found with the replay
off; and the blocks computed are exactly the ones at or after each pass's first changed block
(a count that full passes exceed).

Tolerance: a replayed block returns the output it computed from equal inputs, so a pass does
the same float32 arithmetic as the full pass. A kernel may still block a sum differently for
an input at another address, so losses (~3, summed over <= 64 tokens) are compared to
rel 1e-6, about 8 float32 ulps (2**-23 = 1.2e-7).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise.analysis.replay import Replay
from headwise.analysis.run import default_loss
from headwise.data.synthetic import SyntheticSeq2Seq
from headwise.models.heads import attention_layers
from headwise.train.evaluate import greedy_decode
from tests.analysis.test_greedy import lm_batches, loss_without, order
from tests.models.test_heads import bert, lm, seq2seq

REL = 1e-6
BLOCKS = {"gpt": 2, "llama": 2, "seq2seq": 2 + 2, "bert": 2}  # each called once per batch


def cells_of(model) -> list[tuple[str, int, int]]:
    return [(kind, layer, head) for kind, mods in attention_layers(model).items()
            for layer, mha in enumerate(mods) for head in range(mha.num_heads)]


def seq2seq_case(seed: int):
    model = seq2seq(seed)
    task = SyntheticSeq2Seq("reverse", min_len=3, max_len=6, num_symbols=8, seed=seed)
    return model, [task.batch(0, 4), task.batch(1, 3)], default_loss, task


def bert_loss(model, batch) -> torch.Tensor:
    hidden, _ = model(batch)
    return (hidden ** 2).mean()


def case(kind: str, seed: int):
    """A random small model, its batches and a loss."""
    if kind == "seq2seq":
        return seq2seq_case(seed)[:3]
    if kind == "bert":
        gen = torch.Generator().manual_seed(seed)
        return bert(seed), [torch.randint(0, 31, (2, 7), generator=gen) for _ in range(2)], \
            bert_loss
    return lm(seed, llama=kind == "llama"), lm_batches(seed), default_loss


@pytest.fixture
def no_replay(monkeypatch):
    """Replay with no blocks known: every pass computes every block (the full passes)."""
    monkeypatch.setattr(Replay, "_find_blocks", lambda self: None)


@settings(max_examples=6, deadline=None)
@given(kind=st.sampled_from(["gpt", "llama", "seq2seq", "bert"]), seed=st.integers(0, 2**16),
       data=st.data())
def test_every_pass_equals_the_full_pass_with_the_same_heads_zeroed(kind, seed, data):
    model, batches, loss = case(kind, seed)
    cells = cells_of(model)
    some = st.lists(st.sampled_from(cells), max_size=5, unique=True)

    def run():
        return sum(float(loss(model, b)) for b in batches) / len(batches)

    with Replay(model) as replay:
        for _ in range(4):
            base = data.draw(some)
            replay.rebase(base)
            for removed in (base, *(base + data.draw(some) for _ in range(3))):
                removed = list(dict.fromkeys(removed))
                want = loss_without(model, removed, batches, loss)
                assert replay.measure(removed, run) == pytest.approx(want, rel=REL)
        assert replay.replayed > 0
    assert all("forward" not in vars(block) for block in model.modules())


def run_both(method: str, kind: str, seed: int, **kwargs):
    """``hw.importance`` with the replay and with full passes (the replay's blocks hidden)."""
    model, batches, loss = case(kind, seed)
    got = hw.importance(model, batches, method=method, loss=loss, **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Replay, "_find_blocks", lambda self: None)
        full = hw.importance(model, batches, method=method, loss=loss, **kwargs)
    return got, full


@settings(max_examples=4, deadline=None)
@given(kind=st.sampled_from(["gpt", "llama", "seq2seq", "bert"]), seed=st.integers(0, 2**16),
       ablation=st.sampled_from(["zero", "mean"]))
def test_greedy_removes_the_same_heads_in_the_same_order_as_with_full_passes(kind, seed,
                                                                            ablation):
    got, full = run_both("greedy", kind, seed, ablation=ablation)
    assert order(got) == order(full)
    assert got.details["losses"] == pytest.approx(full.details["losses"], rel=REL)
    assert got.details["passes"] == full.details["passes"]
    for kind_, rows in full.details["alone"].items():
        torch.testing.assert_close(torch.tensor(got.details["alone"][kind_]),
                                   torch.tensor(rows), rtol=0, atol=REL * 10)
    # full passes compute every block of every pass: the unablated one, then each counted pass
    blocks = got.details["blocks"]
    every = (got.details["passes"] + 1) * BLOCKS[kind] * 2  # two batches
    assert blocks["run"] + blocks["replayed"] == every and blocks["run"] < every


@settings(max_examples=3, deadline=None)
@given(kind=st.sampled_from(["llama", "seq2seq", "bert"]), seed=st.integers(0, 2**16))
def test_single_head_ablation_scores_equal_the_full_passes(kind, seed):
    got, full = run_both("ablation", kind, seed)
    for name in got.scores:
        torch.testing.assert_close(got[name], full[name], rtol=0, atol=REL * 10)


@pytest.mark.parametrize("llama", [False, True])
def test_single_head_ablation_computes_only_the_blocks_from_the_heads_own_on(llama):
    """Two batches, 2 blocks of 4 heads: the unablated pass computes 2 x 2 blocks; a head of
    block 0 computes both blocks, one of block 1 only block 1 (block 0 replayed)."""
    model, batches = lm(3, llama=llama), lm_batches(3)
    got = hw.importance(model, batches, method="ablation")
    per_batch = 2 + 4 * 2 + 4 * 1
    assert got.details["blocks"] == {"run": 2 * per_batch, "replayed": 2 * 4}
    full = 2 * 2 * (1 + 8)  # what full passes compute: every block of every pass
    assert got.details["blocks"]["run"] + got.details["blocks"]["replayed"] == full


def test_a_call_with_a_kv_cache_runs_and_decoding_metrics_are_unchanged():
    """Greedy decoding calls the decoder's blocks with a KV cache, which is never replayed;
    the encoder's blocks still are (the benchmark's full ablation of exact match): the
    decoded tokens are those of a full pass with the same head zeroed."""
    model, batches, _, task = seq2seq_case(5)

    batch, tok = batches[0], task.tokenizer

    def exact():
        return greedy_decode(model, batch.src, batch.src_lens, bos_id=tok.bos_id,
                             eos_id=tok.eos_id, pad_id=tok.pad_id, max_new_tokens=8).tolist()

    with Replay(model) as replay:
        base = replay.measure([], exact)
        for cell in cells_of(model):
            with hw.ablate(model, {cell[0]: {cell[1]: [cell[2]]}}), torch.no_grad():
                want = exact()
            assert replay.measure([cell], exact) == want
    with torch.no_grad():
        assert base == exact()
    assert replay.replayed > 0


def test_with_autograd_on_nothing_is_replayed_and_the_blocks_come_back_after_an_error():
    model, batches = lm(1), lm_batches(1)
    kept = []

    def with_grad():
        with torch.enable_grad():
            kept.append(default_loss(model, batches[0]))
        return float(kept[-1])

    with pytest.raises(RuntimeError, match="boom"), Replay(model) as replay:
        replay.measure([], lambda: float(default_loss(model, batches[0])))
        value = replay.measure([("decoder_self", 1, 0)], with_grad)
        assert kept[-1].requires_grad and replay.replayed == 0
        assert value == pytest.approx(loss_without(model, [("decoder_self", 1, 0)],
                                                   batches[:1]), rel=REL)
        raise RuntimeError("boom")
    assert all("forward" not in vars(block) for block in model.modules())


def test_a_pass_on_other_inputs_computes_every_block():
    """The remembered calls are for the first batch; a pass over another batch matches none
    of them (its inputs differ), so it computes everything and still equals the full pass."""
    model, (first, other) = lm(2, llama=True), lm_batches(2)
    cell = ("decoder_self", 1, 2)
    with Replay(model) as replay:
        replay.measure([], lambda: float(default_loss(model, first)))
        got = replay.measure([cell], lambda: float(default_loss(model, other)))
        assert replay.replayed == 0 and replay.run == 2 + 2
    assert got == pytest.approx(loss_without(model, [cell], [other]), rel=REL)
