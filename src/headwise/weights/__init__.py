"""Exact per-head attention weights, for only what was asked, in blocks of query rows.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position,
``j`` key position, ``d`` head dim.

A fused kernel never builds the ``(b, h, i, j)`` probabilities, but it does return (or a cheap
chunked pass recovers) each row's log-sum-exp ``lse[b, h, i] = log sum_j exp(s_ij)`` of the
masked scores ``s_ij = q_i . k_j * scale + bias_ij``. With it every weight is one exact formula,

    w[b, h, i, j] = exp(s_ij - lse[b, h, i])        (0 where masked, 0 for a fully masked row)

so the weights of any heads, query rows and key range are recomputed for only what was asked,
``chunk`` rows at a time: working memory beyond the returned tensor is O(chunk x j), never
``(b, h, i, j)`` unless the caller asked for all of it. When every key of a row is selected the
row is also divided by its sum (1 up to the LSE's rounding), which removes the kernel's LSE
rounding (~1e-5 relative on long rows of large scores). Whole rows need no LSE at all: their
softmax, block by block, with the output ``weights @ v`` from the same blocks when every weight
is asked for (and, under causality, no block above the diagonal multiplied).

Fully masked rows: the CPU flash kernel reports ``lse = 0`` for them (and zero output);
:func:`logsumexp` does the same, so ``exp(-inf - 0) = 0`` gives them zero weights.

The package: :mod:`~headwise.weights.select` (the :class:`Selection` and its blocks),
:mod:`~headwise.weights.lse` (weights from the log-sum-exp), :mod:`~headwise.weights.rows`
(whole rows as their softmax, the output beside them). May import :mod:`headwise.masks` and
:mod:`headwise.fast`.
"""

from headwise.weights.lse import from_lse, logsumexp, mask_scores
from headwise.weights.rows import ROW_BLOCK_ELEMENTS, release_memory, softmax_rows
from headwise.weights.select import (
    BLOCK_ELEMENTS,
    CHUNK_ELEMENTS,
    Selection,
    as_selection,
    chunk_rows,
    row_chunks,
    take,
)

__all__ = ["Selection", "as_selection", "chunk_rows", "from_lse", "logsumexp", "mask_scores",
           "release_memory", "row_chunks", "softmax_rows", "take",
           "BLOCK_ELEMENTS", "CHUNK_ELEMENTS", "ROW_BLOCK_ELEMENTS"]
