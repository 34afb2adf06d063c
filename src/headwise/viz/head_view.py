"""One self-contained, offline HTML file to explore every layer and head.

The page (``assets/head_view.js`` + ``.css``, inlined) shows a layers x heads grid of thumbnails
(the model view), a detail view of one layer (token-to-token lines as in BertViz's head view,
a matrix view, and attention rollout), pickers for the attention kind and the batch example,
head toggles, and head-importance scores on the grid.

Storage, so that 1024 tokens x 48 heads fits in tens of MB and the page paints at once:

- every head's ``(i, j)`` matrix (padding trimmed to the example's tokens) is quantised to
  uint8 with a per-row scale (``w[i, j] ~= q[i, j] / 255 * rowmax[i]``, error <= rowmax / 510),
  zlib-deflated and base64-encoded into its own inert ``<script type="application/octet-stream">``
  block at the *end* of the body; the browser inflates it with the built-in
  ``DecompressionStream`` only when that head is shown;
- thumbnails are max-pooled to at most ``thumbnail`` x ``thumbnail`` cells in Python and sit in
  the small JSON header, so the grid draws before the big blocks are even parsed.

No request of any kind leaves the page: no CDN, no fonts, no fetch.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from headwise.kinds import KINDS, as_tables
from headwise.viz import _blocks
from headwise.viz.display import HeadView, asset
from headwise.viz.rollout import attention_rollout

__all__ = ["head_view", "score_labels"]


def head_view(attentions: Mapping[str, Sequence], tokens, path: str | os.PathLike | None = None,
              *, importance: Mapping[str, object] | None = None, title: str | None = None,
              kind: str | None = None, layer: int | None = None, head: int | None = None,
              kv_heads: int | Mapping[str, int] | None = None,
              generated_start: int | Sequence[int] | None = None,
              thumbnail_scale: str = "shared", rollout: bool = True, thumbnail: int = 48,
              max_mb: float | None = 40.0, compress_level: int = 4) -> HeadView:
    """Make the interactive head view; write it to ``path`` when given.

    Returns a :class:`~headwise.viz.display.HeadView` (``.html``, ``.path``, ``.save(path)``;
    path-like once saved). In Jupyter it displays inline, offline (``_repr_html_``).

    Any model's attentions work, e.g. Hugging Face's ``output_attentions=True``, a tuple with
    one ``(b, h, i, j)`` tensor per layer::

        out = hf_model(**batch, output_attentions=True)   # attn_implementation="eager"
        tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
        head_view({"encoder_self": out.attentions}, tokens)   # decoder-only: "decoder_self"

    Args:
        attentions: ``{"encoder_self" | "decoder_self" | "cross": [per layer (b, h, i, j) tensor
            or None]}`` as returned by headwise models (batch axis kept; layers may differ in
            head count after pruning; ``None`` marks a layer that was not recorded).
        tokens: ``{"src": [[str, ...] per example], "tgt": [[...]]}``, or one list (or list of
            per-example lists) for a model with a single self-attention kind. A side may also be
            one flat list shared by every example. An example's list may be shorter than the
            tensor's ``i``/``j`` (padding is trimmed), never longer.
        path: the ``.html`` file to write (atomically); ``None``: not written.
        importance: optional ``{kind: (layers, heads) array}`` of head-importance scores (or
            the :class:`~headwise.HeadScores` of :func:`headwise.importance`, whose method and
            data the bars are then labelled with), shown on the grid (NaN = no score).
        title: page title (default "headwise head view").
        kind, layer, head: what the page opens on (default: the first kind, its first recorded
            layer, head 0), e.g. the cross-attention head that matters.
        kv_heads: grouped-query attention: the number of key/value heads ``g`` (one int for
            every kind, or ``{kind: g}``). Query head ``h`` reads key/value head
            ``h // (heads / g)`` (Hugging Face's ``repeat_kv`` order); the grid and the head
            pickers show the query heads grouped under their key/value head.
        generated_start: the position of the first generated token on the decoder (``"tgt"``)
            side, one int or one per example (as BertViz's ``sentence_b_start`` marks a second
            sentence): tokens from there on are marked as generated, the prompt before them.
        thumbnail_scale: ``"shared"`` (default) colours every thumbnail of a kind on one scale,
            0 to the largest weight of any head, so a flat head looks flat; ``"own"`` scales each
            to its own maximum. The page can switch between them.
        rollout: precompute attention rollout for self-attention kinds (needs every layer).
        thumbnail: largest side of the max-pooled thumbnails in the model view.
        max_mb: size budget of the file. Weights are stored with 255 levels per row; if the file
            would exceed the budget (long, flat attention compresses poorly) they are stored
            again with 63, then 15 levels, and the page states the precision used. ``None``
            keeps 255 levels whatever the size.
        compress_level: zlib level (1 fastest .. 9 smallest) for the stored weights.
    """
    kinds, batch, sides = _checked(attentions, tokens, path, thumbnail_scale)
    meta = {"title": title or "headwise head view", "examples": batch, "tokens": sides,
            "kinds": {}, "thumbnail": int(thumbnail), "thumbnailScale": thumbnail_scale,
            "initial": _check_initial(kinds, kind, layer, head),
            "generatedStart": _check_generated(generated_start, sides, batch)}
    matrices = _add_kinds(meta, kinds, importance, kv_heads, thumbnail, rollout)
    view = HeadView(_fitted_page(meta, matrices, max_mb, compress_level))
    return view if path is None else view.save(path)


def _add_kinds(meta: dict, kinds: dict, importance, kv_heads, thumbnail: int,
               rollout: bool) -> list[tuple[str, np.ndarray]]:
    """Each kind's page header (with its checked importance scores) into ``meta["kinds"]``;
    returns every ``(block key, (i, j) weights)`` matrix the page stores."""
    # how the bars were made: a HeadScores says (method, data, agreement); a bare table does not
    describe = getattr(importance, "describe", None)
    meta["importanceMethod"] = describe() if callable(describe) else None
    # the kinds' order and button labels, from the one table (the page writes none of its own)
    meta["kindOrder"] = list(KINDS)
    meta["kindShort"] = {name: kind.short for name, kind in KINDS.items()}
    importance = _check_importance(importance, kinds)
    matrices: list[tuple[str, np.ndarray]] = []
    for name, info in kinds.items():
        meta["kinds"][name] = _kind_entry(name, info, meta["tokens"], importance.get(name),
                                          matrices, thumbnail, rollout)
        meta["kinds"][name]["kvHeads"] = _check_kv_heads(kv_heads, name, info)
    return matrices


def _fitted_page(meta: dict, matrices, max_mb: float | None, compress_level: int) -> str:
    """The page with weights stored at the finest of the quantisation levels
    (:data:`headwise.viz._blocks.LEVELS`) whose file fits ``max_mb`` (the coarsest when none
    does); ``meta["levels"]`` says which."""
    for levels in _blocks.LEVELS:
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # zlib frees the GIL
            blocks = list(pool.map(_blocks.block, *zip(*matrices, strict=True),
                                   [levels] * len(matrices), [compress_level] * len(matrices)))
        meta["levels"] = levels
        page = _page(meta, blocks)
        if max_mb is None or len(page.encode("utf-8")) <= max_mb * 1e6:
            break
    return page


def _checked(attentions, tokens, path, thumbnail_scale: str) -> tuple[dict, int, dict]:
    """``(kinds, batch, token sides)`` of checked inputs; a bad path or scale fails first."""
    _check_options(path, thumbnail_scale)
    kinds = _check_attentions(attentions)
    batch = next(iter(kinds.values()))["batch"]
    return kinds, batch, _check_tokens(tokens, kinds, batch)


def _check_options(path, thumbnail_scale: str) -> None:
    if path is not None and Path(path).suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"head_view path {str(path)!r} must end in .html (e.g. view.html)")
    if thumbnail_scale not in ("shared", "own"):
        raise ValueError(f"thumbnail_scale={thumbnail_scale!r}; expected 'shared' or 'own'")


def _kind_entry(kind, info, sides, importance, matrices, thumbnail: int, rollout: bool) -> dict:
    """One attention kind's page header (labels, head counts, thumbnails, rollout status);
    appends each head's ``(i, j)`` matrix, padding trimmed, to ``matrices``."""
    q_side, k_side = KINDS[kind].sides
    lens = [(len(q), len(k)) for q, k in zip(sides[q_side], sides[k_side], strict=True)]
    entry = {"label": KINDS[kind].label, "query": q_side, "key": k_side,
             "heads": [None if w is None else int(w.shape[1]) for w in info["layers"]],
             "importance": importance, "thumbs": [], "rollout": None,
             "importanceLabels": None if importance is None else score_labels(importance)}
    for b, (n_q, n_k) in enumerate(lens):
        thumbs_b = []
        for l, w in enumerate(info["layers"]):
            if w is None:
                thumbs_b.append(None)
                continue
            thumbs_l = []
            for h in range(w.shape[1]):
                m = w[b, h, :n_q, :n_k]
                matrices.append((f"w/{kind}/{b}/{l}/{h}", m))
                thumbs_l.append(_blocks.thumbnail(m, thumbnail))
            thumbs_b.append(thumbs_l)
        entry["thumbs"].append(thumbs_b)
    if rollout and KINDS[kind].is_self:
        entry["rollout"] = _rollouts(kind, info["layers"], lens, matrices)
    return entry


