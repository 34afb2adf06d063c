"""A named-axis shape trace of a real forward pass: where the heads are created, where every
tensor gets its shape, and which attention kernel ran.

``headwise.trace(module, *args, **kwargs)`` runs ``module(*args, **kwargs)`` once, unchanged,
and records two kinds of steps:

- **module outputs**, through forward hooks on every submodule (embedding, positional encoding,
  layer norm, feed-forward, each block ...), nested by module path;
- **the inside of attention**, through :func:`headwise._record.record` calls that
  :class:`~headwise.MultiHeadAttention` and the attention backends make at each step: input,
  q/k/v projection, split heads (with the einops pattern), scores, mask, softmax, dropout,
  weighted sum or fused kernel (with the kernel's name, its memory order and why it was chosen),
  head mask, merge heads, output projection.

Every shape is written with named axes, ``(b=1, h=8, i=8, d=64)``. Axis legend: ``b`` batch,
``h`` heads, ``g`` key/value heads (only when fewer than ``h``), ``i`` query position, ``j`` key
position, ``d`` head dim, ``m`` model dim, ``n`` sequence position outside attention, ``ff`` the
feed-forward width, ``vocab`` the vocabulary; ``(h d)=512`` is a merged axis of size ``h*d``.

The fused kernel never builds the ``(b, h, i, j)`` scores. The trace then shows a
``scores (not materialised)`` line with the logical shape computed from ``q`` and ``k``, so the
listing stays complete without claiming memory that was never allocated.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from headwise._record import recording
from headwise.layers import MultiHeadAttention

__all__ = ["AttentionRun", "Step", "Trace", "trace"]


# --------------------------------------------------------------------------------- data types
@dataclass(frozen=True)
class Step:
    """One recorded step.

    Attributes:
        name: what happened (``"split heads q"``, ``"scores"``, ``"output"`` for a module).
        path: module path inside the traced module (``"blocks.0.self_attn"``; ``""`` = root).
        module: class name of the module the step belongs to.
        shape: the result's shape (``None`` when the step has no tensor).
        axes: one name per axis (``("b", "h", "i", "d")``; a merged axis is ``"(h d)"``).
        info: extra facts as strings (``pattern``, ``backend``, ``memory``, ``reason``, ...).
        materialised: False for the logical scores of a fused kernel (never stored).
        kind: ``"input"``, ``"step"`` (inside a module) or ``"module"`` (a module's output).
    """

    name: str
    path: str
    module: str
    shape: tuple[int, ...] | None
    axes: tuple[str, ...]
    info: dict[str, str] = field(default_factory=dict)
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
    """How one attention call was computed.

    Attributes:
        path: module path of the attention module. kind: ``"self"`` or ``"cross"``.
        backend: the module's configured backend (``"auto"``, ``"sdpa"``, ``"eager"``).
        ran: what actually ran (``"sdpa[FLASH_ATTENTION]"``, ``"sdpa[MATH]"``, ``"eager"``).
        memory: ``"O(n)"`` (no ``(b, h, i, j)`` tensor) or ``"O(n^2)"``.
        fused: True when a fused kernel ran without materialising the scores.
        reason: why this path was taken (``"weights requested"``, ``"dropout > 0 ..."``).
    """

    path: str
    kind: str
    backend: str
    ran: str
    memory: str
    fused: bool
    reason: str

    @property
    def verdict(self) -> str:
        if self.fused:
            return "fused kernel"
        if self.ran == "eager" and self.backend == "eager":
            return f"eager (chosen): {self.reason}"
        target = "sdpa's math kernel" if self.ran.startswith("sdpa") else self.ran
        return f"fell back to {target}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "backend": self.backend, "ran": self.ran,
                "memory": self.memory, "fused": self.fused, "reason": self.reason,
                "verdict": self.verdict}


def named_shape(shape: tuple[int, ...] | None, axes: tuple[str, ...]) -> str:
    """``named_shape((1, 8, 512), ("b", "n", "(h d)"))`` -> ``"(b=1, n=8, (h d)=512)"``."""
    if shape is None:
        return "-"
    if len(axes) != len(shape):
        return str(tuple(shape))
    return "(" + ", ".join(f"{a}={s}" for a, s in zip(axes, shape, strict=True)) + ")"


@dataclass(eq=False)
class _Node:
    """A module call: its steps and nested calls, in the order they happened."""

    path: str
    label: str
    module: str
    children: list[_Node | Step] = field(default_factory=list)
    output: Step | None = None
    notes: str = ""
    kind: str = ""
    q_shape: tuple[int, ...] | None = field(default=None, repr=False)
    k_shape: tuple[int, ...] | None = field(default=None, repr=False)
    # the last child and its tensor, while the call runs: a recorded step that only names a
    # submodule's output (same tensor) is folded into that submodule's line
    last: tuple[Any, Any] | None = field(default=None, repr=False)


# ------------------------------------------------------------------------------------ trace
class Trace:
    """The record of one forward pass.

    Attributes:
        steps: every :class:`Step` in execution order (a module's output comes after its
            inside, so "after the embedding" reads top to bottom).
        attention: one :class:`AttentionRun` per attention call.
        output: what the module returned (unchanged by tracing).

    ``str(trace)`` is the indented listing (repeated identical blocks collapsed; ``render(
    full=True)`` shows all), then the attention summary.
    """

    def __init__(self, root: _Node, steps: list[Step], attention: list[AttentionRun],
                 output: Any):
        self._root = root
        self.steps = steps
        self.attention = attention
        self.output = output

    # ------------------------------------------------------------------ queries
    def find(self, name: str, path: str | None = None) -> list[Step]:
        """Steps called ``name`` (optionally only those under module ``path``)."""
        return [s for s in self.steps if s.name == name
                and (path is None or s.path == path or s.path.startswith(path + "."))]

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    # ------------------------------------------------------------------ text
    def __str__(self) -> str:
        return self.render()

    def __repr__(self) -> str:
        return (f"Trace({self._root.module}, {len(self.steps)} steps, "
                f"{len(self.attention)} attention calls)")

    def render(self, full: bool = False, summary: bool = True) -> str:
        """The indented listing; ``full`` shows repeated identical blocks instead of one line."""
        rows: list[tuple[str, str, str]] = []
        _render_node(self._root, 0, rows, full)
        label_w = min(max(len(r[0]) for r in rows), 72)
        shape_w = min(max(len(r[1]) for r in rows), 40)
        lines = []
        for label, shape, notes in rows:
            if not shape and not notes:
                lines.append(label)
                continue
            line = f"{label:<{label_w}}  {shape:<{shape_w}}  {notes}"
            lines.append(line.rstrip())
        text = "\n".join(lines)
        if summary and self.attention:
            text += "\n\n" + self.summary()
        return text

    def summary(self) -> str:
        """Which attention calls ran a fused kernel and which fell back, and why."""
        runs = self.attention
        fused = [r for r in runs if r.fused]
        back = [r for r in runs if not r.fused]
        head = (f"attention: {len(runs)} call{'s' * (len(runs) != 1)}, {len(fused)} fused "
                f"(O(n) memory), {len(back)} materialised the (b, h, i, j) scores (O(n^2))")
        root = self._root.module
        path_w = max(len(r.path or root) for r in runs)
        ran_w = max(len(r.ran) for r in runs)
        lines = [head]
        for r in runs:
            lines.append(f"  {r.path or root:<{path_w}}  {r.kind:<5}  {r.ran:<{ran_w}}  "
                         f"{r.memory:<6}  {r.verdict}")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """A Markdown table of every step, then the attention summary as a list."""
        out = [f"### Trace of `{self._root.module}`", "",
               "| # | module | step | shape | named axes | notes |",
               "|---|---|---|---|---|---|"]
        for n, s in enumerate(self.steps):
            shape = "-" if s.shape is None else str(tuple(s.shape))
            notes = _notes(s).replace("|", "\\|")
            name = s.name if s.materialised else f"{s.name} (not materialised)"
            out.append(f"| {n} | `{s.path or '(root)'}` {s.module} | {name} | {shape} | "
                       f"`{s.named_shape}` | {notes} |")
        if self.attention:
            out += ["", "**Attention backends**", ""]
            for r in self.attention:
                out.append(f"- `{r.path or '(root)'}` ({r.kind}): {r.ran}, {r.memory} memory "
                           f"— {r.verdict}")
        return "\n".join(out) + "\n"

    def to_json(self, indent: int | None = 2) -> str:
        """``{"module", "steps": [...], "attention": [...]}`` as JSON."""
        return json.dumps({"module": self._root.module,
                           "steps": [s.to_dict() for s in self.steps],
                           "attention": [r.to_dict() for r in self.attention]}, indent=indent)


# -------------------------------------------------------------------------------- recording
def trace(module: nn.Module, *args: Any, **kwargs: Any) -> Trace:
    """Run ``module(*args, **kwargs)`` once and record every step with named-axis shapes.

    The forward pass is the real one (same outputs, same kernels: tracing only reads shapes
    and, for a fused kernel, asks torch which kernel it picks). Gradient mode, train/eval mode
    and devices are left as the caller set them.

    Returns:
        a :class:`Trace`; ``trace.output`` is what the module returned.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"trace expects a torch.nn.Module, got {type(module).__name__}")
    rec = _Recorder(module)
    handles = []
    try:
        for path, sub in rec.hooked():
            handles.append(sub.register_forward_pre_hook(rec.pre_hook(path), with_kwargs=True))
            handles.append(sub.register_forward_hook(rec.post_hook(path), with_kwargs=True))
        rec.enter_root(module, args, kwargs)
        with recording(rec.record):
            output = module(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    rec.exit_root(module, output)
    return Trace(rec.root, rec.steps, rec.runs, output)


_TOKEN_PATTERN = re.compile(r"\([^)]*\)|\S+")


class _Recorder:
    def __init__(self, root: nn.Module):
        self.root_module = root
        self.root = _Node("", type(root).__name__, type(root).__name__)
        self.root.label = _describe(root)
        self.stack: list[_Node] = [self.root]
        self.modules: list[nn.Module] = [root]
        self.steps: list[Step] = []
        self.runs: list[AttentionRun] = []
        self.features = _feature_names(root)

    def hooked(self) -> Iterator[tuple[str, nn.Module]]:
        """Every submodule except the inside of an attention module (its projections are
        recorded as steps by the attention code itself)."""
        if isinstance(self.root_module, MultiHeadAttention):
            return
        skip: list[str] = []
        for path, sub in self.root_module.named_modules():
            if not path or any(path.startswith(s + ".") for s in skip):
                continue
            if isinstance(sub, MultiHeadAttention):
                skip.append(path)
            yield path, sub

    # ------------------------------------------------------------------ hooks
    def pre_hook(self, path: str):
        def hook(module, args, kwargs):
            parent = self.stack[-1]
            rel = path[len(parent.path) + 1:] if parent.path else path
            node = _Node(path, f"{rel}: {_describe(module)}", type(module).__name__)
            parent.children.append(node)
            self.stack.append(node)
            self.modules.append(module)
            if isinstance(module, MultiHeadAttention):
                self._attention_inputs(module, node, args, kwargs)
        return hook

    def post_hook(self, path: str):
        def hook(module, args, kwargs, output):
            node = self.stack.pop()
            self.modules.pop()
            parent = self.stack[-1]
            if isinstance(module, nn.Dropout) and (not module.training or module.p == 0):
                _remove(parent.children, node)  # the identity: nothing to see
                return
            tensor = _first_tensor(output)
            if node.last is not None and isinstance(node.last[0], Step) \
                    and node.last[1] is tensor and tensor is not None \
                    and not isinstance(module, MultiHeadAttention):
                _remove(node.children, node.last[0])  # e.g. "block output": the header says it
                node.notes = _join(node.notes, f"= {node.last[0].name}")
            node.last = None
            if tensor is not None:
                step = self._step("output", tensor, self._module_axes(tensor, module), {},
                                  kind="module", node=node, module=module)
                node.output = step
                self.steps.append(step)
            parent.last = (node, tensor)
        return hook

    def enter_root(self, module: nn.Module, args, kwargs) -> None:
        """The root's tensor arguments, named after the forward signature's parameters."""
        if isinstance(module, MultiHeadAttention):
            self._attention_inputs(module, self.root, args, kwargs)
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            items = list(bound.arguments.items())
        except (TypeError, ValueError):
            items = [(f"arg{n}", a) for n, a in enumerate(args)] + list(kwargs.items())
        for name, value in items:
            if not isinstance(value, torch.Tensor):
                continue
            if isinstance(module, MultiHeadAttention) and name in ("query", "key", "value"):
                continue  # recorded by the module itself and by _attention_inputs
            axes = _argument_axes(name, value, self.features)
            step = self._step(f"input {name}", value, axes, {}, kind="input", node=self.root,
                              module=module)
            self.root.children.append(step)
            self.steps.append(step)

    def exit_root(self, module: nn.Module, output: Any) -> None:
        tensor = _first_tensor(output)
        if tensor is not None:
            step = self._step("output", tensor, self._module_axes(tensor, module), {}, kind="module",
                              node=self.root, module=module)
            self.root.output = step
            self.steps.append(step)

    def record(self, name: str, tensor: torch.Tensor | None, axes: str, **info: Any) -> None:
        node, module = self.stack[-1], self.modules[-1]
        names = self._attention_axes(name, _parse_axes(axes), module)
        if name == "fused attention":
            self._add(self._logical_scores(node, module, info))
        step = self._step(name, tensor, names, {k: _text(v) for k, v in info.items()},
                          node=node, module=module)
        if name == "split heads q":
            node.q_shape = step.shape
        elif name in ("split heads k", "kv cache"):
            node.k_shape = step.shape
        if name.startswith("split heads"):
            step = _grouped_split(step, module)
        last = node.last
        if last is not None and isinstance(last[0], _Node) and tensor is not None \
                and last[1] is tensor:  # names a submodule's output: say so on its line
            last[0].notes = _join(last[0].notes, f"= {name}")
            self.steps.append(step)
            return
        self._add(step)
        node.last = (step, tensor)
        if name in ("weighted sum", "fused attention"):
            self._add_run(node, module, step)

    # ------------------------------------------------------------------ helpers
    def _add(self, step: Step) -> None:
        children = self.stack[-1].children
        if step.name == "input":  # the query input goes before a cross-attention's key/value
            firsts = [n for n, c in enumerate(children) if isinstance(c, Step)
                      and c.name in ("key input", "value input", "key/value input",
                                     "input valid_lens", "input mask")]
            if firsts:
                after = children[firsts[0]]
                children.insert(firsts[0], step)
                self.steps.insert(next(n for n, s in enumerate(self.steps) if s is after), step)
                return
        children.append(step)
        self.steps.append(step)

    def _step(self, name, tensor, axes, info, *, kind="step", node, module,
              materialised=True) -> Step:
        shape = None if tensor is None else tuple(tensor.shape)
        return Step(name, node.path, type(module).__name__, shape, tuple(axes), info,
                    materialised, kind)

    def _attention_inputs(self, module: MultiHeadAttention, node: _Node, args, kwargs) -> None:
        """Say what kind of attention this call is, and record a cross-attention's key/value
        inputs (the query input is recorded by the module itself)."""
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        except TypeError:
            bound = {}
        query, key, value = bound.get("query"), bound.get("key"), bound.get("value")
        cross = key is not None and key is not query
        node.notes = "cross-attention" if cross else "self-attention"
        node.kind = "cross" if cross else "self"
        extras = []
        if bound.get("causal"):
            extras.append("causal")
        mask = bound.get("mask")
        if isinstance(mask, torch.Tensor):
            extras.append(f"mask {_mask_description(mask)}")
        if bound.get("valid_lens") is not None:
            extras.append("valid_lens (key padding)")
        if bound.get("return_weights"):
            extras.append("weights requested")
        if extras:
            node.notes += ", " + ", ".join(extras)
        if cross:
            shared = value is None or value is key
            for name, t, feat in (("key/value input" if shared else "key input", key,
                                   module.kdim), ("value input", value, module.vdim)):
                if t is None or (name == "value input" and shared):
                    continue
                axes = ("b", "j", "m" if feat == module.embed_dim else
                        ("kdim" if name == "key input" else "vdim"))
                self._add(self._step(name, t, axes, {}, node=node, module=module))

    def _attention_axes(self, name: str, axes: list[str], module: nn.Module) -> list[str]:
        """Name the position axis of a projection after its role (queries ``i``, keys and
        values ``j``), and call key/value heads ``h`` when every query head has its own."""
        if name in ("k projection", "v projection"):
            axes = ["j" if a == "n" else a for a in axes]
        elif name in ("q projection", "merge heads"):
            axes = ["i" if a == "n" else a for a in axes]
        if name == "logits":
            axes = ["vocab" if a == "v" else a for a in axes]
        h = getattr(module, "num_heads", None)
        g = getattr(module, "num_kv_heads", h)
        if h is not None and g == h:
            axes = [a.replace("g", "h") if a in ("g", "(g d)") else a for a in axes]
        return axes

    def _logical_scores(self, node: _Node, module: nn.Module, info: dict) -> Step:
        """The ``(b, h, i, j)`` scores a fused kernel computes without returning them."""
        q, k = node.q_shape, node.k_shape
        shape = (q[0], q[1], q[2], k[2]) if q and k else None
        kernel = str(info.get("backend", "sdpa"))
        where = ("computed block by block inside " + kernel + ", never stored"
                 if info.get("memory") == "O(n)" else
                 "built inside " + kernel + " and discarded, not returned")
        return Step("scores", node.path, type(module).__name__, shape, ("b", "h", "i", "j"),
                    {"note": f"logical shape of q k^T; {where}"}, materialised=False)

    def _add_run(self, node: _Node, module: nn.Module, step: Step) -> None:
        ran = step.info.get("backend", "?")
        memory = step.info.get("memory", "?")
        self.runs.append(AttentionRun(
            path=node.path, kind=getattr(node, "kind", "self"),
            backend=str(getattr(module, "backend", "?")), ran=ran, memory=memory,
            fused=ran.startswith("sdpa[") and memory == "O(n)",
            reason=step.info.get("reason", "")))

    def _module_axes(self, tensor: torch.Tensor, module: nn.Module) -> tuple[str, ...]:
        role = "query" if isinstance(module, MultiHeadAttention) else ""
        return _argument_axes(role, tensor, self.features)


# ------------------------------------------------------------------------------- formatting
def _render_node(node: _Node, depth: int, rows: list, full: bool) -> None:
    indent = "  " * depth
    shape = node.output.named_shape if node.output is not None else ""
    notes = node.notes
    rows.append((indent + node.label, shape, notes))
    children = node.children
    n = 0
    while n < len(children):
        child = children[n]
        if isinstance(child, Step):
            label = child.name if child.materialised else f"{child.name} (not materialised)"
            rows.append(("  " * (depth + 1) + label, child.named_shape, _notes(child)))
            n += 1
            continue
        _render_node(child, depth + 1, rows, full)
        run = 1
        if not full:
            sig = _signature(child)
            while (n + run < len(children) and isinstance(children[n + run], _Node)
                   and _signature(children[n + run]) == sig):
                run += 1
        if run > 1:
            last = children[n + run - 1]
            span = _short(last) if run == 2 else f"{_short(children[n + 1])} … {_short(last)}"
            rows.append(("  " * (depth + 1) + span,
                         "", f"{run - 1} more {child.module}, same steps and shapes as "
                             f"{_short(child)}"))
        n += run


def _short(node: _Node) -> str:
    return node.label.split(":", 1)[0]


def _signature(node: _Node) -> tuple:
    """What a block looks like with its own index removed: equal signatures render once."""
    parts = []
    for c in node.children:
        if isinstance(c, Step):
            parts.append((c.name, c.shape, c.axes, tuple(sorted(c.info.items())),
                          c.materialised))
        else:
            parts.append(_signature(c))
    out = node.output.shape if node.output is not None else None
    return (node.module, re.sub(r"^[^:]*:", "", node.label), node.notes, out, tuple(parts))


_NOTE_KEYS = ("pattern", "note", "kind", "p", "backend", "memory", "reason", "mask", "causal")


def _notes(step: Step) -> str:
    info = dict(step.info)
    parts = []
    if "pattern" in info:
        parts.append(info.pop("pattern"))
    if "note" in info:
        parts.append(info.pop("note"))
    if "kind" in info:
        parts.append(info.pop("kind"))
    if "p" in info:
        parts.append(f"p={info.pop('p')}")
    if "backend" in info:
        backend, memory = info.pop("backend"), info.pop("memory", "?")
        reason = info.pop("reason", "")
        parts.append(f"{backend}, {memory} memory" + (f" ({reason})" if reason else ""))
    if "mask" in info:
        parts.append(f"mask: {info.pop('mask')}")
    if "causal" in info:
        parts.append(f"causal: {info.pop('causal')}")
    parts += [f"{k}={v}" for k, v in info.items()]
    return "; ".join(parts)


def _remove(items: list, item: Any) -> None:
    """Remove ``item`` itself (not an equal one: a block may run the same module twice)."""
    del items[next(n for n, x in enumerate(items) if x is item)]


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _grouped_split(step: Step, module: nn.Module) -> Step:
    """Grouped-query attention: key/value heads are split ``g`` ways, each serving ``h // g``
    query heads."""
    h = getattr(module, "num_heads", None)
    g = getattr(module, "num_kv_heads", h)
    if h is None or g == h or step.name in ("split heads q", "kv cache"):
        return step
    info = dict(step.info)
    if "pattern" in info:
        info["pattern"] = info["pattern"].replace("h", "g")
    info["note"] = (f"1 key/value head shared by all {h} query heads (multi-query)" if g == 1
                    else f"{g} key/value heads, each shared by {h // g} query heads")
    return Step(step.name, step.path, step.module, step.shape, step.axes, info,
                step.materialised, step.kind)


def _text(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _parse_axes(axes: str) -> list[str]:
    return _TOKEN_PATTERN.findall(axes or "")


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for o in output:
            t = _first_tensor(o)
            if t is not None:
                return t
    if isinstance(output, dict):
        for o in output.values():
            t = _first_tensor(o)
            if t is not None:
                return t
    for name in ("logits", "last_hidden_state", "output"):  # dataclass-style outputs
        t = getattr(output, name, None)
        if isinstance(t, torch.Tensor):
            return t
    return None


def _feature_names(root: nn.Module) -> dict[int, str]:
    """Feature sizes the model uses, named: model dim ``m``, ``vocab``, ``ff`` width."""
    names: dict[int, str] = {}
    subs = list(root.modules())
    for sub in subs:
        if isinstance(sub, MultiHeadAttention):
            names.setdefault(sub.embed_dim, "m")
            names.setdefault(sub.out_dim, "m")
    for sub in subs:
        if isinstance(sub, nn.Embedding):
            names.setdefault(sub.embedding_dim, "m")
        q_heads = getattr(sub, "q_heads", None)  # PerHeadAttention
        if isinstance(q_heads, nn.ModuleList) and len(q_heads):
            names.setdefault(q_heads[0].in_features, "m")
            names.setdefault(sub.out_proj.out_features, "m")
    for sub in subs:
        if isinstance(sub, nn.Embedding):
            names.setdefault(sub.num_embeddings, "vocab")
    for sub in subs:
        up = getattr(sub, "up", None)
        if isinstance(up, nn.Linear):
            names.setdefault(up.out_features, "ff")
    return names


def _argument_axes(name: str, t: torch.Tensor, features: dict[int, str]) -> tuple[str, ...]:
    if name in ("attention_mask", "padding_mask", "key_padding_mask") and t.dim() == 2:
        return ("b", "n")  # one flag per token (Hugging Face style)
    if "mask" in name and t.dim() >= 2:
        return ("b", "h", "i", "j")[-t.dim():] if t.dim() <= 4 else ()
    if not t.is_floating_point():
        return {1: ("b",), 2: ("b", "n")}.get(t.dim(), ())
    if name in ("key", "value", "memory"):
        pos = "j"
    elif name == "query":
        pos = "i"
    else:
        pos = "n"
    if t.dim() == 3:
        feat = features.get(t.shape[-1], "f")
        if name == "key" and feat != "m":
            feat = "kdim"
        elif name == "value" and feat != "m":
            feat = "vdim"
        return ("b", pos, feat)
    if t.dim() == 2:
        return ("b", features.get(t.shape[-1], "f"))
    if t.dim() == 4:
        return ("b", "h", "i", "j")
    return ()


def _mask_description(mask: torch.Tensor) -> str:
    form = "bool" if mask.dtype == torch.bool else "float"
    shape = named_shape(tuple(mask.shape), ("b", "h", "i", "j")[-mask.dim():]
                        if mask.dim() <= 4 else ())
    what = ""
    if mask.dim() >= 2 and mask.shape[-2] == 1:
        what = " = key padding"
    elif mask.dim() >= 2 and mask.dtype == torch.bool and mask.shape[-1] == mask.shape[-2] \
            and torch.equal(mask, mask.tril()):
        what = " = causal"
    return f"{form} {shape}{what}"


def _describe(module: nn.Module) -> str:
    """A short constructor-like label: ``Embedding(33300, 512)``, ``LayerNorm(512)``."""
    name = type(module).__name__
    if isinstance(module, MultiHeadAttention):
        parts = [f"m={module.embed_dim}", f"h={module.num_heads}", f"d={module.head_dim}"]
        if module.num_kv_heads != module.num_heads:
            parts.insert(2, f"g={module.num_kv_heads}")
        if module.kdim != module.embed_dim:
            parts.append(f"kdim={module.kdim}")
        if module.vdim != module.kdim:
            parts.append(f"vdim={module.vdim}")
        if module.out_dim != module.embed_dim:
            parts.append(f"out={module.out_dim}")
        parts.append(f"backend={module.backend}")
        return f"{name}({', '.join(parts)})"
    if isinstance(module, nn.Linear):
        return f"{name}({module.in_features}, {module.out_features})"
    if isinstance(module, nn.Embedding):
        return f"{name}({module.num_embeddings}, {module.embedding_dim})"
    if isinstance(module, nn.LayerNorm):
        return f"{name}({', '.join(str(s) for s in module.normalized_shape)})"
    if isinstance(module, nn.Dropout):
        return f"{name}(p={module.p})"
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "d_model"):  # a model: its sizes, named
        fields = (("vocab_size", "vocab"), ("src_vocab_size", "src_vocab"),
                  ("tgt_vocab_size", "tgt_vocab"), ("d_model", "m"), ("num_heads", "h"),
                  ("num_kv_heads", "g"), ("head_dim", "d"), ("num_layers", "layers"),
                  ("d_ff", "ff"))
        parts = [f"{short}={getattr(config, f)}" for f, short in fields
                 if getattr(config, f, None) is not None]
        return f"{name}({', '.join(parts)})"
    extra = re.sub(r"(^|, )d_model=\d+(, )?", r"\1", module.extra_repr()).strip(", ")
    return f"{name}({extra})" if extra and len(extra) <= 40 else name
