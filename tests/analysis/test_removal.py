"""headwise.analysis.removal: the metric after removing each ranking's least important heads
equals the metric computed under hw.ablate of those heads; the random baseline is the mean over
the same seeded draws; exact match equals headwise.train.evaluate's on the same strings;
Spearman entries equal HeadScores.spearman; bad arguments are clear errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise import HeadScores
from headwise.analysis.removal import compare, removed_metric, seq2seq_metrics
from headwise.analysis.run import default_loss
from headwise.data.synthetic import SyntheticSeq2Seq
from headwise.models import Transformer, TransformerConfig
from headwise.train.evaluate import evaluate
from tests.models.test_heads import seq2seq


def _random_scores(model, seed: int, name: str) -> HeadScores:
    gen = torch.Generator().manual_seed(seed)
    return HeadScores(name, {k: torch.rand(len(c), max(c), generator=gen, dtype=torch.float64)
                             for k, c in hw.models.head_counts(model).items()})


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16), draws=st.integers(1, 4))
def test_compare_is_the_metric_under_ablate(seed, draws):
    model = seq2seq(seed)
    task = SyntheticSeq2Seq("reverse", min_len=3, max_len=6, num_symbols=8, seed=seed)
    batch = task.eval_set(16)

    def metric(m):
        return float(default_loss(m, batch).detach())

    rankings = {"a": _random_scores(model, seed, "a"), "b": _random_scores(model, seed + 1, "b")}
    found = compare(model, rankings, metric, draws=draws, higher=False, seed=seed)
    assert found.heads == 24 and found.base == pytest.approx(metric(model), abs=1e-9)
    gen = torch.Generator().manual_seed(seed)
    cells = [(k, l, h) for k, l, h, _ in rankings["a"].ranked()]
    for fraction, (k, by_method, random) in zip((0.1, 0.25), found.rows, strict=True):
        assert k == round(fraction * 24)
        for name, scores in rankings.items():
            with hw.ablate(model, scores.least(k)), torch.no_grad():
                assert by_method[name] == pytest.approx(metric(model), abs=1e-9)
        want = []
        for _ in range(draws):
            picked = [cells[x] for x in torch.randperm(24, generator=gen)[:k].tolist()]
            heads: dict = {}
            for kind, layer, head in picked:
                heads.setdefault(kind, {}).setdefault(layer, []).append(head)
            want.append(removed_metric(model, heads, metric))
        assert random == pytest.approx(math.fsum(want) / draws, abs=1e-9)
    assert found.spearman[("a", "b")] == pytest.approx(rankings["a"].spearman(rankings["b"]))
    assert found.harm(found.base + 1) == 1 and "random (mean of" in found.table("loss")


def test_exact_match_is_evaluate_exact_match():
    task = SyntheticSeq2Seq("reverse", min_len=3, max_len=6, num_symbols=8, seed=3)
    tok = task.tokenizer
    torch.manual_seed(3)
    model = Transformer(TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, num_heads=2,
        num_layers=1, d_ff=32, max_len=16, dropout=0.0, pad_id=tok.pad_id)).eval()
    got = seq2seq_metrics(model, task.eval_set(40), task.tokenizer)
    assert got["exact_match"] == pytest.approx(evaluate(model, task, size=40)["exact_match"])
    assert 0 <= got["bleu"] <= 100


def test_errors():
    model = seq2seq(0)
    with pytest.raises(ValueError, match="no rankings"):
        compare(model, {}, lambda m: 0.0)
    with pytest.raises(ValueError, match="draws must be an int >= 1"):
        compare(model, {"a": _random_scores(model, 0, "a")}, lambda m: 0.0, draws=0)
    with pytest.raises(ValueError, match=r"fractions must lie in \(0, 1\)"):
        compare(model, {"a": _random_scores(model, 0, "a")}, lambda m: 0.0, fractions=(1.0,))
