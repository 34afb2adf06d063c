"""``headwise.long.profile``: every selected head of a model over one long document, in the
forward pass itself (one observer of :mod:`headwise.observe`), every input checked first.

Axis legend: ``b`` batch, ``n`` tokens, ``l`` profiled layers, ``h`` profiled query heads,
``g`` key/value heads, ``i`` / ``j`` query / key position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headwise import _progress, finders
from headwise import masks as _masks
from headwise import observe as _observe
from headwise import weights as _weights
from headwise.long import reductions as _red
from headwise.long.checks import default_block
from headwise.long.checks import plan as _plan
from headwise.long.profile import LongProfile
from headwise.long.tiles import Call, tiles

__all__ = ["profile", "default_block"]


@torch.no_grad()
def profile(model, ids: torch.Tensor, *, block: int | None = None, sinks: int = 4,
            window: int = 64, far: int = 1000, top_k: int = 8,
            layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
            reductions: Sequence = (), attention_mask: torch.Tensor | None = None,
            tokens: Sequence[str] | None = None, progress: bool = True,
            budget: int | None = None, dtype: torch.dtype | None = None,
            forward=None) -> LongProfile:
    """Profile the attention of ``model`` over ``ids (b, n)`` in one forward pass.

    Args:
        model: a headwise model, or a transformers model on ``attn_implementation="headwise"``
            (:func:`headwise.hf.use`); sliding windows, grouped-query heads, soft-capping and
            sinks are taken as the model applies them.
        ids: ``(b, n)`` token ids; ``n`` at most the model's context.
        block: tokens per block of the maps (default :func:`default_block`).
        sinks, window: the sink keys (the first ``sinks``) and the local window (the last
            ``window`` keys up to each query) of the sink / local / streaming masses.
        far: the ``far`` score is the mass further back than this many tokens (not on a sink).
        top_k: keys kept per query block.
        layers, heads: the layers (indices into the model's attention layers) and query heads
            to profile (default all).
        reductions: user reductions (:mod:`headwise.long.reductions`' protocol), run in the
            same pass; their results land in ``profile.reduced`` (and ``scores`` when ``(h,)``).
        attention_mask: ``(b, n)`` padding mask for a transformers model (1 = token).
        tokens: the document's tokens as text (for the view; default the first row's ids).
        progress: a progress bar over layers with an ETA (rich, on stderr).
        budget: elements per chunk buffer (default :data:`headwise.weights.CHUNK_ELEMENTS`).
        dtype: the work dtype (default at least float32; float64 for references).
        forward: runs the forward instead of ``model(ids)`` (a transformers model:
            ``model(input_ids=ids, attention_mask=attention_mask, use_cache=False)``), e.g.
            ``lambda: model(input_ids=ids, logits_to_keep=1)``.
    """
    plan = _plan(model, ids, block, sinks, window, far, top_k, layers, heads, reductions)
    if tokens is not None and len(tokens) != ids.shape[1]:
        raise ValueError(f"headwise.long.profile: {len(tokens):,} tokens for {ids.shape[1]:,} "
                         "ids; pass one text per id (e.g. tokenizer.decode([x]) for each)")
    budget = _weights.CHUNK_ELEMENTS if budget is None else budget
    found: dict[int, dict] = {}
    with _progress.bar("headwise long: layers", enabled=progress, transient=True) as bar:
        task = bar.add_task("layers", total=len(plan["layers"]))
        def seen(module, q, k, mask, causal, scale, self_attention, softcap, sink_logits):
            index = plan["index"].get(id(module))
            if index is None or index not in plan["layers"] or index in found:
                return
            found[index] = _layer(plan, q, k, mask, causal, scale, softcap, sink_logits,
                                  budget, dtype)
            bar.advance(task)

        with _observe.observing(_observe.Observer(softmax=seen)):
            _forward(model, ids, attention_mask) if forward is None else forward()
    missing = [x for x in plan["layers"] if x not in found]
    if missing:
        raise RuntimeError(f"headwise.long.profile: layer {missing[0]} never reported its "
                           "attention (a layer the forward skipped?)")
    tokens = [f"[{x}]" for x in ids[0].tolist()] if tokens is None else tokens  # ids if no text
    return _assemble(plan, [found[x] for x in plan["layers"]], ids.shape[1], tokens)


def _layer(plan, q, k, mask, causal, scale, softcap, sink_logits, budget, dtype) -> dict:
    """One attention call's reductions: every head (grouped heads share their keys), or the
    profiled ones, each with its key/value head."""
    h, g = q.shape[1], k.shape[1]
    heads = torch.tensor(plan["heads"], device=q.device)
    if len(plan["heads"]) < h:  # a selection: each head with its own key head (small)
        q, k = q.index_select(1, heads), k.index_select(1, heads // (h // g))
    mask = _masks.as_4d(mask)
    if mask is not None and mask.shape[1] == h and h > 1:
        mask = mask.index_select(1, heads)
    sink_logits = None if sink_logits is None else sink_logits.detach().index_select(0, heads)
    work = dtype or torch.promote_types(q.dtype, torch.float32)
    call = Call(q.shape[0], len(plan["heads"]), q.shape[2], k.shape[2], plan["block"],
                plan["sinks"], plan["window"], work, q.device, plan["far"], bool(causal))
    todo = [cls() for cls in _red.BUILT_INS[:2]] + [_red.TopKeys(plan["top_k"])] + \
        [cls() for cls in _red.BUILT_INS[3:]] + list(plan["reductions"])
    for r in todo:
        r.init(call)
    for tile in tiles(q, k, call, mask=mask, causal=causal, scale=scale, softcap=softcap,
                      sinks=sink_logits, budget=budget):
        for r in todo:
            r.update(tile)
    out = {r.name: r.finish().to("cpu") for r in todo}  # float64 sums; kept in float32
    return {name: v if name == "topk" or not v.is_floating_point() else v.float()
            for name, v in out.items()}


def _forward(model, ids, attention_mask) -> None:
    if finders.transformers_model(model):
        model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
    elif attention_mask is not None:
        raise ValueError("headwise.long.profile: attention_mask is for a transformers model; "
                         "a headwise model takes ids of one length (no padding)")
    else:
        model(ids)


def _assemble(plan, per_layer: list[dict], n: int, tokens) -> LongProfile:
    stack = lambda name: torch.stack([x[name] for x in per_layer])  # noqa: E731
    top, rows = stack("topk"), stack("row_masses")
    scores = {name: rows[..., x] for x, name in enumerate(_red.RowMasses.COLUMNS)}
    reduced = {r.name: stack(r.name) for r in plan["reductions"]}
    scores |= {name: v for name, v in reduced.items() if v.dim() == 2}
    return LongProfile(n=n, block=plan["block"], layers=list(plan["layers"]),
                       heads=list(plan["heads"]), heads_per_layer=plan["h"],
                       groups_per_layer=plan["g"], sinks=plan["sinks"], window=plan["window"],
                       maps=stack("maps"), distance=stack("distance"),
                       distance_edges=_red.distance_edges(n).double(),
                       sink=scores["sink"], local=scores["local"], received=stack("received"),
                       topk_keys=top[..., 0, :].round().long(), topk_mass=top[..., 1, :],
                       scores=scores, reduced=reduced,
                       tokens=[str(t) for t in tokens])
