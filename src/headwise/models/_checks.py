"""Input checks shared by the models, run once at the public boundary (never per layer)."""

from __future__ import annotations

import torch

from headwise import limits
from headwise import masks as _masks
from headwise._device import check_tensor_device
from headwise.fast import host


def tokens(ids, vocab_size: int, name: str, where: str) -> None:
    """``ids`` must be an integer ``(b, n)`` tensor with values in ``[0, vocab_size)``.

    The values are read on the CPU only (:func:`headwise.fast.host`): on a GPU the read would
    stall every forward (a device sync) and torch.compile cannot branch on it, so there an id
    outside the vocabulary fails inside the embedding kernel (a device-side assert), as in
    plain torch."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor of token ids, got "
                        f"{type(ids).__name__}; use torch.tensor([[...]])")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{where}: {name} must hold integer token ids, got dtype {ids.dtype}; "
                        "use .long()")
    check_tensor_device(ids, name, where)
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{where}: {name} has dtype {ids.dtype}; embeddings take int64 or int32 "
                        "ids: use .long()")
    if ids.dim() != 2:
        raise ValueError(f"{where}: {name} must be (b, n), got shape {tuple(ids.shape)}"
                         + ("; add a batch axis with .unsqueeze(0)" if ids.dim() == 1 else ""))
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{where}: {name} is empty, shape {tuple(ids.shape)}; give at least one "
                         "row and one token")
    if not host(ids):  # a device sync on a GPU; a graph break under torch.compile
        return
    lo, hi = (int(v) for v in torch.aminmax(ids))
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{where}: {name} contains id {bad}, outside the vocabulary [0, "
                         f"{vocab_size}); encode with the model's tokenizer or build the model "
                         f"with a larger vocab_size")


def length(n: int, offset: int, max_len: int, name: str, where: str) -> None:
    if offset + n > max_len:
        what = f"{n} positions" if not offset else f"{offset} cached + {n} new positions"
        raise ValueError(f"{where}: {name} has {what}, more than max_len={max_len}; shorten "
                         f"it or build the model with max_len >= {offset + n}")


def same_batch(where: str, **sizes: int) -> None:
    if len(set(sizes.values())) > 1:
        got = ", ".join(f"{k} {v}" for k, v in sizes.items())
        raise ValueError(f"{where}: batch sizes differ ({got}); every input needs the same "
                         "number of rows")


def valid_lens(lens, b: int, name: str, where: str, device) -> torch.Tensor | None:
    """``(b,)`` integer lengths, or None. Negative lengths are refused on the CPU; off it
    (where the read would be a device sync) they mask every key, as a length of 0 does."""
    if lens is None:
        return None
    if not isinstance(lens, torch.Tensor):
        lens = torch.as_tensor(lens, device=device)
    if lens.is_floating_point() or lens.dtype == torch.bool:
        raise TypeError(f"{where}: {name} must hold integer lengths, got dtype {lens.dtype}")
    if lens.shape != (b,):
        raise ValueError(f"{where}: {name} must have shape (b,)=({b},), got "
                         f"{tuple(lens.shape)}; give one length per row")
    if host(lens) and (lens < 0).any():  # (a read: a device sync off the CPU)
        raise ValueError(f"{where}: {name} must be >= 0, got {lens.tolist()}")
    return lens.to(device)


def key_mask(ids: torch.Tensor | None, lens: torch.Tensor | None, n: int,
             pad_id: int | None) -> torch.Tensor | None:
    """Key-padding mask ``(b, 1, 1, j)`` (True = may attend) from lengths and/or a pad id."""
    by_pad = _masks.padding(ids, pad_id) if pad_id is not None and ids is not None else None
    by_len = _masks.from_valid_lens(lens, n) if lens is not None else None
    return _masks.combine(by_pad, by_len)


def cache(kv, config, layers: int, where: str, cross: bool) -> None:
    """A :class:`~headwise.KVCache` must be made for this model (``model.new_cache``): same
    layers, key/value heads and head size, cross-attention slots iff an encoder-decoder."""
    from headwise.cache import KVCache, Ragged

    if isinstance(kv, Ragged):  # a head-wise cache: its plan holds the model's shape
        kv.plan.check((layers, *set(config.layer_kv_heads("decoder_self")), config.head_size))
        return
    if not isinstance(kv, KVCache):
        raise TypeError(f"{where}: cache must be a headwise.KVCache from model.new_cache(...), "
                        f"got {type(kv).__name__}")
    got_l, _, _, _, got_d = kv.k.shape
    has_cross = kv.layers[0].cross_attn is not None
    kv_heads = tuple(config.layer_kv_heads("decoder_self"))
    want = (layers, kv_heads, config.head_size, cross)
    if (got_l, kv.kv_heads, got_d, has_cross) != want:
        g = kv_heads[0] if len(set(kv_heads)) == 1 else list(kv_heads)
        raise ValueError(f"{where}: this cache was made for another model ({kv!r}); this model "
                         f"needs layers={layers}, kv_heads={g}, head_dim="
                         f"{config.head_size}, cross={cross}: use model.new_cache(batch)")


def model_memory(config) -> None:
    """Refuse a config whose parameters (an estimate, float32) exceed this machine's memory,
    before a single layer is built."""
    d, hd = config.d_model, config.num_heads * config.head_size
    kvd = config.kv_heads * config.head_size
    attention = 2 * d * hd + 2 * d * kvd
    block = attention + 2 * d * config.d_ff
    if hasattr(config, "vocab_size"):  # decoder-only
        vocab, params = config.vocab_size, config.num_layers * block
    else:  # encoder + decoder with cross-attention
        vocab = config.src_vocab_size + config.tgt_vocab_size
        params = config.num_layers * block + config.decoder_layers * (block + attention)
    params += 2 * vocab * d + config.max_len * d
    limits.check_memory(4 * params, f"a {type(config).__name__} of about {params:,} parameters",
                        "build")
