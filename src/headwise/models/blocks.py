"""The pieces every Transformer is stacked from: feed-forward, positions, encoder/decoder blocks.

Axis legend: ``b`` batch, ``h`` heads, ``i`` query position, ``j`` key position, ``n`` sequence
position, ``m`` model dim.

Two residual orders (Xiong et al. 2020, "On Layer Normalization in the Transformer
Architecture"):

- pre-norm (default; GPT-2, the Trax ``TransformerLM``): ``x = x + drop(sublayer(norm(x)))``;
- post-norm (Vaswani et al. 2017, BERT): ``x = norm(x + drop(sublayer(x)))``.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from headwise.fast import reuse
from headwise.fast import rows as _rows
from headwise.layers import AttentionConfig, MultiHeadAttention
from headwise.models.feedforward import (
    ACTIVATIONS,
    FeedForward,
    check_activation,
    drop,
    make_feedforward,
)
from headwise.models.norms import make_norm
from headwise.observe import StepKind, record
from headwise.rope import RotaryEmbedding

__all__ = [
    "ACTIVATIONS",
    "DecoderBlock",
    "EncoderBlock",
    "FeedForward",
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "check_activation",
    "drop",
]


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """``(max_len, m)``: ``P[n, 2k] = sin(n / 10000^(2k/m))``, ``P[n, 2k+1] = cos(...)``
    (Vaswani et al. 2017, section 3.5). Computed in float64, returned in float32."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64)
                     / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
    return table.float()


def _check_positions(x: torch.Tensor, offset: int, max_len: int, where: str) -> None:
    if x.dim() != 3:
        raise ValueError(f"{where}: x must be (b, n, m), got shape {tuple(x.shape)}")
    if offset < 0 or offset + x.shape[1] > max_len:
        raise ValueError(f"{where}: positions {offset}..{offset + x.shape[1] - 1} exceed "
                         f"max_len={max_len}; build the model with a larger max_len or pass a "
                         "shorter sequence")


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sine/cosine table: ``forward(x (b, n, m), offset=0) -> x + P[offset:offset+n]``.

    The table is a non-persistent buffer: it is derived, so checkpoints do not carry it.
    ``offset`` is the number of positions already processed (the KV cache's length).
    """

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("pe", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x: (b, n, m) -> (b, n, m)``."""
        _check_positions(x, offset, self.max_len, "SinusoidalPositionalEncoding")
        pe = self.pe[offset:offset + x.shape[1]]
        return x + (pe if pe.dtype == x.dtype else pe.to(x.dtype))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"


class LearnedPositionalEncoding(nn.Module):
    """Adds a learned vector per position (BERT, GPT-2):
    ``forward(x (b, n, m), offset=0) -> x + weight[offset:offset+n]``."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x: (b, n, m) -> (b, n, m)``."""
        _check_positions(x, offset, self.max_len, "LearnedPositionalEncoding")
        return x + self.weight[offset:offset + x.shape[1]]

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"


class _Block(nn.Module):
    """What both blocks share: the residual sublayer, and building norms and sublayers."""

    def _build(self, d_model: int, num_heads: int, d_ff: int, *, attention: AttentionConfig,
               dropout: float, norm_first: bool, activation: str, layer_norm_eps: float,
               bias: bool, norm: str, ffn: str, rope: RotaryEmbedding | None,
               cross_attention: bool = False) -> None:
        """Set ``self_attn``, ``attn_norm``, (``cross_attn``, ``cross_norm``), ``ff``,
        ``ff_norm``, ``dropout``, in this order (the order ``init_weights`` draws them in).
        Cross-attention takes no positions (``rope``) and no window: its keys are the
        encoder's (:meth:`~headwise.layers.AttentionConfig.for_cross`)."""
        self.norm_first = norm_first
        new_norm = partial(make_norm, norm, d_model, layer_norm_eps)
        self.self_attn = MultiHeadAttention(d_model, num_heads, config=attention, bias=bias,
                                            dropout=dropout, rope=rope)
        self.attn_norm = new_norm()
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d_model, num_heads, config=attention.for_cross(),
                                                 bias=bias, dropout=dropout)
            self.cross_norm = new_norm()
        self.ff = make_feedforward(ffn, d_model, d_ff, activation=activation, dropout=dropout,
                                   bias=bias)
        self.ff_norm = new_norm()
        self.dropout = nn.Dropout(dropout)

    def _sublayer(self, x, norm, fn):
        """One residual sublayer in either order; ``fn`` maps ``(b, n, m)`` to
        ``((b, n, m), extra)`` (attention or feed-forward). The residual sum is
        :func:`headwise.fast.reuse.add`: ``x + out``, into ``out`` when the model's forward
        reuses its buffers."""
        if self.norm_first:
            out, extra = fn(norm(x))
            return reuse.add(x, drop(self, out)), extra
        out, extra = fn(x)
        return norm(reuse.add(x, drop(self, out))), extra

    def row(self, cache, *, transpose: bool, fuse: bool) -> BlockRow:
        """This block's one-row form for the cached decoding step (:class:`BlockRow`)."""
        return BlockRow(self, cache, transpose=transpose, fuse=fuse)

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"


