"""What a trace holds: the recorded steps, one summary per attention call, and the call tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from headwise.observe import WEIGHTS_AT_V, WeightsSource

__all__ = ["AttentionRun", "Step", "fact", "named_shape"]


@dataclass(frozen=True)
class Step:
    """One recorded step.

    Attributes:
        name: the step's stable name, a :class:`headwise.observe.StepKind` key (``"split heads
            q"``, ``"scores"``) or, for what the trace itself sees, ``"output"`` (a module's
            output) and ``"input NAME"``.
        path: module path inside the traced module (``"blocks.0.self_attn"``; ``""`` = root).
        module: class name of the module the step belongs to.
        shape: the result's shape (``None`` when the step has no tensor).
        axes: one name per axis (``("b", "h", "i", "d")``; a merged axis is ``"(h d)"``).
        info: the structured facts the producer passed (``pattern``, ``kernel``, ``memory``,
            ``reason``, ``weights_source`` ...), JSON-ready.
        materialised: False for the logical scores of a fused kernel (never stored).
        kind: ``"input"``, ``"step"`` (inside a module) or ``"module"`` (a module's output).
    """

    name: str
    path: str
    module: str
    shape: tuple[int, ...] | None
    axes: tuple[str, ...]
    info: dict[str, Any] = field(default_factory=dict)
    materialised: bool = True
    kind: str = "step"

    @property
    def named_shape(self) -> str:
        """``(b=1, h=8, i=8, d=64)``; the plain shape when the axes are unknown."""
        return named_shape(self.shape, self.axes)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "module": self.module,
                "shape": None if self.shape is None else list(self.shape),
                "axes": list(self.axes), "named_shape": self.named_shape, "info": self.info,
                "materialised": self.materialised, "kind": self.kind}


@dataclass(frozen=True)
class AttentionRun:
    """How one attention call was computed, from the structured facts of its result step.

    Attributes:
        path: module path of the attention module. kind: ``"self"`` or ``"cross"``.
        backend: the module's configured backend (``"auto"``, ``"sdpa"``, ``"eager"``).
        ran_backend: the backend that ran (``"sdpa"``, ``"eager"``).
        kernel: the kernel that produced the output (``"FLASH_ATTENTION"``, ``"MATH"``; ``None``
            for the eager einsum math).
        memory: ``"O(n)"`` (no ``(b, h, i, j)`` tensor) or ``"O(n^2)"``.
        fused: True when a fused kernel produced the output.
        reason: why this path was taken (``"weights requested"``, ``"dropout > 0 ..."``).
        weights: how the returned weights were produced (``None``: none were returned).
    """

    path: str
    kind: str
    backend: str
    ran_backend: str
    kernel: str | None
    memory: str
    fused: bool
    reason: str
    weights: WeightsSource | None = None

    @property
    def ran(self) -> str:
        """What ran: ``sdpa[FLASH_ATTENTION]``, ``sdpa[MATH]``, ``eager``."""
        return f"{self.ran_backend}[{self.kernel}]" if self.kernel else self.ran_backend

    @property
    def verdict(self) -> str:
        if self.fused:
            text = "fused kernel"
        elif self.ran_backend == "eager" and self.backend == "eager":
            text = f"eager (chosen): {self.reason}"
        elif self.kernel == WEIGHTS_AT_V:  # not a fallback: the weights asked for, reused
            text = f"output = {WEIGHTS_AT_V}: {self.reason}"
        else:
            target = "sdpa's math kernel" if self.ran_backend == "sdpa" else self.ran
            text = f"fell back to {target}: {self.reason}"
        if self.weights is not None and (self.fused or self.kernel == WEIGHTS_AT_V):
            text += f"; weights {self.weights.describe()}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "backend": self.backend,
                "ran": self.ran, "kernel": self.kernel, "memory": self.memory,
                "fused": self.fused, "reason": self.reason,
                "weights": None if self.weights is None else self.weights.to_dict(),
                "verdict": self.verdict}


def named_shape(shape: tuple[int, ...] | None, axes: tuple[str, ...]) -> str:
    """``named_shape((1, 8, 512), ("b", "n", "(h d)"))`` -> ``"(b=1, n=8, (h d)=512)"``."""
    if shape is None:
        return "-"
    if len(axes) != len(shape):
        return str(tuple(shape))
    return "(" + ", ".join(f"{a}={s}" for a, s in zip(axes, shape, strict=True)) + ")"


def fact(value: Any) -> Any:
    """A producer's fact in JSON-ready form (enums as their value, tensors as their shape)."""
    if isinstance(value, WeightsSource):
        return value.to_dict()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}"
    if isinstance(value, tuple):
        return [fact(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


@dataclass(eq=False)
class Node:
    """A module call: its steps and nested calls, in the order they happened."""

    path: str
    label: str
    module: str
    children: list[Node | Step] = field(default_factory=list)
    output: Step | None = None
    notes: str = ""
    kind: str = ""
    q_shape: tuple[int, ...] | None = field(default=None, repr=False)
    k_shape: tuple[int, ...] | None = field(default=None, repr=False)
    # the last child and its tensor, while the call runs: a recorded step that only names a
    # submodule's output (same tensor) is folded into that submodule's line
    last: tuple[Any, Any] | None = field(default=None, repr=False)


def weights_source(info: dict[str, Any]) -> WeightsSource | None:
    """The :class:`WeightsSource` of a result step's facts (``None`` when no weights)."""
    raw = info.get("weights_source")
    if not isinstance(raw, dict):
        return None
    return WeightsSource(raw["method"], raw.get("kernel", ""), raw.get("chunk_rows"))
