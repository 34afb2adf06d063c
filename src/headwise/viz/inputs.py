"""What the views are given: attention weights per layer, read once for every view.

A view takes a list (or tuple) with one entry per layer (``None`` for a layer not recorded), or
one tensor or array stacking the layers first; :func:`layer_list` turns either into a list of
detached tensors, each checked to have one of the view's ranks. What a view needs beyond that
(square self-attention for rollout, finite values for a drawing) it checks itself.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["layer_list"]


def layer_list(weights, *, ranks: tuple[int, ...], shape: str, hint: str = "",
               none: str | None = None) -> list[torch.Tensor | None]:
    """``weights`` as one detached tensor (or None) per layer.

    Args:
        weights: a non-empty list or tuple of per-layer tensors or arrays, or one tensor or
            array of rank ``r + 1`` (layers first) for a rank ``r`` in ``ranks``.
        ranks: the ranks a layer's weights may have (``(3,)``: ``(h, i, j)``).
        shape: those shapes as the messages name them (``"(h, i, j)"``).
        hint: appended to the message of a layer (or stack) one rank too high, e.g.
            ``"; pick one example first, e.g. w[0]"``.
        none: None keeps a layer given as None; else the message's reason it cannot be.

    Raises TypeError for anything but a list, tuple, tensor or array (or an empty one), and
    ValueError, naming the layer, for a rank not in ``ranks`` or a refused None.
    """
    too_high = max(ranks) + 1
    if isinstance(weights, (torch.Tensor, np.ndarray)):
        if weights.ndim - 1 not in ranks:
            raise ValueError(f"weights must be (layers, ...) with each layer {shape}, got shape "
                             f"{tuple(weights.shape)}{hint if weights.ndim == too_high + 1 else ''}")
        weights = list(weights)
    if not isinstance(weights, (list, tuple)) or not weights:
        raise TypeError(f"weights must be a non-empty list of per-layer {shape} tensors, or one "
                        f"tensor stacking them (layers first), got {type(weights).__name__}")
    out: list[torch.Tensor | None] = []
    for l, w in enumerate(weights):
        if w is None and none is None:
            out.append(None)
            continue
        if w is None:
            raise ValueError(f"layer {l} has no weights (None); {none}")
        t = torch.as_tensor(w).detach()
        if t.ndim not in ranks:
            raise ValueError(f"layer {l} weights must be {shape}, got shape {tuple(t.shape)}"
                             f"{hint if t.ndim == too_high else ''}")
        out.append(t)
    return out
