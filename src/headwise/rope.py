"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer"), rotate-half form.

Axis legend: ``b`` batch, ``h`` heads (``g`` for keys), ``n`` positions, ``d`` head dim, ``r``
rotated features (``rotary_dim``, even, ``<= d``).

RoPE gives attention relative positions by rotating each query and key *after the head split*:
feature pairs ``(k, k + r/2)`` of a head at position ``p`` turn by the angle ``p * theta^(-2k/r)``,
so ``q_p . k_q`` depends on ``p - q`` only. This is the "rotate-half" pairing of GPT-NeoX and
Hugging Face ``LlamaForCausalLM`` (``x * cos + rotate_half(x) * sin``); Meta's original code and
llama.cpp pair adjacent features ``(2k, 2k+1)`` instead, which is the same rotation after a
permutation of each head's q/k projection rows (a GGUF loader undoes it at the loading edge).
Features past ``r`` pass through unrotated (partial rotary, GPT-NeoX / Phi).

The angles are computed in float64 from the positions actually used (no table: nothing to keep
per layer, nothing a dtype cast can round), then cast to the input's dtype; the last answer is
kept, so the layers of one forward (which share one instance) compute them once, as Hugging
Face's model does. One
:class:`RotaryEmbedding` serves both paths: the module forward (:meth:`forward`, any positions
``offset .. offset + n - 1``) and the cached decoding step (:meth:`angles` once per step for all
layers, :meth:`rotate` per layer).
"""

from __future__ import annotations

import torch
from torch import nn

from headwise.fast import compiling

__all__ = ["MEMO_MAX", "RotaryEmbedding", "rotate_half"]

#: :meth:`RotaryEmbedding.angles` keeps its last answer up to this many positions x rotated
#: features (4 MiB of float32 tables; longer prompts compute them per layer, as cheap by then)
MEMO_MAX = 1 << 19


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(..., r) -> (..., r)``: ``[x1, x2] -> [-x2, x1]`` (halves of the last axis)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` features of every head by position.

    Args:
        head_dim: ``d``. theta: the base (10000 in the paper; Llama 3 uses 500000).
        rotary_dim: ``r`` features rotated (even, ``<= d``), default ``d``.

    ``forward(x (b, h, n, d), offset=0) -> (b, h, n, d)``: ``x`` holds positions
    ``offset .. offset + n - 1`` (``offset`` = positions already in the KV cache).
    No parameters and no buffers: a checkpoint never carries it.
    """

    def __init__(self, head_dim: int, *, theta: float = 10000.0, rotary_dim: int | None = None):
        super().__init__()
        r = head_dim if rotary_dim is None else rotary_dim
        if r % 2 or not 0 < r <= head_dim:
            raise ValueError(f"RotaryEmbedding: rotary_dim must be even and in (0, {head_dim}], "
                             f"got {r}")
        if not theta > 0:
            raise ValueError(f"RotaryEmbedding: theta must be > 0, got {theta}")
        self.head_dim, self.rotary_dim, self.theta = head_dim, r, float(theta)
        self._last = None  # (key, angles) of the last call: the layers of a forward share them

    def angles(self, offset: int, n: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, signed sin)``, each ``(n, 2, r/2)`` in ``like``'s dtype and device, for
        positions ``offset .. offset + n - 1``: row 0 of the middle axis holds the first half's
        ``cos`` / ``-sin``, row 1 the second half's ``cos`` / ``+sin`` (the signs of
        :func:`rotate_half`, folded into the table so :meth:`rotate` needs no negation)."""
        key = (offset, n, like.dtype, like.device, torch.is_inference_mode_enabled(),
               self.theta, self.rotary_dim)
        if self._last is not None and self._last[0] == key and not compiling():
            return self._last[1]  # (every layer of one forward asks for the same positions)
        r, dev = self.rotary_dim, like.device
        inv_freq = self.theta ** (-torch.arange(0, r, 2, dtype=torch.float64, device=dev) / r)
        pos = torch.arange(offset, offset + n, dtype=torch.float64, device=dev)
        ang = torch.outer(pos, inv_freq)  # (n, r/2): feature k pairs with k + r/2
        cos, sin = ang.cos(), ang.sin()
        out = (torch.stack((cos, cos), dim=-2).to(like.dtype),
               torch.stack((-sin, sin), dim=-2).to(like.dtype))
        if n * r <= MEMO_MAX and not compiling():
            self._last = (key, out)
        return out

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x (..., n, d)`` rotated by ``cos, sin (n, 2, r/2)`` (from :meth:`angles`).

        ``x * cos + rotate_half(x) * sin`` in four kernels and two new buffers: ``x`` seen as
        its two halves ``(..., n, 2, r/2)``, swapped by ``flip`` and multiplied by the signed
        sine in place, then added in place (the products and sums of the textbook form, and
        ``(-a) * b`` and ``a * (-b)`` round alike, so the result is bit for bit Hugging Face's;
        autograd follows: neither overwritten buffer is kept for the backward)."""
        r = self.rotary_dim
        part = x if r == x.shape[-1] else x[..., :r]
        halves = part.unflatten(-1, (2, r // 2))
        turned = (halves * cos).add_(halves.flip(-2).mul_(sin)).flatten(-2)
        return turned if part is x else torch.cat((turned, x[..., r:]), dim=-1)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x: (b, h, n, d)`` at positions ``offset ..`` -> rotated ``(b, h, n, d)``."""
        cos, sin = self.angles(offset, x.shape[-2], x)
        return self.rotate(x, cos, sin)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, theta={self.theta:g}"
