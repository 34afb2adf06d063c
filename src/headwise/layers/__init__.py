"""Multi-head attention as a module: project, split heads, attend, merge heads, project.

Axis legend: ``b`` batch, ``h`` heads, ``g`` key/value heads, ``i`` query position, ``j`` key
position, ``d`` head dim, ``m`` model (query feature) dim.

The wing holds the module (here), its options (``config``: :class:`AttentionConfig`) and its
boundary checks (``checks``); its one-row decoding form lives in the decode wing
(:mod:`headwise.decode.attention`). May import: the core below it (masks, heads, attend, cache,
rope, observe, stats, limits) and :mod:`headwise.fast` (never the kernels of one-row steps,
``fast.rows`` / ``fast.native``); never a model, the decode wing or a tool.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from headwise import masks as _masks
from headwise import observe
from headwise.attend import check_selection, dispatch
from headwise.fast import joint_qkv
from headwise.fast.storage import joined
from headwise.heads import MERGE, SPLIT, merge, split
from headwise.layers import checks
from headwise.layers.config import AttentionConfig
from headwise.observe import PROJECTION, SPLIT_HEADS, StepKind, record
from headwise.rope import RotaryEmbedding

__all__ = ["AttentionConfig", "MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with per-head weights, any q/k/v sizes and grouped heads.

    Args:
        embed_dim: feature size of the query input (``m``; the models' configs call it
            ``d_model``, the name this module keeps is torch.nn.MultiheadAttention's).
        num_heads: number of query heads ``h``.
        config: the attention options (:class:`~headwise.layers.AttentionConfig`: key/value
            heads, head size, sliding window, soft-cap, sinks, backend), or None for the
            defaults. Its fields are also keywords here (``window=8``), set over ``config``.
        kdim, vdim: feature sizes of the key and value inputs (default ``embed_dim``).
        out_dim: output feature size, default ``embed_dim``.
        bias: whether the four projections have biases.
        dropout: dropout probability on the attention weights while training (kept as
            ``dropout_p``).
        rope: a :class:`~headwise.rope.RotaryEmbedding` rotating q and k after the head split
            (at their positions: the cache's length onwards), or None.
        strict: raise instead of leaving the fused kernel (see :mod:`headwise.strict`);
            default: the ``HEADWISE_STRICT`` environment variable.

    The options are kept as attributes of their own names: ``num_kv_heads``, ``head_dim``,
    ``window``, ``softcap``, ``backend``, and the parameter ``sinks (h,)`` (or None).

    "Queries of size 4, keys of size 3, values of size 2, hidden size 6 in 2 heads" is
    ``MultiHeadAttention(4, 2, head_dim=3, kdim=3, vdim=2)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, config: AttentionConfig | None = None,
                 kdim: int | None = None, vdim: int | None = None, out_dim: int | None = None,
                 bias: bool = True, dropout: float = 0.0, rope: RotaryEmbedding | None = None,
                 strict: bool | None = None, **options):
        super().__init__()
        config = AttentionConfig.build(config, "MultiHeadAttention", **options)
        checks.config(embed_dim, num_heads, config, kdim, vdim, out_dim, dropout)
        checks.variants(rope)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = config.head_size(embed_dim, num_heads)
        self.kdim = kdim or embed_dim
        self.vdim = vdim or self.kdim  # value defaults to key, so its size does too
        self.num_kv_heads = config.kv_heads(num_heads)
        self.out_dim = out_dim or embed_dim
        self.dropout_p = dropout  # a probability; blocks name their nn.Dropout modules dropout
        self.backend = config.backend
        self.strict = strict
        hd, kvd = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # Each projection is h (or g) per-head projections side by side: column block x of
        # q_proj.weight.T is head x's own W_q (see headwise.per_head.unfuse).
        self.q_proj = nn.Linear(embed_dim, hd, bias=bias)
        self.k_proj = nn.Linear(self.kdim, kvd, bias=bias)
        self.v_proj = nn.Linear(self.vdim, kvd, bias=bias)
        self.out_proj = nn.Linear(hd, self.out_dim, bias=bias)
        self._qkv_sizes = (hd, kvd, kvd)
        self.rope, self.window, self.softcap = rope, config.window, config.softcap
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if config.sinks else None

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None,
                value: torch.Tensor | None = None, *, mask: torch.Tensor | None = None,
                valid_lens: torch.Tensor | None = None, causal: bool = False,
                head_mask: torch.Tensor | None = None, return_weights=False,
                cache=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(b, i, m)``. key: ``(b, j, kdim)``, default ``query`` (self-attention).
            value: ``(b, j, vdim)``, default ``key``.
            mask: bool (True = may attend) or float (additive), broadcastable to
                ``(b, h, i, j)``; ``(b, 1, 1, j)`` for key padding.
            valid_lens: ``(b,)`` or ``(b, i)`` key lengths (d2l style), AND-ed with ``mask``.
            causal: bottom-right causal masking.
            head_mask: ``(h,)`` or ``(b, h)``, multiplies each head's output (0 removes it).
            return_weights: ``True`` for per-head weights ``(b, h, i, j)`` (never averaged), or a
                :class:`headwise.Selection` / dict of ``heads``, ``rows``, ``keys`` for only
                those; recomputed exactly from the fused kernel's log-sum-exp.
            cache: a :mod:`headwise.cache` layer cache. Self-attention appends the new keys/values
                and attends over every cached position (``j`` = cache length; with ``causal``
                the newest queries line up bottom-right); cross-attention projects ``key``/
                ``value`` once per source and reuses them.

        Returns:
            ``(output (b, i, out_dim), weights (b, h, i, j) or None)``.
        """
        key = query if key is None else key
        value = key if value is None else value
        mask = checks.inputs(self, query, key, value, mask, valid_lens, head_mask, cache)
        record(StepKind.INPUT, query)
        # 1) project  2) split heads: (b, n, h*d) -> (b, h, n, d)
        q, k, v = self._project(query, key, value, cache)
        if self.window is not None:
            mask = _masks.combine(mask, _masks.sliding_window(
                q.shape[2], k.shape[2], self.window, causal=causal, device=q.device))
        if return_weights is not False:
            check_selection(return_weights, self.backend, self.num_heads, q.shape[2], k.shape[2])
        # 3) attend, each head separately
        if getattr(cache, "ragged", False):  # a head-wise cache attends each group itself
            out, weights = self._ragged(q, k, v, mask, causal, return_weights, cache), None
        else:
            out, weights = dispatch(q, k, v, mask=mask, causal=causal,
                                    return_weights=return_weights,
                                    dropout_p=self.dropout_p if self.training else 0.0,
                                    backend=self.backend, softcap=self.softcap, sinks=self.sinks,
                                    strict=self.strict)
        observe.attention(self, q, k, mask, causal, None, key is query, softcap=self.softcap,
                          sinks=self.sinks)
        if head_mask is not None:
            out = out * rearrange(head_mask.to(out.dtype), "... h -> ... h 1 1")
            record(StepKind.HEAD_MASK, out)
        out = observe.heads(self, out)  # kept or edited (ablation, patching) by observers
        # 4) merge heads: (b, h, i, d) -> (b, i, h*d)  5) output projection
        out = merge(out)  # (the MERGE pattern, as views)
        record(StepKind.MERGE_HEADS, out, pattern=MERGE)
        out = self.out_proj(out)
        record(StepKind.OUTPUT_PROJECTION, out)
        return out, weights

    def _project(self, query, key, value, cache):
        """q ``(b, h, i, d)``, k and v ``(b, g, j, d)``, through the cache when one is given."""
        if cache is not None and cache.ready:  # cross-attention: k/v already projected
            q = self._split(self.q_proj(query), "q", self.num_heads)
            record(StepKind.KV_CACHE, cache.k, reused=True)
            return q, cache.k, cache.v
        if (key is query and value is query and self.kdim == self.vdim == self.embed_dim
                and isinstance(self.q_proj, nn.Linear)  # (not 4-bit codes: _int4.Int4Linear)
                and joint_qkv(query, self.q_proj.weight)):
            # Self-attention on the CPU, or training: the three projections as one GEMM over
            # the concatenated weights (what a fused in_proj does), then cut back into q, k, v.
            # Off the CPU without autograd three GEMMs, as hand-written attention runs: no
            # per-call concatenation.
            qkv = F.linear(query, *self.qkv_weight())
            record(StepKind.QKV_PROJECTION, qkv)
            q, k, v = qkv.split(self._qkv_sizes, dim=-1)
        else:
            q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        q = self._split(q, "q", self.num_heads)
        k = self._split(k, "k", self.num_kv_heads)
        v = self._split(v, "v", self.num_kv_heads)
        if self.rope is not None:  # positions enter here, per head, before keys are cached
            q, k = self._rotate(q, k, 0 if cache is None else cache.offset)
        if cache is not None and not getattr(cache, "ragged", False):
            k, v = cache.update(k, v)  # self: append and return all positions; cross: store
            record(StepKind.KV_CACHE, k, reused=False)
        return q, k, v

    def _ragged(self, q, k, v, mask, causal, return_weights, cache):
        """Attention through a head-wise cache layer (:mod:`headwise.decode.ragged`), which
        writes the new keys/values as its plan keeps them and attends each group over its own."""
        if return_weights is not False or self.window is not None:
            raise ValueError("MultiHeadAttention: a head-wise KV cache returns no weights and "
                             "takes no sliding window; use model.new_cache for those")
        if mask is not None:  # (b, 1, i, j) over the logical positions
            mask = mask.expand(q.shape[0], 1, q.shape[2], cache.offset + q.shape[2])
        return cache.attend(q, k, v, mask=mask, causal=causal, backend=self.backend,
                            softcap=self.softcap, sinks=self.sinks)

    def _rotate(self, q, k, offset: int):
        cos, sin = self.rope.angles(offset, q.shape[2], q)
        q, k = self.rope.rotate(q, cos, sin), self.rope.rotate(k, cos, sin)
        facts = dict(offset=offset, theta=self.rope.theta, rotary_dim=self.rope.rotary_dim)
        record(StepKind.ROTARY_Q, q, **facts)
        record(StepKind.ROTARY_K, k, **facts)
        return q, k

    def qkv_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(cat(W_q, W_k, W_v) (h*d + 2*g*d, m), cat(b_q, b_k, b_v) or None)``: the fused
        self-attention projection on the CPU (:func:`headwise.fast.joint_qkv`) and the decoding
        step's.

        A view, with no copy, when the speed layer stored the three as blocks of one matrix at
        the start of a generation (:meth:`joint_linears`, :func:`headwise.fast.rows.lay_out`;
        never for autograd, which would then train none of them, nor under torch.compile,
        which cannot read storages: :func:`headwise.fast.storage.joined` says which).

        Otherwise made afresh on every call, never cached: an in-place weight update need not
        bump the tensors' version counters (the fused AdamW kernel and ``p.data.add_`` do not),
        so no cache key could tell a stale copy from a fresh one. The concatenation costs one
        pass over the three matrices."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        whole = joined(projs)
        if whole is not None:
            return whole
        bias = torch.cat([p.bias for p in projs]) if self.q_proj.bias is not None else None
        return torch.cat([p.weight for p in projs]), bias

    def joint_linears(self) -> tuple[tuple[nn.Linear, ...], ...]:
        """The projections that read one input, in fused order: q, k, v of ``embed_dim``
        features (:func:`headwise.fast.rows.lay_out` stores float ones as blocks of one matrix,
        :func:`headwise.fast.int4.share` 4-bit ones as blocks of one set of codes)."""
        same = self.kdim == self.vdim == self.embed_dim
        return ((self.q_proj, self.k_proj, self.v_proj),) if same else ()

    def _split(self, x: torch.Tensor, name: str, heads: int) -> torch.Tensor:
        record(PROJECTION[name], x)
        x = split(x, heads)  # (the SPLIT pattern, as views)
        record(SPLIT_HEADS[name], x, pattern=SPLIT)
        return x

    # ------------------------------------------------------------------ sizes and conversion


    @property
    def hidden_dim(self) -> int:
        """``h * d``: the width of the concatenated heads."""
        return self.num_heads * self.head_dim

    def changed_sizes(self) -> dict[str, int]:
        """The sizes that differ from their defaults, in constructor order: ``kdim`` (default
        ``embed_dim``), ``vdim`` (default ``kdim``), ``num_kv_heads`` (default ``num_heads``),
        ``out_dim`` (default ``embed_dim``). The trace and the split/merge picture name these."""
        sizes = {"kdim": (self.kdim, self.embed_dim), "vdim": (self.vdim, self.kdim),
                 "num_kv_heads": (self.num_kv_heads, self.num_heads),
                 "out_dim": (self.out_dim, self.embed_dim)}
        return {name: got for name, (got, default) in sizes.items() if got != default}

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}, kdim={self.kdim}, vdim={self.vdim}, "
                f"num_kv_heads={self.num_kv_heads}, out_dim={self.out_dim}, "
                f"backend={self.backend!r}"
                + "".join(f", {k}={v}" for k, v in (("window", self.window),
                                                    ("softcap", self.softcap)) if v is not None)
                + (", sinks=True" if self.sinks is not None else ""))

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, backend: str = "auto") -> MultiHeadAttention:
        """A headwise copy of ``torch.nn.MultiheadAttention`` with identical outputs.

        The weights are copied; inputs stay batch-first ``(b, n, features)`` here, and masks use
        True = may attend (torch's bool masks use True = blocked: pass ``~attn_mask``).
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"from_torch expects torch.nn.MultiheadAttention, got "
                            f"{type(mha).__name__}")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("from_torch: add_bias_kv / add_zero_attn have no headwise "
                             "equivalent (they append a learned or zero key); build without them")
        e = mha.embed_dim
        has_bias = mha.in_proj_bias is not None
        out = cls(e, mha.num_heads, kdim=mha.kdim, vdim=mha.vdim, bias=has_bias,
                  dropout=mha.dropout, backend=backend).to(mha.out_proj.weight)
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                wq, wk, wv = mha.in_proj_weight.chunk(3)
            else:
                wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
            for proj, w in ((out.q_proj, wq), (out.k_proj, wk), (out.v_proj, wv)):
                proj.weight.copy_(w)
            out.out_proj.weight.copy_(mha.out_proj.weight)
            if has_bias:
                for proj, bb in zip((out.q_proj, out.k_proj, out.v_proj),
                                    mha.in_proj_bias.chunk(3), strict=True):
                    proj.bias.copy_(bb)
                out.out_proj.bias.copy_(mha.out_proj.bias)
        return out

    def to_torch(self) -> nn.MultiheadAttention:
        """The equivalent ``torch.nn.MultiheadAttention`` (``batch_first=True``)."""
        problems = []
        if self.hidden_dim != self.embed_dim:
            problems.append(f"num_heads*head_dim={self.hidden_dim} != embed_dim="
                            f"{self.embed_dim} (torch ties head_dim to embed_dim // num_heads)")
        if self.out_dim != self.embed_dim:
            problems.append(f"out_dim={self.out_dim} != embed_dim={self.embed_dim}")
        if self.num_kv_heads != self.num_heads:
            problems.append(f"num_kv_heads={self.num_kv_heads} != num_heads={self.num_heads} "
                            "(torch has no grouped-query attention)")
        if problems:
            raise ValueError("to_torch: this configuration has no torch.nn.MultiheadAttention "
                             "equivalent: " + "; ".join(problems))
        bias = self.q_proj.bias is not None
        mha = nn.MultiheadAttention(self.embed_dim, self.num_heads, dropout=self.dropout_p,
                                    bias=bias, kdim=self.kdim, vdim=self.vdim, batch_first=True)
        mha = mha.to(self.q_proj.weight)
        with torch.no_grad():
            ws = (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
            if mha._qkv_same_embed_dim:
                mha.in_proj_weight.copy_(torch.cat(ws))
            else:
                for name, w in zip(("q", "k", "v"), ws, strict=True):
                    getattr(mha, f"{name}_proj_weight").copy_(w)
            mha.out_proj.weight.copy_(self.out_proj.weight)
            if bias:
                mha.in_proj_bias.copy_(torch.cat((self.q_proj.bias, self.k_proj.bias,
                                                  self.v_proj.bias)))
                mha.out_proj.bias.copy_(self.out_proj.bias)
        return mha
