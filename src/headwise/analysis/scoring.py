"""Which heads matter: ``headwise.importance(model, batches, method=...)`` -> :class:`HeadScores`,
a ``(layers, heads)`` table per attention kind.

Methods (the default is ``"greedy"``: the question is which heads the model can lose, and the
answer is measured by removing them; issue 30):

- ``"greedy"`` (default): iterative ablation, Michel et al.'s iterative pruning with the
  measured loss in place of the gradient: remove the head whose removal raises the loss least,
  then try the rest again with it removed, and so on; the score is the step at which a head
  goes (0 = first; ``details["losses"]``: the loss after each step), up to half of the heads
  or ``steps``; the rest, which no pruning that far reaches, follow by the loss last measured.
  It sees what single-head ablation cannot: heads that stand in for each other, each harmless
  to lose alone, harmful together. Its first round is single-head zero ablation, returned as
  ``details["alone"]`` and as the agreement. Evaluated lazily (see :func:`_greedy`): 1.5-3
  forward passes per head per batch on the reversal models and SmolLM2, 13 on
  all-MiniLM-L6-v2 (going to half the heads), where single-head ablation takes one; stopping
  at the k you will remove (``steps=k``) keeps the first k and skips the rest of the search.
  Each pass computes only the blocks from the first whose removed heads differ from those
  gone so far (:mod:`headwise.analysis.replay`; ``details["blocks"]``): about half of them.
- ``"ablation"``: how much the loss rises when the head alone is removed (``ablation="zero"``,
  the default: its output is 0, exactly what pruning it does; ``"mean"``: its mean output over
  the same batches), averaged over batches. Negative: the model does better without it. One
  forward pass per head, from the head's own block on: the effect of each head alone, which sets of heads do not add up to.
- ``"attribution"`` (attribution patching, Nanda 2023; Syed, Rager & Conmy 2023): the
  first-order estimate of ablation, ``sum dL/dx * (x_removed - x)`` over each head's output
  ``x (b, i, d)`` (``x_removed`` is 0 or the head's mean, as ``ablation`` says), from one
  forward and one backward pass per batch. Only as good as the linearisation: on the demo's
  converged reversal model removing a head is far from linear and its ranking is no better
  than chance (measure with ``headwise heads score --compare`` before trusting it).
- ``"gradient"`` (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?",
  eq. 2): a gate ``xi_h = 1`` multiplies each head's output, and the score is the expected
  ``|dL/dxi_h|`` over the examples (one gate per example, so the absolute value is taken per
  example), divided by its layer's L2 norm over heads (their section 4.1; ``normalize=False``
  keeps the raw expectation). Per-layer normalised scores are not comparable across layers,
  and at a converged model's optimum (training loss ~1e-4) the gradients are noise: on the
  demo's reversal model it agrees with ablation at Spearman 0.15-0.4 and its four "least
  important" heads, zeroed, take exact match from 1.00 to 0.30-0.60. Kept by name (the default
  before issue 30).
- ``"prev_token"``, ``"induction"``, ``"sink"``, ``"entropy"``: what the head does, from the
  streaming statistics of :mod:`headwise.stats` (weight on the previous token, on the token
  after an earlier occurrence of the current one, on the first key; row entropy in nats),
  averaged over query rows and examples. Previous-token and induction are self-attention
  behaviours (NaN for cross-attention); induction needs the token ids of the sequence
  (language models, BERT, and a Transformer's decoder).

The loss is the model's own training loss (teacher-forced cross-entropy; see
:func:`headwise.analysis.run.default_loss`) or ``loss(model, batch) -> scalar tensor`` (lower is
better). Scores are computed in eval mode (no dropout); the model's mode is restored.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch
from torch import nn

from headwise import stats as _stats
from headwise.analysis.ablation import ABLATIONS, edit_heads, head_means
from headwise.analysis.head_scores import HeadScores
from headwise.analysis.replay import Replay
from headwise.analysis.run import as_batches, batch_size, default_loss, run_batch
from headwise.data import LMBatch, Seq2SeqBatch
from headwise.finders import transformers_model
from headwise.models.heads import attention_layers, head_count
from headwise.train.evaluate import device_of

__all__ = ["BEHAVIOURS", "DEFAULT_METHOD", "METHODS", "importance"]

BEHAVIOURS = {"prev_token": "prev_token", "induction": "induction", "sink": "sink",
              "entropy": "entropy"}  # method -> HeadStats field
DEFAULT_METHOD = "greedy"
METHODS = ("ablation", "greedy", "attribution", "gradient", *BEHAVIOURS)
_SELF_ONLY = ("prev_token", "induction")


def importance(model: nn.Module, batches, *, method: str = DEFAULT_METHOD,
               loss: Callable | None = None, ablation: str = "zero",
               normalize: bool = True, steps: int | None = None) -> HeadScores:
    """Score every head of ``model`` on ``batches`` (see the module docstring for the methods).

    Args:
        model: a headwise model (TransformerLM, Transformer, Encoder, Decoder, BertModel).
        batches: an iterable of batches, or one batch: Seq2SeqBatch / LMBatch, ``(b, n)``
            token-id tensors, dicts of keyword arguments of the model's forward.
        method: one of :data:`METHODS` (default ``"greedy"``).
        loss: ``loss(model, batch) -> scalar tensor``, lower is better (default: the model's
            training loss; required for BERT, which has none).
        ablation: ``"zero"`` or ``"mean"``: what removing a head means (methods
            ``"greedy"``, ``"ablation"`` and ``"attribution"``).
        normalize: method ``"gradient"``: divide each layer's scores by their L2 norm.
        steps: method ``"greedy"``: how many heads go one by one (default: half of them); the
            rest follow by the loss last measured. A caller that will remove at most ``k``
            heads loses nothing with ``steps=k``: the first ``k`` are the same heads in the
            same order, for fewer forward passes.

    Returns:
        :class:`HeadScores` with ``{kind: (layers, heads)}`` and the number of examples.
    """
    if method not in METHODS:
        close = difflib.get_close_matches(str(method), METHODS, n=1)
        raise ValueError(f"importance: unknown method {method!r}; choose from "
                         f"{', '.join(METHODS)}" + (f" (did you mean {close[0]!r}?)"
                                                    if close else ""))
    if ablation not in ABLATIONS:
        raise ValueError(f"importance: ablation must be one of {ABLATIONS}, got {ablation!r}")
    if steps is not None and (method != "greedy" or not isinstance(steps, int)
                              or isinstance(steps, bool) or steps < 1):
        raise ValueError(f"importance: steps is for method 'greedy', an int >= 1 (the most "
                         f"heads you will remove), got steps={steps!r} with method {method!r}")
    if loss is not None and not callable(loss):
        raise TypeError(f"importance: loss must be a callable loss(model, batch) -> scalar "
                        f"tensor, got {type(loss).__name__}")
    layers = attention_layers(model)
    batches = as_batches(batches, "importance", device_of(model))
    loss = loss or default_loss
    was_training = model.training
    model.eval()
    try:
        if method == "gradient":
            scores = _gradient(model, layers, batches, loss, normalize)
        elif method == "ablation":
            scores = _ablation(model, layers, batches, loss, ablation)
        elif method == "greedy":
            scores = _greedy(model, layers, batches, loss, ablation, steps)
        elif method == "attribution":
            scores = _attribution(model, layers, batches, loss, ablation)
        else:
            scores = _behaviour(model, layers, batches, method)
    finally:
        model.train(was_training)
    sizes = [batch_size(b) for b in batches]
    return replace(scores, examples=None if None in sizes else sum(sizes))


def _table(layers, kind: str) -> torch.Tensor:
    mods = layers[kind]
    return torch.full((len(mods), max(head_count(m) for m in mods)), float("nan"),
                      dtype=torch.float64)


def _scalar(value, where: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise TypeError(f"importance: the loss must return a scalar tensor ({where}), got "
                        f"{type(value).__name__}{tuple(getattr(value, 'shape', ()))}")
    if not torch.isfinite(value):
        raise ValueError(f"importance: the loss is {float(value)} on a batch; check the batches "
                         "(all labels padding?) and the model")
    return value.reshape(())


def _head_grads(model, layers, batch, loss, probe, method: str) -> list:
    """One forward and backward of ``loss`` with ``probe`` at every head's output:
    ``[(kind, layer, kept, dL/d(probe's leaf))]`` (``kept``: what the probe kept of the heads'
    output; the gradient ``None`` where the loss does not reach that layer)."""
    found: list = []
    edits = [(mha, partial(probe, found=found, kind=kind, layer=layer))
             for kind, mods in layers.items() for layer, mha in enumerate(mods)]
    with edit_heads(edits):
        value = _scalar(loss(model, batch), f"method '{method}'")
    if not value.requires_grad:
        raise ValueError("importance: the loss does not depend on any head (no gradient); "
                         "compute it from the model's output, not under torch.no_grad()")
    grads = torch.autograd.grad(value, [leaf for *_, leaf in found], allow_unused=True)
    return [(kind, layer, kept, grad) for (kind, layer, kept, _), grad in zip(found, grads,
                                                                            strict=True)]


def _gate(x: torch.Tensor, *, found: list, kind: str, layer: int) -> torch.Tensor:
    """``x (b, h, i, d)`` times a fresh gate ``xi (b, h)`` of ones (kept in ``found``)."""
    g = torch.ones(x.shape[0], x.shape[1], dtype=x.dtype, device=x.device, requires_grad=True)
    found.append((kind, layer, g, g))
    return x * g[:, :, None, None]


def _gradient(model, layers, batches, loss, normalize: bool) -> HeadScores:
    """Michel et al.: expected |dL/dxi_h| with one gate xi = 1 per example and head."""
    totals = {kind: [torch.zeros(head_count(m), dtype=torch.float64) for m in mods]
              for kind, mods in layers.items()}
    examples = 0
    for batch in batches:
        gates = _head_grads(model, layers, batch, loss, _gate, "gradient")
        for kind, layer, _, grad in gates:
            if grad is not None:
                totals[kind][layer] += grad.abs().sum(0).double().cpu()
        examples += gates[0][2].shape[0]
    scores = {}
    for kind, per_layer in totals.items():
        table = _table(layers, kind)
        for layer, t in enumerate(per_layer):
            t = t / examples
            table[layer, :len(t)] = t / (t.norm() + 1e-20) if normalize else t
        scores[kind] = table
    return HeadScores("gradient", scores, {"batches": len(batches), "examples": examples,
                                           "normalized": normalize})


def _probe(x: torch.Tensor, *, found: list, kind: str, layer: int) -> torch.Tensor:
    """``x (b, h, i, d)`` plus a zero tensor whose gradient is ``dL/dx`` (kept in ``found``)."""
    zero = torch.zeros_like(x, requires_grad=True)
    found.append((kind, layer, x.detach(), zero))
    return x + zero


def _attribution(model, layers, batches, loss, mode: str) -> HeadScores:
    """Attribution patching: ``sum dL/dx * (x_removed - x)`` per head, averaged over batches
    (the first-order Taylor estimate of :func:`_ablation`'s loss change)."""
    means = head_means(model, batches) if mode == "mean" else None
    totals = {kind: [torch.zeros(head_count(m), dtype=torch.float64) for m in mods]
              for kind, mods in layers.items()}
    for batch in batches:
        for kind, layer, x, grad in _head_grads(model, layers, batch, loss, _probe,
                                                "attribution"):
            if grad is None:
                continue
            removed = torch.zeros_like(x) if means is None else \
                means[kind][layer].to(x)[None, :, None, :]  # (1, h, 1, d)
            totals[kind][layer] += (grad * (removed - x)).sum((0, 2, 3)).double().cpu()
    scores = {}
    for kind, per_layer in totals.items():
        table = _table(layers, kind)
        for layer, t in enumerate(per_layer):
            table[layer, :len(t)] = t / len(batches)
        scores[kind] = table
    return HeadScores("attribution", scores, {"batches": len(batches), "ablation": mode})


@torch.no_grad()
def _mean_loss(model, batches, loss) -> float:
    return sum(float(_scalar(loss(model, b), "method 'ablation'")) for b in batches) / len(batches)


@torch.no_grad()
def _ablation(model, layers, batches, loss, mode: str) -> HeadScores:
    """The loss with one head removed minus the loss with none removed (the blocks before the
    head's own replayed: :class:`~headwise.analysis.replay.Replay`)."""
    means = head_means(model, batches) if mode == "mean" else None
    with Replay(model, mode=mode, means=means) as replay:
        run = partial(_mean_loss, model, batches, loss)
        base = replay.measure([], run)
        scores = {kind: _table(layers, kind) for kind in layers}
        for kind, layer, head in _cells(layers):
            scores[kind][layer, head] = replay.measure([(kind, layer, head)], run) - base
    return HeadScores("ablation", scores, {"batches": len(batches), "ablation": mode,
                                           "baseline_loss": base, "blocks": _blocks(replay)})


def _cells(layers) -> list[tuple[str, int, int]]:
    """Every head as ``(kind, layer, head)``."""
    return [(kind, layer, head) for kind, mods in layers.items()
            for layer, mha in enumerate(mods) for head in range(head_count(mha))]


def _blocks(replay: Replay) -> dict[str, int]:
    """Block calls computed and replayed (the cost that the replay saves)."""
    return {"run": replay.run, "replayed": replay.replayed}


@torch.no_grad()
def _greedy(model, layers, batches, loss, mode: str, steps: int | None) -> HeadScores:
    """Iterative ablation, evaluated lazily (Minoux 1978): each head keeps the loss measured
    when it was last tried; the head with the lowest is measured again with every head removed
    so far, and goes when it still has the lowest. Exact greedy when removing other heads never
    makes a head cheaper to lose; typically a few passes per step instead of one per head.
    The first round is single-head ablation: its loss rises come back as
    ``details["alone"]`` and, for zero ablation, as the scores' agreement (at no extra cost).
    Every pass replays the blocks before the first one whose removed heads differ from the
    heads gone so far (:class:`~headwise.analysis.replay.Replay`; ``details["blocks"]``)."""
    means = head_means(model, batches) if mode == "mean" else None
    with Replay(model, mode=mode, means=means) as replay:
        run = partial(_mean_loss, model, batches, loss)
        base = replay.measure([], run)
        left = _cells(layers)
        known = {cell: (replay.measure([cell], run), 0) for cell in left}  # (loss, step)
        alone = {kind: _table(layers, kind) for kind in layers}
        for (kind, layer, head), (value, _) in known.items():
            alone[kind][layer, head] = value - base
        gone: list[tuple[str, int, int]] = []
        losses, passes = [], len(left)
        stop = min(len(left), steps) if steps is not None else (len(left) + 1) // 2
        while len(gone) < stop:
            cell = min(left, key=lambda c: known[c][0])
            if known[cell][1] < len(gone):
                known[cell] = (replay.measure([*gone, cell], run), len(gone))
                passes += 1
                continue
            left.remove(cell)
            gone.append(cell)
            replay.rebase(gone)
            losses.append(known[cell][0])
    gone += sorted(left, key=lambda c: known[c][0])  # past the stop: by the loss last measured
    scores = {kind: _table(layers, kind) for kind in layers}
    for step, (kind, layer, head) in enumerate(gone):
        scores[kind][layer, head] = step
    found = HeadScores("greedy", scores, {"batches": len(batches), "ablation": mode,
                                          "baseline_loss": base, "losses": losses,
                                          "passes": passes, "steps": stop,
                                          "blocks": _blocks(replay),
                                          "alone": {k: [[None if math.isnan(v) else v for v in row]
                                                     for row in t.tolist()]
                                                 for k, t in alone.items()}})
    return found.with_agreement(HeadScores("ablation", alone)) if mode == "zero" else found


def _token_ids(batch):
    """The ids of the sequence the induction score looks up (None when unknown)."""
    if isinstance(batch, LMBatch):
        return batch.inputs
    if isinstance(batch, Seq2SeqBatch):
        return batch.tgt_in
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        return batch.get("input_ids", batch.get("tokens"))
    return None


def _ids_kind(layers) -> str:
    """The kind whose sequence :func:`_token_ids` returns (a decoder's when there is one)."""
    return "decoder_self" if "decoder_self" in layers else "encoder_self"


@torch.no_grad()
def _behaviour(model, layers, batches, method: str) -> HeadScores:
    """Per-head averages of one :class:`headwise.stats.HeadStats` field over rows and examples."""
    field = BEHAVIOURS[method]
    if transformers_model(model):
        from headwise.hf.model import refuse_unmodelled
        refuse_unmodelled(model, layers["layers"], f"importance(method={method!r})",
                          "score its heads by what removing them does (method 'greedy', "
                          "'ablation' or 'attribution')")
    where = {id(mha): (kind, layer) for kind, mods in layers.items()
             for layer, mha in enumerate(mods)}
    paths = {name: where[id(m)] for name, m in model.named_modules() if id(m) in where}
    sums = {kind: [torch.zeros(head_count(m), dtype=torch.float64) for m in mods]
            for kind, mods in layers.items()}
    counts = {kind: [0] * len(mods) for kind, mods in layers.items()}
    for batch in batches:
        with _stats.collect(model, token_ids=_token_ids(batch)) as found:
            run_batch(model, batch)
        for path, calls in found.items():
            kind, layer = paths[path]
            if (kind == "cross" and method in _SELF_ONLY) or \
                    (method == "induction" and kind != _ids_kind(layers)):
                continue
            for s in calls:
                if getattr(s, field) is None:
                    continue
                per_head = s.per_head(field)  # (b, h)
                sums[kind][layer] += per_head.sum(0).double().cpu()
                counts[kind][layer] += per_head.shape[0]
    scores = {}
    for kind, per_layer in sums.items():
        table = _table(layers, kind)
        for layer, total in enumerate(per_layer):
            if counts[kind][layer]:
                table[layer, :len(total)] = total / counts[kind][layer]
        scores[kind] = table
    return HeadScores(method, scores, {"batches": len(batches)})
