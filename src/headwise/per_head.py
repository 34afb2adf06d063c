"""Multi-head attention as the loop over independent heads it really is, and the way back.

One projection of width ``h*d`` split into ``h`` heads *is* ``h`` independent projections of
width ``d`` (:mod:`headwise.heads`). :func:`unfuse` makes that literal, a ModuleList of per-head
projections (:class:`PerHeadAttention`), and :func:`fuse` puts it back into one
:class:`~headwise.MultiHeadAttention`; both forms have exactly the same parameters and outputs.
"""

from __future__ import annotations

import torch
from torch import nn

from headwise.attend import attention
from headwise.layers import MultiHeadAttention

__all__ = ["PerHeadAttention", "fuse", "unfuse"]


class PerHeadAttention(nn.Module):
    """Multi-head attention written as the for-loop over heads that it really is.

    ``q_heads[x]``, ``k_heads[y]``, ``v_heads[y]`` are head ``x``'s own ``Linear(in, d)``
    projections (query head ``x`` reads key/value head ``y = x // (h // g)``); the head outputs
    are concatenated and mixed by ``out_proj``. Made by :func:`unfuse`, turned back into one
    fused :class:`~headwise.MultiHeadAttention` by :func:`fuse`; the parameter count is the same
    either way: ``h`` projections of width ``d`` are one projection of width ``h*d``.
    """

    def __init__(self, q_heads: nn.ModuleList, k_heads: nn.ModuleList, v_heads: nn.ModuleList,
                 out_proj: nn.Linear, backend: str = "eager", dropout: float = 0.0):
        super().__init__()
        if len(q_heads) % len(k_heads) or len(k_heads) != len(v_heads):
            raise ValueError(f"PerHeadAttention: {len(q_heads)} query heads need a divisor "
                             f"number of key/value heads, got {len(k_heads)} k and "
                             f"{len(v_heads)} v heads")
        self.q_heads, self.k_heads, self.v_heads = q_heads, k_heads, v_heads
        self.out_proj = out_proj
        self.backend = backend
        self.dropout = dropout

    @property
    def num_heads(self) -> int:
        return len(self.q_heads)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None,
                value: torch.Tensor | None = None, *, mask: torch.Tensor | None = None,
                causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``query (b, i, m)``, ``key (b, j, kdim)``, ``value (b, j, vdim)`` ->
        ``(output (b, i, out_dim), weights (b, h, i, j))``; ``mask`` as in MultiHeadAttention."""
        key = query if key is None else key
        value = key if value is None else value
        group = self.num_heads // len(self.k_heads)
        outputs, weights = [], []
        for x, q_proj in enumerate(self.q_heads):  # one head at a time, nothing shared
            q = q_proj(query)[:, None]  # (b, 1, i, d)
            k = self.k_heads[x // group](key)[:, None]
            v = self.v_heads[x // group](value)[:, None]
            m = mask
            if m is not None and m.dim() == 4 and m.shape[1] > 1:
                m = m[:, x:x + 1]
            out, w = attention(q, k, v, mask=m, causal=causal, return_weights=True,
                               dropout_p=self.dropout if self.training else 0.0,
                               backend=self.backend)
            outputs.append(out[:, 0])  # (b, i, d)
            weights.append(w[:, 0])
        return self.out_proj(torch.cat(outputs, dim=-1)), torch.stack(weights, dim=1)


def _split_linear(linear: nn.Linear, heads: int) -> nn.ModuleList:
    """Cut ``Linear(in, heads*d)`` into ``heads`` copies of ``Linear(in, d)`` (row blocks of the
    weight, i.e. column blocks of ``W^T``)."""
    d = linear.out_features // heads
    parts = nn.ModuleList()
    for x in range(heads):
        part = nn.Linear(linear.in_features, d, bias=linear.bias is not None,
                         device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            part.weight.copy_(linear.weight[x * d:(x + 1) * d])
            if linear.bias is not None:
                part.bias.copy_(linear.bias[x * d:(x + 1) * d])
        parts.append(part)
    return parts


def _cat_linears(parts: nn.ModuleList) -> nn.Linear:
    first = parts[0]
    out = nn.Linear(first.in_features, first.out_features * len(parts),
                    bias=first.bias is not None, device=first.weight.device,
                    dtype=first.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(torch.cat([p.weight for p in parts]))
        if first.bias is not None:
            out.bias.copy_(torch.cat([p.bias for p in parts]))
    return out


def unfuse(mha: MultiHeadAttention) -> PerHeadAttention:
    """Split a :class:`~headwise.MultiHeadAttention` into independent per-head projections,
    in the same training/eval mode (so with dropout the outputs stay the same)."""
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"unfuse expects headwise.MultiHeadAttention, got {type(mha).__name__}")
    out_proj = nn.Linear(mha.hidden_dim, mha.out_dim, bias=mha.out_proj.bias is not None,
                         device=mha.out_proj.weight.device, dtype=mha.out_proj.weight.dtype)
    out_proj.load_state_dict(mha.out_proj.state_dict())
    return PerHeadAttention(_split_linear(mha.q_proj, mha.num_heads),
                            _split_linear(mha.k_proj, mha.num_kv_heads),
                            _split_linear(mha.v_proj, mha.num_kv_heads), out_proj,
                            backend=mha.backend, dropout=mha.dropout_p).train(mha.training)


def fuse(per_head: PerHeadAttention, backend: str | None = None) -> MultiHeadAttention:
    """Concatenate per-head projections back into one :class:`~headwise.MultiHeadAttention`
    (with the per-head module's dropout and training/eval mode, and its backend unless
    ``backend`` is given)."""
    if not isinstance(per_head, PerHeadAttention):
        raise TypeError(f"fuse expects PerHeadAttention, got {type(per_head).__name__}")
    _check_fusable(per_head)
    q0, k0, v0 = per_head.q_heads[0], per_head.k_heads[0], per_head.v_heads[0]
    mha = MultiHeadAttention(q0.in_features, per_head.num_heads, head_dim=q0.out_features,
                             kdim=k0.in_features, vdim=v0.in_features,
                             num_kv_heads=len(per_head.k_heads),
                             out_dim=per_head.out_proj.out_features,
                             bias=q0.bias is not None, dropout=per_head.dropout,
                             backend=per_head.backend if backend is None else backend)
    mha = mha.to(device=q0.weight.device, dtype=q0.weight.dtype)
    mha.q_proj = _cat_linears(per_head.q_heads)
    mha.k_proj = _cat_linears(per_head.k_heads)
    mha.v_proj = _cat_linears(per_head.v_heads)
    mha.out_proj.load_state_dict(per_head.out_proj.state_dict())
    return mha.train(per_head.training)


def _check_fusable(per_head: PerHeadAttention) -> None:
    """ValueError unless every head's projections are Linears of one shape (and bias), all of
    one width ``d``, and ``out_proj`` reads ``h * d`` features."""
    def shape(m):
        return ((m.in_features, m.out_features, m.bias is not None)
                if isinstance(m, nn.Linear) else type(m).__name__)

    for kind in ("q_heads", "k_heads", "v_heads"):
        heads = getattr(per_head, kind)
        for x, m in enumerate(heads):
            if shape(m) != shape(heads[0]) or not isinstance(m, nn.Linear):
                raise ValueError(f"fuse: {kind}[{x}] is {m} but {kind}[0] is {heads[0]}; every "
                                 "head's projection must be a Linear of the same shape and bias"
                                 " to fuse (restore the edited head, or keep the per-head form)")
    d = per_head.q_heads[0].out_features
    widths = {kind: getattr(per_head, kind)[0].out_features for kind in ("k_heads", "v_heads")}
    if any(w != d for w in widths.values()):
        raise ValueError(f"fuse: query heads are {d} wide but key/value heads {widths}; a fused "
                         "module has one head_dim (restore the edited heads)")
    if per_head.out_proj.in_features != per_head.num_heads * d:
        raise ValueError(f"fuse: out_proj reads {per_head.out_proj.in_features} features but "
                         f"{per_head.num_heads} heads of {d} give {per_head.num_heads * d}; "
                         "make out_proj match the heads")
