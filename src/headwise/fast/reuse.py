"""Inference that reuses its own buffers: residual sums, activations and logits written into
memory the forward already owns, applied at one edge, the model's ``forward``.

Fresh large buffers are mapped and page-faulted anew, a cost that grows with every MiB: a
visible share of a SmolLM2 prefill, most of it the logits, which huge-page or recycled memory
avoids (:mod:`headwise.fast.large`). So, when nothing can see an intermediate tensor, a forward
may overwrite it:

- :func:`add`: a residual ``x + out`` written into ``out``, the sublayer's fresh output;
- :func:`activate`: an activation (and a gated feed-forward's product) into its input, the
  fresh output of a projection;
- :func:`linear`: the vocabulary head's product into :func:`headwise.fast.large.empty`.

Each computes exactly what the plain expression computes (the same kernels; the tests compare
bits). Whether a forward may do so is decided once, at its edge, by :func:`buffers` (a
decorator on each model's ``forward``): autograd is off (no backward needs the old values),
no module of the model has a forward hook and no global hook exists (a hook may keep a
tensor: an activation cache would see it change). Everything else, a block called on its own
included, computes the plain expression. The decision is per thread and per context.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from headwise.fast import compiling, host
from headwise.fast import large as _large

__all__ = ["IN_PLACE", "activate", "add", "buffers", "gate", "linear", "reusable", "scope"]

_on: ContextVar[bool] = ContextVar("headwise_reuse", default=False)

# The activations writing into their input (the values bit for bit those of the plain forms).
IN_PLACE = {"relu": torch.relu_, "gelu": torch.ops.aten.gelu_,
            "gelu_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
            "silu": lambda x: F.silu(x, inplace=True)}


def reusable(model: nn.Module) -> bool:
    """Whether a forward of ``model`` may overwrite its intermediate tensors (module
    docstring): autograd off, no forward hook on any of its modules, no global one."""
    if torch.is_grad_enabled():
        return False
    hooks = nn.modules.module
    if hooks._global_forward_hooks:
        return False
    return not any(m._forward_hooks for m in model.modules())


@contextmanager
def scope(model: nn.Module) -> Iterator[bool]:
    """Inside the block, buffer reuse is on exactly when :func:`reusable` says so for
    ``model`` (yielded); the previous setting comes back after, exceptions included."""
    on = reusable(model)
    token = _on.set(on)
    try:
        yield on
    finally:
        _on.reset(token)


def buffers(forward: Callable) -> Callable:
    """Decorate a model's ``forward`` to run in its own :func:`scope` (nested models decide
    again, for themselves): the one edge where reuse is decided."""
    @functools.wraps(forward)
    def run(model: nn.Module, *args, **kwargs):
        if compiling():  # a compiled graph has no Python-side state: the plain expressions
            return forward(model, *args, **kwargs)
        with scope(model):
            return forward(model, *args, **kwargs)
    return run


def _reusing() -> bool:
    """Whether this forward reuses its buffers (torch.compile traces the plain forms)."""
    return not compiling() and _on.get()


def add(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``x + out``, the residual sum; written into ``out`` (a sublayer's fresh output) when
    the forward reuses buffers."""
    if _reusing() and out.shape == x.shape and out.dtype == x.dtype:
        return out.add_(x)
    return x + out


def activate(name: str, h: torch.Tensor, plain: Callable) -> torch.Tensor:
    """``plain(h)``, the activation ``name`` of a projection's fresh output ``h``; in place
    (:data:`IN_PLACE`) when the forward reuses buffers."""
    return IN_PLACE[name](h) if _reusing() else plain(h)


def gate(gated: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gated * up``, a gated feed-forward's product; into ``gated`` (its own activation's
    fresh output) when the forward reuses buffers."""
    return gated.mul_(up) if _reusing() else gated * up


def linear(head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``head(x) (..., out)``; with buffer reuse, an ``nn.Linear`` on the CPU (no autocast)
    computes the same product (the ``mm`` / ``addmm`` that ``F.linear`` runs) into
    :func:`headwise.fast.large.empty`: recycled or huge-page memory, not fresh pages."""
    if (not _reusing() or type(head) is not nn.Linear or head.weight.dtype != x.dtype
            or not host(x) or torch.is_autocast_enabled("cpu")):
        return head(x)
    out = _large.empty((*x.shape[:-1], head.out_features), x.dtype, x.device)
    rows, flat, w = x.reshape(-1, x.shape[-1]), out.view(-1, head.out_features), head.weight.t()
    if head.bias is None:
        torch.mm(rows, w, out=flat)
    else:
        torch.addmm(head.bias, rows, w, out=flat)
    return out
