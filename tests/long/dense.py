"""A float64 dense reference for the long-context statistics: the whole ``(b, h, i, j)``
probabilities, then every statistic by its definition (no tiles, no cumulative sums)."""

from __future__ import annotations

import math

import torch


def probabilities(q, k, *, mask=None, causal=False, scale=None, softcap=None, sinks=None):
    """``(b, h, i, j)`` float64 probabilities of ``q (b, h, i, d)`` over ``k (b, h, j, d)``."""
    q, k = q.double(), k.double()
    nq, nk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    allowed = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        allowed = allowed.tril(nk - nq)
    allowed = allowed.expand_as(s)
    if mask is not None:
        allowed = allowed & (mask if mask.dtype == torch.bool else torch.isfinite(mask))
        if mask.dtype != torch.bool:
            s = s + mask.double().masked_fill(~torch.isfinite(mask), 0)
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    top = s.amax(-1, keepdim=True).clamp(min=-1e300)
    e = torch.exp(s - top)
    p = e / e.sum(-1, keepdim=True).clamp(min=1e-300)
    return (p[..., :nk] if sinks is not None else p), allowed, s[..., :nk]


def statistics(p, allowed, scores, *, block, sinks, window, far, top_k):
    """Every statistic of the pass, by definition, from dense ``p (b, h, i, j)``."""
    b, h, nq, nk = p.shape
    live = allowed.any(-1).double()                                    # (b, h, i)
    pos = torch.arange(nq).double() + (nk - nq)
    dist = pos[:, None] - torch.arange(nk).double()[None, :]           # (i, j)
    nI, nJ = math.ceil(nq / block), math.ceil(nk / block)
    maps = torch.zeros(b, h, nI, nJ, dtype=torch.float64)
    top_keys = torch.zeros(h, nI, min(top_k, nk), dtype=torch.long)
    top_mass = torch.zeros(h, nI, min(top_k, nk), dtype=torch.float64)
    for I in range(nI):
        rows = slice(I * block, (I + 1) * block)
        count = live[:, :, rows].sum(-1).clamp(min=1)
        for J in range(nJ):
            maps[:, :, I, J] = p[:, :, rows, J * block:(J + 1) * block].sum((-1, -2)) / count
        pooled = p[:, :, rows].sum((0, 2)) / live[:, :, rows].sum((0, 2)).clamp(min=1)[:, None]
        top_mass[:, I], top_keys[:, I] = pooled.topk(min(top_k, nk), dim=-1)
    rows_live = live.sum(-1).clamp(min=1)                               # (b, h)
    mean = lambda band: ((p * band).sum((-1, -2)) / rows_live).mean(0)  # noqa: E731
    edges = [0, 1] + [2 ** t for t in range(1, max(1, math.ceil(math.log2(max(nk, 2)))))]
    edges = [e for e in edges if e < nk] + [nk]
    distance = torch.stack([mean((dist >= a) & (dist < c)) for a, c in zip(edges, edges[1:], strict=False)],
                           -1)
    keys = torch.arange(nk)[None, :]
    sink, local = keys < sinks, (dist >= 0) & (dist < window)
    return {"maps": maps.mean(0), "received": p.sum(2).mean(0), "distance": distance,
            "sink": mean(sink), "local": mean(local), "streaming": mean(sink | local),
            "far": mean((dist > far) & ~sink), "mean_distance": mean(dist.clamp(min=0)),
            "topk_keys": top_keys, "topk_mass": top_mass, "edges": torch.tensor(edges),
            "max_logit": scores.amax(dim=(0, 2, 3))}
