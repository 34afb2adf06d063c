"""Physical head pruning of transformers models: cut query heads (and the key/value heads left
serving none) out of Llama-family attention layers, so that every product after it is smaller.

Axis legend: ``h`` query heads, ``g`` key/value heads, ``d`` head dim, ``m`` model dim.

Head ``x`` owns rows ``x*d:(x+1)*d`` of ``q_proj`` (and its bias) and the same columns of
``o_proj``; key/value head ``y`` owns rows ``y*d:(y+1)*d`` of ``k_proj`` and ``v_proj``. Phi-3
fuses the three into ``qkv_proj`` (rows: the ``h*d`` query rows, then ``g*d`` key rows, then
``g*d`` value rows), cut part by part; GPT-2 likewise in ``c_attn``, a ``Conv1D`` (its weight is
transposed: output features are columns), with ``c_proj`` as the output; BERT names them
``query``/``key``/``value``, and its output projection ``dense`` sits in the attention block's
``output``. gpt-oss's sinks are one number per query head. Qwen3's and Gemma 3's q/k norms act
on the head dim and are shared by all heads: they stay. So the pruned model computes exactly
what the unpruned one computes with those heads' slices of the output projection's input gated
to 0 (``hw.ablate``; tested to 1e-6 x max(1, |logits|)).

Grouped-query attention: the rule of :func:`headwise.heads.layer_plan`, the one headwise's own
models follow. A key/value head goes only with all of its query heads, and every surviving
key/value head must still serve the same number of query heads (transformers' eager path and
headwise's kernel both read query head ``x``'s key/value head as ``x // (h / g)``): a selection
may remove whole groups, or the same number of heads from every group; anything else is refused
with the groups named (gate those heads with ``hw.ablate`` instead).

Per-layer head counts: a transformers config has one ``num_attention_heads``, so the config
keeps the original counts and records what went in ``config.headwise_pruned_heads`` (one list
of pruned query heads per attention layer, original indices; written by ``save_pretrained``).
A pruned layer gets its own counts as attributes (``num_heads``, ``num_key_value_heads``,
``num_key_value_groups``) and a view of the config with its own head counts (Phi-3's forward
reads ``config.num_attention_heads``). transformers itself cannot rebuild that structure: a
plain ``from_pretrained`` of a pruned checkpoint stops with its size-mismatch report; load one
with :func:`headwise.hf.load` (``(model, tokenizer)`` on headwise), or with
:func:`from_pretrained` here (a model class and ``from_pretrained`` options of your own), both
building the recorded structure before the weights load.

Heads are named as :func:`headwise.hf.attention_layers` numbers layers and as the model is now
(the form ``hw.ablate`` takes on transformers models: ``{"layers": {layer: [heads]}}``), so a
pruned model can be pruned again.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from headwise.heads import check_heads, layer_plan
from headwise.hf.model import attention_layers, head_count, refuse_unless_served

__all__ = ["KEY", "from_pretrained", "load_pruned", "prune_heads"]

KEY = "headwise_pruned_heads"  # the config field: [pruned query heads per layer], original indices
WHERE = "headwise.hf.prune_heads"
# how a layer holds its heads: family -> (q/k/v projections, output projection, its owner)
LAYOUTS = {"llama": (("q_proj", "k_proj", "v_proj"), "o_proj", "layer"),  # Qwen, Mistral, Gemma
           "phi3": (("qkv_proj",), "o_proj", "layer"),  # q, k, v fused
           "gpt2": (("c_attn",), "c_proj", "layer"),  # q, k, v fused, Conv1D
           "bert": (("query", "key", "value"), "dense", "block output")}

Plan = tuple[tuple[int, ...], tuple[int, ...]]  # (kept query heads, kept key/value heads)


def prune_heads(model, heads: Mapping[str, Mapping[int, Iterable[int]]]):
    """Remove heads from a transformers ``model`` in place and return it.

    Args:
        model: a transformers model whose attention layers are laid out as one of
            :data:`LAYOUTS`: Llama's (Qwen2/3, Mistral, Gemma 2/3, gpt-oss), Phi-3's, GPT-2's
            self-attention or BERT's.
        heads: ``{"layers": {layer: [heads]}}``, layer and head indices as the model is now
            (negative count from the end; ``True``, every head, is refused: a layer keeps at
            least one). Empty: nothing changes.

    Every chosen layer is checked before any is cut (a bad selection leaves the model as it
    was): a kind other than ``"layers"``, a layer or head that does not exist, one named twice,
    a layer left with no head, grouped heads left unequal, or a layer laid out otherwise raise
    one ``ValueError`` line; a selection of another form a ``TypeError``
    (:func:`headwise.heads.check_heads`, the reading every head tool shares).
    ``model.config.headwise_pruned_heads`` records the result.
    """
    layers = refuse_unless_served(model, WHERE)
    chosen = {layer: now for layer, now in check_heads(
        heads, {"layers": [head_count(m) for m in layers]}, WHERE, once=True).get(
        "layers", {}).items() if now}
    if not chosen:
        return model
    record = _record(model.config, len(layers), WHERE)
    cuts = []
    for layer, now in chosen.items():
        module = layers[layer]
        output = _output(model, module, f"{WHERE}: layer {layer}")
        h, g = _counts(module)
        before = layer_plan(h, g, record[layer], f"{WHERE}: layer {layer}")
        removed = sorted({*record[layer], *(before[0][x] for x in now)})
        after = layer_plan(h, g, removed, f"{WHERE}: layer {layer} (original head indices)")
        cuts.append((module, output, before, after))
        record[layer] = removed
    for module, output, before, after in cuts:
        cut(module, output, before, after)
    setattr(model.config, KEY, record)
    return model


def load_pruned(path, model_class=None, **kwargs):
    """Deprecated: ``headwise.hf.load(path)`` loads a pruned folder too, and returns
    ``(model, tokenizer)`` on headwise like every other folder. This is
    :func:`from_pretrained` (the model alone, on transformers' default attention unless
    ``attn_implementation=`` says otherwise), with a DeprecationWarning."""
    warnings.warn("headwise.hf.load_pruned is deprecated: headwise.hf.load(path) loads a "
                  "pruned folder as any other, as (model, tokenizer) on headwise; for a model "
                  "class or from_pretrained options of your own, call "
                  "headwise.hf.prune.from_pretrained(path, model_class, **kwargs)",
                  DeprecationWarning, stacklevel=2)
    from headwise.errors import CheckpointError, one_line
    from headwise.hf import folder

    where = "headwise.hf.load_pruned"
    folder.check_folder(path, where)
    try:
        return from_pretrained(path, model_class, **kwargs)
    except RuntimeError as e:  # transformers' size-mismatch report
        raise CheckpointError(f"{where}: {path}: the weights do not fit config.json (or its "
                              f"{KEY} was edited): {one_line(e)[:200]}; put the config.json "
                              "saved with these weights beside them") from None


def from_pretrained(path, model_class=None, **kwargs):
    """``model_class.from_pretrained(path, **kwargs)`` for a checkpoint that
    :func:`prune_heads` pruned: the model is built, given the structure its config's
    ``headwise_pruned_heads`` records, and only then loaded (an unpruned checkpoint loads as
    usual). ``model_class``: a transformers model class or Auto class; None reads the config's
    ``architectures``. Returns an instance of the plain model class (what
    :func:`headwise.hf.load` runs, with ``attn_implementation="headwise"``)."""
    import transformers

    config = kwargs.pop("config", None) or transformers.AutoConfig.from_pretrained(path)
    model_class = _model_class(model_class, config)

    class Pruned(model_class):  # builds the recorded structure before the weights load
        def __init__(self, config, *args, **kw):
            super().__init__(config, *args, **kw)
            restructure(self)

    Pruned.__name__, Pruned.__qualname__ = model_class.__name__, model_class.__qualname__
    model = Pruned.from_pretrained(path, config=config, **kwargs)
    model.__class__ = model_class
    return model


def restructure(model) -> None:
    """Give a freshly built ``model`` the pruned structure its config records (nothing when it
    records none)."""
    if getattr(model.config, KEY, None) is None:
        return
    layers = attention_layers(model)
    where = f"{type(model).__name__} config.{KEY}"
    for layer, removed in enumerate(_record(model.config, len(layers), where)):
        if removed:
            module = layers[layer]
            output = _output(model, module, f"{where}[{layer}]")
            h, g = _counts(module)
            if removed[-1] >= h:
                raise ValueError(f"{where}[{layer}] names head {removed[-1]} but the layer has "
                                 f"{h} heads (0..{h - 1}); the config does not belong to these "
                                 f"weights, or it was edited")
            full = (tuple(range(h)), tuple(range(g)))
            cut(module, output, full, layer_plan(h, g, removed, f"{where}[{layer}]"))


def cut(module: nn.Module, output: tuple[nn.Module, str], before: Plan, after: Plan) -> None:
    """Keep the heads of ``after`` (original indices) in ``module``, which holds those of
    ``before``: rows of q/k/v (and their biases), the input features of the output projection
    (``output``: its owner and name), sinks; then the layer's own head counts."""
    d = _head_dim(module)
    heads = [before[0].index(x) for x in after[0]]
    groups = [before[1].index(x) for x in after[1]]
    q_rows, kv_rows = _feature_rows(heads, d), _feature_rows(groups, d)
    names = LAYOUTS[_family(module)][0]
    if len(names) == 1:  # fused: the h*d query features, then g*d key and g*d value features
        hd, gd = len(before[0]) * d, len(before[1]) * d
        rows = torch.cat([q_rows, hd + kv_rows, hd + gd + kv_rows])
        setattr(module, names[0], _keep(getattr(module, names[0]), out=rows))
    else:
        for name, rows in zip(names, (q_rows, kv_rows, kv_rows), strict=True):
            setattr(module, name, _keep(getattr(module, name), out=rows))
    owner, name = output
    setattr(owner, name, _keep(getattr(owner, name), inp=q_rows))
    sinks = getattr(module, "sinks", None)
    if isinstance(sinks, nn.Parameter):
        module.sinks = nn.Parameter(sinks.detach()[heads].clone(),
                                    requires_grad=sinks.requires_grad)
    h, g = len(heads), len(groups)
    # the layer's own counts (headwise.hf's head_count reads num_heads first), then the names
    # each family's forward reads, where it has them
    module.num_heads, module.num_key_value_heads, module.num_key_value_groups = h, g, h // g
    for attribute, value in (("num_attention_heads", h), ("split_size", h * d),
                             ("all_head_size", h * d)):
        if hasattr(module, attribute):
            setattr(module, attribute, value)
    module.config = LayerConfig(_base(module.config), num_attention_heads=h,
                                num_key_value_heads=g)