def _rollouts(kind, layers, lens, matrices) -> dict:
    if any(w is None for w in layers):
        missing = [l for l, w in enumerate(layers) if w is None]
        return {"error": f"rollout needs every layer; layers {missing} were not recorded"}
    for b, (n, _) in enumerate(lens):
        per_layer = [torch.from_numpy(w[b, :, :n, :n]) for w in layers]
        r = attention_rollout(per_layer).numpy()  # (layers, i, i)
        for l in range(r.shape[0]):
            matrices.append((f"r/{kind}/{b}/{l}", r[l]))
    return {"error": None}


# ----------------------------------------------------------------------------- checking

def _check_attentions(attentions) -> dict:
    if not isinstance(attentions, Mapping):
        raise TypeError(f"attentions must be a dict kind -> list of per-layer (b, h, i, j) "
                        f"tensors (kinds {list(KINDS)}), got {type(attentions).__name__}; "
                        "e.g. {'encoder_self': weights}")
    if not attentions:
        raise ValueError(f"attentions is empty; expected at least one of {list(KINDS)}")
    kinds, ref = {}, None
    for kind in KINDS:
        if kind not in attentions:
            continue
        layers = attentions[kind]
        if isinstance(layers, (torch.Tensor, np.ndarray)) and layers.ndim == 5:
            layers = list(layers)
        if not isinstance(layers, (list, tuple)) or not layers:
            raise TypeError(f"attentions[{kind!r}] must be a non-empty list with one (b, h, i, j)"
                            f" tensor (or None) per layer, got {type(layers).__name__}")
        arrays = [None if w is None else _as_array(kind, l, w) for l, w in enumerate(layers)]
        shapes = {(w.shape[0], w.shape[2], w.shape[3]) for w in arrays if w is not None}
        if not shapes:
            raise ValueError(f"attentions[{kind!r}] has no recorded layer (all None)")
        if len(shapes) > 1:
            raise ValueError(f"attentions[{kind!r}] layers disagree on (b, i, j): {sorted(shapes)}"
                             "; every layer must come from the same batch")
        (b, i, j), = shapes
        if ref is not None and b != ref:
            raise ValueError(f"attentions[{kind!r}] has batch size {b} but another kind has {ref}"
                             "; pass the attentions of one forward pass")
        ref = b
        if KINDS[kind].is_self and i != j:
            raise ValueError(f"attentions[{kind!r}] is self-attention, so i must equal j, got "
                             f"(i, j) = ({i}, {j})")
        kinds[kind] = {"layers": arrays, "batch": b, "i": i, "j": j}
    unknown = sorted(set(attentions) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown attention kinds {unknown}; expected keys from {list(KINDS)}")
    return kinds


def _as_array(kind: str, l: int, w) -> np.ndarray:
    a = torch.as_tensor(w).detach().to("cpu", torch.float32).numpy()
    if a.ndim != 4:
        raise ValueError(f"attentions[{kind!r}][{l}] must be (b, h, i, j), got shape {a.shape}"
                         + ("; add the batch axis with w[None]" if a.ndim == 3 else ""))
    if not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(f"attentions[{kind!r}][{l}] must hold finite, non-negative weights "
                         "(softmax probabilities), found NaN/inf or negative values")
    return a


def _check_tokens(tokens, kinds: dict, batch: int) -> dict:
    needed = {side for kind in kinds for side in KINDS[kind].sides}
    if not isinstance(tokens, Mapping):
        if len(needed) > 1 or len(kinds) > 1:
            raise ValueError(f"a plain token list is ambiguous for kinds {list(kinds)}; pass "
                             "{'src': [...], 'tgt': [...]}")
        tokens = {next(iter(needed)): tokens}
    sides = {}
    for side in sorted(needed):
        if side not in tokens:
            users = [k for k in kinds if side in KINDS[k].sides]
            raise ValueError(f"tokens has no {side!r} entry, needed by kinds {users}; pass "
                             "tokens={'src': [...], 'tgt': [...]}")
        sides[side] = _per_example(side, tokens[side], batch)
    for kind, info in kinds.items():
        q_side, k_side = KINDS[kind].sides
        for b in range(batch):
            for side, n in ((q_side, info["i"]), (k_side, info["j"])):
                if len(sides[side][b]) > n:
                    raise ValueError(f"tokens[{side!r}] example {b} has {len(sides[side][b])} "
                                     f"tokens but attentions[{kind!r}] has only {n} positions on "
                                     "that axis")
                if not sides[side][b]:
                    raise ValueError(f"tokens[{side!r}] example {b} is empty")
    return sides


def _per_example(side: str, value, batch: int) -> list[list[str]]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"tokens[{side!r}] must be a list of strings (or one list per example), "
                        f"got {type(value).__name__}")
    if value and all(isinstance(t, str) for t in value):
        return [list(value)] * batch
    if len(value) != batch or not all(isinstance(e, Sequence) and not isinstance(e, str)
                                      and all(isinstance(t, str) for t in e) for e in value):
        raise ValueError(f"tokens[{side!r}] must be one list of strings or {batch} lists (one "
                         f"per example), got {len(value)} entries")
    return [list(e) for e in value]


