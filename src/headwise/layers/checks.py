"""The checks of :class:`~headwise.layers.MultiHeadAttention`, made once at its boundary: its
constructor arguments (:func:`config`, :func:`variants`) and every call's inputs
(:func:`inputs`, :func:`dtypes`), each failure one readable error naming what was expected,
what was got and the fix."""

from __future__ import annotations

import torch

from headwise import limits
from headwise import masks as _masks
from headwise._device import check_tensor_device
from headwise.cache import CrossAttentionCache, Ragged, SelfAttentionCache
from headwise.fast.int4 import dtype_of
from headwise.rope import RotaryEmbedding

__all__ = ["batched", "config", "dtypes", "inputs", "variants"]


def inputs(mha, query, key, value, mask, valid_lens, head_mask, cache=None):
    """Validate once at the boundary; return the combined (True = may attend) mask."""
    if cache is not None and not isinstance(cache, (SelfAttentionCache, CrossAttentionCache,
                                                       Ragged)):
        raise TypeError(f"MultiHeadAttention: cache must be one layer of a headwise.KVCache "
                        f"(cache.layers[i].self_attn or .cross_attn), got "
                        f"{type(cache).__name__}")
    named = (("query", query, mha.embed_dim), ("key", key, mha.kdim), ("value", value, mha.vdim))
    if key is query and value is query and mha.kdim == mha.vdim == mha.embed_dim:
        named = named[:1]  # self-attention: one tensor, checked once
    for name, t, dim in named:
        batched(t, name, 3, "batch-first (b, n, features)", "MultiHeadAttention")
        if t.shape[-1] != dim:
            raise ValueError(f"MultiHeadAttention: {name} has {t.shape[-1]} features, "
                             f"expected {dim}; build the module with "
                             f"{ {'query': 'embed_dim', 'key': 'kdim', 'value': 'vdim'}[name]}"
                             f"={t.shape[-1]}")
        check_tensor_device(t, name, "MultiHeadAttention")
    dtypes(mha, *(t for _, t, _ in named))
    b, nq, nk = query.shape[0], query.shape[1], key.shape[1]
    if key.shape[0] != b or value.shape[0] != b:
        raise ValueError(f"MultiHeadAttention: batch sizes differ: query {b}, key "
                         f"{key.shape[0]}, value {value.shape[0]}")
    if value.shape[1] != nk:
        raise ValueError(f"MultiHeadAttention: key has {nk} positions but value has "
                         f"{value.shape[1]}; they must match")
    scores_shape = (b, mha.num_heads, nq, nk)
    if mask is not None:
        _masks.check(mask, "MultiHeadAttention", scores_shape)
    if valid_lens is not None:
        if not isinstance(valid_lens, torch.Tensor):
            valid_lens = torch.as_tensor(valid_lens, device=query.device)
        if valid_lens.shape not in ((b,), (b, nq)):
            raise ValueError(f"MultiHeadAttention: valid_lens must be (b,)=({b},) or "
                             f"(b, i)=({b}, {nq}), got {tuple(valid_lens.shape)}")
        mask = _masks.combine(mask, _masks.from_valid_lens(valid_lens, nk, nq))
    if head_mask is not None:
        if not isinstance(head_mask, torch.Tensor):
            raise TypeError("MultiHeadAttention: head_mask must be a tensor of shape (h,) "
                            f"or (b, h), got {type(head_mask).__name__}")
        if head_mask.shape not in ((mha.num_heads,), (b, mha.num_heads)):
            raise ValueError(f"MultiHeadAttention: head_mask must be (h,)=({mha.num_heads},)"
                             f" or (b, h)=({b}, {mha.num_heads}), got "
                             f"{tuple(head_mask.shape)}")
    return mask


def batched(t, name: str, rank: int, shape: str, where: str, var: str = "x") -> None:
    """``t`` is a tensor of ``rank`` axes (``shape`` names them in the message), else a
    TypeError or ValueError; one axis short, the fix named is a batch axis."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{where}: {name} must be {shape}, got shape {tuple(t.shape)}"
                         + (f"; add a batch axis with {var}.unsqueeze(0)" if t.dim() == rank - 1
                            else ""))


def dtypes(mha, *inputs: torch.Tensor) -> None:
    """Inputs (query, then key and value when they are other tensors) are floating point and,
    outside autocast, of the parameters' dtype."""
    want = dtype_of(mha.q_proj)
    autocast = torch.is_autocast_enabled(inputs[0].device.type)
    for name, t in zip(("query", "key", "value"), inputs, strict=False):  # (1 or 3 of them)
        if not t.is_floating_point():
            raise TypeError(f"MultiHeadAttention: {name} must be floating point, got "
                            f"{t.dtype}; token ids go through an embedding first, other "
                            f"tensors through .to({want})")
        if t.dtype != want and not autocast:
            raise TypeError(f"MultiHeadAttention: {name} has dtype {t.dtype} but the "
                            f"module's parameters are {want}; pass {name}.to({want}) or "
                            f"convert the module with .to({t.dtype})")


def variants(rope) -> None:
    if rope is not None and not isinstance(rope, RotaryEmbedding):
        raise TypeError(f"MultiHeadAttention: rope must be a RotaryEmbedding or None, got "
                        f"{type(rope).__name__}")


def config(embed_dim, num_heads, attention, kdim, vdim, out_dim, dropout) -> None:
    """The sizes beside ``attention`` (an :class:`~headwise.layers.AttentionConfig`, whose own
    values it checked itself), the checks that need both, and the parameters' memory."""
    where = "MultiHeadAttention"
    for name, value, kind in (("embed_dim", embed_dim, "dim"), ("num_heads", num_heads, "heads"),
                              ("kdim", kdim, "dim"), ("vdim", vdim, "dim"),
                              ("out_dim", out_dim, "dim")):
        if value is not None or name in ("embed_dim", "num_heads"):
            limits.size(value, name, kind, where)
    attention.check_heads(embed_dim, num_heads, where)
    hd = num_heads * attention.head_size(embed_dim, num_heads)
    kvd = attention.kv_heads(num_heads) * attention.head_size(embed_dim, num_heads)
    k_in, v_in = kdim or embed_dim, vdim or kdim or embed_dim
    params = (embed_dim + 1) * hd + (k_in + v_in + 2) * kvd + (hd + 1) * (out_dim or embed_dim)
    limits.check_memory(params * torch.empty((), dtype=torch.get_default_dtype()).element_size(),
                        f"its {params:,} parameters", where)
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) \
            or not 0.0 <= dropout < 1.0:
        raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
