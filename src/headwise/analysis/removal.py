"""Whether a head ranking is right, checked the only way it can be: remove the heads it calls
least important and measure the model's own metric (held-out exact match, BLEU, loss,
similarity), against as many heads drawn at random. :func:`compare` is what
``headwise heads score --compare`` and ``benchmarks/importance.py`` print.

Removing a head here is zeroing its output (:func:`headwise.ablate`, the same as a
``head_mask`` of 0 and as pruning it, :func:`headwise.prune_heads`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from headwise.analysis.ablation import ablate
from headwise.analysis.head_scores import HeadScores, as_heads
from headwise.data import Seq2SeqBatch
from headwise.train.evaluate import greedy_decode, strip_special

__all__ = ["Comparison", "compare", "removed_metric", "seq2seq_metrics"]

Metric = Callable[[nn.Module], float]


def removed_metric(model: nn.Module, heads, metric: Metric) -> float:
    """``metric(model)`` with ``heads`` (``{kind: {layer: [heads]}}``) zeroed."""
    with ablate(model, heads), torch.no_grad():
        return float(metric(model))


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found.

    Attributes:
        spearman: ``{(a, b): rho}`` for every pair of methods.
        base: the metric with every head present.
        rows: one per k: ``(k, {method: metric with its k least important heads zeroed},
            mean metric over the random draws)``.
        higher: whether a larger metric is better.
        draws: random draws per k.
        heads: how many heads were ranked.
    """

    methods: tuple[str, ...]
    spearman: dict[tuple[str, str], float]
    base: float
    rows: list[tuple[int, dict[str, float], float]]
    higher: bool
    draws: int
    heads: int

    def harm(self, value: float) -> float:
        """How much worse than the unablated model ``value`` is (>= 0 is worse)."""
        return self.base - value if self.higher else value - self.base

    def table(self, metric_name: str) -> str:
        """Two markdown tables: Spearman between methods; the metric after removing k heads."""
        names = self.methods
        lines = ["Spearman | " + " | ".join(names), "---" + " | ---" * len(names)]
        for a in names:
            lines.append(f"{a} | " + " | ".join(
                "1" if a == b else f"{self.spearman[(a, b)]:.2f}" for b in names))
        total = self.heads
        head = [f"heads removed (of {total})", *(f"{m}: {metric_name}" for m in names),
                f"random (mean of {self.draws})"]
        lines += ["", " | ".join(head), " | ".join("---" for _ in head),
                  " | ".join(["0", *(f"{self.base:.4g}" for _ in names), f"{self.base:.4g}"])]
        for k, by_method, random in self.rows:
            lines.append(" | ".join([f"{k} ({k / total:.0%})",
                                     *(f"{by_method[m]:.4g}" for m in names), f"{random:.4g}"]))
        return "\n".join(lines)


def compare(model: nn.Module, scores: Mapping[str, HeadScores], metric: Metric, *,
            fractions=(0.1, 0.25), draws: int = 10, higher: bool = True,
            seed: int = 0) -> Comparison:
    """Zero the ``k = round(fraction * heads)`` (at least 1) least important heads of each
    ranking in ``scores`` and measure ``metric(model)``; the same for ``draws`` sets of ``k``
    heads drawn at random (seeded); Spearman correlations between every pair of rankings."""
    if not scores:
        raise ValueError("compare: no rankings; pass {name: headwise.importance(...)}")
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"compare: draws must be an int >= 1, got {draws!r}")
    names = tuple(scores)
    cells = [(kind, layer, head) for kind, layer, head, _ in scores[names[0]].ranked()]
    spearman = {(a, b): scores[a].spearman(scores[b]) for a in names for b in names if a != b}
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        base = removed_metric(model, {}, metric)
        rows = []
        for fraction in fractions:
            if not 0 < fraction < 1:
                raise ValueError(f"compare: fractions must lie in (0, 1), got {fraction!r}")
            k = max(1, round(fraction * len(cells)))
            by_method = {m: removed_metric(model, scores[m].least(k), metric) for m in names}
            random = [removed_metric(model, as_heads([cells[x] for x in
                                                       torch.randperm(len(cells), generator=gen)
                                                       [:k].tolist()]), metric)
                      for _ in range(draws)]
            rows.append((k, by_method, math.fsum(random) / draws))
    finally:
        model.train(was_training)
    return Comparison(names, spearman, base, rows, higher, draws, len(cells))


@torch.no_grad()
def seq2seq_metrics(model: nn.Module, batch: Seq2SeqBatch, tokenizer) -> dict[str, float]:
    """Greedy decoding of ``batch``: ``exact_match`` (fraction of targets reproduced exactly)
    and ``bleu`` (sacrebleu corpus BLEU of the decoded strings against the targets)."""
    import sacrebleu

    tok = tokenizer
    out = greedy_decode(model, batch.src, batch.src_lens, bos_id=tok.bos_id, eos_id=tok.eos_id,
                        pad_id=tok.pad_id, max_new_tokens=batch.tgt_out.shape[1])
    got = [strip_special(row, tok.eos_id, tok.pad_id) for row in out.tolist()]
    want = [strip_special(row, tok.eos_id, tok.pad_id) for row in batch.tgt_out.tolist()]
    exact = sum(g == w for g, w in zip(got, want, strict=True)) / max(len(want), 1)
    bleu = sacrebleu.corpus_bleu([tok.decode(g) for g in got],
                                 [[tok.decode(w) for w in want]]).score
    return {"exact_match": exact, "bleu": bleu}
