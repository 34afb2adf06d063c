"""The hook every traced step goes through.

Attention code calls :func:`record` at each step (project, split heads, scores, ...). With no
trace active this is a single global read and a return, so the fast path pays nothing; inside
:func:`headwise.trace` a recorder collects every step with its shape and named axes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

Recorder = Callable[..., None]
_recorder: Recorder | None = None


def active() -> bool:
    """True while a trace is recording (lets callers skip work that only a trace needs)."""
    return _recorder is not None


def record(step: str, tensor: torch.Tensor | None = None, axes: str = "", **info: Any) -> None:
    """Report one step of a computation: its name, result, axis names (e.g. ``"b h i d"``) and
    any extra facts (``pattern=...``, ``backend=...``, ``memory=...``)."""
    if _recorder is not None:
        _recorder(step, tensor, axes, **info)


@contextmanager
def recording(recorder: Recorder):
    """Route every :func:`record` call to ``recorder`` for the duration of the block."""
    global _recorder
    previous, _recorder = _recorder, recorder
    try:
        yield
    finally:
        _recorder = previous
