"""Per-head attention weights written once, by one Triton kernel, from the row log-sum-exp.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position, ``j``
key position, ``d`` head dim; ``hs``, ``is``, ``js`` the selected heads, rows and keys.

Given the LSE the fused CUDA kernel returned with the output (:mod:`headwise.fast.cuda_lse`),
each weight is one formula (:mod:`headwise.weights`)::

    w[b, h, i, j] = exp(q_i . k_j * scale + bias_ij - lse[b, h, i])

Plain torch ops cannot beat torch's own ``need_weights`` path with it (a float32 score
tensor is written, read, written again); the kernel here computes a tile of scores in registers
(float32 accumulation), masks it, exponentiates it and stores it once in the output dtype, so its
cost is the write of the weights plus ``q k^T`` (``benchmarks/RESULTS.md``, the H100 ``weights``
section). No working
memory beyond the returned tensor, no host read.

What it writes, per the rules of :func:`headwise.attention`:

- masked keys (bool mask False, additive ``-inf``, causal) -> exactly 0; a fully masked row
  -> all 0, whatever LSE the kernel reported for it (flash gives ``+inf``, others ``-inf``);
- NaN policy: a query row holding NaN or inf, or a head whose keys hold one anywhere (masked
  positions too), -> NaN in every entry (the row's float32 sum, tested in the kernel; the
  head's float32 key sum, one reduction before the launch).

:func:`weights_from_lse` is a ``torch.library`` custom op (``headwise::weights_from_lse``) with
a fake implementation, so fake-CUDA tests count it as one kernel and torch.compile can trace it.
Under ``TRITON_INTERPRET=1`` the same kernel runs on CPU tensors (the tests' float64 check).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from headwise import masks as _masks
from headwise.fast import compiling

__all__ = ["select_and_launch", "weights_from_lse"]

_NO_MASK, _BOOL_MASK, _ADD_MASK = 0, 1, 2


# Sizes, offsets and the inputs' outer strides vary from call to call: specialising the kernel
# on them (== 1, divisible by 16) would compile a variant per selection shape for no gain, as
# the cost is the store of the weights. The key count stays specialised, and the contiguous
# output's offsets are computed from it: a key count divisible by 16 lets the masked stores go
# out 16 bytes at a time (st.global.v4 instead of one st.global.b16 per bf16 weight, seen in
# the PTX for sm_90), and one flag of it is the only variant the output adds.
_VARYING = ["sq0", "sq1", "sq2", "sk0", "sk1", "sk2", "sl0", "sl1", "sl2", "ss0", "ss1",
            "sm0", "sm1", "sm2", "HS", "NI", "D", "GROUP", "HEAD0", "ROW0", "KEY0", "SHIFT"]


@triton.jit(do_not_specialize=_VARYING)
def _weights_kernel(Q, K, LSE, KSUM, M, W, RP, KP,
                    sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sl0, sl1, sl2, ss0, ss1,
                    sm0, sm1, sm2, sm3,
                    HS, NI, NJ, D, GROUP, HEAD0, ROW0, KEY0, SHIFT, scale,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    MASK: tl.constexpr, CAUSAL: tl.constexpr, ROW_IDX: tl.constexpr,
                    KEY_IDX: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n, pid_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # 64-bit offsets: a weights tensor may pass 2^31 elements (b=8, h=16, n=4096)
    b, h = (pid_bh // HS).to(tl.int64), (pid_bh % HS).to(tl.int64)
    kvh = (HEAD0 + h) // GROUP  # grouped-query attention: the key head this query head reads
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    in_m, in_n, in_d = offs_m < NI, offs_n < NJ, offs_d < D
    q = tl.load(Q + b * sq0 + h * sq1 + offs_m[:, None] * sq2 + offs_d[None, :] * sq3,
                mask=in_m[:, None] & in_d[None, :], other=0.0)
    kt = tl.load(K + b * sk0 + kvh * sk1 + offs_n[None, :] * sk2 + offs_d[:, None] * sk3,
                 mask=in_n[None, :] & in_d[:, None], other=0.0)          # (d, n)
    if IEEE:
        s = tl.dot(q, kt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)                                                 # float32 accumulation
    s = s * scale
    allowed = in_n[None, :] & in_m[:, None]
    mp = M + b * sm0 + h * sm1 + offs_m[:, None] * sm2 + offs_n[None, :] * sm3
    if MASK == 1:
        allowed = allowed & (tl.load(mp, mask=allowed, other=0) != 0)
    if MASK == 2:
        s = s + tl.load(mp, mask=allowed, other=0.0).to(tl.float32)
        allowed = allowed & (s > float("-inf"))
    if CAUSAL:  # bottom-right: key j allowed for query i iff j <= i + (nk - nq)
        if ROW_IDX:
            rows = tl.load(RP + offs_m, mask=in_m, other=0)
        else:
            rows = ROW0 + offs_m
        if KEY_IDX:
            keys = tl.load(KP + offs_n, mask=in_n, other=0)
        else:
            keys = KEY0 + offs_n
        allowed = allowed & (keys[None, :] <= rows[:, None] + SHIFT)
    lse = tl.load(LSE + b * sl0 + h * sl1 + offs_m * sl2, mask=in_m, other=0.0)
    w = tl.where(allowed, tl.exp(s - lse[:, None]), 0.0)
    qsum = tl.sum(q.to(tl.float32), axis=1)                               # NaN policy: the row
    ksum = tl.load(KSUM + b * ss0 + kvh * ss1)                            # and the head
    poison = qsum * 0.0 + ksum * 0.0                  # 0 when both are finite, else NaN
    w = tl.where((poison != poison)[:, None], float("nan"), w)
    row = (b * HS + h) * NI + offs_m                                      # W is contiguous
    tl.store(W + row[:, None] * NJ + offs_n[None, :], w.to(W.dtype.element_ty),
             mask=in_m[:, None] & in_n[None, :])


def _weights_from_lse(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, ksum: torch.Tensor,
                     mask: torch.Tensor | None, row_pos: torch.Tensor | None,
                     key_pos: torch.Tensor | None, group: int, head0: int, row0: int,
                     key0: int, shift: int, causal: bool, scale: float) -> torch.Tensor:
    """``w (b, hs, is, js)`` in ``q.dtype``: ``exp(q k^T * scale + bias - lse)``, masked -> 0,
    the NaN policy's rows -> NaN (module docstring).

    Args:
        q: ``(b, hs, is, d)`` the selected queries (any strides).
        k: ``(b, gk, js, d)`` the selected keys; query head ``x`` reads key head
            ``(head0 + x) // group``.
        lse: ``(b, hs, is)`` float32, natural log, of the same masked scores.
        ksum: ``(b, gk)`` float32 sum of each key head over all its keys (NaN policy).
        mask: None, or bool (True = may attend) / additive, ``(b, hs, is, js)`` (stride-0 views
            of a broadcast mask are fine).
        row_pos, key_pos: the positions of the selected rows / keys (int64) when not a range
            starting at ``row0`` / ``key0``; with ``causal`` (bottom-right, ``shift = nk - nq``).
    """
    b, hs, ni, d = q.shape
    nj = k.shape[2]
    w = torch.empty(b, hs, ni, nj, dtype=q.dtype, device=q.device)
    if w.numel() == 0:
        return w
    kind = _NO_MASK if mask is None else _BOOL_MASK if mask.dtype == torch.bool else _ADD_MASK
    if kind == _BOOL_MASK:
        mask = mask.view(torch.uint8)
    m = mask if mask is not None else w  # any pointer: not read without a mask
    block_d = max(16, triton.next_power_of_2(d))
    block_n = 128 if block_d <= 128 else 64
    grid = (triton.cdiv(ni, 64), triton.cdiv(nj, block_n), b * hs)
    _weights_kernel[grid](
        q, k, lse, ksum, m, w, row_pos if row_pos is not None else lse,
        key_pos if key_pos is not None else lse,
        *q.stride(), *k.stride(), *lse.stride(), *ksum.stride(),
        *(m.stride() if mask is not None else (0, 0, 0, 0)),
        hs, ni, nj, d, group, head0, row0, key0, shift, scale,
        BLOCK_M=64, BLOCK_N=block_n, BLOCK_D=block_d, MASK=kind, CAUSAL=causal,
        ROW_IDX=row_pos is not None, KEY_IDX=key_pos is not None,
        IEEE=q.dtype == torch.float32, num_warps=4)
    return w


# The custom op: what fake tensors (the CPU-only budget tests) and torch.compile see. Eager
# calls on real tensors launch directly: the op's dispatch costs more host time per call than
# the one-head kernel itself takes on the GPU (cProfile, torch 2.11).
weights_from_lse = torch.library.custom_op("headwise::weights_from_lse",
                                           mutates_args=())(_weights_from_lse)


@weights_from_lse.register_fake
def _(q, k, lse, ksum, mask, row_pos, key_pos, group, head0, row0, key0, shift, causal, scale):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _take(x: torch.Tensor, dim: int, index, broadcast: bool = False) -> torch.Tensor:
    """``x`` along ``dim``: a view for a slice, a gather for index positions; with
    ``broadcast`` (a mask) an axis of size 1 stays."""
    if broadcast and x.shape[dim] == 1:
        return x
    if isinstance(index, slice):
        return x.narrow(dim, index.start, index.stop - index.start)
    return x.index_select(dim, index)


def select_and_launch(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, *,
                      mask: torch.Tensor | None, causal: bool, scale: float,
                      heads, rows, keys) -> torch.Tensor:
    """The weights of the selected ``heads``, ``rows``, ``keys`` (slices or int64 index
    tensors on the device, as :meth:`headwise.weights.Selection.resolve` gives them) of
    ``q (b, h, i, d)``, ``k (b, g, j, d)``, ``lse (b, h, i)``; ``mask`` broadcastable to
    ``(b, h, i, j)`` or None, ``causal`` bottom-right: views where the selection is a range,
    small gathers of q, k, lse and the mask where it is not, one key-sum reduction and one
    kernel."""
    b, h, nq, _ = q.shape
    g, nk = k.shape[1], k.shape[2]
    group, head0 = h // g, 0  # query head x of the selection reads key head (head0 + x) // group
    if isinstance(heads, slice):  # only the key heads the selected heads read
        kv0, kv1 = heads.start // group, (heads.stop - 1) // group + 1
        k, head0 = k.narrow(1, kv0, kv1 - kv0), heads.start - kv0 * group
    else:  # each selected query head's key head, gathered (a few heads' keys)
        k, group = k.index_select(1, heads // group), 1
    ksum = k.sum(dim=(-2, -1), dtype=torch.float32)                    # (b, gk)
    qs = _take(_take(q, 1, heads), 2, rows)
    lses = _take(_take(lse, 1, heads), 2, rows)
    ks = _take(k, 2, keys)
    if mask is not None:
        mask = _masks.as_4d(mask)
        mask = _take(_take(_take(mask, 1, heads, True), 2, rows, True), 3, keys, True)
        mask = mask.expand(b, qs.shape[1], qs.shape[2], ks.shape[2])
    row_pos = None if isinstance(rows, slice) else rows
    key_pos = None if isinstance(keys, slice) else keys
    direct = type(qs) is torch.Tensor and not compiling()
    return (_weights_from_lse if direct else weights_from_lse)(
        qs, ks, lses, ksum, mask, row_pos, key_pos, group, head0,
        rows.start if isinstance(rows, slice) else 0,
        keys.start if isinstance(keys, slice) else 0, nk - nq, causal, float(scale))
