"""The hooks one filter installs on a model, and what they keep or edit, forward by forward.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position, ``j``
key position, ``d`` head dim, ``m`` model dim.

Only what the filter names is installed: module hooks on the blocks, the attention layers,
their projections and MLPs; the observer channel (:mod:`headwise.observe`) for each head's
output ``hook_z`` (before the output projection, where :func:`headwise.ablate` edits it) and
for the scores' q and k; and, for patterns, a weights selection on the chosen layers only, so
every other layer runs the fused kernel with no weights (headwise's language model:
``return_weights`` of those layers; a transformers model: :func:`headwise.hf.weights`).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch

from headwise import masks, observe
from headwise.finders import transformers_model
from headwise.lens import names as N
from headwise.lens import sites
from headwise.weights import Selection, mask_scores, take
from headwise.weights.select import kv_heads

__all__ = ["HookPoint", "Stop", "installed"]


class Stop(Exception):
    """Raised by the block after the last one a run needs (TransformerLens' stop_at_layer)."""


@dataclass(frozen=True)
class HookPoint:
    """What a TransformerLens hook function gets as ``hook``: its ``name``, and ``layer()``."""

    name: str

    def layer(self) -> int:
        return N.layer_of(self.name)


class Hooks:
    """The state of one installed filter: ``steps`` gets one ``{name: tensor}`` per forward
    (each starting at the first block); ``edits`` maps a name to its functions."""

    def __init__(self, model, layers: list[sites.Layer], wanted: list[str], edits: dict,
                 selection: Selection | None, stop: int | None):
        self.model, self.layers, self.edits, self.selection = model, layers, edits, selection
        self.wanted = set(wanted)
        self.stop = stop
        self.steps: list[dict[str, torch.Tensor]] = []
        self.by_module = {id(layer.attn): layer for layer in layers}
        self.pending: dict[int, torch.Tensor] = {}  # layer -> its edited hook_result
        touched = self.wanted | set(edits)
        self.need = {layer.index: {N.short_of(n) for n in touched if N.layer_of(n) == layer.index}
                     for layer in layers}

    # ---- keeping and editing one activation
    def point(self, layer: int, short: str, x: torch.Tensor) -> torch.Tensor:
        name = N.full(short, layer)
        for fn in self.edits.get(name, ()):
            got = fn(x, hook=HookPoint(name))
            x = x if got is None else got
        if name in self.wanted:
            self.steps[-1][name] = x.detach()
        return x

    # ---- module hooks
    def block_pre(self, layer: sites.Layer):
        def hook(module, args, kwargs):
            if layer.index == 0:
                self.steps.append({})
            if self.stop is not None and layer.index == self.stop:
                raise Stop
            if "resid_pre" not in self.need[layer.index]:
                return None
            return _with_input(args, kwargs, self.point(layer.index, "resid_pre",
                                                        _input(args, kwargs)))
        return hook

    def block_post(self, layer: sites.Layer):
        def hook(module, args, out):
            return _with_first(out, self.point(layer.index, "resid_post", _first(out)))
        return hook

    def attn_post(self, layer: sites.Layer):
        need = self.need[layer.index]

        def hook(module, args, kwargs, out):
            if "pattern" in need and isinstance(out, tuple) and len(out) > 1:
                self.point(layer.index, "pattern", out[1])
            if "attn_out" in need:
                return _with_first(out, self.point(layer.index, "attn_out", _first(out)))
            return None
        return hook

    def attn_pre(self, layer: sites.Layer):
        need = self.need[layer.index]

        def hook(module, args, kwargs):
            if need & {"q", "k", "v"} and not sites.qkv_sites(layer):
                for short, x in sites.project(layer, _input(args, kwargs, "query")).items():
                    self.point(layer.index, short, x)
            if "pattern" in need and not transformers_model(self.model):
                return args, {**kwargs, "return_weights": self.selection or True}
            return None
        return hook

    def projection(self, layer: sites.Layer, which: str):
        def hook(module, args, out):
            for short, x in sites.split_qkv(layer, which, out).items():
                if short in self.need[layer.index]:
                    self.point(layer.index, short, x)
        return hook

    def module_post(self, layer: sites.Layer, short: str):
        def hook(module, args, out):
            return _with_first(out, self.point(layer.index, short, _first(out)))
        return hook

    def mid_pre(self, layer: sites.Layer):
        def hook(module, args, kwargs):
            self.point(layer.index, "resid_mid", _input(args, kwargs))
        return hook

    def out_post(self, layer: sites.Layer):
        def hook(module, args, out):
            edited = self.pending.pop(layer.index, None)
            if edited is None:
                return None
            bias = getattr(module, "bias", None)
            total = edited.sum(2)
            return total if bias is None else total + bias
        return hook

    # ---- the observer channel
    def heads(self, module, out: torch.Tensor) -> torch.Tensor:
        layer = self.by_module.get(id(module))
        if layer is None or not self.need[layer.index] & {"z", "result"}:
            return out
        z = self.point(layer.index, "z", out.transpose(1, 2))  # (b, i, h, d)
        if "result" in self.need[layer.index]:
            w = sites.result_weight(layer)
            result = torch.einsum("bihd,mhd->bihm", z, w.to(z.dtype))
            edited = self.point(layer.index, "result", result)
            if N.full("result", layer.index) in self.edits:
                self.pending[layer.index] = edited
        return z.transpose(1, 2)

    def attention(self, module, q, k, mask, causal, scale, self_attention) -> None:
        layer = self.by_module.get(id(module))
        if layer is not None and "attn_scores" in self.need[layer.index]:
            self.point(layer.index, "attn_scores", scores(q, k, mask, causal, scale,
                                                          self.selection))


def scores(q, k, mask, causal, scale, selection: Selection | None) -> torch.Tensor:
    """``(b, hs, is, js)``: ``q.k * scale`` of the selected heads, rows and keys, masked keys
    ``-inf`` (an additive mask added), from what the attention call got."""
    h, nq, g, nk = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    heads, rows, keys = (selection or Selection()).resolve(h, nq, nk, q.device)
    qs = take(take(q, 1, heads), 2, rows)
    ks = take(take(k, 1, kv_heads(heads, h, g, q.device)), 2, keys)
    s = torch.matmul(qs, ks.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None
                                                   else scale)
    mask_scores(s, None if mask is None else masks.as_4d(mask), causal, heads, rows, keys, nq, nk)
    return s


def _input(args, kwargs, name: str = "hidden_states") -> torch.Tensor:
    return args[0] if args else kwargs[name]


def _with_input(args, kwargs, x):
    if args:
        return (x, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": x}


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _with_first(out, x):
    if isinstance(out, tuple):
        return None if x is out[0] else (x, *out[1:])
    return None if x is out else x


@contextmanager
def installed(model, layers: list[sites.Layer], wanted: list[str], *, edits=None,
              selection: Selection | None = None, stop: int | None = None):
    """Install the hooks ``wanted`` and ``edits`` need on ``model``; yields the :class:`Hooks`
    (its ``steps`` fill as the model runs); removes every one on exit."""
    state = Hooks(model, layers, wanted, edits or {}, selection, stop)
    with ExitStack() as stack:
        add = lambda handle: stack.callback(handle.remove)  # noqa: E731
        for layer in layers:
            _install_layer(state, layer, add)
        shorts = set().union(*state.need.values())
        if shorts & {"z", "result", "attn_scores"}:  # the channel only when a hook reads it
            stack.enter_context(observe.observing(observe.Observer(
                heads=state.heads if shorts & {"z", "result"} else None,
                attention=state.attention if "attn_scores" in shorts else None)))
        pattern = sorted(n for n, need in state.need.items() if "pattern" in need)
        if pattern and transformers_model(model):
            from headwise.hf.select import weights
            sel = selection or Selection()
            stack.enter_context(weights(model, {"layers": pattern, "heads": sel.heads,
                                                "rows": sel.rows, "keys": sel.keys}))
        yield state


def _install_layer(state: Hooks, layer: sites.Layer, add) -> None:
    need = state.need[layer.index]
    add(layer.block.register_forward_pre_hook(state.block_pre(layer), with_kwargs=True))
    add(layer.block.register_forward_hook(state.block_post(layer)))  # (also: no buffer reuse)
    if need & {"pattern", "attn_out", "q", "k", "v"}:
        add(layer.attn.register_forward_pre_hook(state.attn_pre(layer), with_kwargs=True))
        add(layer.attn.register_forward_hook(state.attn_post(layer), with_kwargs=True))
    if need & {"q", "k", "v"}:
        for module, which in sites.qkv_sites(layer):
            add(module.register_forward_hook(state.projection(layer, which)))
    if "mlp_out" in need:
        add(layer.need("mlp", "hook_mlp_out").register_forward_hook(
            state.module_post(layer, "mlp_out")))
    if "resid_mid" in need:
        add(layer.need("mid", "hook_resid_mid").register_forward_pre_hook(
            state.mid_pre(layer), with_kwargs=True))
    if "result" in need:
        add(layer.need("out", "hook_result").register_forward_hook(state.out_post(layer)))
