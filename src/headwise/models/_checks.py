"""Input checks shared by the models, run once at the public boundary (never per layer)."""

from __future__ import annotations

import torch

from headwise import masks as _masks


def tokens(ids, vocab_size: int, name: str, where: str) -> None:
    """``ids`` must be an integer ``(b, n)`` tensor with values in ``[0, vocab_size)``."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor of token ids, got "
                        f"{type(ids).__name__}; use torch.tensor([[...]])")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{where}: {name} must hold integer token ids, got dtype {ids.dtype}; "
                        "use .long()")
    if ids.dim() != 2:
        raise ValueError(f"{where}: {name} must be (b, n), got shape {tuple(ids.shape)}"
                         + ("; add a batch axis with .unsqueeze(0)" if ids.dim() == 1 else ""))
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{where}: {name} is empty, shape {tuple(ids.shape)}; give at least one "
                         "row and one token")
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
    """``(b,)`` integer lengths, or None."""
    if lens is None:
        return None
    if not isinstance(lens, torch.Tensor):
        lens = torch.as_tensor(lens, device=device)
    if lens.is_floating_point() or lens.dtype == torch.bool:
        raise TypeError(f"{where}: {name} must hold integer lengths, got dtype {lens.dtype}")
    if lens.shape != (b,):
        raise ValueError(f"{where}: {name} must have shape (b,)=({b},), got "
                         f"{tuple(lens.shape)}; give one length per row")
    if (lens < 0).any():
        raise ValueError(f"{where}: {name} must be >= 0, got {lens.tolist()}")
    return lens.to(device)


def key_mask(ids: torch.Tensor | None, lens: torch.Tensor | None, n: int,
             pad_id: int | None) -> torch.Tensor | None:
    """Key-padding mask ``(b, 1, 1, j)`` (True = may attend) from lengths and/or a pad id."""
    by_pad = _masks.padding(ids, pad_id) if pad_id is not None and ids is not None else None
    by_len = _masks.from_valid_lens(lens, n) if lens is not None else None
    return _masks.combine(by_pad, by_len)
