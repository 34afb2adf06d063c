"""Names for what the trace sees from outside: module labels, the axes of a module's arguments
and outputs (from the sizes the model declares), and the per-module axis rules of the table."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from headwise.layers import MultiHeadAttention
from headwise.tracing.steps import named_shape

__all__ = ["argument_axes", "describe", "feature_names", "first_tensor", "mask_description",
           "module_axes"]


def module_axes(axes: tuple[str, ...], module: nn.Module) -> tuple[str, ...]:
    """The table's axes for one module: key/value heads ``g`` are called ``h`` when every query
    head has its own, and the output size ``out`` is called ``m`` when it is the model dim."""
    h = getattr(module, "num_heads", None)
    g = getattr(module, "num_kv_heads", h)
    out, m = getattr(module, "out_dim", None), getattr(module, "embed_dim", None)
    renamed = []
    for a in axes:
        if h is not None and g == h and a in ("g", "(g d)"):
            a = a.replace("g", "h")
        if a == "out" and (out is None or out == m):
            a = "m"
        renamed.append(a)
    return tuple(renamed)


def first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for o in output:
            t = first_tensor(o)
            if t is not None:
                return t
    if isinstance(output, dict):
        for o in output.values():
            t = first_tensor(o)
            if t is not None:
                return t
    for name in ("logits", "last_hidden_state", "output"):  # dataclass-style outputs
        t = getattr(output, name, None)
        if isinstance(t, torch.Tensor):
            return t
    return None


def feature_names(root: nn.Module) -> dict[int, str]:
    """Feature sizes the model uses, named: model dim ``m``, attention output size ``out`` (when
    it differs from ``m``), ``vocab``, ``ff`` width."""
    names: dict[int, str] = {}
    subs = list(root.modules())
    for sub in subs:
        if isinstance(sub, MultiHeadAttention):
            names.setdefault(sub.embed_dim, "m")
    for sub in subs:
        if isinstance(sub, MultiHeadAttention):
            names.setdefault(sub.out_dim, "out")
        if isinstance(sub, nn.Embedding):
            names.setdefault(sub.embedding_dim, "m")
        q_heads = getattr(sub, "q_heads", None)  # PerHeadAttention
        if isinstance(q_heads, nn.ModuleList) and len(q_heads):
            names.setdefault(q_heads[0].in_features, "m")
            names.setdefault(sub.out_proj.out_features, "out")
    for sub in subs:
        if isinstance(sub, nn.Embedding):
            names.setdefault(sub.num_embeddings, "vocab")
    for sub in subs:
        up = getattr(sub, "up", None)
        if isinstance(up, nn.Linear):
            names.setdefault(up.out_features, "ff")
    return names


def argument_axes(name: str, t: torch.Tensor, features: dict[int, str]) -> tuple[str, ...]:
    """Axes of a tensor argument (or output, ``name=""``/``"query"``) by its role and size."""
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


def mask_description(mask: torch.Tensor) -> str:
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


_MODEL_FIELDS = (("vocab_size", "vocab"), ("src_vocab_size", "src_vocab"),
                 ("tgt_vocab_size", "tgt_vocab"), ("d_model", "m"), ("num_heads", "h"),
                 ("attention.num_kv_heads", "g"), ("attention.head_dim", "d"),
                 ("num_layers", "layers"), ("d_ff", "ff"))


def _field(config, path: str):
    """``config``'s field at a dotted ``path``, or None where it has none."""
    for name in path.split("."):
        config = getattr(config, name, None)
    return config


def describe(module: nn.Module) -> str:
    """A short constructor-like label: ``Embedding(33300, 512)``, ``LayerNorm(512)``."""
    name = type(module).__name__
    if isinstance(module, MultiHeadAttention):
        return f"{name}({', '.join(_attention_sizes(module))})"
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
        parts = [f"{short}={_field(config, f)}" for f, short in _MODEL_FIELDS
                 if _field(config, f) is not None]
        return f"{name}({', '.join(parts)})"
    extra = re.sub(r"(^|, )d_model=\d+(, )?", r"\1", module.extra_repr()).strip(", ")
    return f"{name}({extra})" if extra and len(extra) <= 40 else name


def _attention_sizes(module: MultiHeadAttention) -> list[str]:
    changed = module.changed_sizes()
    g = [f"g={changed.pop('num_kv_heads')}"] if "num_kv_heads" in changed else []
    named = {"out_dim": "out"}  # the trace's short names for the axis legend's m, h, g, d
    return ([f"m={module.embed_dim}", f"h={module.num_heads}", *g, f"d={module.head_dim}"]
            + [f"{named.get(name, name)}={size}" for name, size in changed.items()]
            + [f"backend={module.backend}"])
