"""The embeddings' one-row form: :class:`~headwise.models.Embeddings` for one token per row.

Axis legend: ``b`` rows, ``m`` model dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from headwise.models.blocks import LearnedPositionalEncoding

__all__ = ["embedding_row"]


def embedding_row(emb) -> Callable[[torch.Tensor, int | torch.Tensor], torch.Tensor]:
    """``f(ids (b,), position) -> (b, m)`` (eval: no dropout) for an
    :class:`~headwise.models.Embeddings`: token embedding, scale, additive positions;
    ``position`` an int or a ``(1,)`` long tensor (the fixed-shape step's)."""
    tokens, scale, pos = emb.tokens.weight, emb.scale, emb.positions
    table = None
    if pos is not None:
        table = pos.weight if isinstance(pos, LearnedPositionalEncoding) else pos.pe
        table = table.detach().to(tokens.dtype)

    def embed(ids: torch.Tensor, position: int) -> torch.Tensor:
        x = F.embedding(ids, tokens)
        x = x * scale if scale != 1.0 else x
        if table is None:
            return x
        return x + (table[position] if isinstance(position, int)
                    else table.index_select(0, position))
    return embed
