"""Recording one forward pass: forward hooks for module outputs, and the structured records the
attention code sends through :func:`headwise.observe.record` for the inside of attention."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from headwise.layers import MultiHeadAttention
from headwise.observe import Role, StepKind, recording
from headwise.tracing.naming import (
    argument_axes,
    describe,
    feature_names,
    first_tensor,
    mask_description,
    module_axes,
)
from headwise.tracing.report import Trace
from headwise.tracing.steps import AttentionRun, Node, Step, fact, weights_source

__all__ = ["trace"]

_KEY_INPUTS = ("key input", "value input", "key/value input", "input valid_lens", "input mask")


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
    try:  # before any hook is attached: hw.trace(mha) alone has no input
        inspect.signature(module.forward).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"trace: {type(module).__name__}.forward cannot take these inputs ({e}); "
                        "pass its inputs after the module, e.g. hw.trace(mha, x)") from None
    except ValueError:  # no signature to read (a builtin forward): the call itself will tell
        pass
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


class _Recorder:
    def __init__(self, root: nn.Module):
        self.root_module = root
        self.root = Node("", describe(root), type(root).__name__)
        self.stack: list[Node] = [self.root]
        self.modules: list[nn.Module] = [root]
        self.steps: list[Step] = []
        self.runs: list[AttentionRun] = []
        self.features = feature_names(root)

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
            node = Node(path, f"{rel}: {describe(module)}", type(module).__name__)
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
            tensor = first_tensor(output)
            if node.last is not None and isinstance(node.last[0], Step) \
                    and node.last[1] is tensor and tensor is not None \
                    and not isinstance(module, MultiHeadAttention):
                _remove(node.children, node.last[0])  # e.g. "block output": the header says it
                node.notes = _join(node.notes, f"= {_label(node.last[0])}")
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
            axes = argument_axes(name, value, self.features)
            step = self._step(f"input {name}", value, axes, {}, kind="input", node=self.root,
                              module=module)
            self.root.children.append(step)
            self.steps.append(step)

    def exit_root(self, module: nn.Module, output: Any) -> None:
        tensor = first_tensor(output)
        if tensor is not None:
            step = self._step("output", tensor, self._module_axes(tensor, module), {},
                              kind="module", node=self.root, module=module)
            self.root.output = step
            self.steps.append(step)

    # ------------------------------------------------------------------ the structured records
    def record(self, kind: StepKind, tensor: torch.Tensor | None, **facts: Any) -> None:
        """One :func:`headwise.observe.record` call: dispatch on the table member's role."""
        node, module = self.stack[-1], self.modules[-1]
        info = {k: fact(v) for k, v in facts.items()}
        if kind.role is Role.FUSED_ATTENTION:
            self._add(self._logical_scores(node, module, info))
        if kind.role in (Role.KEYS, Role.VALUES):
            h = getattr(module, "num_heads", None)
            g = getattr(module, "num_kv_heads", h)
            if h is not None and g != h:  # grouped-query: split g ways
                info.update(kv_heads=g, query_heads=h)
        step = self._step(kind.value, tensor, module_axes(kind.axes, module), info,
                          node=node, module=module)
        if kind.role is Role.QUERIES:
            node.q_shape = step.shape
        elif kind.role in (Role.KEYS, Role.CACHED_KEYS):
            node.k_shape = step.shape
        last = node.last
        if last is not None and isinstance(last[0], Node) and tensor is not None \
                and last[1] is tensor:  # names a submodule's output: say so on its line
            last[0].notes = _join(last[0].notes, f"= {kind.label}")
            self.steps.append(step)
            return
        self._add(step)
        node.last = (step, tensor)
        if kind.role in (Role.ATTENTION, Role.FUSED_ATTENTION):
            self._add_run(node, module, info)

    # ------------------------------------------------------------------ helpers
    def _add(self, step: Step) -> None:
        children = self.stack[-1].children
        if step.name == StepKind.INPUT:  # the query input goes before a cross-attention's k/v
            firsts = [n for n, c in enumerate(children)
                      if isinstance(c, Step) and c.name in _KEY_INPUTS]
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

    def _attention_inputs(self, module: MultiHeadAttention, node: Node, args, kwargs) -> None:
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
            extras.append(f"mask {mask_description(mask)}")
        if bound.get("valid_lens") is not None:
            extras.append("valid_lens (key padding)")
        if bound.get("return_weights"):
            extras.append("weights requested")
        if extras:
            node.notes += ", " + ", ".join(extras)
        if cross:
            self._cross_inputs(module, node, key, value)

    def _cross_inputs(self, module: MultiHeadAttention, node: Node, key, value) -> None:
        shared = value is None or value is key
        for name, t, feat in (("key/value input" if shared else "key input", key,
                               module.kdim), ("value input", value, module.vdim)):
            if t is None or (name == "value input" and shared):
                continue
            axes = ("b", "j", "m" if feat == module.embed_dim else
                    ("kdim" if name == "key input" else "vdim"))
            self._add(self._step(name, t, axes, {}, node=node, module=module))

    def _logical_scores(self, node: Node, module: nn.Module, info: dict) -> Step:
        """The ``(b, h, i, j)`` scores a fused kernel computes without returning them."""
        q, k = node.q_shape, node.k_shape
        shape = (q[0], q[1], q[2], k[2]) if q and k else None
        facts = {key: info.get(key) for key in ("backend", "kernel", "memory")}
        return Step(StepKind.SCORES.value, node.path, type(module).__name__, shape,
                    ("b", "h", "i", "j"), facts, materialised=False)

    def _add_run(self, node: Node, module: nn.Module, info: dict) -> None:
        self.runs.append(AttentionRun(
            path=node.path, kind=node.kind or "self",
            backend=str(getattr(module, "backend", "?")),
            ran_backend=str(info.get("backend", "?")), kernel=info.get("kernel"),
            memory=str(info.get("memory", "?")), fused=bool(info.get("fused")),
            reason=str(info.get("reason", "")), weights=weights_source(info)))

    def _module_axes(self, tensor: torch.Tensor, module: nn.Module) -> tuple[str, ...]:
        role = "query" if isinstance(module, MultiHeadAttention) else ""
        return argument_axes(role, tensor, self.features)


def _label(step: Step) -> str:
    try:
        return StepKind(step.name).label
    except ValueError:
        return step.name


def _remove(items: list, item: Any) -> None:
    """Remove ``item`` itself (not an equal one: a block may run the same module twice)."""
    del items[next(n for n, x in enumerate(items) if x is item)]


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
