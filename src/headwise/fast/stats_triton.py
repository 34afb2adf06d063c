"""Streaming head statistics in one Triton kernel: the GPU form of :func:`headwise.stats.head_stats`.

Axis legend: ``b`` batch, ``h`` heads, ``g`` key/value heads, ``i`` query position, ``j`` key
position, ``d`` head dim, ``k`` top-k.

The plain torch form materialises a block of weights and makes ~15 passes over it (scores,
shift, exp, sums, products, ``topk``): at 16k tokens that is tens of GB of memory traffic. The
floor is ``q k^T`` plus one exp per score (``anchors-gpu-2026.md`` section 3). This kernel gets
close to it the way flash attention does: one program per ``(batch x head, block of query
rows)`` walks the keys in tiles held in registers, and reduces every tile at once to the row
statistics (entropy, max weight, sink, previous token, distance, induction), the per-key column
sums (``received``, one atomic add per key and row block) and a running top-k per row (the
tile's best ``k`` replace the running list's smallest entries; a tile none of whose weights
beats a row's current k-th best is skipped). Nothing of size ``(i, j)`` is written.

The weights are ``exp(s - lse)`` with ``s`` the scaled, masked score: with ``lse`` given (the
fused kernel's, float32, ~1e-6 from a float64 logsumexp) that is one pass over the keys; without
it a first pass computes it (online max and sum, as flash attention's forward). Fully masked
rows have ``lse = -inf`` and every statistic 0 (not live), as on the CPU. NaN rows are the
caller's to mark (:func:`headwise.stats.head_stats` does, with no host read).

:func:`head_stats` takes ``q (b, h, i, d)``, ``k (b, g, j, d)`` in float32, bfloat16 or float16
(products accumulate in float32; float32 inputs multiply in IEEE float32, not TF32). Under
``TRITON_INTERPRET=1`` the same kernel runs on CPU tensors (how the CPU tests check it).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

__all__ = ["head_stats", "DTYPES", "MAX_TOP_K"]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_TOP_K = 16  # the running top-k list lives in registers: (rows, next_pow2(k)) per program
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@triton.jit
def _scores(q, k_ptr, kb, offs_n, offs_d, j0, nk, D, stride_kj, stride_kd, mask_ptr, mb,
            stride_mi, stride_mj, offs_m, row_ok, pos, qk_scale, PREC: tl.constexpr,
            MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """``(M, N)`` scores of a tile in log2 units (``-inf`` where masked or past ``nk``) and its
    allowed-key mask."""
    cols = j0 + offs_n
    kt = tl.load(k_ptr + kb + cols[None, :] * stride_kj + offs_d[:, None] * stride_kd,
                 mask=(cols[None, :] < nk) & (offs_d[:, None] < D), other=0.0)
    s = tl.dot(q, kt, input_precision=PREC) * qk_scale
    ok = (cols < nk)[None, :] & row_ok[:, None]
    if CAUSAL:
        ok = ok & (cols[None, :] <= pos[:, None])
    if MASK == 1:  # bool: True = may attend
        mv = tl.load(mask_ptr + mb + offs_m[:, None] * stride_mi + cols[None, :] * stride_mj,
                     mask=ok, other=0)
        ok = ok & (mv != 0)
    if MASK == 2:  # additive, in natural-log units
        mv = tl.load(mask_ptr + mb + offs_m[:, None] * stride_mi + cols[None, :] * stride_mj,
                     mask=ok, other=0.0).to(tl.float32)
        s = s + mv * 1.4426950408889634
    s = tl.where(ok, s, float("-inf"))
    return s, ok, cols


@triton.jit
def _lse_pass(q, k_ptr, kb, offs_n, offs_d, end, NK, D, stride_kj, stride_kd, mask_ptr, mb,
              stride_mi, stride_mj, offs_m, row_ok, pos, qk_scale, PREC: tl.constexpr,
              MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """``(M,)`` log2-sum-exp2 of the rows' scores: the online max and sum of flash attention
    (``-inf`` for a row with no allowed key)."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for j0 in range(0, end, BLOCK_N):
        s, ok, cols = _scores(q, k_ptr, kb, offs_n, offs_d, j0, NK, D, stride_kj, stride_kd,
                              mask_ptr, mb, stride_mi, stride_mj, offs_m, row_ok, pos, qk_scale,
                              PREC, MASK, CAUSAL)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - safe) + tl.sum(tl.exp2(s - safe[:, None]), 1)
        m_i = m_new
    return tl.where(l_i > 0, m_i + tl.log2(l_i), float("-inf"))


