"""headwise.importance: the gradient score equals the gradient through the model's own
head_mask argument (an independent path), the attribution score equals minus that gradient
(zero) or a float64 finite difference (mean), the ablation score equals the loss change under a
head_mask of 0, the behavioural scores equal the same averages over the returned weights;
gradient importance ranks heads like ablation on the small model trained here (Spearman > 0.5);
the default method's least important heads, zeroed, keep the exact match of that model;
clear errors for no data, an unknown method, a model that is not one, BERT without a loss."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise import checkpoint
from headwise.analysis.removal import seq2seq_metrics
from headwise.analysis.run import default_loss
from headwise.data import LMBatch, Seq2SeqBatch
from headwise.data.synthetic import SyntheticSeq2Seq
from headwise.models import Transformer, TransformerConfig, head_counts
from headwise.train.config import TrainConfig
from headwise.train.recipe import task_for
from tests.models.test_heads import bert, lm, seq2seq


def lm_batches(seed: int, count: int = 2) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 29, (3, 7), generator=gen) for _ in range(count)]


@settings(max_examples=6)
@given(seed=st.integers(0, 2**16), llama=st.booleans(), normalize=st.booleans())
def test_gradient_equals_the_head_mask_gradient(seed, llama, normalize):
    """Michel's score through hw.importance's gates == |d loss / d head_mask| with a
    ``(layers, b, h)`` head_mask of ones passed to the model, averaged over examples."""
    model, batches = lm(seed, llama), lm_batches(seed)
    got = hw.importance(model, batches, method="gradient", normalize=normalize)
    total, examples = torch.zeros(2, 4, dtype=torch.float64), 0
    pad = -100 if model.config.pad_id is None else model.config.pad_id  # labels it ignores
    for tokens in batches:
        mask = torch.ones(2, tokens.shape[0], 4, requires_grad=True)
        logits, _ = model(tokens, head_mask=mask)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                 tokens[:, 1:].flatten(), ignore_index=pad)
        (grad,) = torch.autograd.grad(loss, mask)
        total += grad.abs().sum(1).double()
        examples += tokens.shape[0]
    want = total / examples
    if normalize:
        want = want / want.norm(dim=1, keepdim=True)
    torch.testing.assert_close(got["decoder_self"], want, atol=1e-7, rtol=1e-5)
    assert got.details["examples"] == 6 and got.method == "gradient"


@settings(max_examples=6)
@given(seed=st.integers(0, 2**16), llama=st.booleans())
def test_zero_attribution_is_minus_the_head_mask_gradient(seed, llama):
    """Zeroing a head moves its output x to 0, so the first-order loss change is
    sum dL/dx * (-x) = -dL/d(head_mask) at a mask of ones shared by the batch; averaged over
    batches (the loss is a batch mean, like ablation's)."""
    model, batches = lm(seed, llama), lm_batches(seed)
    got = hw.importance(model, batches, method="attribution")
    want = torch.zeros(2, 4, dtype=torch.float64)
    for tokens in batches:
        mask = torch.ones(2, 4, requires_grad=True)
        (grad,) = torch.autograd.grad(default_loss_with_mask(model, tokens, mask), mask)
        want -= grad.double() / len(batches)
    torch.testing.assert_close(got["decoder_self"], want, atol=1e-7, rtol=1e-5)
    assert got.method == "attribution" and got.examples == 6


def default_loss_with_mask(model, tokens, mask):
    pad = -100 if model.config.pad_id is None else model.config.pad_id
    logits, _ = model(tokens, head_mask=mask)
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                             tokens[:, 1:].flatten(), ignore_index=pad)


def test_mean_attribution_is_the_derivative_towards_the_mean():
    """Mean attribution == d/dt loss(x + t (mean - x)) at t = 0 for each head, by a central
    finite difference in float64 (the loss too: the default casts logits to float32; error
    ~ t^2 ~ 1e-10 and rounding ~ 1e-16 / t ~ 1e-11 against scores ~ 1e-4 and up)."""
    model, batches = lm(3).double(), lm_batches(3)

    def loss64(m, tokens):
        return default_loss_with_mask(m, tokens, None)

    got = hw.importance(model, batches, method="attribution", ablation="mean", loss=loss64)
    means = hw.head_means(model, batches)
    from headwise.analysis.ablation import edit_heads
    t = 1e-5

    def moved(x, layer, head, step):
        picked = torch.zeros(x.shape[1], 1, 1, dtype=torch.bool)
        picked[head] = True
        return torch.where(picked, x + step * (means["decoder_self"][layer][:, None] - x), x)

    layers = model.attention_layers()["decoder_self"]
    for layer, head in [(0, 1), (1, 3)]:
        loss = []
        for step in (t, -t):
            edit = partial(moved, layer=layer, head=head, step=step)
            with edit_heads([(layers[layer], edit)]), torch.no_grad():
                loss.append(sum(float(loss64(model, b)) for b in batches) / len(batches))
        assert float(got["decoder_self"][layer, head]) == pytest.approx(
            (loss[0] - loss[1]) / (2 * t), rel=1e-5, abs=1e-10)


