"""``run_with_cache``, ``run_with_hooks`` and ``capture``: TransformerLens' conventions on the
fused path, for headwise's language model and any transformers decoder.

Axis legend: ``b`` batch, ``h`` query heads, ``i`` query position, ``j`` key position.

A transformers model takes them as every head tool does: running
``attn_implementation="headwise"`` (load it so, or :func:`headwise.hf.use`); on another
implementation it is refused in one line, as its heads would be out of headwise's sight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager

import torch

from headwise.analysis.run import run_batch
from headwise.lens import names as N
from headwise.lens import sites
from headwise.lens.activations import ActivationCache
from headwise.lens.hooks import Stop, installed
from headwise.weights import Selection

__all__ = ["capture", "run_with_cache", "run_with_hooks"]

_SPEC = {"layers", "heads", "rows", "keys"}


def run_with_cache(model, inputs, names=None, select=None, stop_at_layer=None,
                   ) -> tuple[torch.Tensor | None, ActivationCache]:
    """One forward of ``model`` on ``inputs`` keeping the activations ``names`` picks.

    Args:
        model: a headwise ``TransformerLM`` or a transformers decoder running
            ``attn_implementation="headwise"``.
        inputs: token ids ``(b, i)``, or a batch dict (``input_ids``, ``attention_mask``: a
            padded batch's masked keys get weight 0 and score ``-inf``).
        names: ``None`` (every hook), a hook name (``"blocks.5.attn.hook_pattern"``), a short
            name for every layer's (``"pattern"``), a list of them, or a callable
            ``name -> bool`` (:mod:`headwise.lens.names`).
        select: which layers to cache at all and, for patterns and scores, which heads, query
            rows and keys: a :class:`headwise.Selection` or a dict with ``layers`` / ``heads``
            / ``rows`` / ``keys`` (``{"layers": [5], "heads": [3]}``). A pattern is computed
            for that selection only, from the fused kernel's log-sum-exp; every other layer
            runs the fused kernel with no weights.
        stop_at_layer: run the blocks before this one and stop (``logits`` is then None), as
            TransformerLens does. By default the run stops after the last layer whose hooks
            the filter picks, and returns logits only when that is the last layer; pass the
            model's layer count to always run it all.

    Returns:
        ``(logits (b, i, vocab) or None, cache)``: ``cache["pattern", 5]`` is ``(b, h, i, j)``
        (the selection's ``(b, hs, is, js)`` under ``select``).
    """
    with _prepared(model, "run_with_cache") as layers:
        wanted, selection, stop = plan(layers, names, select, stop_at_layer, "run_with_cache")
        with torch.no_grad(), installed(model, layers, wanted, selection=selection,
                                        stop=stop) as state:
            logits = _forward(model, inputs, stop is not None)
        return logits, _cache(state.steps[-1] if state.steps else {}, wanted, layers, selection)


def run_with_hooks(model, inputs, fwd_hooks: Iterable[tuple[str | Callable, Callable]] = ()):
    """One forward of ``model`` with each ``(name or name -> bool, fn)`` of ``fwd_hooks`` applied:
    ``fn(activation, hook)`` returns the replacement (or None to keep it), TransformerLens'
    convention. ``hook_z`` / ``hook_result`` edits act at the input of the output projection,
    as :func:`headwise.ablate` and :func:`headwise.patch` do (zero, replace or scale single
    heads); the residual stream, ``hook_attn_out`` and ``hook_mlp_out`` may be edited too. q, k,
    v and ``hook_resid_mid`` are read only here, and a pattern or score edit needs eager
    attention for its layer (the fused kernel never builds the weights it would apply).
    Returns the logits (autograd as the caller has it)."""
    with _prepared(model, "run_with_hooks") as layers:
        edits: dict[str, list[Callable]] = {}
        for entry in fwd_hooks:
            if not (isinstance(entry, tuple) and len(entry) == 2 and callable(entry[1])):
                raise TypeError(f"run_with_hooks: each fwd_hooks entry must be (name or callable "
                                f"filter, fn), got {entry!r}")
            for name in N.choose(entry[0], len(layers), "run_with_hooks"):
                _check_editable(name)
                edits.setdefault(name, []).append(entry[1])
        with installed(model, layers, [], edits=edits):
            return _forward(model, inputs, False)


@contextmanager
def capture(model, names=None, select=None):
    """Every forward of ``model`` inside the block (each step of ``model.generate`` or
    :func:`headwise.generate`) keeps its :class:`ActivationCache`: after the block the yielded
    list holds one per forward, in order. With a
    KV cache each step runs the new token only, so ``steps[t]["pattern", l]`` is that token's
    row ``(b, h, 1, j)`` (or the selection's): nothing is recomputed for earlier positions."""
    with _prepared(model, "capture") as layers:
        wanted, selection, _ = plan(layers, names, select, len(layers), "capture")
        caches: list[ActivationCache] = []
        with installed(model, layers, wanted, selection=selection) as state:
            try:
                yield caches
            finally:
                caches[:] = [_cache(s, wanted, layers, selection) for s in state.steps]


def _cache(step: dict, wanted: list[str], layers, selection) -> ActivationCache:
    """One forward's tensors as a cache, in forward order (the order of ``wanted``)."""
    return ActivationCache({n: step[n] for n in wanted if n in step}, len(layers), selection)


def plan(layers, names, select, stop_at_layer, where: str):
    """``(hook names, selection for patterns, block to stop at or None)``, checked."""
    n = len(layers)
    wanted = N.choose(names, n, where)
    chosen, selection = _selection(select, n, where)
    if chosen is not None:
        wanted = [w for w in wanted if N.layer_of(w) in chosen]
    if stop_at_layer is None:
        stop = max((N.layer_of(w) for w in wanted), default=n - 1) + 1
    elif isinstance(stop_at_layer, int) and not isinstance(stop_at_layer, bool) \
            and 0 <= stop_at_layer <= n:
        stop = stop_at_layer
    else:
        raise ValueError(f"{where}: stop_at_layer must be None or 0..{n} (the model has {n} "
                         f"layers), got {stop_at_layer!r}")
    wanted = [w for w in wanted if N.layer_of(w) < stop]
    if not wanted:
        raise ValueError(f"{where}: names and select together pick no hook before layer {stop} "
                         f"(select: {select!r}); widen one of them")
    for w in wanted:
        if N.short_of(w) in N.WEIGHTS and selection is not None:
            Selection(heads=selection.heads).resolve(layers[N.layer_of(w)].heads, 1, 1, "cpu")
    return wanted, selection, (None if stop >= n else stop)


def _selection(select, n: int, where: str) -> tuple[set[int] | None, Selection | None]:
    if select is None or isinstance(select, Selection):
        return None, select
    if not isinstance(select, Mapping):
        raise TypeError(f"{where}: select must be None, a headwise.Selection or a dict with "
                        f"{sorted(_SPEC)}, got {type(select).__name__}")
    unknown = set(select) - _SPEC
    if unknown:
        raise ValueError(f"{where}: select has unknown keys {sorted(unknown)}; use {sorted(_SPEC)}")
    layers = select.get("layers")
    picked = None
    if layers is not None:
        picked = [layers] if isinstance(layers, int) else list(range(n)[layers]) \
            if isinstance(layers, slice) else list(layers)
        bad = [x for x in picked if not isinstance(x, int) or not -n <= x < n]
        if bad or not picked:
            raise ValueError(f"{where}: select's layer {bad[0] if bad else layers!r} is out of "
                             f"range: the model has {n} layers (0..{n - 1})")
        picked = {x % n for x in picked}
    rest = {k: select[k] for k in ("heads", "rows", "keys") if k in select}
    return picked, (Selection(**rest) if rest else None)


def _check_editable(name: str) -> None:
    short, layer = N.short_of(name), N.layer_of(name)
    if short in N.WEIGHTS:
        raise ValueError(f"run_with_hooks: editing {name} needs eager attention for layer "
                         f"{layer} (the fused kernel never builds the weights it would apply); "
                         "edit hook_z or hook_result instead")
    if short not in N.EDITABLE:
        raise ValueError(f"run_with_hooks: {name} is read only on the fused path; edit one of "
                         f"{', '.join('hook_' + s for s in N.EDITABLE)}")


@contextmanager
def _prepared(model, where: str):
    """The model's hook sites (a transformers model: on headwise's attention, or one line)."""
    yield sites.layers_of(model, where)


def _forward(model, inputs, stops: bool):
    if not isinstance(inputs, (torch.Tensor, Mapping)):
        raise TypeError(f"expected token ids (b, i) or a batch dict (input_ids, attention_mask), "
                        f"got {type(inputs).__name__}")
    try:
        out = run_batch(model, inputs)
    except Stop:
        return None
    if stops:  # (a stop that the run never reached: the model has fewer blocks than asked)
        return None
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out[0] if isinstance(out, tuple) else out
