"""What :func:`headwise.catalogue` returns: one entry per head, JSON, ranking, the page."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from headwise.kinds import KINDS, as_tables
from headwise.models.heads import head_count

__all__ = ["Catalogue", "SCORES", "SELF_ONLY"]

# The per-head scores, in table order: (name, what it is). Streamed from headwise.stats unless
# marked; "self-only" scores are None for cross-attention (query and key positions differ).
SCORES = {
    "prev_token": "weight on the key just before the query (self-attention)",
    "next_token": "weight on the key just after the query (self-attention)",
    "self": "weight on the query's own position (self-attention)",
    "mirror": "weight on the mirrored key n_k - 1 - i (reversal: the anti-diagonal)",
    "induction": "weight on the keys right after earlier copies of the query's token",
    "sink": "weight on the first key",
    "entropy": "entropy of the weights, nats (low = focused)",
    "max_weight": "largest weight of the row (high = focused)",
    "distance": "mean |query - key| position under the weights",
}
SELF_ONLY = ("prev_token", "next_token", "self", "induction")


@dataclass(frozen=True)
class Catalogue:
    """Every head of one model over one dataset.

    Attributes:
        meta: model and dataset labels, counts (inputs, batches), ``window``, ``grid``, and the
            score descriptions.
        heads: one dict per head: ``kind``, ``layer``, ``head``, ``rows`` (query rows seen),
            ``scores`` (name -> float or None), ``profile`` (mean weight per key offset
            ``-window-1`` (further back) .. ``window+1`` (further on); self-attention only),
            ``pattern`` (``grid x grid`` mean weights on length-scaled positions), ``top_tokens``
            (``[{token, share, lift, count}]``: share of the head's attention on that key token,
            lift over uniform attention, occurrences as a key).
    """

    meta: dict
    heads: list

    @classmethod
    def _build(cls, acc, modules, names, *, window, grid, top_tokens, importance, name,
               dataset, counts) -> Catalogue:
        imp = _importance(importance, modules)
        heads = []
        for (kind, layer), a in acc.items():
            rows = a.rows.clamp(min=1)
            for h in range(a.heads):
                scores = {s: _score(a, s, h, kind, rows, window) for s in SCORES}
                if imp is not None:
                    scores["importance"] = imp.get(kind, {}).get((layer, h))
                heads.append({
                    "kind": kind, "layer": layer, "head": h, "rows": int(a.rows[h]),
                    "scores": scores,
                    "profile": (None if not KINDS[kind].is_self else
                                _rounded(a.profile[h] / rows[h])),
                    "pattern": _rounded(a.pattern[h] / a.pattern_rows.clamp(min=1)[:, None]),
                    "top_tokens": _tokens(a, h, names, top_tokens)})
        scores = dict(SCORES, **({"importance": "importance scores given"} if imp else {}))
        meta = {"model": name, "dataset": dataset, **counts, "window": window, "grid": grid,
                "scores": scores,
                "kinds": {kind: [head_count(m) for m in mods] for kind, mods in modules.items()}}
        return cls(meta, heads)

    def head(self, kind: str, layer: int, head: int) -> dict:
        """The entry of one head (KeyError naming what exists)."""
        for entry in self.heads:
            if (entry["kind"], entry["layer"], entry["head"]) == (kind, layer, head):
                return entry
        raise KeyError(f"no head {kind} layer {layer} head {head}; this model has "
                       f"{self.meta['kinds']} (kind: heads per layer)")

    def table(self, score: str) -> dict[str, torch.Tensor]:
        """``{kind: (layers, heads)}`` of one score (NaN where it does not apply)."""
        self._check_score(score)
        out = {}
        for kind, per_layer in self.meta["kinds"].items():
            t = torch.full((len(per_layer), max(per_layer)), math.nan, dtype=torch.float64)
            for e in self.heads:
                value = e["scores"][score] if e["kind"] == kind else None
                if value is not None:
                    t[e["layer"], e["head"]] = value
            out[kind] = t
        return out

    def ranked(self, score: str, *, kind: str | None = None, descending: bool = True) -> list:
        """Head entries with that score, highest first (``kind`` keeps only one kind)."""
        self._check_score(score)
        chosen = [e for e in self.heads if e["scores"][score] is not None
                  and (kind is None or e["kind"] == kind)]
        return sorted(chosen, key=lambda e: e["scores"][score], reverse=descending)

    def _check_score(self, score: str) -> None:
        if score not in self.meta["scores"]:
            raise ValueError(f"unknown score {score!r}; the catalogue has "
                             f"{', '.join(self.meta['scores'])}")

    def to_dict(self) -> dict:
        return {"meta": self.meta, "heads": self.heads}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The catalogue as JSON; written (atomically) to ``path`` too when given."""
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n"
        if path is not None:
            from headwise._io import atomic_write
            atomic_write(Path(path), lambda f: f.write(text), binary=False)
        return text

    @classmethod
    def from_json(cls, text: str) -> Catalogue:
        d = json.loads(text)
        return cls(d["meta"], d["heads"])

    def page(self, path: str | os.PathLike | None = None, *, title: str | None = None):
        """The offline HTML page (:func:`headwise.viz.catalogue_page`)."""
        from headwise.viz.catalogue import catalogue_page
        return catalogue_page(self, path, title=title)

    def __repr__(self) -> str:
        return (f"Catalogue({self.meta['model']}, {len(self.heads)} heads, "
                f"{self.meta['inputs']} inputs)")


def _score(a, name: str, h: int, kind: str, rows, window: int):
    if not KINDS[kind].is_self and name in SELF_ONLY:
        return None
    if name == "next_token":
        value = a.profile[h, window + 2] / rows[h]
    elif name == "self":
        value = a.profile[h, window + 1] / rows[h]
    elif name == "mirror":
        value = a.sums["mirror"][h] / a.mirror_rows[h] if a.mirror_rows[h] > 0 else None
    elif name in a.sums:
        value = a.sums[name][h] / rows[h]
    else:
        return None
    return None if value is None or a.rows[h] == 0 else float(value)


def _rounded(t: torch.Tensor) -> list:
    return [round(float(x), 6) for x in t] if t.dim() == 1 else [_rounded(r) for r in t]


def _tokens(a, h: int, names, k: int) -> list[dict]:
    total = float(a.mass[h].sum())
    if total <= 0:
        return []
    share = a.mass[h] / total
    base = a.uniform / a.uniform.sum().clamp(min=1e-30)
    top = share.topk(min(k, share.numel())).indices.tolist()
    labels = names(top)
    return [{"token": label, "id": i, "share": round(float(share[i]), 6),
             "lift": round(float(share[i] / base[i]), 4) if base[i] > 0 else None,
             "count": int(a.seen[i])} for i, label in zip(top, labels, strict=True)
            if share[i] > 0]


def _importance(importance, modules) -> dict | None:
    """``{kind: (layers, heads)}`` (a HeadScores or a tensor/array per kind) as
    ``{kind: {(layer, head): float | None}}``."""
    if importance is None:
        return None
    heads = {kind: [head_count(m) for m in ms] for kind, ms in modules.items()}
    shapes = {kind: (len(n), max(n)) for kind, n in heads.items()}
    return {kind: {(l, h): (None if math.isnan(t[l, h]) else float(t[l, h]))
                   for l, n in enumerate(heads[kind]) for h in range(n)}
            for kind, t in as_tables(importance, shapes, "catalogue").items()}