def _check_initial(kinds: dict, kind: str | None, layer: int | None, head: int | None) -> dict:
    """The kind/layer/head the page opens on, checked against what was recorded."""
    kind = kind if kind is not None else next(iter(kinds))
    if kind not in kinds:
        raise ValueError(f"kind={kind!r} is not among the attentions given ({list(kinds)})")
    layers = kinds[kind]["layers"]
    recorded = [l for l, w in enumerate(layers) if w is not None]
    layer = recorded[0] if layer is None else layer
    if layer not in recorded:
        raise ValueError(f"layer={layer} is not a recorded layer of {kind!r}; choose one of "
                         f"{recorded}")
    n_heads = layers[layer].shape[1]
    head = 0 if head is None else head
    if not 0 <= head < n_heads:
        raise ValueError(f"head={head} is out of range: layer {layer} of {kind!r} has "
                         f"{n_heads} heads (0..{n_heads - 1})")
    return {"kind": kind, "layer": int(layer), "head": int(head)}


def _check_importance(importance, kinds: dict) -> dict:
    if importance is None:
        return {}
    shapes = {kind: (len(info["layers"]), max(w.shape[1] for w in info["layers"] if w is not None))
              for kind, info in kinds.items()}
    return {kind: [[x if math.isfinite(x) else None for x in row] for row in t.tolist()]
            for kind, t in as_tables(importance, shapes, "head_view").items()}


