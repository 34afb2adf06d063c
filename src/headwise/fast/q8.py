"""8-bit codes beside a float32 matrix, read by the decoding step instead of it: :class:`Q8` (a
GGUF's Q8_0 blocks: 32 int8 codes per float16 scale, ``w = q * scale``, exact in float32).

SmolLM2's GGUF holds its tied embedding (the vocabulary head) as Q8_0: 29 MiB of codes and
scales where the float32 table the model keeps is 108 MiB, the step's largest read.
:func:`headwise.pretrained.gguf.attach_q4` attaches the file's codes to the ``nn.Linear`` whose
float32 weight they dequantize to (checked equal), and the step multiplies by them
(:func:`headwise.fast.native.q8_matmul`); everything else (the module path, a prompt, hooks,
training) keeps reading the float32 weight. Since ``q * scale`` is exactly that weight, the
two differ only in the order of float32 sums. :func:`of` is the one rule for when the codes
stand in for the weight: the same parameter and storage, not changed in place since they were
attached. In-place changes are seen through the tensor's version counter, and through an
optimizer step over the parameter (a fused optimizer such as ``AdamW(fused=True)`` writes the
weight without counting a version; every optimizer's step is watched once codes exist). Only an
in-place write through ``weight.data`` escapes both, as it escapes autograd.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from headwise.fast import native as _native

__all__ = ["GROUP", "Q8", "of"]

GROUP = 32  # input features per scale (a GGUF block)


class Q8:
    """``W (out, in)`` as int8 ``codes (out, in)`` and float16 ``scales (out, in / 32)``
    (``w = q * scale`` per output row and group of :data:`GROUP` inputs), kept beside the
    float32 weight ``source`` they dequantize to; ``version`` is ``source._version`` when
    attached (an in-place change of the weight makes the codes stale: :func:`of`)."""

    __slots__ = ("codes", "scales", "source", "version", "_product", "__weakref__")

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, source: torch.Tensor):
        out, n = codes.shape
        if (n % GROUP or scales.shape != (out, n // GROUP) or codes.dtype is not torch.int8
                or source.shape != (out, n) or source.dtype is not torch.float32):
            raise ValueError(f"Q8: expected int8 codes (out, in) with in a multiple of {GROUP}, "
                             f"scales (out, in / {GROUP}) and a float32 weight (out, in), got "
                             f"{codes.dtype} {tuple(codes.shape)}, {tuple(scales.shape)}, "
                             f"{source.dtype} {tuple(source.shape)}")
        self.codes, self.scales = codes.contiguous(), scales.to(torch.float16).contiguous()
        if not all(torch.equal(self.dequantize(rows), source.detach()[rows])  # (a few MiB
                   for rows in _blocks(out)):                                  # at a time)
            raise ValueError("Q8: the codes do not dequantize to the weight they stand for; "
                             "attach the codes of this weight's own tensor")
        self.source, self.version = source, _state(source)
        self._product = None  # headwise's kernel bound to the codes, once it took them
        _watch(self)

    def dequantize(self, rows: slice = slice(None)) -> torch.Tensor:
        """The float32 ``(out, in)`` the codes stand for (exact: 8 + 11 significant bits), or
        those ``rows`` of it."""
        return self.codes[rows].float().mul_(
            self.scales[rows].float().repeat_interleave(GROUP, 1))

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None,
               res: torch.Tensor | None = None) -> torch.Tensor | None:
        """``x (b, in) @ W^T + bias + res`` -> ``(b, out)`` float32, or None where the kernel
        declines (the caller multiplies by :attr:`source`)."""
        if self._product is None:  # (bound once it takes the codes; a decline asks again)
            self._product = _native.q4_product(self.codes, self.scales, None)
        return None if self._product is None else self._product(x, bias, res)

    def nbytes(self) -> int:
        """Bytes a product reads: the codes and the scales."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales))


def _blocks(out: int, step: int = 4096):
    return (slice(i, i + step) for i in range(0, out, step))


def of(layer: nn.Module) -> Q8 | None:
    """The :class:`Q8` codes the decoding step reads for ``layer`` instead of its weight (where
    headwise's kernel takes the product; else the weight): those attached as ``layer.q8`` while
    they still stand for it (the same float32 parameter, not changed in place since); else
    None."""
    q8 = getattr(layer, "q8", None)
    w = getattr(layer, "weight", None)
    if q8 is None or w is not q8.source or w.dtype is not torch.float32 \
            or _state(w) != q8.version:
        return None
    return q8


def _state(w: torch.Tensor) -> tuple[int, int]:
    """What an in-place change or a new storage changes: the version and the address."""
    return w._version, w.data_ptr()


_attached: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id(weight) -> its Q8
_hook: list = []  # the optimizer hook's handle, once registered


def _watch(q8: Q8) -> None:
    _attached[id(q8.source)] = q8
    if not _hook:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        _hook.append(register_optimizer_step_post_hook(_stepped))


def _stepped(optimizer, args, kwargs) -> None:
    """After any optimizer step: the codes of every weight it updated are stale."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            q8 = _attached.get(id(p))
            if q8 is not None and q8.source is p:
                q8.version = None