class LayerConfig:
    """The model's config as one pruned layer sees it: its own ``num_attention_heads`` and
    ``num_key_value_heads``; every other name read from (and written to) the model's config,
    so ``set_attn_implementation`` still reaches the layer."""

    def __init__(self, config, **own):
        object.__setattr__(self, "base", config)
        object.__setattr__(self, "own", own)

    def __getattr__(self, name):
        if name in ("base", "own"):  # not set yet (copy and deepcopy build without __init__)
            raise AttributeError(name)
        return self.own[name] if name in self.own else getattr(self.base, name)

    def __setattr__(self, name, value):
        if name in self.own:
            self.own[name] = value
        else:
            setattr(self.base, name, value)

    def __repr__(self):
        return f"LayerConfig({self.own}, base={type(self.base).__name__})"


def _base(config):
    return config.base if isinstance(config, LayerConfig) else config


def _counts(module: nn.Module) -> tuple[int, int]:
    """The original ``(h, g)`` of a layer: its config's, whatever was pruned since."""
    config = _base(module.config)
    h = config.num_attention_heads
    return h, getattr(config, "num_key_value_heads", None) or h


def _family(module: nn.Module) -> str | None:
    """Which of :data:`LAYOUTS` ``module`` follows (None: none)."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's transposed linear

    def are(kind: type, *names: str) -> bool:
        return all(type(getattr(module, n, None)) is kind for n in names)

    if not isinstance(getattr(_base(getattr(module, "config", None)), "num_attention_heads",
                              None), int) or not isinstance(_head_dim(module), int):
        return None
    if are(nn.Linear, "q_proj", "k_proj", "v_proj", "o_proj"):
        return "llama"
    if are(nn.Linear, "qkv_proj", "o_proj"):
        return "phi3"
    if are(Conv1D, "c_attn", "c_proj") and getattr(module, "q_attn", None) is None:
        return "gpt2"  # (GPT-2's cross-attention has q_attn: its keys come from elsewhere)
    if are(nn.Linear, "query", "key", "value"):
        return "bert"
    return None


def _output(model: nn.Module, module: nn.Module, where: str) -> tuple[nn.Module, str]:
    """``(owner, name)`` of the output projection of attention layer ``module``; ValueError for
    a layer laid out as none of :data:`LAYOUTS`."""
    family = _family(module)
    if family is not None:
        _, name, owner = LAYOUTS[family]
        if owner == "layer":
            return module, name
        for block in model.modules():  # BERT: the block holding the layer as .self
            if getattr(block, "self", None) is module and type(
                    getattr(getattr(block, "output", None), name, None)) is nn.Linear:
                return block.output, name
    raise ValueError(
        f"{where}: {type(module).__name__} is laid out as none of Llama's (q_proj/k_proj/v_proj/"
        f"o_proj), Phi-3's (qkv_proj/o_proj), GPT-2's self-attention (c_attn/c_proj) or "
        f"BERT's (query/key/value, output.dense), so headwise cannot cut its heads; gate them "
        f"instead with hw.ablate(model, {{'layers': {{layer: [heads]}}}})")


def _head_dim(module: nn.Module):
    return getattr(module, "head_dim", None) or getattr(module, "attention_head_size", None)


def _record(config, n: int, where: str) -> list[list[int]]:
    """The config's ``headwise_pruned_heads`` (a copy), or no heads pruned in ``n`` layers."""
    record = getattr(config, KEY, None)
    if record is None:
        return [[] for _ in range(n)]
    if (not isinstance(record, (list, tuple)) or len(record) != n or not all(
            isinstance(r, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool)
                                                 and x >= 0 for x in r) for r in record)):
        raise ValueError(f"{where}: config.{KEY} must list the pruned heads of each of the "
                         f"model's {n} attention layers, got {record!r}")
    return [sorted(r) for r in record]


