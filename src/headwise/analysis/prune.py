"""Physical head pruning: cut query heads (and the key/value heads left serving none) out of a
model's :class:`~headwise.MultiHeadAttention` layers, so that every product after it is smaller.

Axis legend: ``h`` query heads, ``g`` key/value heads, ``d`` head dim, ``m`` model dim.

Gating a head to 0 (``head_mask``) removes its contribution but still computes it; pruning
removes its rows of ``W_q`` (and, with its whole group, of ``W_k``/``W_v``) and its columns of
``W_out``: head ``x`` owns rows ``x*d:(x+1)*d`` of ``q_proj`` and the same columns of
``out_proj`` (see :func:`headwise.per_head.unfuse`), so the pruned model computes exactly what
the unpruned one computes with those heads gated to 0 (Michel et al. 2019, "Are Sixteen Heads
Really Better than One?"; tested to 1e-6).

Grouped-query attention (``g < h``): query head ``x`` reads key/value head ``x // (h / g)``.
A key/value head goes only with all of its query heads; after pruning every surviving key/value
head must still serve the same number of query heads (what the grouped kernel assumes), so a
selection may remove whole groups, or the same number of query heads from every group, or both
as long as the surviving groups stay equal; anything else is refused with the groups named.

Heads are named by their index in the model *as it is now* (the index of ``head_mask`` and of
the weights the model returns). The config records the pruned structure in the original
indices (``config.pruned_heads``: ``{kind: [pruned heads per layer]}``), so a checkpoint of a
pruned model rebuilds the same structure and a pruned model can be pruned again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import nn

from headwise.finders import transformers_model
from headwise.models.heads import attention_layers, check_heads
from headwise.models.pruned import config_plans, cut, layer_plan

__all__ = ["prune_heads"]


def prune_heads(model: nn.Module, heads: Mapping[str, Mapping[int, Iterable[int]]]) -> nn.Module:
    """Remove heads from ``model`` in place and return it.

    Args:
        model: a headwise model (:class:`~headwise.models.TransformerLM`,
            :class:`~headwise.models.Transformer`, its ``Encoder``/``Decoder``, or
            :class:`~headwise.models.bert.BertModel`); a transformers model is handed to
            :func:`headwise.hf.prune_heads` (``heads``: ``{"layers": {layer: [heads]}}``).
        heads: ``{kind: {layer: [heads]}}`` with kinds ``encoder_self``, ``decoder_self``,
            ``cross`` (those the model has), layer and head indices as the model is now
            (negative count from the end). Empty: nothing changes.

    Every layer is checked before any is cut (a bad selection leaves the model as it was):
    a kind, layer or head that does not exist, a layer left with no head, or grouped heads
    left unequal raise ``ValueError``. ``model.config.pruned_heads`` records the result.
    """
    if transformers_model(model):
        from headwise.hf.prune import prune_heads as prune_transformers
        return prune_transformers(model, heads)
    modules = attention_layers(model)
    config = model.config
    chosen = {kind: {layer: x for layer, x in layers.items() if x}
              for kind, layers in check_heads(heads, modules, "prune_heads").items()}
    chosen = {kind: layers for kind, layers in chosen.items() if layers}
    if not chosen:
        return model
    pruned = {kind: [list(x) for x in (config.pruned_heads or {}).get(kind, [[]] * n)]
              for kind, n in config.attention_kinds().items()}
    plans, cuts = config_plans(config), []
    for kind, layers in chosen.items():
        for layer, now in layers.items():
            before = plans[kind][layer]
            pruned[kind][layer] = sorted({*pruned[kind][layer], *(before[0][x] for x in now)})
            where = f"prune_heads: {kind} layer {layer}"
            after = layer_plan(config.num_heads, config.kv_heads, pruned[kind][layer], where)
            cuts.append((modules[kind][layer], before, after))
    new_config = config.replace(pruned_heads=pruned)
    for module, before, after in cuts:
        cut(module, before, after)
    for m in model.modules():  # the model and its encoder/decoder share one config object
        if getattr(m, "config", None) is config:
            m.config = new_config
    return model