@triton.jit
def _induction(p, ids_ptr, idb, stride_idj, cols, cur, pos, NK):
    """``(M,)`` weight on keys ``j`` whose previous token is the query's token, ``j - 1`` before
    the query (Olsson et al. 2022)."""
    before = tl.load(ids_ptr + idb + (cols - 1) * stride_idj, mask=(cols >= 1) & (cols < NK),
                     other=-1)
    target = (before[None, :] == cur[:, None]) & (cols[None, :] - 1 < pos[:, None]) \
        & (cols[None, :] >= 1)
    return tl.sum(tl.where(target, p, 0.0), 1)


@triton.jit
def _merge_top(cand, offs_n, j0, topv, topi, slots, TOP_K: tl.constexpr):
    """The running top-k ``(M, KP)`` (unsorted) merged with a tile's weights ``cand (M, N)``:
    the tile's best ``TOP_K``, one at a time, each replacing the list's smallest if larger.
    A round in which no row's best left beats its current k-th best ends the merge (the best
    only falls and the k-th best only rises): with row j's list full, a tile brings ~64 x 64 x
    k / j new entries spread over 64 rows, so one or two rounds, not k."""
    for _t in range(TOP_K):  # a loop, not unrolled: compile time and code size stay small
        best = tl.max(cand, 1)
        low = tl.min(topv, 1)
        if tl.max(best - low, 0) > 0:
            at = tl.argmax(cand, 1)
            cand = tl.where(offs_n[None, :] == at[:, None], -3.0, cand)
            slot = tl.argmin(topv, 1)
            put = (slots[None, :] == slot[:, None]) & (best > low)[:, None]
            topv = tl.where(put, best[:, None], topv)
            topi = tl.where(put, (at + j0)[:, None], topi)
    return topv, topi


