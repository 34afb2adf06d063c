"""Running a model on one batch, and the model's own training loss on it: what the head tools
(importance, mean ablation) call for every batch a user hands them.

A batch is a :class:`~headwise.data.Seq2SeqBatch` (encoder-decoder), an
:class:`~headwise.data.LMBatch` or a ``(b, n)`` tensor of token ids (language model, BERT), a
dict of keyword arguments or a tuple of positional arguments of the model's ``forward``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from headwise.data import LMBatch, Seq2SeqBatch
from headwise.train.evaluate import labels_of, logits_of

__all__ = ["as_batches", "batch_size", "default_loss", "run_batch"]

_ONE_BATCH = (torch.Tensor, LMBatch, Seq2SeqBatch, Mapping)


def as_batches(batches, where: str, device: torch.device | None = None) -> list:
    """``batches`` as a non-empty list (one batch object counts as a list of one), the
    tensors of each moved to ``device`` when given."""
    if isinstance(batches, _ONE_BATCH):
        batches = [batches]
    elif not isinstance(batches, Iterable) or isinstance(batches, (str, bytes)):
        raise TypeError(f"{where}: batches must be a batch or an iterable of batches (Seq2SeqBatch,"
                        f" LMBatch, token-id tensors, dicts of model arguments), got "
                        f"{type(batches).__name__}")
    batches = list(batches)
    if not batches:
        raise ValueError(f"{where}: no data: batches is empty; pass at least one batch, e.g. "
                         "task.eval_set(64) or a (b, n) tensor of token ids")
    empty = next((n for n, b in enumerate(batches) if batch_size(b) == 0), None)
    if empty is not None:
        raise ValueError(f"{where}: batch {empty} has 0 rows (examples); drop it or pass "
                         "at least one example per batch")
    return batches if device is None else [_to(b, device) for b in batches]


def _to(batch, device: torch.device):
    if isinstance(batch, (torch.Tensor, LMBatch, Seq2SeqBatch)):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in batch)
    return batch


def batch_size(batch) -> int | None:
    """The examples in one batch: the leading size of its token ids (None when it has none)."""
    if isinstance(batch, Seq2SeqBatch):
        return batch.src.shape[0]
    if isinstance(batch, LMBatch):
        return batch.inputs.shape[0]
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    values = batch.values() if isinstance(batch, Mapping) else batch
    first = next((v for v in values if isinstance(v, torch.Tensor) and v.dim()), None) \
        if isinstance(values, Iterable) else None
    return None if first is None else first.shape[0]


def run_batch(model: nn.Module, batch):
    """``model``'s output on ``batch`` (whatever its forward returns)."""
    if isinstance(batch, (Seq2SeqBatch, LMBatch)):
        return logits_of(model, batch)
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple):
        return model(*batch)
    raise TypeError(f"cannot run {type(model).__name__} on a {type(batch).__name__}; pass "
                    "Seq2SeqBatch / LMBatch / token-id tensors, dicts of keyword arguments or "
                    "tuples of positional arguments")


def default_loss(model: nn.Module, batch) -> torch.Tensor:
    """Mean next-token cross-entropy (the training loss, without label smoothing) of a headwise
    encoder-decoder or language model: teacher-forced on a Seq2SeqBatch / LMBatch (``pad_id``
    labels ignored), next-token on a ``(b, n)`` tensor fed to a language model; for a Hugging
    Face causal language model, :func:`headwise.hf.next_token_loss`."""
    from headwise.finders import transformers_model
    from headwise.models import Transformer, TransformerLM

    if transformers_model(model):  # a Hugging Face model: its next-token loss
        from headwise.hf.tools import next_token_loss
        return next_token_loss(model, batch)
    pad = getattr(getattr(model, "config", None), "pad_id", None)
    ignore = -100 if pad is None else pad
    if isinstance(model, Transformer) and isinstance(batch, Seq2SeqBatch) or \
            isinstance(model, TransformerLM) and isinstance(batch, LMBatch):
        logits, labels = logits_of(model, batch), labels_of(batch)
    elif isinstance(model, TransformerLM) and isinstance(batch, torch.Tensor):
        logits, labels = model(batch)[0][:, :-1], batch[:, 1:]
    else:
        raise TypeError(f"no default loss for {type(model).__name__} on a "
                        f"{type(batch).__name__}; pass loss=lambda model, batch: ... returning "
                        "a scalar tensor (lower is better)")
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=ignore)
