"""A float64 reference for attention, written independently of headwise (loops over batch and
heads, plain matmul + softmax), used by the tests as the ground truth."""

from __future__ import annotations

import math

import torch


def reference_attention(q, k, v, mask=None, causal=False, scale=None):
    """q (b, h, i, d), k (b, g, j, d), v (b, g, j, e); mask bool (True = attend) or float,
    broadcastable to (b, h, i, j); causal bottom-right. Returns (out, weights) in float64."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, nq, d = q.shape
    g, nk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    allowed = torch.ones(b, h, nq, nk, dtype=torch.bool)
    bias = torch.zeros(b, h, nq, nk, dtype=torch.float64)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask.expand(b, h, nq, nk)
        else:
            bias = bias + mask.double().expand(b, h, nq, nk)
    if causal:
        for i in range(nq):
            allowed[:, :, i, max(0, i + (nk - nq) + 1):] = False
    out = torch.zeros(b, h, nq, v.shape[-1], dtype=torch.float64)
    weights = torch.zeros(b, h, nq, nk, dtype=torch.float64)
    for bi in range(b):
        for x in range(h):
            y = x // (h // g)
            s = q[bi, x] @ k[bi, y].T * scale + bias[bi, x]
            s = s.masked_fill(~allowed[bi, x], -math.inf)
            for i in range(nq):
                if torch.isneginf(s[i]).all():
                    continue  # fully masked row: zero weights, zero output
                p = torch.softmax(s[i], dim=-1)
                weights[bi, x, i] = p
                out[bi, x, i] = p @ v[bi, y]
    return out, weights
