"""The loss a run minimises and the held-out metrics it reports: teacher-forced loss and
perplexity for every task; exact match by greedy decoding for sequence-to-sequence tasks (and
over the scored tokens for induction); token accuracy; BLEU for sentence pairs.

Language modelling on text (metric ``perplexity``) reports no exact match: whole windows of
text are never predicted exactly, so the number would say nothing.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from headwise.data import LMBatch, Seq2SeqBatch

__all__ = ["evaluate", "format_metrics", "greedy_decode", "loss_sum", "strip_special"]


def logits_of(model: nn.Module, batch) -> torch.Tensor:
    """``(b, i, vocab)`` next-token logits of a seq2seq or LM batch."""
    if isinstance(batch, Seq2SeqBatch):
        logits, _ = model(batch.src, batch.tgt_in, src_valid_lens=batch.src_lens)
    else:
        logits, _ = model(batch.inputs)
    return logits


def labels_of(batch) -> torch.Tensor:
    return batch.tgt_out if isinstance(batch, Seq2SeqBatch) else batch.labels


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def loss_sum(model: nn.Module, batch, *, pad_id: int, label_smoothing: float,
             autocast: bool) -> torch.Tensor:
    """Summed (not averaged) cross-entropy over the non-pad labels of ``batch``."""
    with torch.autocast(device_of(model).type, dtype=torch.bfloat16, enabled=autocast):
        logits = logits_of(model, batch)
    labels = labels_of(batch)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=pad_id,
                           label_smoothing=label_smoothing, reduction="sum")


@torch.no_grad()
def greedy_decode(model: nn.Module, src: torch.Tensor, src_lens: torch.Tensor, *, bos_id: int,
                  eos_id: int, pad_id: int, max_new_tokens: int) -> torch.Tensor:
    """Greedy translations ``(b, <= max_new_tokens)`` of ``src (b, j)`` (after ``<eos>``: pad)."""
    from headwise.decode.generation import generate
    start = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    out = generate(model, start, src=src, src_valid_lens=src_lens, max_new_tokens=max_new_tokens,
                   eos_id=eos_id, pad_id=pad_id)
    return out[:, 1:]


def strip_special(ids: list[int], eos_id: int, pad_id: int) -> list[int]:
    """``ids`` up to the first ``<eos>``, without padding."""
    out = []
    for i in ids:
        if i == eos_id:
            break
        if i != pad_id:
            out.append(i)
    return out


class _Tally:
    """Running sums of one evaluation."""

    def __init__(self):
        self.nll = self.count = 0.0
        self.exact = self.total = self.tok_right = self.tok_total = 0
        self.hyps: list[str] = []

    def lm(self, pred: torch.Tensor, batch: LMBatch) -> None:
        right = (pred == batch.labels) | ~batch.scored
        self.exact += right.all(dim=1).sum().item()
        self.total += len(batch)
        self.tok_right += ((pred == batch.labels) & batch.scored).sum().item()
        self.tok_total += batch.scored.sum().item()

    def seq2seq(self, out: torch.Tensor, batch: Seq2SeqBatch, tok) -> None:
        for k in range(len(batch)):
            got = strip_special(out[k].tolist(), tok.eos_id, tok.pad_id)
            want = strip_special(batch.tgt_out[k].tolist(), tok.eos_id, tok.pad_id)
            self.exact += got == want
            self.total += 1
            self.tok_right += sum(a == b for a, b in zip(got, want, strict=False))
            self.tok_total += len(want)
            self.hyps.append(tok.decode(got))


@torch.no_grad()
def evaluate(model: nn.Module, task, *, size: int = 500, autocast: bool = False,
             batch_size: int = 250) -> dict[str, float]:
    """Held-out metrics of ``task``: ``loss`` and ``perplexity`` (teacher-forced, per token),
    ``token_accuracy`` and, by task, ``exact_match`` (greedy decoding for seq2seq; argmax over
    the scored tokens for induction; none for text) and ``bleu`` (sacrebleu, greedy)."""
    was_training = model.training
    model.eval()
    device, tok = device_of(model), task.tokenizer
    full = task.eval_set(size)
    tally = _Tally()
    try:
        for start in range(0, len(full), batch_size):
            batch = type(full)(**{f.name: getattr(full, f.name)[start:start + batch_size]
                                  for f in dataclasses.fields(full)}).to(device)
            tally.nll += loss_sum(model, batch, pad_id=tok.pad_id, label_smoothing=0.0,
                                  autocast=autocast).item()
            tally.count += (labels_of(batch) != tok.pad_id).sum().item()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                if isinstance(batch, LMBatch):
                    tally.lm(logits_of(model, batch).argmax(-1), batch)
                    continue
                out = greedy_decode(model, batch.src, batch.src_lens, bos_id=tok.bos_id,
                                    eos_id=tok.eos_id, pad_id=tok.pad_id,
                                    max_new_tokens=batch.tgt_out.shape[1])
            tally.seq2seq(out, batch, tok)
    finally:
        model.train(was_training)
    mean = tally.nll / max(tally.count, 1)
    metrics = {"loss": mean, "perplexity": math.exp(min(mean, 50))}
    if task.metric == "bleu":
        import sacrebleu
        metrics["bleu"] = sacrebleu.corpus_bleu(tally.hyps, [task.references(size)]).score
    if task.metric != "perplexity":
        metrics["exact_match"] = tally.exact / max(tally.total, 1)
    metrics["token_accuracy"] = tally.tok_right / max(tally.tok_total, 1)
    return metrics


def format_metrics(step: int, m: dict[str, float]) -> str:
    """One short line per evaluation: losses, perplexity, and the task's own metrics."""
    parts = [f"step {step:>6}", f"train {m['train_loss']:.4f}", f"eval {m['loss']:.4f}",
             f"ppl {m['perplexity']:.3f}"]
    if "bleu" in m:
        parts.append(f"BLEU {m['bleu']:.2f}")
    if "exact_match" in m:
        parts.append(f"EM {m['exact_match']:.4f}")
    parts.append(f"tok-acc {m['token_accuracy']:.4f}")
    return "  ".join(parts)
