"""A float64 reference for attention, written independently of headwise (loops over batch and
heads, plain matmul + softmax), used by the tests as the ground truth."""

from __future__ import annotations

import math

import torch


def reference_attention(q, k, v, mask=None, causal=False, scale=None, *, softcap=None,
                        sinks=None, window=None):
    """q (b, h, i, d), k (b, g, j, d), v (b, g, j, e); mask bool (True = attend) or float,
    broadcastable to (b, h, i, j); causal bottom-right. softcap: scores -> c tanh(s / c) before
    masking; sinks (h,): one more softmax term e^sink per head, no value; window: query i (at
    position i + j_len - i_len) sees no key window or more positions before it. Returns
    (out, weights) in float64."""
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
    for i in range(nq):
        if causal:
            allowed[:, :, i, max(0, i + (nk - nq) + 1):] = False
        if window is not None:
            allowed[:, :, i, :max(0, i + (nk - nq) - window + 1)] = False
    out = torch.zeros(b, h, nq, v.shape[-1], dtype=torch.float64)
    weights = torch.zeros(b, h, nq, nk, dtype=torch.float64)
    for bi in range(b):
        for x in range(h):
            y = x // (h // g)
            s = q[bi, x] @ k[bi, y].T * scale
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            s = (s + bias[bi, x]).masked_fill(~allowed[bi, x], -math.inf)
            for i in range(nq):
                if torch.isneginf(s[i]).all():
                    continue  # fully masked row: zero weights, zero output
                e = torch.exp(s[i] - s[i].max())
                total = e.sum()
                if sinks is not None:
                    total = total + torch.exp(sinks[x].double() - s[i].max())
                p = e / total
                weights[bi, x, i] = p
                out[bi, x, i] = p @ v[bi, y]
    return out, weights