@triton.jit
def _stats_pass(q, k_ptr, kb, offs_n, offs_d, end, NK, D, stride_kj, stride_kd, mask_ptr, mb,
                stride_mi, stride_mj, offs_m, row_ok, pos, qk_scale, lse2, ids_ptr, idb,
                stride_idj, recv_ptr, PREC: tl.constexpr, MASK: tl.constexpr,
                CAUSAL: tl.constexpr, IDS: tl.constexpr, TOP_K: tl.constexpr,
                KP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One walk over the keys with weights ``exp2(s - lse2)``: the row sums (entropy in log2
    units, max, sink, previous token, distance, induction), whether a row has a finite score,
    the running top-k, and the column sums added into ``recv_ptr``."""
    shift = tl.where(lse2 == float("-inf"), 0.0, lse2)
    zero = tl.zeros([BLOCK_M], tl.float32)
    ent, maxw, sink, prev, dist, ind = zero, zero, zero, zero, zero, zero
    live = tl.zeros([BLOCK_M], tl.int32)  # a given lse is 0, not -inf, on fully masked rows
    slots = tl.arange(0, KP)
    # real slots start at -1 (below any weight), padding slots at +inf (never the minimum)
    topv = tl.where(slots < TOP_K, -1.0, float("inf"))[None, :] \
        + tl.zeros([BLOCK_M, KP], tl.float32)
    topi = slots[None, :] + tl.zeros([BLOCK_M, KP], tl.int32)
    cur = pos
    if IDS:  # the query's own token
        cur = tl.load(ids_ptr + idb + tl.minimum(tl.maximum(pos, 0), NK - 1) * stride_idj,
                      mask=row_ok, other=-1)
    for j0 in range(0, end, BLOCK_N):
        s, ok, cols = _scores(q, k_ptr, kb, offs_n, offs_d, j0, NK, D, stride_kj, stride_kd,
                              mask_ptr, mb, stride_mi, stride_mj, offs_m, row_ok, pos, qk_scale,
                              PREC, MASK, CAUSAL)
        live = tl.maximum(live, tl.max((s > float("-inf")).to(tl.int32), 1))
        x = s - shift[:, None]
        p = tl.where(ok, tl.exp2(x), 0.0)
        ent += tl.sum(tl.where(p > 0, p * x, 0.0), 1)  # 0 x -inf (an additive -inf) is 0
        maxw = tl.maximum(maxw, tl.max(p, 1))
        sink += tl.sum(tl.where(cols[None, :] == 0, p, 0.0), 1)
        prev += tl.sum(tl.where(cols[None, :] == pos[:, None] - 1, p, 0.0), 1)
        dist += tl.sum(p * tl.abs(pos[:, None] - cols[None, :]).to(tl.float32), 1)
        if IDS:
            ind += _induction(p, ids_ptr, idb, stride_idj, cols, cur, pos, NK)
        tl.atomic_add(recv_ptr + cols, tl.sum(p, 0), mask=cols < NK, sem="relaxed")
        topv, topi = _merge_top(tl.where((cols < NK)[None, :], p, -2.0), offs_n, j0, topv,
                                topi, slots, TOP_K)
    return live, ent, maxw, sink, prev, dist, ind, topv, topi


@triton.jit(do_not_specialize=["H", "G", "NQ", "NK"])  # one compilation for every length
def _stats_kernel(
        q_ptr, k_ptr, mask_ptr, ids_ptr, lse_ptr,
        ent_ptr, maxw_ptr, sink_ptr, prev_ptr, dist_ptr, ind_ptr, live_ptr, recv_ptr,
        topv_ptr, topi_ptr,
        H, G, NQ, NK, D, qk_scale,
        stride_qb, stride_qh, stride_qi, stride_qd,
        stride_kb, stride_kh, stride_kj, stride_kd,
        stride_mb, stride_mh, stride_mi, stride_mj,
        stride_lb, stride_lh, stride_li,
        stride_idb, stride_idj,
        HAS_LSE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, IDS: tl.constexpr,
        TOP_K: tl.constexpr, KP: tl.constexpr, PREC: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    rb, bh = tl.program_id(0), tl.program_id(1)  # a block of query rows of one (batch, head)
    b, h = bh // H, bh % H
    offs_m = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_D)
    row_ok = offs_m < NQ
    pos = offs_m + (NK - NQ)  # each query's key position (bottom-right aligned)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qi
                + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & (offs_d[None, :] < D),
                other=0.0)
    kb = b * stride_kb + (h // (H // G)) * stride_kh  # the key head this query head reads
    mb = b * stride_mb + h * stride_mh
    # keys in reach of this block: up to its last row under causal; at least the first TOP_K
    # (every slot of the top-k list gets a distinct real key, weight 0 if masked)
    last = tl.minimum(rb * BLOCK_M + BLOCK_M, NQ) - 1 + (NK - NQ)
    reach = NK
    if CAUSAL:
        reach = tl.minimum(NK, last + 1)
    end = tl.maximum(reach, tl.minimum(NK, TOP_K))
    if HAS_LSE:  # natural log -> log2 units
        lse2 = tl.load(lse_ptr + b * stride_lb + h * stride_lh + offs_m * stride_li,
                       mask=row_ok, other=float("-inf")).to(tl.float32) * 1.4426950408889634
    else:
        lse2 = _lse_pass(q, k_ptr, kb, offs_n, offs_d, end, NK, D, stride_kj, stride_kd,
                         mask_ptr, mb, stride_mi, stride_mj, offs_m, row_ok, pos, qk_scale,
                         PREC, MASK, CAUSAL, BLOCK_M, BLOCK_N)
    live, ent, maxw, sink, prev, dist, ind, topv, topi = _stats_pass(
        q, k_ptr, kb, offs_n, offs_d, end, NK, D, stride_kj, stride_kd, mask_ptr, mb,
        stride_mi, stride_mj, offs_m, row_ok, pos, qk_scale, lse2, ids_ptr, b * stride_idb,
        stride_idj, recv_ptr + bh * NK, PREC, MASK, CAUSAL, IDS, TOP_K, KP, BLOCK_M, BLOCK_N)
    out = bh * NQ + offs_m
    tl.store(ent_ptr + out, -ent * 0.6931471805599453, mask=row_ok)  # log2 -> nats
    tl.store(maxw_ptr + out, maxw, mask=row_ok)
    tl.store(sink_ptr + out, sink, mask=row_ok)
    tl.store(prev_ptr + out, prev, mask=row_ok)
    tl.store(dist_ptr + out, dist, mask=row_ok)
    tl.store(live_ptr + out, live.to(tl.int8), mask=row_ok)
    if IDS:
        tl.store(ind_ptr + out, ind, mask=row_ok)
    top = out[:, None] * TOP_K + tl.arange(0, KP)[None, :]
    keep = row_ok[:, None] & (tl.arange(0, KP)[None, :] < TOP_K)
    tl.store(topv_ptr + top, tl.maximum(topv, 0.0), mask=keep)
    tl.store(topi_ptr + top, topi.to(tl.int64), mask=keep)


def head_stats(q: torch.Tensor, k: torch.Tensor, *, mask: torch.Tensor | None, causal: bool,
               scale: float | None, lse: torch.Tensor | None, token_ids: torch.Tensor | None,
               top_k: int) -> dict[str, torch.Tensor | None]:
    """The fields of :class:`headwise.stats.HeadStats` (float32; ``top_values``/``top_keys``
    sorted by weight, largest first) from one kernel launch (two key passes without ``lse``).

    Args:
        q: ``(b, h, i, d)``; k: ``(b, g, j, d)``, ``h`` a multiple of ``g``.
        mask: bool (True = may attend) or additive float, 4-D, broadcastable to ``(b, h, i, j)``.
        lse: ``(b, h, i)`` natural-log row log-sum-exp of the masked scores, or None.
        token_ids: ``(b, j)`` integer ids, or None.
        top_k: ``1..MAX_TOP_K``, at most ``j``.
    """
    b, h, nq, d = q.shape
    g, nk = k.shape[1], k.shape[2]
    assert 1 <= top_k <= min(MAX_TOP_K, nk) and h % g == 0
    dev = q.device
    rows = lambda: torch.empty(b, h, nq, device=dev, dtype=torch.float32)  # noqa: E731
    ent, maxw, sink, prev, dist = rows(), rows(), rows(), rows(), rows()
    ind = rows() if token_ids is not None else None
    live = torch.empty(b, h, nq, device=dev, dtype=torch.int8)
    recv = torch.zeros(b, h, nk, device=dev, dtype=torch.float32)
    topv = torch.empty(b, h, nq, top_k, device=dev, dtype=torch.float32)
    topi = torch.empty(b, h, nq, top_k, device=dev, dtype=torch.int64)
    if mask is not None:
        mask = mask.expand(b, h, nq, nk)
        kind = 1 if mask.dtype == torch.bool else 2
        mask_arg = mask.view(torch.int8) if kind == 1 else mask
        ms = mask.stride()
    else:
        kind, mask_arg, ms = 0, q, (0, 0, 0, 0)
    ids = token_ids if token_ids is not None else q
    ids_s = token_ids.stride() if token_ids is not None else (0, 0)
    lse_arg = lse if lse is not None else q
    ls = lse.stride() if lse is not None else (0, 0, 0)
    block_m, block_n = 64, 64
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    grid = (triton.cdiv(nq, block_m), b * h)
    _stats_kernel[grid](
        q, k, mask_arg, ids, lse_arg, ent, maxw, sink, prev, dist, ind if ind is not None
        else ent, live, recv, topv, topi,
        h, g, nq, nk, d, scale * _LOG2E,
        *q.stride(), *k.stride(), *ms, *ls, *ids_s,
        HAS_LSE=lse is not None, MASK=kind, CAUSAL=bool(causal), IDS=token_ids is not None,
        TOP_K=top_k, KP=triton.next_power_of_2(top_k),
        PREC="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        num_warps=4)
    topv, order = topv.sort(-1, descending=True)
    return {"entropy": ent, "max_weight": maxw, "received": recv, "sink": sink,
            "prev_token": prev, "induction": ind, "distance": dist, "top_values": topv,
            "top_keys": topi.gather(-1, order), "live": live.bool()}
