"""The checks of :class:`~headwise.layers.MultiHeadAttention`, made once at its boundary: its
constructor arguments (:func:`config`, :func:`variants`) and every call's inputs
(:func:`inputs`, :func:`dtypes`), each failure one readable error naming what was expected,
what was got and the fix."""

from __future__ import annotations

import torch

from headwise import limits
from headwise import masks as _masks
from headwise._device import check_tensor_device
from headwise.attend import check_backend
from headwise.cache import CrossAttentionCache, SelfAttentionCache
from headwise.fast.int4 import dtype_of
from headwise.rope import RotaryEmbedding

__all__ = ["batched", "config", "dtypes", "inputs", "variants"]


def inputs(mha, query, key, value, mask, valid_lens, head_mask, cache=None):
    """Validate once at the boundary; return the combined (True = may attend) mask."""
    if cache is not None and not isinstance(cache, (SelfAttentionCache, CrossAttentionCache)):
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


def variants(rope, window, softcap) -> None:
    if rope is not None and not isinstance(rope, RotaryEmbedding):
        raise TypeError(f"MultiHeadAttention: rope must be a RotaryEmbedding or None, got "
                        f"{type(rope).__name__}")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool)
                               or window < 1):
        raise ValueError(f"MultiHeadAttention: window must be None or an int >= 1, got {window!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0):
        raise ValueError(f"MultiHeadAttention: softcap must be None or > 0, got {softcap!r}")


def config(embed_dim, num_heads, head_dim, kdim, vdim, num_kv_heads, out_dim, dropout,
                  backend) -> None:
    where = "MultiHeadAttention"
    for name, value, kind in (("embed_dim", embed_dim, "dim"), ("num_heads", num_heads, "heads"),
                              ("head_dim", head_dim, "dim"), ("kdim", kdim, "dim"),
                              ("vdim", vdim, "dim"), ("num_kv_heads", num_kv_heads, "heads"),
                              ("out_dim", out_dim, "dim")):
        if value is not None or name in ("embed_dim", "num_heads"):
            limits.size(value, name, kind, where)
    if head_dim is None and embed_dim % num_heads:
        # The hint looks only near num_heads: it costs no more than the check did.
        near = min((x for x in range(1, 2 * num_heads + 1) if embed_dim % x == 0),
                   key=lambda x: (abs(x - num_heads), -x))
        raise ValueError(f"MultiHeadAttention: embed_dim={embed_dim} is not divisible by "
                         f"num_heads={num_heads}; pass head_dim={max(1, embed_dim // num_heads)} "
                         f"or use num_heads={near}")
    hd = num_heads * (head_dim or embed_dim // num_heads)
    kvd = (num_kv_heads or num_heads) * (head_dim or embed_dim // num_heads)
    k_in, v_in = kdim or embed_dim, vdim or kdim or embed_dim
    params = (embed_dim + 1) * hd + (k_in + v_in + 2) * kvd + (hd + 1) * (out_dim or embed_dim)
    limits.check_memory(params * torch.empty((), dtype=torch.get_default_dtype()).element_size(),
                        f"its {params:,} parameters", where)
    if num_kv_heads is not None and num_heads % num_kv_heads:
        raise ValueError(f"MultiHeadAttention: num_heads={num_heads} is not a multiple of "
                         f"num_kv_heads={num_kv_heads}; each key/value head must serve the same "
                         "number of query heads")
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) \
            or not 0.0 <= dropout < 1.0:
        raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
    check_backend(backend, "MultiHeadAttention")