_BLOCK_ARGS = """
        d_model: model dim ``m``. num_heads: query heads ``h``. d_ff: feed-forward width.
        dropout: on sublayer outputs (and attention probabilities, and after the activation).
        norm_first: pre-norm (True) or post-norm (False, BERT / the original paper).
        activation: of the feed-forward (see :class:`FeedForward`).
        layer_norm_eps: the norm's epsilon (BERT uses 1e-12).
        attention: the attention options (:class:`~headwise.layers.AttentionConfig`: key/value
            heads, head size, sliding window, soft-cap, sinks, backend), or None for the
            defaults; its fields are also keywords here (``num_kv_heads=2``), set over it.
        bias: biases in every projection.
        norm: ``"layer"`` or ``"rms"``. ffn: ``"mlp"`` or ``"glu"`` (see
            :mod:`headwise.models.norms`, :mod:`headwise.models.feedforward`).
        rope: a :class:`~headwise.rope.RotaryEmbedding` for self-attention, or None."""


class EncoderBlock(_Block):
    __doc__ = """Self-attention then feed-forward, each in a residual sublayer (pre- or post-norm).

    Args:""" + _BLOCK_ARGS + """

    Submodules: ``self_attn``, ``attn_norm``, ``ff``, ``ff_norm``, ``dropout``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *,
                 attention: AttentionConfig | None = None, dropout: float = 0.0,
                 norm_first: bool = True, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 bias: bool = True, norm: str = "layer", ffn: str = "mlp",
                 rope: RotaryEmbedding | None = None, **options):
        super().__init__()
        self._build(d_model, num_heads, d_ff, dropout=dropout, norm_first=norm_first,
                    activation=activation, layer_norm_eps=layer_norm_eps, bias=bias, norm=norm,
                    ffn=ffn, rope=rope,
                    attention=AttentionConfig.build(attention, "EncoderBlock", **options))

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None = None, causal: bool = False,
                head_mask: torch.Tensor | None = None, return_weights: bool = False,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x: (b, n, m)``; ``mask`` True = may attend, broadcastable to ``(b, h, n, n)``
        (``(b, 1, 1, n)`` for padding); ``head_mask (h,)`` or ``(b, h)``.

        Returns ``(x (b, n, m), weights (b, h, n, n) or None)``.
        """
        x, weights = self._sublayer(x, self.attn_norm, lambda y: self.self_attn(
            y, mask=mask, causal=causal, head_mask=head_mask, return_weights=return_weights))
        x, _ = self._sublayer(x, self.ff_norm, lambda y: (self.ff(y), None))
        record(StepKind.BLOCK_OUTPUT, x)
        return x, weights