def _model_class(model_class, config):
    """A concrete transformers model class: ``model_class``, an Auto class resolved for
    ``config``, or the config's ``architectures[0]``."""
    import transformers

    if model_class is None:
        names = getattr(config, "architectures", None) or []
        model_class = getattr(transformers, names[0], None) if names else None
        if model_class is None:
            raise ValueError(f"headwise.hf.prune.from_pretrained: the config names no model class "
                             f"transformers has (architectures={names!r}); pass model_class=, "
                             f"e.g. transformers.AutoModelForCausalLM")
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is not None:  # an Auto class
        model_class = mapping[type(config)]
    return model_class


def _feature_rows(heads: list[int], d: int) -> torch.Tensor:
    """Feature indices ``x*d .. x*d + d - 1`` of every head ``x``, in order."""
    return (torch.tensor(heads, dtype=torch.long)[:, None] * d + torch.arange(d)).reshape(-1)


def _keep(old: nn.Module, *, out=None, inp=None) -> nn.Module:
    """A new ``nn.Linear`` (or transformers ``Conv1D``, whose weight is ``(in, out)``) holding
    the output features ``out`` (or input features ``inp``) of ``old``, on its device and in
    its dtype."""
    conv = type(old).__name__ == "Conv1D"
    out_axis, in_axis = (1, 0) if conv else (0, 1)
    w = old.weight.detach()
    bias = None if old.bias is None else old.bias.detach()
    if out is not None:
        w = w.index_select(out_axis, out.to(w.device))
        bias = None if bias is None else bias.index_select(0, out.to(w.device))
    if inp is not None:
        w = w.index_select(in_axis, inp.to(w.device))
    with torch.device("meta"):
        new = (type(old)(w.shape[1], w.shape[0]) if conv
               else nn.Linear(w.shape[1], w.shape[0], bias=bias is not None))
    new.weight = nn.Parameter(w.contiguous(), requires_grad=old.weight.requires_grad)
    if bias is not None:
        new.bias = nn.Parameter(bias.clone(), requires_grad=old.bias.requires_grad)
    return new
