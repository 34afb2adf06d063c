"""Attention masks, one vocabulary everywhere: **True = may attend**.

A bool mask keeps a key where it is True. A float mask is *added* to the scores (``-inf``
blocks). Every mask broadcasts to the scores' shape ``(b, h, i, j)``; helpers return the
smallest broadcast form (e.g. ``(b, 1, 1, j)`` for padding) and never fold heads into the batch,
so the fused kernel is fed an ``O(b * j)`` mask instead of an ``O(b * h * i * j)`` one.

Axis legend: ``b`` batch, ``h`` heads, ``i`` query position, ``j`` key position.
"""

from __future__ import annotations

import torch

from headwise import limits

__all__ = ["causal", "causal_block", "sliding_window", "from_valid_lens", "padding", "combine",
           "as_bias", "as_4d", "fill", "check", "neutral"]

_ALIGNS = ("bottom_right", "top_left")


def causal(nq: int, nk: int | None = None, *, align: str = "bottom_right",
           device: torch.device | str | None = None) -> torch.Tensor:
    """Causal mask ``(i, j)``: query ``i`` may attend key ``j`` only if ``j`` is not later.

    ``align`` matters only when ``nq != nk``:

    - ``"bottom_right"`` (default; FlashAttention >= 2.1, KV-cache decoding): the *last* query
      lines up with the *last* key, i.e. the queries are the newest ``nq`` positions of a
      sequence of ``nk``. Query ``i`` sees keys ``j <= i + (nk - nq)``.
    - ``"top_left"`` (``F.scaled_dot_product_attention(is_causal=True)``): the *first* query
      lines up with the first key. Query ``i`` sees keys ``j <= i``.
    """
    nk = nq if nk is None else nk
    for name, n in (("nq", nq), ("nk", nk)):
        limits.size(n, name, "length", "causal", low=0)
    if align not in _ALIGNS:
        raise ValueError(f"causal: align must be one of {_ALIGNS}, got {align!r}")
    _check_room(nq, nk, "causal", "pass causal=True to headwise.attention instead (no (i, j) "
                "mask is built)")
    offset = nk - nq if align == "bottom_right" else 0
    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril(diagonal=offset)


def _check_room(nq: int, nk: int, where: str, fix: str) -> None:
    """An ``(nq, nk)`` bool mask (1 byte each) must fit in memory: each length may be within
    the limits while their product is not (causal(10**6) is a 1 TB tensor)."""
    limits.check_memory(nq * nk, f"a ({nq:,}, {nk:,}) bool mask", where, fix)


def causal_block(rows: torch.Tensor, keys: torch.Tensor, nq: int, nk: int) -> torch.Tensor:
    """The bottom-right rule of :func:`causal` for a block of it: ``(c, js)`` bool for query
    positions ``rows (c,)`` and key positions ``keys (js,)`` of an ``(nq, nk)`` attention, key
    ``j`` allowed for query ``i`` iff ``j <= i + nk - nq`` (the chunked weights and statistics
    take it block by block instead of building the whole ``(i, j)`` mask)."""
    return keys[None, :] <= rows[:, None] + (nk - nq)


