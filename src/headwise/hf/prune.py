"""Physical head pruning of transformers models: cut query heads (and the key/value heads left
serving none) out of Llama-family attention layers, so that every product after it is smaller.

Axis legend: ``h`` query heads, ``g`` key/value heads, ``d`` head dim, ``m`` model dim.

Head ``x`` owns rows ``x*d:(x+1)*d`` of ``q_proj`` (and its bias) and the same columns of
``o_proj``; key/value head ``y`` owns rows ``y*d:(y+1)*d`` of ``k_proj`` and ``v_proj``. Phi-3
fuses the three into ``qkv_proj`` (rows: the ``h*d`` query rows, then ``g*d`` key rows, then
``g*d`` value rows), cut part by part. gpt-oss's sinks are one number per query head. Qwen3's
and Gemma 3's q/k norms act on the head dim and are shared by all heads: they stay. So the
pruned model computes exactly what the unpruned one computes with those heads' slices of the
``o_proj`` input gated to 0 (``hw.ablate``; tested to 1e-6 x max(1, |logits|)).

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
with :func:`load_pruned`, which builds the recorded structure before the weights load.

Heads are named as :func:`headwise.hf.attention_layers` numbers layers and as the model is now
(the form ``hw.ablate`` takes on transformers models: ``{"layers": {layer: [heads]}}``), so a
pruned model can be pruned again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from headwise.heads import layer_plan
from headwise.hf.model import attention_layers, head_count, refuse_unless_served

__all__ = ["KEY", "load_pruned", "prune_heads"]

KEY = "headwise_pruned_heads"  # the config field: [pruned query heads per layer], original indices
WHERE = "headwise.hf.prune_heads"
SEPARATE = ("q_proj", "k_proj", "v_proj", "o_proj")  # Llama, Qwen, Mistral, Gemma, gpt-oss
FUSED = ("qkv_proj", "o_proj")  # Phi-3

Plan = tuple[tuple[int, ...], tuple[int, ...]]  # (kept query heads, kept key/value heads)


def prune_heads(model, heads: Mapping[str, Mapping[int, Iterable[int]]]):
    """Remove heads from a transformers ``model`` in place and return it.

    Args:
        model: a transformers model whose attention layers hold ``q_proj``/``k_proj``/
            ``v_proj``/``o_proj`` (Llama, Qwen2/3, Mistral, Gemma 2/3, gpt-oss) or Phi-3's
            ``qkv_proj``/``o_proj``, as ``nn.Linear``.
        heads: ``{"layers": {layer: [heads]}}``, layer and head indices as the model is now
            (negative count from the end; ``True`` for every head, which is refused). Empty:
            nothing changes.

    Every chosen layer is checked before any is cut (a bad selection leaves the model as it
    was): a layer or head that does not exist, one named twice, a layer left with no head,
    grouped heads left unequal, or a layer that is not Llama-family attention raise one
    ``ValueError`` line; a selection of another form a ``TypeError``.
    ``model.config.headwise_pruned_heads`` records the result.
    """
    layers = refuse_unless_served(model, WHERE)
    chosen = _check_heads(heads, layers)
    if not chosen:
        return model
    record = _record(model.config, len(layers), WHERE)
    cuts = []
    for layer, now in chosen.items():
        module = layers[layer]
        _check_family(module, f"{WHERE}: layer {layer}")
        h, g = _counts(module)
        before = layer_plan(h, g, record[layer], f"{WHERE}: layer {layer}")
        removed = sorted({*record[layer], *(before[0][x] for x in now)})
        after = layer_plan(h, g, removed, f"{WHERE}: layer {layer} (original head indices)")
        cuts.append((module, before, after))
        record[layer] = removed
    for module, before, after in cuts:
        cut(module, before, after)
    setattr(model.config, KEY, record)
    return model


def load_pruned(path, model_class=None, **kwargs):
    """``model_class.from_pretrained(path, **kwargs)`` for a checkpoint that
    :func:`prune_heads` pruned: the model is built, given the structure its config's
    ``headwise_pruned_heads`` records, and only then loaded (an unpruned checkpoint loads as
    usual). ``model_class``: a transformers model class or Auto class; None reads the config's
    ``architectures``. Returns an instance of the plain model class."""
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
            _check_family(module, f"{where}[{layer}]")
            h, g = _counts(module)
            full = (tuple(range(h)), tuple(range(g)))
            cut(module, full, layer_plan(h, g, removed, f"{where}[{layer}]"))


def cut(module: nn.Module, before: Plan, after: Plan) -> None:
    """Keep the heads of ``after`` (original indices) in ``module``, which holds those of
    ``before``: rows of q/k/v (and their biases), columns of ``o_proj``, sinks; then the
    layer's own head counts."""
    d = module.head_dim
    heads = [before[0].index(x) for x in after[0]]
    groups = [before[1].index(x) for x in after[1]]
    q_rows, kv_rows = _feature_rows(heads, d), _feature_rows(groups, d)
    if hasattr(module, "qkv_proj"):
        hd, gd = len(before[0]) * d, len(before[1]) * d
        module.qkv_proj = _keep(module.qkv_proj, rows=torch.cat([q_rows, hd + kv_rows,
                                                                 hd + gd + kv_rows]))
    else:
        module.q_proj = _keep(module.q_proj, rows=q_rows)
        module.k_proj = _keep(module.k_proj, rows=kv_rows)
        module.v_proj = _keep(module.v_proj, rows=kv_rows)
    module.o_proj = _keep(module.o_proj, cols=q_rows)
    sinks = getattr(module, "sinks", None)
    if isinstance(sinks, nn.Parameter):
        module.sinks = nn.Parameter(sinks.detach()[heads].clone(),
                                    requires_grad=sinks.requires_grad)
    h, g = len(heads), len(groups)
    module.num_heads, module.num_key_value_heads, module.num_key_value_groups = h, g, h // g
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