@settings(max_examples=2)
@given(seed=st.integers(0, 2**16), mode=st.sampled_from(["zero", "mean"]))
def test_ablation_is_the_loss_change(seed, mode):
    model = seq2seq(seed)
    task = SyntheticSeq2Seq("reverse", min_len=3, max_len=6, num_symbols=8, seed=seed)
    batches = [task.batch(0, 4), task.batch(1, 3)]
    got = hw.importance(model, batches, method="ablation", ablation=mode)
    with torch.no_grad():
        base = sum(float(default_loss(model, b)) for b in batches) / 2
    means = hw.head_means(model, batches)
    for kind, layer, head in [("cross", 1, 3), ("encoder_self", 0, 1), ("decoder_self", 1, 0)]:
        if mode == "zero":
            mask = {kind: torch.ones(2, 4)}
            mask[kind][layer, head] = 0
            with torch.no_grad():
                ablated = sum(float(torch.nn.functional.cross_entropy(
                    model(b.src, b.tgt_in, src_valid_lens=b.src_lens, head_mask=mask)[0]
                    .flatten(0, 1), b.tgt_out.flatten(), ignore_index=0)) for b in batches) / 2
        else:
            with hw.ablate(model, {kind: {layer: [head]}}, mode="mean", means=means), \
                    torch.no_grad():
                ablated = sum(float(default_loss(model, b)) for b in batches) / 2
        assert got[kind][layer, head] == pytest.approx(ablated - base, abs=1e-5)
    assert got.details["baseline_loss"] == pytest.approx(base, abs=1e-6)


@settings(max_examples=6)
@given(seed=st.integers(0, 2**16), method=st.sampled_from(["prev_token", "sink", "entropy",
                                                           "induction"]))
def test_behaviours_are_averages_of_the_weights(seed, method):
    model = lm(seed)
    gen = torch.Generator().manual_seed(seed)
    half = torch.randint(0, 29, (3, 5), generator=gen)
    tokens = torch.cat([half, half], 1)  # repeated: induction has something to find
    got = hw.importance(model, tokens, method=method)
    _, att = model(tokens, return_weights=True)
    n = tokens.shape[1]
    for layer, w in enumerate(att["decoder_self"]):  # (b, h, i, j)
        if method == "prev_token":
            rows = torch.cat([torch.zeros(3, 4, 1), w.diagonal(-1, 2, 3)], -1)
        elif method == "sink":
            rows = w[..., 0]
        elif method == "entropy":
            rows = torch.special.entr(w).sum(-1)
        else:  # key j counts for query i when token j-1 equals token i, j-1 < i
            prev = torch.cat([torch.full((3, 1), -1), tokens[:, :-1]], 1)
            hit = (prev[:, None, :] == tokens[:, :, None]) & \
                  (torch.arange(n)[None, :] - 1 < torch.arange(n)[:, None]) & \
                  (torch.arange(n) >= 1)
            rows = (w * hit[:, None].float()).sum(-1)
        torch.testing.assert_close(got["decoder_self"][layer], rows.mean((0, 2)).double(),
                                   atol=1e-5, rtol=1e-5)


def test_cross_attention_has_no_previous_token_score():
    model = seq2seq(1)
    task = SyntheticSeq2Seq("reverse", min_len=3, max_len=6, num_symbols=8)
    got = hw.importance(model, task.batch(0, 4), method="prev_token")
    assert got["cross"].isnan().all() and not got["decoder_self"].isnan().any()
    assert all(kind != "cross" for kind, *_ in got.ranked())


