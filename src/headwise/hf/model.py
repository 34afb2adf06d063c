"""Which modules of a transformers model headwise serves, and switching a loaded model to it.

A module is an *attention layer* when its class's ``forward`` looks its attention function up
in transformers' ``ALL_ATTENTION_FUNCTIONS`` (the attention interface): only those calls reach
``attn_implementation="headwise"``. Layers are numbered in module order (for a decoder, the
order of its blocks; an encoder-decoder numbers self- and cross-attention as they appear).
"""

from __future__ import annotations

import functools
import inspect

from torch import nn

from headwise.finders import Finder, transformers_model

__all__ = ["FINDER", "NAME", "attention_layers", "context", "head_count", "kind", "kv_head_count",
           "running", "refuse_unmodelled", "unmodelled", "use"]

NAME = "headwise"  # the attn_implementation name


@functools.cache
def _calls_interface(cls: type) -> bool:
    forward = inspect.unwrap(cls.forward)
    code = getattr(forward, "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that call transformers' attention interface, in module order."""
    return [m for m in model.modules() if _calls_interface(type(m))]


def head_count(module: nn.Module) -> int:
    """The number of query heads ``h`` of one attention layer (HF names it differently per
    family: ``num_heads``, ``num_attention_heads``, or only on the config)."""
    for owner, name in ((module, "num_heads"), (module, "num_attention_heads"),
                        (getattr(module, "config", None), "num_attention_heads")):
        value = getattr(owner, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"headwise.hf: cannot tell how many heads {type(module).__name__} has "
                     "(no num_heads, num_attention_heads or config.num_attention_heads)")


def kv_head_count(module: nn.Module) -> int:
    """The key/value heads ``g`` of one attention layer: ``h`` divided by its
    ``num_key_value_groups`` (query heads per key/value head; 1 where the family has none)."""
    return head_count(module) // getattr(module, "num_key_value_groups", 1)


def context(model) -> int | None:
    """The most positions ``model`` reads (its config's ``max_position_embeddings``), or None
    where the config names no limit."""
    return getattr(model.config, "max_position_embeddings", None)


def kind(model: nn.Module) -> str:
    """The attention kind of ``model``'s layers in headwise's views (the head view, the
    catalogue): ``"decoder_self"`` when every layer is causal (a decoder), ``"encoder_self"``
    when none is; ValueError for a mix (an encoder-decoder)."""
    causal = {bool(getattr(m, "is_causal", False)) for m in attention_layers(model)}
    if len(causal) != 1:
        raise ValueError(f"headwise.hf: {type(model).__name__} mixes causal and non-causal "
                         "attention layers (an encoder-decoder); the head view and the catalogue "
                         "take a decoder or an encoder")
    return "decoder_self" if causal == {True} else "encoder_self"


def unmodelled(module: nn.Module) -> str | None:
    """Why head statistics cannot describe one attention layer (None: they can): its scores are
    soft-capped (Gemma 2) or its softmax has sinks (gpt-oss), which the statistics' softmax of
    ``q k^T`` does not model, so :func:`headwise.hf.interface.attention_forward` reports no
    call of it to statistics observers."""
    if getattr(module, "attn_logit_softcapping", None) is not None:
        return "soft-caps its attention scores"
    if getattr(module, "sinks", None) is not None:
        return "has attention sinks"
    return None


def refuse_unmodelled(model, layers, where: str, instead: str) -> None:
    """A ValueError naming the first of ``layers`` whose softmax head statistics do not model
    (:func:`unmodelled`): every statistic of it would be missing, so a tool built on them
    stops here instead, and says what to use ``instead``."""
    why = next(filter(None, map(unmodelled, layers)), None)
    if why:
        raise ValueError(f"{where}: {type(model).__name__} {why}, which head statistics do not "
                         f"model (every score would be empty); {instead}")


def running(model, where: str) -> list[nn.Module]:
    """``model``'s attention layers when it runs ``attn_implementation="headwise"`` (only then
    do its layers report to headwise's observers and weights selections), else a ValueError
    saying how to switch it."""
    layers = refuse_unless_served(model, where)
    implementation = model.config._attn_implementation
    if implementation != NAME:
        raise ValueError(f"{where}: the model runs attn_implementation={implementation!r}; "
                         f"call headwise.hf.use(model) first (or load it with "
                         f"attn_implementation={NAME!r}): only then do its heads report to "
                         "headwise")
    return layers


def refuse_unless_served(model, where: str) -> list[nn.Module]:
    """``model``'s attention layers, or a ValueError saying why headwise cannot serve it."""
    from transformers import PreTrainedModel  # the hf wing's one optional dependency

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"{where}: expected a transformers PreTrainedModel, got "
                        f"{type(model).__name__}")
    layers = attention_layers(model)
    if not layers or not model.is_backend_compatible():
        raise ValueError(
            f"{where}: {type(model).__name__} does not call transformers' attention interface "
            "(its attention is written inline, not looked up in ALL_ATTENTION_FUNCTIONS), so "
            "attn_implementation='headwise' cannot serve it; use a model class that supports "
            "attention backends (Llama, Qwen, Gemma, Mistral, GPT-2, BERT, ...)")
    return layers


def use(model):
    """Switch a loaded transformers model to ``attn_implementation="headwise"`` (every
    sub-model too) and return it. ValueError for a model whose attention does not go through
    the attention interface."""
    refuse_unless_served(model, "headwise.hf.use")
    model.set_attn_implementation(NAME)
    return model


# what the core asks of a transformers model (headwise.finders; registered by headwise.hf)
FINDER = Finder("transformers", owns=transformers_model, layers=running,
                owns_layer=lambda module: _calls_interface(type(module)), head_count=head_count)
