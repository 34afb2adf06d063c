"""Where the speed layer stored a model's weights: views of one storage that the products
reading one input share, and matrices stored as ``W^T``.

Axis legend: ``in`` / ``out`` a linear map's input and output features.

:func:`headwise.fast.rows.lay_out` stores the ``nn.Linear`` layers a component lists as reading
one input (``joint_linears()``: self-attention's q, k, v; a gated feed-forward's gate, up) as
consecutive blocks of one buffer. Both the module path's fused projection
(:meth:`headwise.layers.MultiHeadAttention.qkv_weight`) and the decoding step's forms then take
the group as one matrix without a copy: :func:`joined` finds it. Only reads of strides and
addresses: this module computes nothing and changes no value.
"""

from __future__ import annotations

import torch
from torch import nn

from headwise.fast import applies, host

__all__ = ["joined", "joined_any", "stored_transposed"]


def stored_transposed(w: torch.Tensor) -> bool:
    """Whether a matrix ``w (out, in)`` is stored as ``W^T``: ``(in, out)`` contiguous."""
    return w.dim() == 2 and w.shape[0] > 1 and w.stride() == (1, w.shape[0])


def joined(layers) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(W, bias)`` of ``nn.Linear`` layers that read one input (q, k, v; gate, up) as one
    ``(sum of out, in)`` matrix and ``(sum of out,)`` bias, *without a copy*: views of one
    storage, when :func:`headwise.fast.rows.lay_out` stored the weights as consecutive blocks of
    it (rows of an ``(out, in)`` buffer or columns of an ``(in, out)`` one, biases end to end);
    else None.
    Also None while autograd would need the parameters' gradients: the view is detached (a
    product through it would train none of them), so training takes ``torch.cat``; and under
    torch.compile, which cannot read storages."""
    if not all(isinstance(layer, nn.Linear) for layer in layers):
        return None  # (an Int4Linear's weight would be dequantized just to look)
    if not host(layers[0].weight):  # (first: off the CPU every training forward asks)
        return None
    whole = joined_any(layers)  # (before the rule: not laid out is the common case, and cheaper)
    if whole is None or not applies(*(t for layer in layers for t in (layer.weight, layer.bias)
                                      if t is not None), bf16=True):
        return None
    return whole


def joined_any(layers) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """:func:`joined` whatever autograd needs (for :func:`~headwise.fast.rows.lay_out`'s
    "already so?")."""
    ws = [layer.weight for layer in layers]
    n_in, total = ws[0].shape[1], sum(w.shape[0] for w in ws)
    strides = next((s for s in ((n_in, 1), (1, total)) if ws[0].stride() == s), None)
    w = _consecutive(ws, (total, n_in), strides, strides and strides[0])
    if w is None:
        return None
    biases = [layer.bias for layer in layers]
    if all(bias is None for bias in biases):
        return w, None
    if any(bias is None for bias in biases):
        return None
    bias = _consecutive(biases, (total,), (1,), 1)
    return None if bias is None else (w, bias)


def _consecutive(ts, shape, strides, step):
    """``ts`` as one tensor of ``shape``/``strides`` over their common storage, each starting
    where the one before ends (``step`` elements per leading index); None otherwise. The
    addresses are compared first: separate tensors (every call outside a generation) are
    told apart by two attribute reads."""
    first = ts[0]
    if strides is None:
        return None
    at, size = first.data_ptr(), first.element_size()
    for t in ts:
        if t.data_ptr() != at or t.dtype != first.dtype or t.stride() != strides[-t.dim():]:
            return None
        at += t.shape[0] * step * size
    if any(t.device != first.device or t.untyped_storage().data_ptr()
           != first.untyped_storage().data_ptr() for t in ts[1:]):
        return None
    return first.detach().as_strided(shape, strides, first.storage_offset())
