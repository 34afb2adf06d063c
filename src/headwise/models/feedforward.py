"""Position-wise feed-forward networks, chosen by ``config.ffn``.

Axis legend: ``b`` batch, ``n`` position, ``m`` model dim, ``f`` feed-forward width.

- ``"mlp"``: ``down(act(up(x)))`` (Vaswani et al. 2017; GPT-2, BERT).
- ``"glu"``: ``down(act(gate(x)) * up(x))`` (Shazeer 2020, "GLU Variants Improve
  Transformer"): with ``act = silu`` this is SwiGLU (Llama, Mistral, SmolLM2), with
  ``gelu_tanh`` GeGLU (Gemma). Parameter names follow Llama's ``gate_proj`` / ``up_proj`` /
  ``down_proj`` as ``gate`` / ``up`` / ``down``.

Each supplies :meth:`row`, its one-row form for the cached decoding step: ``(inner, down)``
where ``inner(y (b, m)) -> (b, f)`` and ``down`` is the output :data:`~headwise.fast.rows.Weight`
the step multiplies with the residual addition fused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from headwise.fast import reuse
from headwise.fast import rows as _rows

__all__ = ["ACTIVATIONS", "FFNS", "FeedForward", "GatedFeedForward", "GatedRow",
           "check_activation", "drop", "make_feedforward"]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# "gelu" is the exact erf form BERT uses; "gelu_tanh" the approximation of GPT-2.
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": _gelu_tanh, "silu": F.silu}
def check_activation(activation: str, where: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"{where}: activation must be one of {sorted(ACTIVATIONS)}, got "
                         f"{activation!r}")


def drop(owner: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``owner.dropout(x)``, skipping the call when it is the identity (eval or p = 0): decoding
    one token at a time is bound by per-call overhead, not arithmetic (``owner.training`` is a
    plain attribute; reading the submodule is not free)."""
    return owner.dropout(x) if owner.training and owner.dropout.p > 0 else x


RowForm = tuple  # (inner: (b, m) -> (b, f), down: _rows.Weight)


class FeedForward(nn.Module):
    """Position-wise feed-forward ``down(drop(act(up(x))))``, applied to every position alone.

    Args:
        d_model: model dim ``m``. d_ff: hidden width ``f`` (usually ``4 * m``).
        activation: ``"relu"``, ``"gelu"`` (exact erf, as BERT), ``"gelu_tanh"`` or ``"silu"``.
        dropout: dropout after the activation while training.
        bias: whether ``up`` and ``down`` have biases.

    ``forward(x (b, n, m)) -> (b, n, m)``.
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_activation(activation, type(self).__name__)
        self.activation = activation
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self._act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (b, n, m) -> (b, n, m)``."""
        return self.down(drop(self, reuse.activate(self.activation, self.up(x), self._act)))

    def row(self, *, transpose: bool, fuse: bool) -> RowForm:
        """``(inner, down)`` for rows ``(b, m)`` (eval: no dropout). ``fuse`` is unused (one
        input product)."""
        up, act = _rows.of_linear(self.up, transpose), self._act
        return (lambda y: act(_rows.linear(y, up))), _rows.of_linear(self.down, transpose)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class GatedFeedForward(FeedForward):
    """Gated feed-forward ``down(drop(act(gate(x)) * up(x)))`` (SwiGLU with ``"silu"``).

    Same arguments as :class:`FeedForward`; adds ``gate = nn.Linear(m, f)``.
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "silu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.gate = nn.Linear(d_model, d_ff, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x: (b, n, m) -> (b, n, m)``."""
        gated = reuse.activate(self.activation, self.gate(x), self._act)
        return self.down(drop(self, reuse.gate(gated, self.up(x))))

    def joint_linears(self) -> tuple[tuple[nn.Linear, ...], ...]:
        """gate and up read one input (:func:`headwise.fast.rows.lay_out` stores them as one
        matrix)."""
        return ((self.gate, self.up),)

    def row(self, *, transpose: bool, fuse: bool) -> RowForm:
        """``(inner, down)`` for rows ``(b, m)``: gate and up as one product when they are
        stored as one matrix or share one set of 4-bit codes (:meth:`joint_linears`,
        :func:`headwise.fast.rows.of_group`), or with ``fuse`` over a copy of
        ``cat(W_gate, W_up)`` (fewer calls; costs a copy of both matrices)."""
        both = _rows.of_group((self.gate, self.up), transpose)  # stored as one: no copy
        if fuse and both is None:
            bias = (None if self.up.bias is None
                    else torch.cat((self.gate.bias, self.up.bias)).detach())
            both = _rows.weight(torch.cat((self.gate.weight, self.up.weight)), bias, transpose)
        pair = None if both is not None else (_rows.of_linear(self.gate, transpose),
                                              _rows.of_linear(self.up, transpose))
        inner = GatedRow(both, pair, self._act, self.up.out_features)
        return inner, _rows.of_linear(self.down, transpose)


class GatedRow:
    """A gated feed-forward's ``inner`` for rows ``y (b, m)`` -> ``act(gate(y)) * up(y)`` ``(b,
    f)``: ``both``, gate|up's one :data:`~headwise.fast.rows.Weight`, or ``pair``, theirs."""

    __slots__ = ("both", "pair", "act", "f")

    def __init__(self, both, pair, act, f: int):
        self.both, self.pair, self.act, self.f = both, pair, act, f

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        if self.both is not None:
            # (split_with_sizes, not .split: Tensor.split is a Python wrapper around it)
            g, u = _rows.linear(y, self.both).split_with_sizes((self.f, self.f), -1)
            return self.act(g).mul_(u)
        gate, up = self.pair
        return self.act(_rows.linear(y, gate)).mul_(_rows.linear(y, up))

    def bind(self, plan, y: torch.Tensor):
        """Add gate|up's one product of ``y`` to ``plan`` (:class:`headwise.fast.plan.Plan`)
        and ``out = act(g) * u`` ``(b, f)``; returns ``(rest, out)``: ``rest`` None when the
        plan computes silu's product itself (:meth:`~headwise.fast.plan.Plan.silu_mul`, torch's
        bits), else the call the step makes between two of the plan's C calls (torch's own
        activation). None where it cannot bind."""
        gu = plan.buffer("gate|up", 2 * self.f, y.dtype)
        if self.both is None or not _rows.bind(plan, y, self.both, gu):
            return None
        (g, u), act = gu.split_with_sizes((self.f, self.f), -1), self.act
        out = plan.buffer("act", self.f, y.dtype)
        if act is F.silu and plan.silu_mul(g, u, out):
            return None, out
        return (lambda: torch.mul(act(g), u, out=out)), out


FFNS: dict[str, type[FeedForward]] = {"mlp": FeedForward, "glu": GatedFeedForward}


def make_feedforward(kind: str, d_model: int, d_ff: int, **kwargs) -> FeedForward:
    """The feed-forward ``kind`` (``"mlp"`` or ``"glu"``); ``kwargs`` as :class:`FeedForward`."""
    if kind not in FFNS:
        raise ValueError(f"ffn must be one of {sorted(FFNS)}, got {kind!r}")
    return FFNS[kind](d_model, d_ff, **kwargs)