def _check_family(module: nn.Module, where: str) -> None:
    """Refuse an attention layer whose heads are not laid out as Llama's (or Phi-3's)."""
    names = FUSED if hasattr(module, "qkv_proj") else SEPARATE
    if (all(type(getattr(module, n, None)) is nn.Linear for n in names)
            and isinstance(getattr(module, "head_dim", None), int)
            and isinstance(getattr(_base(getattr(module, "config", None)),
                                   "num_attention_heads", None), int)):
        return
    raise ValueError(
        f"{where}: {type(module).__name__} is not Llama-family attention (nn.Linear "
        f"q_proj/k_proj/v_proj/o_proj, or Phi-3's qkv_proj/o_proj, with head_dim and "
        f"config.num_attention_heads), so headwise cannot cut its heads; gate them instead "
        f"with hw.ablate(model, {{'layers': {{layer: [heads]}}}})")


def _check_heads(heads, layers: list[nn.Module]) -> dict[int, list[int]]:
    """``{"layers": {layer: heads}}`` as ``{layer: sorted heads}`` (indices as the model is
    now), refusing another form, a layer or head that does not exist, and one named twice."""
    if not isinstance(heads, Mapping) or set(heads) - {"layers"}:
        raise TypeError(f"{WHERE}: heads must be {{'layers': {{layer: [heads]}}}} (the form "
                        f"hw.ablate takes on transformers models), got {heads!r}")
    per_layer = heads.get("layers", {})
    if not isinstance(per_layer, Mapping):
        raise TypeError(f"{WHERE}: heads['layers'] must be a dict {{layer: [heads]}}, got "
                        f"{type(per_layer).__name__}")
    out: dict[int, list[int]] = {}
    for layer, picked in per_layer.items():
        index = _index(layer, len(layers), "layer", "")
        if index in out:
            raise ValueError(f"{WHERE}: layer {layer!r} names layer {index} twice")
        h = head_count(layers[index])
        if picked is True:
            picked = range(h)
        elif isinstance(picked, int) and not isinstance(picked, bool):
            picked = [picked]
        elif not isinstance(picked, Iterable) or isinstance(picked, (str, bytes)):
            raise TypeError(f"{WHERE}: heads['layers'][{layer!r}] must be a head index, a list "
                            f"of them or True (all), got {picked!r}")
        now = [_index(x, h, "head", f" of layer {index}") for x in picked]
        if len(set(now)) < len(now):
            raise ValueError(f"{WHERE}: layer {index} names a head twice ({list(picked)!r} is "
                             f"heads {now} of {h}); name each head once")
        if now:
            out[index] = sorted(now)
    return out


def _index(value, size: int, what: str, of: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not -size <= value < size:
        raise ValueError(f"{WHERE}: {what} {value!r}{of} does not exist (there are {size}: "
                         f"0..{size - 1}, or negative from the end)")
    return value % size


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
            raise ValueError(f"headwise.hf.load_pruned: the config names no model class "
                             f"transformers has (architectures={names!r}); pass model_class=, "
                             f"e.g. transformers.AutoModelForCausalLM")
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is not None:  # an Auto class
        model_class = mapping[type(config)]
    return model_class


def _feature_rows(heads: list[int], d: int) -> torch.Tensor:
    """Feature indices ``x*d .. x*d + d - 1`` of every head ``x``, in order."""
    return (torch.tensor(heads, dtype=torch.long)[:, None] * d + torch.arange(d)).reshape(-1)


def _keep(old: nn.Linear, *, rows=None, cols=None) -> nn.Linear:
    """A new ``nn.Linear`` holding the output ``rows`` (or input ``cols``) of ``old``, on its
    device and in its dtype."""
    w = old.weight.detach()
    bias = None if old.bias is None else old.bias.detach()
    if rows is not None:
        w = w.index_select(0, rows.to(w.device))
        bias = None if bias is None else bias.index_select(0, rows.to(w.device))
    if cols is not None:
        w = w.index_select(1, cols.to(w.device))
    new = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta")
    new.weight = nn.Parameter(w.contiguous(), requires_grad=old.weight.requires_grad)
    if bias is not None:
        new.bias = nn.Parameter(bias.clone(), requires_grad=old.bias.requires_grad)
    return new
