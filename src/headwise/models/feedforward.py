"""Position-wise feed-forward networks, chosen by ``config.ffn``.

Axis legend: ``b`` batch, ``n`` position, ``m`` model dim, ``f`` feed-forward width.

- ``"mlp"``: ``down(act(up(x)))`` (Vaswani et al. 2017; GPT-2, BERT).
- ``"glu"``: ``down(act(gate(x)) * up(x))`` (Shazeer 2020, "GLU Variants Improve
  Transformer"): with ``act = silu`` this is SwiGLU (Llama, Mistral, SmolLM2), with
  ``gelu_tanh`` GeGLU (Gemma). Parameter names follow Llama's ``gate_proj`` / ``up_proj`` /
  ``down_proj`` as ``gate`` / ``up`` / ``down``.

Their one-row forms for the cached decoding step live in :mod:`headwise.decode.feedforward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from headwise.fast import reuse

__all__ = ["ACTIVATIONS", "FFNS", "FeedForward", "GatedFeedForward", "check_activation", "drop",
           "make_feedforward"]


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
        """gate and up read one input (the speed layer may store them as one matrix:
        :func:`headwise.fast.storage.joined`)."""
        return ((self.gate, self.up),)


FFNS: dict[str, type[FeedForward]] = {"mlp": FeedForward, "glu": GatedFeedForward}


def make_feedforward(kind: str, d_model: int, d_ff: int, **kwargs) -> FeedForward:
    """The feed-forward ``kind`` (``"mlp"`` or ``"glu"``); ``kwargs`` as :class:`FeedForward`."""
    if kind not in FFNS:
        raise ValueError(f"ffn must be one of {sorted(FFNS)}, got {kind!r}")
    return FFNS[kind](d_model, d_ff, **kwargs)