def as_4d(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``mask`` broadcastable to ``(b, h, i, j)`` as a 4-D view (leading axes of size 1): the
    form the fused kernels take and the chunked passes index."""
    return None if mask is None else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def fill(scores: torch.Tensor, mask: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
    """The one way a mask enters scores: a bool mask (True = may attend) puts ``-inf`` where it
    is False, a float mask is added (cast to the scores' dtype, as SDPA does). ``inplace``: into
    ``scores`` (the chunked passes' scratch), else a new tensor (autograd's eager path)."""
    if mask.dtype == torch.bool:
        return (scores.masked_fill_ if inplace else scores.masked_fill)(~mask, float("-inf"))
    return scores.add_(mask) if inplace else scores + mask.to(scores.dtype)


def sliding_window(nq: int, nk: int, window: int, *, causal: bool = True,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Sliding-window mask ``(i, j)`` (Longformer; Mistral), bottom-right aligned like
    :func:`causal`: query ``i`` sits at position ``p = i + (nk - nq)``.

    With ``causal`` it keeps the keys ``j > p - window`` (the query itself and the
    ``window - 1`` positions before it; later keys are causal's business, so the result combines
    with ``is_causal``); without, the keys with ``|p - j| < window``.
    """
    for name, n, low in (("nq", nq, 0), ("nk", nk, 0), ("window", window, 1)):
        if not isinstance(n, int) or isinstance(n, bool) or n < low:
            raise ValueError(f"sliding_window: {name} must be an int >= {low}, got {n!r}")
    _check_room(nq, nk, "sliding_window", "build it for fewer positions")
    ones = torch.ones(nq, nk, dtype=torch.bool, device=device)
    offset = nk - nq
    keep = ones.triu(diagonal=offset - window + 1)  # j >= p - window + 1
    return keep if causal else keep & ones.tril(diagonal=offset + window - 1)


def from_valid_lens(valid_lens: torch.Tensor, nk: int, nq: int | None = None) -> torch.Tensor:
    """Key-padding mask from lengths (the d2l convention): key ``j`` is valid if ``j < len``.

    ``valid_lens``: ``(b,)`` -> mask ``(b, 1, 1, j)``; or ``(b, i)`` (one length per query,
    ``nq`` must then equal ``i`` if given) -> mask ``(b, 1, i, j)``.
    """
    limits.size(nk, "nk", "length", "from_valid_lens", low=0)
    if nq is not None:
        limits.size(nq, "nq", "length", "from_valid_lens", low=0)
    if not isinstance(valid_lens, torch.Tensor):
        try:
            valid_lens = torch.as_tensor(valid_lens)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"from_valid_lens: valid_lens must be integer lengths, got "
                            f"{valid_lens!r:.80}; pass e.g. torch.tensor([3, 5])") from None
    if valid_lens.is_floating_point() or valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(f"valid_lens must be an integer tensor, got dtype {valid_lens.dtype}; "
                        "pass lengths such as torch.tensor([3, 5])")
    keys = torch.arange(nk, device=valid_lens.device)
    if valid_lens.dim() == 1:
        return (keys < valid_lens[:, None])[:, None, None, :]
    if valid_lens.dim() == 2:
        if nq is not None and valid_lens.shape[1] != nq:
            raise ValueError(f"valid_lens has shape {tuple(valid_lens.shape)} = (b, i) but "
                             f"nq={nq}; give one length per query position")
        return (keys < valid_lens[..., None])[:, None, :, :]
    raise ValueError(f"valid_lens must have shape (b,) or (b, i), got {tuple(valid_lens.shape)}")


def padding(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Key-padding mask ``(b, 1, 1, j)`` from token ids ``(b, j)``: False where ``tokens == pad_id``."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"padding: tokens must be a torch.Tensor of ids (b, j), got "
                        f"{type(tokens).__name__}; use torch.tensor(...)")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"padding: tokens must hold integer ids, got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"padding: tokens must be (b, j), got shape {tuple(tokens.shape)}")
    if not isinstance(pad_id, int) or isinstance(pad_id, bool):
        raise TypeError(f"padding: pad_id must be an int, got {pad_id!r}")
    return (tokens != pad_id)[:, None, None, :]


def as_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive form of a mask: 0 where attending is allowed, ``-inf`` where not."""
    check(mask, "as_bias")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"as_bias: dtype must be a floating torch.dtype, got {dtype!r}")
    if mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        return torch.where(mask, zero, float("-inf"))
    return mask.to(dtype)


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Combine masks (``None`` entries ignored) into one that allows only what all allow.

    Bool masks are AND-ed and stay bool; if any mask is a float (additive) mask, the result is
    the sum of their additive forms. The result broadcasts to every input's shape.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    for m in present:
        check(m, "combine")
    try:
        torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError:
        raise ValueError(f"combine: masks of shapes {[tuple(m.shape) for m in present]} do not "
                         "broadcast together; give each (b, h, i, j) axis size 1 or its full "
                         "size, e.g. (b, 1, 1, j) padding with an (i, j) causal mask") from None
    if all(m.dtype == torch.bool for m in present):
        out = present[0]
        for m in present[1:]:
            out = out & m
        return out
    dtype = next(m.dtype for m in present if m.is_floating_point())
    out = as_bias(present[0], dtype)
    for m in present[1:]:
        out = out + as_bias(m, dtype)
    return out


def neutral(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
            mask: torch.Tensor | None, causal: bool):
    """The masked-NaN rule, for inputs a finite check found NaN or inf in (or could not read):
    ``(k, v, weights_bad, out_bad)``. A row's output and weights depend only on the positions
    it may attend:

    - ``k (b, g, j, d)`` and ``v (b, g, j, e)`` (or None) come back with every NaN and inf put
      to 0 where a mask is given (``mask`` 4-D or fewer, ``causal`` bottom-right), so a
      position a row may not attend changes nothing of that row, whatever it held (``0 * NaN``
      is NaN, and ``-inf + NaN`` is NaN: masking the scores alone does not do it);
    - ``weights_bad (b, h, i, 1)`` is True for the rows whose weights the NaN policy makes NaN:
      their query ``q (b, h, i, d)`` holds NaN or inf, or they may attend a position whose key
      does; ``out_bad``, the rows whose output it makes NaN: those, and the rows that may
      attend a position whose value does (without a mask: every row of that head, and ``k``,
      ``v`` are returned as they are).

    A float mask excludes where it is ``-inf`` or the dtype's lowest value (transformers'
    additive padding)."""
    # NaN or inf: exactly where x * 0 is NaN (two kernels where isfinite launches four)
    bad = [None if t is None else (t * 0).isnan() for t in (k, v)]
    bad_w = (q * 0).isnan().any(-1, keepdim=True) | _seen(bad[0].any(-1), q, mask, causal)
    bad_out = bad_w if v is None else bad_w | _seen(bad[1].any(-1), q, mask, causal)
    if mask is not None or causal:
        k, v = (None if t is None else t.masked_fill(x, 0.0)
                for t, x in zip((k, v), bad, strict=True))
    return k, v, bad_w, bad_out


def _seen(pos: torch.Tensor, q: torch.Tensor, mask: torch.Tensor | None,
          causal: bool) -> torch.Tensor:
    """``(b, h, i or 1, 1)``: the rows of ``q (b, h, i, d)`` that may attend a position ``pos
    (b, g, j)`` marks, with no ``(b, h, i, j)`` tensor and no host read: a mask without a query
    axis is folded into ``pos`` (then causality is the first marked key: row ``i`` sees it iff
    it lies at or before ``i + j - i_len``); one with a query axis is multiplied with it."""
    h, nq, nk = q.shape[1], q.shape[2], pos.shape[-1]
    pos = pos.repeat_interleave(h // pos.shape[1], dim=1)[:, :, None, :]    # (b, h, 1, j)
    keep = None if mask is None else as_4d(mask)
    if keep is not None and keep.dtype != torch.bool:
        keep = keep > torch.finfo(keep.dtype).min  # -inf, and transformers' lowest value
    if keep is not None and keep.shape[-2] == 1:
        pos, keep = pos & keep, None
    if nk == 0 or (keep is None and not causal):
        return pos.any(-1, keepdim=True)
    if keep is None:  # causal alone: the first marked key of each head
        where = torch.arange(nk, device=pos.device)
        first = torch.where(pos, where, nk).amin(-1, keepdim=True)             # (b, h, 1, 1)
        rows = torch.arange(nk - nq, nk, device=pos.device)[:, None]           # (i, 1)
        return rows >= first
    if causal:
        keep = keep & causal_block(torch.arange(nq, device=pos.device),
                                   torch.arange(nk, device=pos.device), nq, nk)
    return (keep.to(torch.float32) @ pos.to(torch.float32).transpose(-1, -2)) > 0


def form(mask: torch.Tensor) -> str:
    """How a mask enters the scores, as the trace names it: ``"bool"`` or ``"float (additive)"``."""
    return "bool" if mask.dtype == torch.bool else "float (additive)"


def check(mask: torch.Tensor, where: str, shape: tuple[int, ...] | None = None) -> None:
    """Raise a readable error unless ``mask`` is a bool or float tensor broadcastable to ``shape``
    (the scores' ``(b, h, i, j)``)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{where}: mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"{where}: mask must be bool (True = may attend) or float (added to the "
                        f"scores), got dtype {mask.dtype}; use mask.bool() for a 0/1 mask")
    if shape is None:
        return
    if mask.dim() > len(shape):
        raise ValueError(f"{where}: mask has {mask.dim()} dims {tuple(mask.shape)}, expected at "
                         f"most {len(shape)} broadcastable to (b, h, i, j) = {tuple(shape)}")
    for got, want in zip(reversed(mask.shape), reversed(shape), strict=False):
        if got not in (1, want):
            raise ValueError(f"{where}: mask of shape {tuple(mask.shape)} does not broadcast to "
                             f"(b, h, i, j) = {tuple(shape)}; use size 1 or the full size on "
                             "each axis, e.g. (b, 1, 1, j) for key padding")
