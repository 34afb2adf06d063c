"""A head-wise KV plan: which key/value groups of each layer keep every position and which keep
only ``S`` sinks and the ``W`` most recent ones, and the one rule of which positions those are.

Axis legend: ``l`` layer, ``g`` key/value groups (heads) of a layer, ``b`` rows, ``i`` query
position, ``j`` key position, ``s`` a streaming group's slots (``S + W``).

Why. Most heads of a trained language model look at the first few tokens and the last few
(*streaming* heads); a few look far back (*retrieval* heads). A streaming key/value group then
needs only ``S + W`` cached positions, a ring buffer, however long the text grows; a retrieval
group keeps everything. A :class:`KVPlan` says which is which for one model shape; the head-wise
caches (:mod:`headwise.decode.ragged`, :class:`headwise.hf.HeadwiseKVCache`) store each group as
it says.

The rule, relative to each row's first real position (left padding moves it): a streaming
group's query at position ``i`` sees key ``j <= i`` when ``j`` is one of the first ``S`` real
positions or one of the ``W`` latest (``j > i - W``); :func:`streaming_allowed` is that mask and
:func:`slot` the ring slot a position is stored in. A plan is saved as strict JSON, atomically
(:func:`headwise._io.atomic_write`), and refused by a model of another shape.

May import: the leaves only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from headwise._io import atomic_write
from headwise.errors import CheckpointError

__all__ = ["KVPlan", "check_window", "plan_shape", "slot", "streaming_allowed"]

FORMAT = "headwise-kv-plan"
VERSION = 1
_KEYS = {"format", "version", "layers", "groups", "head_dim", "sinks", "window", "streaming",
         "budget", "scores", "loss", "model"}


def check_window(sinks, window) -> None:
    """ValueError unless ``sinks`` is an int >= 0 and ``window`` an int >= 1."""
    if not isinstance(sinks, int) or isinstance(sinks, bool) or sinks < 0:
        raise ValueError(f"KVPlan: sinks must be an int >= 0, got {sinks!r}; pass e.g. sinks=4")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise ValueError(f"KVPlan: window must be an int >= 1 (the recent positions a streaming "
                         f"group keeps), got {window!r}; pass e.g. window=256")


def _check_budget(budget) -> None:
    if budget is None:
        return
    if (not isinstance(budget, (int, float)) or isinstance(budget, bool)
            or not math.isfinite(budget) or not 0 <= budget <= 1):
        raise ValueError(f"KVPlan: budget must be a fraction in [0, 1] (the share of key/value "
                         f"groups that stream), got {budget!r}; pass e.g. budget=0.5")


@dataclass(frozen=True)
class KVPlan:
    """Which key/value groups stream, for a model of ``layers`` x ``groups`` x ``head_dim``.

    Attributes:
        layers, groups, head_dim: the model's shape (its fingerprint: a plan for another shape
            is refused by :meth:`check`).
        sinks, window: ``S`` first positions and ``W`` latest ones a streaming group keeps.
        streaming: per layer, the sorted indices of its streaming groups (the rest keep all).
        budget: the share of groups asked to stream (None: chosen by hand).
        scores: per layer, per group, the streaming score the choice read (None: by hand).
        loss: measured next-token losses, e.g. ``{"full": 2.31, "plan": 2.33}`` (None: unmeasured).
        model: a name for the model it was made for (shown only).
    """

    layers: int
    groups: int
    head_dim: int
    sinks: int
    window: int
    streaming: tuple[tuple[int, ...], ...]
    budget: float | None = None
    scores: tuple[tuple[float, ...], ...] | None = None
    loss: dict[str, float] | None = field(default=None, compare=False)
    model: str | None = None

    def __post_init__(self):
        for name in ("layers", "groups", "head_dim"):
            n = getattr(self, name)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"KVPlan: {name} must be a positive int, got {n!r}")
        check_window(self.sinks, self.window)
        _check_budget(self.budget)
        rows = tuple(tuple(sorted(int(g) for g in row)) for row in self.streaming)
        if len(rows) != self.layers:
            raise ValueError(f"KVPlan: streaming lists {len(rows)} layers, expected "
                             f"{self.layers}; give one list of group indices per layer")
        for i, row in enumerate(rows):
            if len(set(row)) != len(row) or any(not 0 <= g < self.groups for g in row):
                raise ValueError(f"KVPlan: layer {i} streams groups {list(row)}, expected "
                                 f"distinct indices in 0..{self.groups - 1}")
        object.__setattr__(self, "streaming", rows)
        if self.scores is not None:
            scores = tuple(tuple(float(s) for s in row) for row in self.scores)
            if len(scores) != self.layers or any(len(r) != self.groups for r in scores):
                raise ValueError(f"KVPlan: scores must be {self.layers} x {self.groups} "
                                 f"(layers x groups), got {[len(r) for r in scores]}")
            object.__setattr__(self, "scores", scores)

    # ------------------------------------------------------------------ making one
    @classmethod
    def uniform(cls, layers: int, groups: int, head_dim: int, *, sinks: int = 4,
                window: int = 256, streaming: bool = True, **kw) -> KVPlan:
        """Every group streaming (or, with ``streaming=False``, none)."""
        row = tuple(range(groups)) if streaming else ()
        return cls(layers, groups, head_dim, sinks, window, (row,) * layers, **kw)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.layers, self.groups, self.head_dim

    @property
    def fraction(self) -> float:
        """The share of all groups that stream."""
        return sum(map(len, self.streaming)) / (self.layers * self.groups)

    def full(self, layer: int) -> tuple[int, ...]:
        """The groups of ``layer`` that keep every position."""
        keep = set(self.streaming[layer])
        return tuple(g for g in range(self.groups) if g not in keep)

    def check(self, shape: tuple[int, int, int], what: str = "the model") -> None:
        """ValueError unless ``shape`` (layers, groups, head_dim) is this plan's."""
        if tuple(shape) != self.shape:
            raise ValueError(f"KVPlan: the plan is for (layers, kv groups, head dim) = "
                             f"{self.shape}, {what} has {tuple(shape)}; make a plan for this "
                             f"model (headwise kvplan)")

    def kv_bytes(self, batch: int, length: int, element_size: int) -> int:
        """Bytes of keys and values a head-wise cache of ``length`` positions holds."""
        ring = min(length, self.sinks + self.window)
        kept = sum((self.groups - len(r)) * length + len(r) * ring for r in self.streaming)
        return 2 * batch * kept * self.head_dim * element_size

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "layers": self.layers,
                "groups": self.groups, "head_dim": self.head_dim, "sinks": self.sinks,
                "window": self.window, "streaming": [list(r) for r in self.streaming],
                "budget": self.budget,
                "scores": None if self.scores is None else [list(r) for r in self.scores],
                "loss": self.loss, "model": self.model}

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON, atomically (never half-written)."""
        text = json.dumps(self.to_dict(), indent=1)
        return atomic_write(path, lambda f: f.write(text + "\n"), binary=False)

    @classmethod
    def load(cls, path: str | Path) -> KVPlan:
        """Read a plan :meth:`save` wrote; CheckpointError on a damaged or foreign file,
        ValueError on bad values."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"KVPlan: {path} is not a complete JSON plan ({e.msg} at line "
                                  f"{e.lineno}); it may be truncated: make it again") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw, where: str = "the plan") -> KVPlan:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CheckpointError(f"KVPlan: {where} is not a headwise KV plan (expected "
                                  f"format={FORMAT!r}); pass a file headwise kv-plan wrote")
        if raw.get("version") != VERSION:
            raise CheckpointError(f"KVPlan: {where} has version {raw.get('version')!r}, this "
                                  f"headwise reads version {VERSION}; make the plan again")
        unknown, missing = sorted(set(raw) - _KEYS), sorted(_KEYS - set(raw))
        if unknown or missing:
            raise CheckpointError(f"KVPlan: {where} has unknown keys {unknown} and lacks "
                                  f"{missing}; expected exactly {sorted(_KEYS)}")
        if not isinstance(raw["streaming"], list) or any(
                not isinstance(r, list) for r in raw["streaming"]):
            raise ValueError(f"KVPlan: {where}: streaming must be a list of lists of group "
                             f"indices, got {raw['streaming']!r}")
        keep = {k: raw[k] for k in _KEYS - {"format", "version"}}
        return cls(**keep)

    # ------------------------------------------------------------------ printing
    def table(self) -> str:
        """One line per layer: its streaming groups (``S``) and full ones (``F``), scores."""
        head = (f"KVPlan {self.model or ''} layers={self.layers} groups={self.groups} "
                f"head_dim={self.head_dim} sinks={self.sinks} window={self.window} "
                f"streaming={self.fraction:.0%}"
                + ("" if self.budget is None else f" budget={self.budget:g}")).replace("  ", " ")
        lines = [head, "layer  groups" + ("  streaming scores" if self.scores else "")]
        for i in range(self.layers):
            marks = "".join("S" if g in self.streaming[i] else "F" for g in range(self.groups))
            score = "" if self.scores is None else "  " + " ".join(
                f"{s:.3f}" for s in self.scores[i])
            lines.append(f"{i:5d}  {marks}{score}")
        if self.loss:
            lines.append("loss  " + "  ".join(f"{k}={v:.4f}" for k, v in self.loss.items()))
        return "\n".join(lines)

    __str__ = table


def plan_shape(layers: int, groups: int, head_dim: int) -> tuple[int, int, int]:
    """A model's fingerprint as :meth:`KVPlan.check` compares it."""
    return int(layers), int(groups), int(head_dim)


def slot(rel: int, sinks: int, window: int) -> int:
    """The ring slot of the position ``rel`` positions after the row's first real one: the
    sinks in slots ``0 .. S-1``, later positions cycling through ``S .. S+W-1``."""
    return rel if rel < sinks else sinks + (rel - sinks) % window


def streaming_allowed(rel_q, rel_k, sinks: int, window: int):
    """The streaming mask (True = may attend) of queries at ``rel_q`` over keys at ``rel_k``
    (tensors of positions relative to each row's first real one, broadcast against each
    other): causal, and the key among the first ``S`` or the ``W`` latest."""
    return (rel_k <= rel_q) & ((rel_k < sinks) | (rel_k > rel_q - window)) & (rel_k >= 0)
