"""Where each hook of a model lives: its blocks, their attention, MLP and norms, and the
projections a head's q / k / v / output come from, for headwise's language model and for a
transformers decoder on ``attn_implementation="headwise"``.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value heads, ``i`` query position, ``d``
head dim, ``m`` model dim.

A transformers block is the parent of its attention layer; its MLP is the child named ``mlp``
(``feed_forward``), and the residual between attention and MLP is the input of the norm before
the MLP (``pre_feedforward_layernorm``, ``post_attention_layernorm``, ``ln_2``). A headwise block
names them ``ff`` and ``ff_norm`` (post-norm blocks: the feed-forward's own input).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from headwise.layers import MultiHeadAttention
from headwise.models.heads import attention_layers, head_count

__all__ = ["Layer", "layers_of", "project", "qkv_sites", "result_weight", "split_qkv"]

_MLP = ("mlp", "feed_forward", "ff")
_MID = ("pre_feedforward_layernorm", "post_attention_layernorm", "ln_2", "ff_norm")
_QKV = ("q_proj", "k_proj", "v_proj")
_OUT = ("o_proj", "out_proj", "c_proj", "dense")


@dataclass(frozen=True)
class Layer:
    """One block's hook sites. ``mid``: the module whose input is the residual between
    attention and MLP (None: the block has none found); ``heads``, ``kv_heads``: query and
    key/value heads."""

    index: int
    block: nn.Module
    attn: nn.Module
    mlp: nn.Module | None
    mid: nn.Module | None
    out: nn.Module | None
    heads: int
    kv_heads: int

    def need(self, what: str, name: str) -> nn.Module:
        module = getattr(self, what)
        if module is None:
            raise ValueError(f"run_with_cache: cannot find {name} in {type(self.block).__name__} "
                             f"(layer {self.index}): its {what} module is none of "
                             f"{_MLP if what == 'mlp' else _MID if what == 'mid' else _OUT}")
        return module


def layers_of(model: nn.Module, where: str = "run_with_cache") -> list[Layer]:
    """The hook sites of every layer of ``model``: a headwise :class:`TransformerLM` or a
    transformers decoder running ``attn_implementation="headwise"``."""
    found = attention_layers(model)
    if set(found) not in ({"layers"}, {"decoder_self"}):
        raise TypeError(f"{where}: expected a language model (a headwise TransformerLM or a "
                        f"transformers decoder), got {type(model).__name__} with attention kinds "
                        f"{sorted(found)}")
    attns = next(iter(found.values()))
    parents = {id(child): parent for parent in model.modules() for child in parent.children()}
    return [_layer(n, parents[id(a)], a) for n, a in enumerate(attns)]


def _layer(n: int, block: nn.Module, attn: nn.Module) -> Layer:
    if isinstance(attn, MultiHeadAttention):
        mid = block.ff_norm if block.norm_first else block.ff
        return Layer(n, block, attn, block.ff, mid, attn.out_proj, attn.num_heads,
                     attn.num_kv_heads)
    child = dict(block.named_children())
    pick = lambda names, owner=child: next((owner[x] for x in names if x in owner), None)  # noqa: E731
    h = head_count(attn)
    config = getattr(attn, "config", None)
    g = getattr(attn, "num_key_value_heads", None) or getattr(config, "num_key_value_heads",
                                                              None) or h
    return Layer(n, block, attn, pick(_MLP), pick(_MID), pick(_OUT, dict(attn.named_children())),
                 h, g)


def qkv_sites(layer: Layer) -> list[tuple[nn.Module, str]]:
    """``[(module, "q" | "k" | "v" | "qkv")]``: the modules whose outputs are the layer's q / k /
    v projections (GPT-2: one ``c_attn``, q | k | v); ``[]`` for headwise's attention, which
    runs its three as one product (:func:`project` takes them again from its input)."""
    attn = layer.attn
    if isinstance(attn, MultiHeadAttention):
        return []
    if all(hasattr(attn, p) for p in _QKV):
        return [(getattr(attn, p), p[0]) for p in _QKV]
    if hasattr(attn, "c_attn"):
        return [(attn.c_attn, "qkv")]
    raise ValueError(f"run_with_cache: cannot find the q/k/v projections of "
                     f"{type(attn).__name__} (layer {layer.index}): none of {_QKV}, c_attn")


def split_qkv(layer: Layer, which: str, out: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{"q": (b, i, h, d), "k"/"v": (b, i, g, d)}`` from one projection's output
    ``(b, i, (h|g) d)`` (``which="qkv"``: the three side by side)."""
    parts = out.chunk(len(which), dim=-1) if len(which) > 1 else (out,)
    heads = {"q": layer.heads, "k": layer.kv_heads, "v": layer.kv_heads}
    return {s: o.unflatten(-1, (heads[s], -1)) for s, o in zip(which, parts, strict=True)}


def project(layer: Layer, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """q, k and v (:func:`split_qkv`) of headwise's attention input ``x (b, i, m)`` by its own
    projections, before rotary positions: its forward runs the three as one product, so they
    are taken again here (only when a hook asks for them)."""
    attn = layer.attn
    got = {}
    for s, m in zip("qkv", (attn.q_proj, attn.k_proj, attn.v_proj), strict=True):
        got |= split_qkv(layer, s, F.linear(x, m.weight, m.bias))
    return got


def result_weight(layer: Layer) -> torch.Tensor:
    """``(m, h, d)``: the output projection split per head, so a head's share of the output is
    ``einsum("bihd,mhd->bihm", z, W)`` (the bias, shared, left out as TransformerLens does)."""
    out = layer.need("out", "the output projection")
    w = out.weight
    if type(out).__name__ == "Conv1D":  # transformers' GPT-2 stores it (in, out)
        w = w.t()
    return w.unflatten(1, (layer.heads, -1))
