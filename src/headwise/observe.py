"""The one channel through which a forward pass reports what it does, and the table of steps.

Axis legend: ``b`` batch, ``h`` heads, ``g`` key/value heads, ``i`` query position, ``j`` key
position, ``d`` head dim, ``m`` model dim.

A forward reports three things, each with one call that is a single global read and a return
while nothing observes (so the fused path and the decoding step pay nothing):

- :func:`record`: each step (project, split heads, scores, ...) as a :class:`StepKind` from the
  table below with structured facts (``pattern=``, ``kernel=``, ``memory=``, ``reason=``,
  ``weights_source=`` ...): the named-axis trace (:func:`headwise.trace`);
- :func:`attention`: each attention call's ``q (b, h, i, d)``, ``k (b, g, j, d)``, mask, causality
  and scale: streaming head statistics (:func:`headwise.stats.collect`, the catalogue);
- :func:`heads`: each attention's per-head output ``(b, h, i, d)`` before the merge, which an
  observer keeps (:func:`headwise.record_heads`, :func:`headwise.head_means`) or edits
  (:func:`headwise.ablate`, :func:`headwise.patch`).

An :class:`Observer` takes any of the three and is active for the duration of an
:func:`observing` block. While one is active the cached decoding step stands aside
(:func:`headwise.step.usable`): it bypasses the module forward, so it would report nothing.

The table is the contract between producers and :mod:`headwise.tracing`: the trace dispatches on
the member and its :class:`Role`, reads axes from the table and facts from the keywords, and never
parses text. Each member's ``label`` and ``note`` are display only (a test rewrites all of them
and checks that the trace's structured output does not move). Adding a step is one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch

__all__ = ["FUSED_KERNEL", "WEIGHTS_AT_V", "PROJECTION", "SPLIT_HEADS", "Memory", "Observer",
           "Role", "StepKind", "WeightsSource", "active", "attention", "describe", "heads",
           "observed", "observing", "record", "recording"]


class Memory(StrEnum):
    """The memory class of an attention call, in the sequence length n."""

    LINEAR = "O(n)"  # no (b, h, i, j) tensor exists at any time
    QUADRATIC = "O(n^2)"  # the (b, h, i, j) scores or weights were materialised


class Role(StrEnum):
    """What the trace does with a step beyond listing it."""

    PLAIN = ""
    QUERIES = "queries"  # its shape gives the logical scores' (b, h, i)
    KEYS = "keys"  # its shape gives j; split ``g`` ways under grouped-query attention
    VALUES = "values"  # split ``g`` ways under grouped-query attention
    CACHED_KEYS = "cached keys"  # its shape gives j (every cached position)
    ATTENTION = "attention"  # the attention result: one AttentionRun per call
    FUSED_ATTENTION = "fused attention"  # the result of a kernel that keeps the scores inside


def _split_axes(axes: str) -> list[str]:
    """``"b n (h d)"`` -> ``["b", "n", "(h d)"]``."""
    out: list[str] = []
    for word in axes.split():
        if out and out[-1].startswith("(") and not out[-1].endswith(")"):
            out[-1] += " " + word
        else:
            out.append(word)
    return out


@dataclass(frozen=True)
class WeightsSource:
    """How the attention weights a call returned were produced.

    Attributes:
        method: ``"softmax"`` (softmax of the materialised ``(b, h, i, j)`` scores),
            ``"rows"`` (whole rows recomputed as their softmax, chunk by chunk, never holding
            more than a chunk of scores) or ``"lse"`` (a key range, recomputed from the row
            log-sum-exp a kernel returned).
        kernel: whose log-sum-exp (``"flash"``, ``"efficient"``, ``"chunked pass"``).
        chunk_rows: query rows recomputed at a time (``None``: all at once).
    """

    method: str
    kernel: str = ""
    chunk_rows: int | None = None

    def describe(self) -> str:
        """``"recomputed from the flash LSE, 256-row chunks"``."""
        if self.method == "lse":
            text = f"recomputed from the {self.kernel} LSE".replace("the  LSE", "the LSE")
        elif self.method == "rows":
            text = "recomputed exactly as the softmax of whole rows"
        else:
            text = "softmax of the materialised scores"
        return text + (f", {self.chunk_rows}-row chunks" if self.chunk_rows else "")

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "kernel": self.kernel, "chunk_rows": self.chunk_rows,
                "description": self.describe()}


def _kv_note(facts: dict) -> str:
    if facts.get("reused"):
        return "cross-attention keys/values, projected once per source and reused"
    return "self: every position so far; cross: stored once"


def _mask_note(facts: dict) -> str:
    if facts.get("form") == "causal":
        return f"causal ({facts.get('alignment', 'bottom-right')})"
    return f"{facts.get('form')} {tuple(facts.get('shape', ()))}"


def _attention_note(facts: dict) -> str:
    kernel = facts.get("kernel")
    ran = f"{facts.get('backend')}[{kernel}]" if kernel else str(facts.get("backend"))
    reason = facts.get("reason")
    text = f"{ran}, {facts.get('memory')} memory" + (f" ({reason})" if reason else "")
    source = facts.get("weights_source")
    if isinstance(source, WeightsSource):
        text += f"; weights {source.describe()}"
    if "mask" in facts:
        text += f"; mask: {facts['mask']}"
    if "causal" in facts:
        text += f"; causal: {facts['causal']}"
    return text


class StepKind(StrEnum):
    """Every step a producer may record: ``NAME = key, axes, note, role``.

    ``key`` (the member's value) is the step's stable name in :class:`headwise.Trace` (``find``,
    ``to_dict``, ``to_json``). ``axes`` name the recorded tensor's axes in the legend ``b h g i j
    d m``; ``n`` is a position outside attention, ``out`` the attention output size (shown as
    ``m`` when it equals the model dim), ``(h d)`` a merged axis, and ``g`` is shown as ``h`` when
    every query head has its own key/value head. ``note`` is display only: a template filled with
    the step's facts, or a function of them. ``label`` (display only) defaults to the key.
    """

    # MultiHeadAttention, in forward order
    INPUT = "input", "b i m"
    QKV_PROJECTION = ("q, k, v projection", "b i qkv",
                      "one GEMM over cat(W_q, W_k, W_v), then cut into q, k, v")
    Q_PROJECTION = "q projection", "b i (h d)"
    K_PROJECTION = "k projection", "b j (g d)"
    V_PROJECTION = "v projection", "b j (g d)"
    SPLIT_Q = "split heads q", "b h i d", "{pattern}", Role.QUERIES
    SPLIT_K = "split heads k", "b g j d", "{pattern}", Role.KEYS
    SPLIT_V = "split heads v", "b g j d", "{pattern}", Role.VALUES
    ROTARY_Q = ("rotary positions q", "b h i d", "RoPE from position {offset}: feature pairs "
                "(k, k + r/2) turn by position * {theta:g}^(-2k/r), r = {rotary_dim}")
    ROTARY_K = ("rotary positions k", "b g j d", "RoPE from position {offset}, as q (before the "
                "keys are cached)")
    KV_CACHE = "kv cache", "b g j d", _kv_note, Role.CACHED_KEYS
    SCORES = "scores", "b h i j", "q k^T * {scale:.4g}"
    SOFT_CAP = ("soft-cap", "b h i j", "{softcap:g} * tanh(scores / {softcap:g}); eager only: "
                "no fused kernel takes a function of the scores")
    MASK = "mask", "b h i j", _mask_note
    SOFTMAX = "softmax", "b h i j", "over j; fully masked rows -> 0"
    SOFTMAX_WITH_SINKS = ("softmax with sinks", "b h i j", "over j and one learned sink logit "
                          "per head, whose share is dropped (rows sum to < 1); eager only")
    DROPOUT = "dropout", "b h i j", "p={p}"
    WEIGHTED_SUM = "weighted sum", "b h i d", _attention_note, Role.ATTENTION
    FUSED_ATTENTION = "fused attention", "b h i d", _attention_note, Role.FUSED_ATTENTION
    HEAD_MASK = "head mask", "b h i d"
    MERGE_HEADS = "merge heads", "b i (h d)", "{pattern}"
    OUTPUT_PROJECTION = "output projection", "b i out"
    # models
    EMBED = "embed", "b n m"
    SCALE_EMBEDDING = "scale embedding by sqrt(m)", "b n m", "scale={scale:.4g}"
    ADD_POSITIONS = "add positions", "b n m", "offset={offset}"
    TOKEN_EMBEDDING = "token embedding", "b n m"
    SEGMENT_AND_POSITION = "+ segment + learned position", "b n m"
    EMBEDDING_NORM = "embedding LayerNorm", "b n m"
    BLOCK_OUTPUT = "block output", "b n m"
    MEMORY = "memory", "b j m"
    LOGITS = "logits", "b n vocab"

    def __new__(cls, key: str, axes: str, note: str | Callable[[dict], str] = "",
                role: Role = Role.PLAIN):
        member = str.__new__(cls, key)
        member._value_ = key
        member.axes = tuple(_split_axes(axes))
        member.note = note
        member.role = role
        member.label = key
        return member


# the projection and the head split of each of q, k and v, by name
PROJECTION = {"q": StepKind.Q_PROJECTION, "k": StepKind.K_PROJECTION, "v": StepKind.V_PROJECTION}
SPLIT_HEADS = {"q": StepKind.SPLIT_Q, "k": StepKind.SPLIT_K, "v": StepKind.SPLIT_V}


FUSED_KERNEL = "fused kernel"  # the reason a fused path records: nothing fell back
# the kernel an sdpa call records when its output is the returned weights @ v, block by block
WEIGHTS_AT_V = "weights @ v"


def describe(step: StepKind, facts: dict[str, Any]) -> str:
    """The display note of one recorded step (never read back by the trace)."""
    note = step.note
    if callable(note):
        return note(facts)
    try:
        return note.format_map(facts)
    except (KeyError, ValueError, TypeError):
        return note


# ---------------------------------------------------------------------------------- the channel
Recorder = Callable[..., None]  # (step, tensor, **facts)
Attention = Callable[..., None]  # (module, q, k, mask, causal, scale, self_attention)
Softmax = Callable[..., None]  # (module, q, k, mask, causal, scale, self_attention, softcap, sinks)
Heads = Callable[[Any, torch.Tensor], torch.Tensor]  # (module, out (b, h, i, d)) -> out


@dataclass(frozen=True, eq=False)
class Observer:
    """What one observer takes from the forward passes inside its :func:`observing` block.

    Attributes:
        step: ``step(kind, tensor, **facts)``, every :func:`record` call (the trace).
        attention: ``attention(module, q, k, mask, causal, scale, self_attention)``, every
            :func:`attention` call: ``q (b, h, i, d)``, ``k (b, g, j, d)`` after the head split
            and rotary positions, ``mask`` and ``causal`` as the kernel got them; only calls
            whose softmax is plain (no soft-capping, no sinks), which these observers model.
        softmax: ``softmax(module, q, k, mask, causal, scale, self_attention, softcap, sinks)``,
            every :func:`attention` call with the terms its softmax adds (``softcap``: Gemma 2's
            cap or None; ``sinks``: gpt-oss's ``(h,)`` logits or None): the long-context pass.
        heads: ``heads(module, out) -> out``, every :func:`heads` call: the module's per-head
            output ``(b, h, i, d)`` (after its ``head_mask``), returned as it is (recording) or
            edited (ablation, patching); what it returns is what the merge gets.

    Nesting: a step and an attention call go to the innermost observer that takes them (a trace
    inside a trace records its own run only); per-head outputs go through every observer that
    takes them, outermost first (an ablation inside an ablation removes both selections, and
    ``record_heads`` inside ``ablate`` records the ablated outputs).
    """

    step: Recorder | None = None
    attention: Attention | None = None
    heads: Heads | None = None
    softmax: Softmax | None = None


# The active observers, outermost first, and what each report calls: set only by _install, read
# once per report (None while nothing takes that report).
_observers: tuple[Observer, ...] = ()
_step: Recorder | None = None
_attention: Attention | None = None
_softmax: Softmax | None = None
_heads: tuple[Heads, ...] | None = None


def _install(observers: tuple[Observer, ...]) -> None:
    global _observers, _step, _attention, _softmax, _heads
    _observers = observers
    _step = next((o.step for o in reversed(observers) if o.step is not None), None)
    _attention = next((o.attention for o in reversed(observers) if o.attention is not None),
                      None)
    _softmax = next((o.softmax for o in reversed(observers) if o.softmax is not None), None)
    _heads = tuple(o.heads for o in observers if o.heads is not None) or None


@contextmanager
def observing(observer: Observer):
    """Make ``observer`` active for the duration of the block (removed on any exit)."""
    if not isinstance(observer, Observer):
        raise TypeError(f"observing expects a headwise.observe.Observer, got "
                        f"{type(observer).__name__}")
    _install(_observers + (observer,))
    try:
        yield observer
    finally:  # this observer only (the innermost copy): blocks may close out of order
        last = max(n for n, o in enumerate(_observers) if o is observer)
        _install(_observers[:last] + _observers[last + 1:])


def recording(recorder: Recorder):
    """Route every :func:`record` call to ``recorder`` for the duration of the block."""
    return observing(Observer(step=recorder))


def active() -> bool:
    """True while a trace is recording (lets callers skip work that only a trace needs)."""
    return _step is not None


def observed() -> bool:
    """True while any observer is active (what it would see needs the module forward)."""
    return bool(_observers)


def record(step: StepKind, tensor: torch.Tensor | None = None, **facts: Any) -> None:
    """Report one step: a :class:`StepKind` from the table, its result and structured facts
    (``pattern=``, ``backend=``, ``kernel=``, ``memory=``, ``reason=``, ``weights_source=``)."""
    if _step is not None:
        _step(step, tensor, **facts)


def attention(module, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
              causal: bool, scale: float | None, self_attention: bool, *,
              softcap: float | None = None, sinks: torch.Tensor | None = None) -> None:
    """Report one attention call of ``module``: ``q (b, h, i, d)``, ``k (b, g, j, d)``, the mask
    (broadcastable to ``(b, h, i, j)``, True = may attend) and causality the kernel got, the
    scale (None: ``1/sqrt(d)``), whether the keys are the queries' own sequence, and what the
    softmax adds (``softcap``, ``sinks (h,)``). ``attention`` observers see only plain softmax
    calls (their statistics model no cap and no sink); ``softmax`` observers see every call."""
    if _softmax is not None:
        _softmax(module, q, k, mask, causal, scale, self_attention, softcap, sinks)
    if _attention is not None and softcap is None and sinks is None:
        _attention(module, q, k, mask, causal, scale, self_attention)


def heads(module, out: torch.Tensor) -> torch.Tensor:
    """Report ``module``'s per-head output ``out (b, h, i, d)`` before the merge; returns it as
    the observers left it (``out`` itself while none takes it)."""
    edits = _heads
    if edits is None:
        return out
    for edit in edits:
        out = edit(module, out)
    return out