class DecoderBlock(_Block):
    """Causal self-attention, cross-attention to the encoder output, feed-forward.

    Same arguments as :class:`EncoderBlock`, plus ``cross_attention``: with ``False`` the block
    has no ``cross_attn``/``cross_norm`` and is a decoder-only (language model) block.
    Cross-attention takes no RoPE and no window (its keys have no positions of their own).

    Submodules: ``self_attn``, ``attn_norm``, ``cross_attn``, ``cross_norm``, ``ff``,
    ``ff_norm``, ``dropout``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *,
                 attention: AttentionConfig | None = None, dropout: float = 0.0,
                 norm_first: bool = True, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 bias: bool = True, norm: str = "layer", ffn: str = "mlp",
                 rope: RotaryEmbedding | None = None, cross_attention: bool = True, **options):
        super().__init__()
        if not cross_attention:
            self.cross_attn = self.cross_norm = None
        self._build(d_model, num_heads, d_ff, dropout=dropout, norm_first=norm_first,
                    activation=activation, layer_norm_eps=layer_norm_eps, bias=bias, norm=norm,
                    ffn=ffn, rope=rope, cross_attention=cross_attention,
                    attention=AttentionConfig.build(attention, "DecoderBlock", **options))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, *,
                self_mask: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                causal: bool = True, cache=None, head_mask: torch.Tensor | None = None,
                cross_head_mask: torch.Tensor | None = None,
                return_weights: bool | tuple[bool, bool] = False,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, torch.Tensor | None]]:
        """Decode ``x (b, i, m)`` attending to itself (causally) and to ``memory (b, j, m)``.

        Args:
            self_mask: True = may attend, broadcastable to ``(b, h, i, i)``.
            memory_mask: broadcastable to ``(b, h, i, j)``; ``(b, 1, 1, j)`` for source padding.
            causal: bottom-right causal self-attention (correct when ``x`` holds only the newest
                positions of a cached sequence).
            cache: a :class:`headwise.cache.LayerCache` (self: append; cross: computed once).
            head_mask / cross_head_mask: ``(h,)`` or ``(b, h)`` for each attention.
            return_weights: bool or :class:`headwise.Selection`, or a ``(self, cross)`` pair of
                them to ask for one kind only.

        Returns ``(x (b, i, m), (self weights (b, h, i, i') | None, cross (b, h, i, j) | None))``.
        """
        want_self, want_cross = (return_weights if isinstance(return_weights, tuple)
                                 else (return_weights, return_weights))
        self_cache, cross_cache = (None, None) if cache is None else (cache.self_attn,
                                                                      cache.cross_attn)
        x, self_w = self._sublayer(x, self.attn_norm, lambda y: self.self_attn(
            y, mask=self_mask, causal=causal, head_mask=head_mask, return_weights=want_self,
            cache=self_cache))
        cross_w = None
        if memory is not None:
            if self.cross_attn is None:
                raise ValueError("DecoderBlock: this block was built with cross_attention=False "
                                 "(a language-model block); call it with memory=None")
            x, cross_w = self._sublayer(x, self.cross_norm, lambda y: self.cross_attn(
                y, memory, mask=memory_mask, head_mask=cross_head_mask,
                return_weights=want_cross, cache=cross_cache))
        x, _ = self._sublayer(x, self.ff_norm, lambda y: (self.ff(y), None))
        record(StepKind.BLOCK_OUTPUT, x)
        return x, (self_w, cross_w)

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}, cross_attention={self.cross_attn is not None}"


class BlockRow:
    """A block for decoding rows ``x (b, m)``: its sublayers' one-row forms (attention, norms,
    feed-forward) in the block's residual order, each output projection with the residual
    addition fused (``x + y @ W^T`` as one ``addmm``). Dropout is off (eval)."""

    __slots__ = ("pre", "self_attn", "attn_norm", "cross_attn", "cross_norm", "ff_inner",
                 "ff_out", "ff_norm", "cache")

    def __init__(self, block: _Block, cache, *, transpose: bool, fuse: bool):
        self.pre, self.cache = block.norm_first, cache
        self.self_attn = block.self_attn.row(transpose=transpose, fuse=fuse)
        self.attn_norm, self.ff_norm = block.attn_norm.row(), block.ff_norm.row()
        cross = getattr(block, "cross_attn", None)
        self.cross_attn = (None if cross is None
                           else cross.row(transpose=transpose, fuse=fuse, cross=True))
        self.cross_norm = None if cross is None else block.cross_norm.row()
        self.ff_inner, self.ff_out = block.ff.row(transpose=transpose, fuse=fuse)

    def __call__(self, x: torch.Tensor, rot, memory_mask, at=None) -> torch.Tensor:
        """``x (b, m)`` -> ``(b, m)``; ``rot``: this position's RoPE ``(cos, sin)`` or None;
        ``at``: the fixed-shape step's position and masks (``AttentionRow.static_attend``) or
        None (the growing cache)."""
        attn, cache = self.self_attn, self.cache.self_attn
        x = self._sublayer(x, self.attn_norm, attn.out,
                           (lambda y: attn.self_attend(y, cache, rot)) if at is None else
                           (lambda y: attn.static_attend(y, cache, rot, at)))
        if self.cross_attn is not None:
            cross = self.cross_attn
            x = self._sublayer(x, self.cross_norm, cross.out, lambda y: cross.cross_attend(
                y, self.cache.cross_attn, memory_mask))
        return self._sublayer(x, self.ff_norm, self.ff_out, self.ff_inner)

    def bind(self, plan, x: torch.Tensor, y: torch.Tensor, angles, pos: int):
        """Add this block's ops for rows ``x (b, m)`` -> ``y (b, m)`` to ``plan``
        (:class:`headwise.fast.plan.Plan`; ``angles``, ``pos`` as
        :meth:`~headwise.layers.row.AttentionRow.bind` takes them): norm, attention, output
        product with the residual, norm, the feed-forward's inner product, its activation, its
        down product with the residual. Returns True, or where the plan leaves the activation to
        torch (:meth:`~headwise.models.feedforward.GatedRow.bind`) the call to make for it
        between the two stretches the block then is; None where the block has no bound form
        (post-norm, cross-attention, a form without ``bind``, a declined kernel): the step runs
        unbound."""
        attn, norms = self.self_attn, (self.attn_norm, self.ff_norm)
        if (not self.pre or self.cross_attn is not None
                or not all(hasattr(f, "bind") for f in (*norms, self.ff_inner))):
            return None
        m, dtype = x.shape[1], x.dtype
        normed, mid = plan.buffer("normed", m, dtype), plan.buffer("mid", m, dtype)
        heads = plan.buffer("heads", attn.h * attn.d, dtype)
        inner = (self.attn_norm.bind(plan, x, normed)
                 and attn.bind(plan, normed, self.cache.self_attn, angles, pos, heads)
                 and _rows.bind(plan, heads, attn.out, mid, res=x)
                 and self.ff_norm.bind(plan, mid, normed) and self.ff_inner.bind(plan, normed))
        if not inner:
            return None
        rest, act = inner
        if rest is not None:
            plan.cut()
        return (rest or True) if _rows.bind(plan, act, self.ff_out, y, res=mid) else None

    def _sublayer(self, x, norm, out_w, inner):
        """Pre-norm ``x + inner(norm(x)) @ W``, post-norm ``norm(x + inner(x) @ W)``."""
        if self.pre:
            return _rows.residual(x, inner(norm(x)), out_w)
        return norm(_rows.residual(x, inner(x), out_w))


def block_args(c) -> dict:
    """The keyword arguments every block of a model config shares (LM, encoder, decoder); one
    stateless :class:`~headwise.rope.RotaryEmbedding` serves every block of the stack."""
    a = c.attention
    rope = (RotaryEmbedding(c.head_size, theta=a.rope_theta, rotary_dim=a.rotary_dim)
            if c.positional == "rope" else None)
    return dict(attention=a, dropout=c.dropout, norm_first=c.norm_first,
                activation=c.activation, layer_norm_eps=c.layer_norm_eps, bias=c.bias,
                norm=c.norm, ffn=c.ffn, rope=rope)


def final_norm(c) -> nn.Module:
    """The norm after the last block of a pre-norm stack; post-norm blocks end normalised."""
    return make_norm(c.norm, c.d_model, c.layer_norm_eps) if c.norm_first else nn.Identity()