@pytest.fixture(scope="module")
def trained():
    """A Transformer trained here to reverse strings (a few seconds), its task and held-out
    strings: 256 to score on, 512 others to measure exact match on."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a d_model-32 model: more threads only add overhead
    try:
        torch.manual_seed(0)
        task = SyntheticSeq2Seq("reverse", min_len=3, max_len=8, num_symbols=8)
        tok = task.tokenizer
        model = Transformer(TransformerConfig(
            src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=32,
            num_heads=4, num_layers=2, d_ff=64, max_len=16, dropout=0.0, pad_id=tok.pad_id))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        first = None
        for step in range(STEPS):
            loss = default_loss(model, task.batch(step, 32))
            first = first if first is not None else float(loss.detach())
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    scored, measured = split(task.eval_set(768), 256)
    assert float(default_loss(model, scored).detach()) < first / 3  # it learned
    return model.eval(), task, scored, measured


STEPS = 300


def split(batch: Seq2SeqBatch, first: int) -> tuple[Seq2SeqBatch, Seq2SeqBatch]:
    fields = [f.name for f in dataclasses.fields(batch)]
    return tuple(type(batch)(**{f: getattr(batch, f)[part] for f in fields})
                 for part in (slice(0, first), slice(first, None)))


def test_gradient_ranks_heads_like_ablation_on_a_trained_model(trained):
    """Michel et al.'s claim in small, true on this model (not on a converged one: issue 30):
    the expected |dL/dxi| ranks the 24 heads like the loss increase when each is zeroed,
    far better than chance (Spearman > 0.5)."""
    model, _, held_out, _ = trained
    gradient = hw.importance(model, held_out, method="gradient", normalize=False)
    ablation = hw.importance(model, held_out, method="ablation")
    assert gradient.spearman(ablation) > 0.5


def keeps_exact_match(model, tok, scored, measured, method: str | None = None,
                      removed: int = 4) -> tuple[float, float]:
    """Exact match on ``measured`` before and after zeroing the ``removed`` least important
    heads by ``method`` (None: the default), scored on ``scored``."""
    scores = hw.importance(model, scored) if method is None else \
        hw.importance(model, scored, method=method)
    metric = partial(seq2seq_metrics, batch=measured, tokenizer=tok)
    base = metric(model)["exact_match"]
    with hw.ablate(model, scores.least(removed)):
        after = metric(model)["exact_match"]
    return base, after


def test_the_default_method_least_important_heads_keep_exact_match(trained):
    """Issue 30: the heads the default method calls least important are the ones the model can
    lose; zeroing four of 24 keeps >= 95% of its held-out exact match. (On this model
    single-head ablation does not: four heads each harmless alone, 0.96 -> 0.80 together.)"""
    model, task, scored, measured = trained
    base, after = keeps_exact_match(model, task.tokenizer, scored, measured)
    assert base > 0.5, f"the model did not learn (exact match {base})"
    assert after >= 0.95 * base, (base, after)
    assert hw.importance(model, scored).method == "greedy"


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "importance" / "reverse"


def test_on_a_converged_checkpoint_the_default_keeps_exact_match():
    """The committed fixture (a demo-shaped reversal model trained to convergence,
    tests/fixtures/importance/make.py): the default method's four least important heads,
    zeroed, keep >= 95% of held-out exact match. Gradient importance, the default before
    issue 30, fails this on that model (its training loss is saturated)."""
    loaded = checkpoint.load(FIXTURE)
    saved = TrainConfig.from_dict(loaded.metadata["train_config"]).resolved()
    task = task_for(saved)
    scored, measured = split(task.eval_set(768), 256)
    base, after = keeps_exact_match(loaded.model.eval(), task.tokenizer, scored, measured)
    assert base > 0.9, f"the fixture is not converged (exact match {base})"
    assert after >= 0.95 * base, (base, after)


def test_errors():
    model = lm(0)
    with pytest.raises(ValueError, match="no data: batches is empty"):
        hw.importance(model, [])
    with pytest.raises(ValueError, match="unknown method 'gradeint'.*did you mean 'gradient'"):
        hw.importance(model, lm_batches(0), method="gradeint")
    with pytest.raises(ValueError, match="ablation must be one of"):
        hw.importance(model, lm_batches(0), method="ablation", ablation="resample")
    with pytest.raises(TypeError, match="expected a headwise model"):
        hw.importance(torch.nn.Linear(3, 3), lm_batches(0))
    with pytest.raises(TypeError, match="no default loss for BertModel"):
        hw.importance(bert(0), lm_batches(0))
    with pytest.raises(TypeError, match="loss must be a callable"):
        hw.importance(model, lm_batches(0), loss=3)
    with pytest.raises(TypeError, match="must return a scalar tensor"):
        hw.importance(model, lm_batches(0), loss=lambda m, b: m(b)[0])
    for method in ("gradient", "attribution"):
        with pytest.raises(ValueError, match="does not depend on any head"):
            hw.importance(model, lm_batches(0), method=method,
                          loss=lambda m, b: torch.tensor(1.0))
    assert model.training is False


def test_bert_with_a_user_loss_and_lm_batches():
    """Any model scores with a user loss; an LMBatch uses the LM's own loss; train mode is
    restored afterwards."""
    model = bert(2).train()
    ids = lm_batches(2)
    scores = hw.importance(model, ids, method="gradient", loss=lambda m, b: m(b)[0].pow(2).mean())
    assert set(scores.kinds) == {"encoder_self"} and model.training
    assert (scores["encoder_self"] > 0).all()
    order = hw.importance(model, ids, loss=lambda m, b: m(b)[0].pow(2).mean())  # greedy
    assert sorted(order["encoder_self"].flatten().tolist()) == list(range(8)) and model.training
    lm_model = lm(2)
    batch = LMBatch(inputs=ids[0][:, :-1], labels=ids[0][:, 1:], valid_lens=torch.full((3,), 6),
                    scored=torch.ones(3, 6, dtype=torch.bool))
    assert hw.importance(lm_model, batch, method="ablation")["decoder_self"].shape == \
        (2, head_counts(lm_model)["decoder_self"][0])


@pytest.mark.parametrize("method", ["gradient", "ablation", "attribution", "induction"])
def test_scoring_stays_on_the_fused_kernel(method, monkeypatch):
    """Strict mode raises for any attention call off the fused kernel: scoring makes none
    (behaviours recompute their weights from the kernel's log-sum-exp, chunk by chunk)."""
    monkeypatch.setenv("HEADWISE_STRICT", "1")
    scores = hw.importance(lm(4, llama=True), lm_batches(4), method=method)
    assert not scores["decoder_self"].isnan().any()
