"""Padded batches for the two model kinds, and the rank split used by multi-process training.

Every task builds a *global* batch as a pure function of ``(seed, step)``; with ``world``
processes, rank ``r`` keeps rows ``r, r + world, r + 2 world, ...`` (DistributedSampler's
strided split). Nothing is stateful, so resuming at step ``s`` sees exactly the batches an
uninterrupted run would, whatever the number of processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Self

import torch

__all__ = ["Batch", "LMBatch", "Seq2SeqBatch", "collate_lm", "collate_seq2seq"]


class Batch:
    """What every batch (a dataclass of ``(b, ...)`` tensors) does: its rank's rows, a device
    move, and its size (the first field's rows)."""

    def shard(self, rank: int, world: int) -> Self:
        return _shard(self, rank, world)

    def to(self, device) -> Self:
        return type(self)(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def __len__(self) -> int:
        return getattr(self, fields(self)[0].name).shape[0]


@dataclass
class Seq2SeqBatch(Batch):
    """Source and target token ids for an encoder-decoder, padded with ``pad_id``.

    src: ``(b, j)``; src_lens: ``(b,)``; tgt_in: ``(b, i)`` = ``<bos> + target``;
    tgt_out: ``(b, i)`` = ``target + <eos>`` (the labels; ``pad_id`` is ignored by the loss).
    """

    src: torch.Tensor
    src_lens: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor


@dataclass
class LMBatch(Batch):
    """Next-token prediction: inputs ``(b, n)``, labels ``(b, n)`` (= inputs shifted by one;
    ``pad_id`` ignored); ``valid_lens (b,)``; ``scored (b, n)`` bool marks the labels a task
    metric counts (e.g. the predictable half of an induction sequence)."""

    inputs: torch.Tensor
    labels: torch.Tensor
    valid_lens: torch.Tensor
    scored: torch.Tensor


def _shard(batch, rank: int, world: int):
    if len(batch) % world:
        raise ValueError(f"global batch size {len(batch)} is not divisible by the "
                         f"{world} processes; pick a batch size that is a multiple of {world}")
    return type(batch)(**{f.name: getattr(batch, f.name)[rank::world] for f in fields(batch)})


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for k, r in enumerate(rows):
        out[k, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out


def collate_seq2seq(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], *, pad_id: int,
                    bos_id: int, eos_id: int) -> Seq2SeqBatch:
    """Pad source rows and wrap target rows in ``<bos>`` / ``<eos>``."""
    return Seq2SeqBatch(
        src=_pad(src, pad_id),
        src_lens=torch.tensor([len(s) for s in src], dtype=torch.long),
        tgt_in=_pad([[bos_id, *t] for t in tgt], pad_id),
        tgt_out=_pad([[*t, eos_id] for t in tgt], pad_id))


def collate_lm(seqs: Sequence[Sequence[int]], *, pad_id: int,
               scored: Sequence[Sequence[bool]] | None = None) -> LMBatch:
    """Turn whole sequences (length n + 1) into inputs ``seq[:-1]`` and labels ``seq[1:]``.

    ``scored[k][t]`` flags label ``t`` of row ``k`` for the task metric (default: all)."""
    inputs = _pad([s[:-1] for s in seqs], pad_id)
    labels = _pad([s[1:] for s in seqs], pad_id)
    lens = torch.tensor([len(s) - 1 for s in seqs], dtype=torch.long)
    valid = torch.arange(inputs.shape[1]) < lens[:, None]
    if scored is None:
        mask = valid
    else:
        mask = torch.zeros_like(valid)
        for k, row in enumerate(scored):
            mask[k, :len(row)] = torch.as_tensor(list(row), dtype=torch.bool)
        mask &= valid
    return LMBatch(inputs=inputs, labels=labels, valid_lens=lens, scored=mask)