def _check_kv_heads(kv_heads, kind: str, info: dict) -> int | None:
    """``g`` for ``kind`` (None: no grouping shown), checked to divide every layer's heads."""
    g = kv_heads.get(kind) if isinstance(kv_heads, Mapping) else kv_heads
    if g is None:
        return None
    if not isinstance(g, int) or isinstance(g, bool) or g < 1:
        raise TypeError(f"kv_heads must be an int >= 1 (or {{kind: int}}), got {g!r}")
    heads = sorted({w.shape[1] for w in info["layers"] if w is not None})
    if any(h % g for h in heads):
        raise ValueError(f"kv_heads={g} does not divide the {kind!r} layers' query heads "
                         f"{heads}; pass the model's number of key/value heads (a divisor)")
    return g


def _check_generated(start, sides: dict, batch: int) -> list[int] | None:
    """One first-generated position per example on the ``tgt`` side, or None."""
    if start is None:
        return None
    if "tgt" not in sides:
        raise ValueError("generated_start marks decoder tokens, but these attentions have no "
                         "decoder side (pass 'decoder_self' or 'cross' weights)")
    starts = [start] * batch if isinstance(start, int) else list(start)
    if len(starts) != batch or not all(isinstance(s, int) and not isinstance(s, bool)
                                       for s in starts):
        raise TypeError(f"generated_start must be an int or {batch} ints (one per example), "
                        f"got {start!r}")
    for b, (s, toks) in enumerate(zip(starts, sides["tgt"], strict=True)):
        if not 0 < s <= len(toks):
            raise ValueError(f"generated_start={s} for example {b}: expected 1..{len(toks)} "
                             "(the prompt has at least one token; the generated part may be "
                             "empty)")
    return starts


