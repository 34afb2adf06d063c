"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Raw attention of a deep layer says little about the *input* tokens, because every layer mixes
tokens again and the residual stream carries each token forward. Rollout models both: per layer
the heads are fused (averaged by default), the identity is mixed in for the residual connection
(``A = 0.5 W + 0.5 I`` in the paper), rows are renormalised, and the layers are multiplied:
``R_l = A_l @ A_{l-1} @ ... @ A_0``. Row ``i`` of ``R_l`` says how much of query ``i``'s
representation after layer ``l`` comes from each input position ``j``.

Only meaningful for self-attention (queries and keys are the same sequence).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from headwise.viz.inputs import layer_list

__all__ = ["attention_rollout"]

HEAD_FUSIONS = ("mean", "max", "min")


def attention_rollout(weights: torch.Tensor | np.ndarray | Sequence, *, head_fusion: str = "mean",
                      residual: float = 0.5) -> torch.Tensor:
    """Cumulative attention rollout after every layer.

    Args:
        weights: self-attention weights, one entry per layer, each ``(h, i, i)`` or
            ``(b, h, i, i)``; a list/tuple of tensors or arrays, or one ``(layers, [b,] h, i, i)``
            tensor. Layers may have different head counts (pruned models).
        head_fusion: how heads are fused per layer: ``"mean"`` (the paper), ``"max"`` or
            ``"min"`` (as in vit-explain).
        residual: weight of the identity, ``A = (1 - residual) * W + residual * I``; 0.5 in the
            paper. Rows are renormalised afterwards (so fully masked rows become the identity).

    Returns:
        ``(layers, [b,] i, i)`` float tensor (float64 if the input is float64, else float32):
        entry ``l`` is the rollout through layers ``0..l``; every row sums to 1.
    """
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion={head_fusion!r} is not one of {HEAD_FUSIONS}; "
                         "pass 'mean' (Abnar & Zuidema) or 'max'/'min'")
    if not 0.0 <= float(residual) <= 1.0:
        raise ValueError(f"residual={residual} must lie in [0, 1] (0.5 in the paper)")
    layers = _as_layers(weights)
    out = []
    rollout = None
    for l, w in enumerate(layers):
        fuse = {"mean": torch.mean, "max": torch.amax, "min": torch.amin}[head_fusion]
        a = fuse(w, dim=-3)  # ([b,] i, i)
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = (1.0 - residual) * a + residual * eye
        a = a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
        if rollout is not None and rollout.shape != a.shape:
            raise ValueError(f"layer {l} weights have shape {tuple(w.shape)} but earlier layers "
                             f"give ([b,] i, i) = {tuple(rollout.shape)}; all layers must share "
                             "the batch and sequence sizes")
        rollout = a if rollout is None else a @ rollout
        out.append(rollout)
    return torch.stack(out)


def _as_layers(weights) -> list[torch.Tensor]:
    layers = []
    for l, t in enumerate(layer_list(weights, ranks=(3, 4), shape="(h, i, i) or (b, h, i, i)",
                                     none="rollout multiplies through every layer, so record "
                                          "all layers (return_weights=True)")):
        if not t.is_floating_point():
            raise TypeError(f"layer {l} weights must be floating point, got {t.dtype}")
        if t.shape[-1] != t.shape[-2]:
            raise ValueError(f"layer {l} weights must be (h, i, i) or (b, h, i, i) self-attention,"
                             f" got shape {tuple(t.shape)}")
        layers.append(t if t.dtype == torch.float64 else t.float())
    return layers
