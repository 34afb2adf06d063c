"""A named-axis shape trace of a real forward pass: where the heads are created, where every
tensor gets its shape, and which attention kernel ran.

``headwise.trace(module, *args, **kwargs)`` runs ``module(*args, **kwargs)`` once, unchanged,
and records two kinds of steps:

- **module outputs**, through forward hooks on every submodule (embedding, positional encoding,
  layer norm, feed-forward, each block ...), nested by module path;
- **the inside of attention**, through the structured records that
  :class:`~headwise.MultiHeadAttention` and the attention backends send with
  :func:`headwise.observe.record`: a step from the table :class:`headwise.observe.StepKind`
  (input, q/k/v projection, split heads, scores, mask, softmax, dropout, weighted sum or fused
  kernel, head mask, merge heads, output projection) and facts (the einops pattern; the kernel,
  its memory class, why it was chosen and how any weights were produced).

Every shape is written with named axes, ``(b=1, h=8, i=8, d=64)``. Axis legend: ``b`` batch,
``h`` heads, ``g`` key/value heads (only when fewer than ``h``), ``i`` query position, ``j`` key
position, ``d`` head dim, ``m`` model dim, ``out`` the attention output size (only when it is
not ``m``), ``n`` sequence position outside attention, ``ff`` the feed-forward width, ``vocab``
the vocabulary; ``(h d)=512`` is a merged axis of size ``h*d``.

The fused kernel never builds the ``(b, h, i, j)`` scores. The trace then shows a
``scores (not materialised)`` line with the logical shape computed from ``q`` and ``k``, so the
listing stays complete without claiming memory that was never allocated.

The package is ``headwise.tracing`` and the function is ``headwise.trace``: no module of that
name exists, so the function shadows nothing (``from headwise import trace, Trace``).

Modules: ``recorder`` (hooks and records -> steps), ``report`` (:class:`Trace`), ``render``
(text from the table's display strings), ``steps`` (data types), ``naming`` (axes and labels).

May import (the rule and its check: the table in ``tests/test_wings.py``): ``observe`` (the channel), ``layers`` (the module it traces) and torch; the
core never imports this wing (it reports through the channel).
"""

from headwise.tracing.recorder import trace
from headwise.tracing.report import Trace
from headwise.tracing.steps import AttentionRun, Step

__all__ = ["AttentionRun", "Step", "Trace", "trace"]