# ----------------------------------------------------------------------------- page

def _page(meta: dict, blocks: list[str]) -> str:
    # "<" escaped so no token can close the <script> element.
    meta_json = json.dumps(meta, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    title = html.escape(meta["title"])
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:;\">",
        f"<title>{title}</title><style>{asset('head_view.css')}</style></head>\n<body>",
        f'<script type="application/json" id="hw-meta">{meta_json}</script>\n',
        f"<script>{asset('head_view.js')}</script>\n",
        "\n".join(blocks),
        "\n<script>window.headwise && window.headwise._dataLoaded();</script></body></html>\n",
    ])


def score_labels(rows: list[list[float | None]]) -> list[list[str | None]]:
    """The grid's importance bar labels, in one format for every score of a kind (a grid of
    ``21.0``, ``23.0`` and ``9.000`` reads as three kinds of number): whole numbers when every
    score is one (ranks, counts); else one count of decimals, three significant digits of the
    largest magnitude; under 0.01 or from 1e5 on, every label in one scientific form (6.5e-3).
    None (no score) stays None; the exact value is the bar's tooltip."""
    values = [v for row in rows for v in row if v is not None]
    top = max((abs(v) for v in values), default=0.0)
    if top < 1e5 and all(float(v).is_integer() for v in values):
        form = "{:.0f}"
    elif top < 0.01 or top >= 1e5:
        form = "{:.1e}"
    else:
        form = f"{{:.{max(0, 2 - math.floor(math.log10(top)))}f}}"

    def label(v: float) -> str:
        text = form.format(v).replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")
        return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.00"

    return [[None if v is None else label(v) for v in row] for row in rows]
