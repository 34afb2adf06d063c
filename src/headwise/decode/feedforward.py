"""The feed-forwards' one-row forms: :class:`~headwise.models.feedforward.FeedForward` and
:class:`~headwise.models.feedforward.GatedFeedForward` for decoding rows ``y (b, m)``.

Axis legend: ``b`` rows, ``m`` model dim, ``f`` feed-forward width.

Each form is ``(inner, down)``: ``inner(y (b, m)) -> (b, f)`` and ``down`` the output
:data:`~headwise.fast.rows.Weight`, which the block's form multiplies with the residual addition
fused (:func:`headwise.fast.rows.residual`). Dropout is off (eval).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from headwise.fast import rows as _rows
from headwise.models.feedforward import ACTIVATIONS

__all__ = ["GatedRow", "RowForm", "feedforward_row", "gated_row"]

RowForm = tuple  # (inner: (b, m) -> (b, f), down: _rows.Weight)


def feedforward_row(ff, *, transpose: bool, fuse: bool) -> RowForm:
    """``(inner, down)`` of a plain feed-forward ``down(act(up(y)))``. ``fuse`` is unused (one
    input product)."""
    up, act = _rows.of_linear(ff.up, transpose), ACTIVATIONS[ff.activation]
    return (lambda y: act(_rows.linear(y, up))), _rows.of_linear(ff.down, transpose)


def gated_row(ff, *, transpose: bool, fuse: bool) -> RowForm:
    """``(inner, down)`` of a gated feed-forward: gate and up as one product when they are stored
    as one matrix or share one set of 4-bit codes (its ``joint_linears()``,
    :func:`headwise.fast.rows.of_group`), or with ``fuse`` over a copy of ``cat(W_gate, W_up)``
    (fewer calls; costs a copy of both matrices)."""
    both = _rows.of_group((ff.gate, ff.up), transpose)  # stored as one: no copy
    if fuse and both is None:
        bias = (None if ff.up.bias is None
                else torch.cat((ff.gate.bias, ff.up.bias)).detach())
        both = _rows.weight(torch.cat((ff.gate.weight, ff.up.weight)), bias, transpose)
    pair = None if both is not None else (_rows.of_linear(ff.gate, transpose),
                                          _rows.of_linear(ff.up, transpose))
    inner = GatedRow(both, pair, ACTIVATIONS[ff.activation], ff.up.out_features)
    return inner, _rows.of_linear(ff.down, transpose)


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
