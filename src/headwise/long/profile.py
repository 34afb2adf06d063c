"""The result of a long-context pass: :class:`LongProfile`, saved and loaded strictly.

Axis legend: ``l`` profiled layers, ``h`` profiled query heads, ``g`` key/value groups,
``I`` query blocks, ``J`` key blocks, ``D`` distance bins, ``j`` key positions, ``k`` top keys
per query block.

Every mass is a probability mass of the attention the model ran (masks, sliding windows,
soft-capping and sinks included), averaged over the live query rows (rows with at least one
allowed key) and the batch. A file is one safetensors file: the tensors, and the rest as JSON
in its metadata, written atomically (a reader never sees half a file).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headwise._io import atomic_write
from headwise.errors import CheckpointError

__all__ = ["FORMAT", "STREAMING_LIKE", "LongProfile", "classes", "group_scores"]

FORMAT = "headwise.long/1"
# scores where a group is only as streaming as its least streaming head (min over its heads);
# every other score takes the group's largest head (a group retrieves if one head does)
STREAMING_LIKE = frozenset({"streaming", "sink", "local"})
TENSORS = ("maps", "distance", "distance_edges", "sink", "local", "received", "topk_keys",
           "topk_mass")
META = ("n", "block", "layers", "heads", "heads_per_layer", "groups_per_layer", "sinks",
        "window", "tokens")
SHOWN = ("streaming", "sink", "local", "far", "mean_distance", "retrieval")  # repr columns


@dataclass
class LongProfile:
    """Per-head statistics of one long document, for the profiled layers and heads.

    Attributes:
        n: tokens in the document (keys of the last row).
        block: tokens per block of the block maps (the last block may be shorter).
        layers: the profiled layers' indices (the ``l`` axis).
        heads: the profiled query heads of each layer (the ``h`` axis).
        heads_per_layer, groups_per_layer: the model's query heads and key/value groups.
        sinks, window: the first ``sinks`` keys are the sink; the last ``window`` keys up to a
            query (its own included) are its local window.
        maps: ``(l, h, I, J)`` mean over query block I's rows of the mass on key block J.
        distance: ``(l, h, D)`` mass at query-key distances ``distance_edges[d] <= i - j <
            distance_edges[d + 1]`` (edges 0, 1, 2, 4, ..., then n).
        distance_edges: ``(D + 1,)``.
        sink, local: ``(l, h)`` mass on the sink keys / in the local window.
        received: ``(l, h, j)`` attention each key receives (column sums over query rows,
            batch mean): H2O's score.
        topk_keys, topk_mass: ``(l, h, I, k)`` the keys with the most mean mass over query
            block I's rows, and that mass.
        scores: ``{name: (l, h)}`` per-head scores (``streaming``: mass on sinks or window;
            ``far``: mass further back than ``far`` tokens, the sinks aside; ``mean_distance``;
            ``max_logit``
            and any user reduction giving one number per head).
        group_scores: ``{name: (l, g)}`` the same per key/value group (:func:`group_scores`).
        reduced: ``{name: tensor}`` what user reductions returned (leading axis ``l``).
        tokens: the document's tokens as text (for the view).
    """

    n: int
    block: int
    layers: list[int]
    heads: list[int]
    heads_per_layer: int
    groups_per_layer: int
    sinks: int
    window: int
    maps: torch.Tensor
    distance: torch.Tensor
    distance_edges: torch.Tensor
    sink: torch.Tensor
    local: torch.Tensor
    received: torch.Tensor
    topk_keys: torch.Tensor
    topk_mass: torch.Tensor
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    group_scores: dict[str, torch.Tensor] = field(default_factory=dict)
    reduced: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.group_scores:
            self.group_scores = group_scores(self.scores, self.heads, self.heads_per_layer,
                                             self.groups_per_layer)

    def classes(self, retrieval: torch.Tensor | None = None, *, streaming_at: float = 0.9,
                retrieval_at: float = 0.1) -> dict[str, torch.Tensor]:
        """Head classes for a KV cache (:func:`classes`: 2 retrieval, 1
        streaming, 0 full): ``{"heads": (l, h), "groups": (l, g)}`` int8, from
        ``scores["streaming"]`` and ``retrieval (l, h)`` (default ``scores["retrieval"]``,
        e.g. from :func:`headwise.long.retrieval`'s needle profile of the same heads).
        A group is streaming only if all its heads are, retrieval if any is."""
        retrieval = self.scores.get("retrieval") if retrieval is None else retrieval
        if retrieval is None:
            raise ValueError("LongProfile.classes: no retrieval score; pass retrieval= (l, h), "
                             "e.g. headwise.long.retrieval(model, tokenizer)[0].scores"
                             "['retrieval']")
        retrieval = torch.as_tensor(retrieval).float()
        streaming = self.scores["streaming"]
        if retrieval.shape != streaming.shape:
            raise ValueError(f"LongProfile.classes: retrieval has shape {tuple(retrieval.shape)}"
                             f", the profiled heads {tuple(streaming.shape)}; profile the same "
                             "layers and heads")
        groups = group_scores({"streaming": streaming, "retrieval": retrieval}, self.heads,
                              self.heads_per_layer, self.groups_per_layer)
        return {"heads": classes(streaming, retrieval, streaming_at=streaming_at,
                                 retrieval_at=retrieval_at),
                "groups": classes(groups["streaming"].nan_to_num(0.0),
                                  groups["retrieval"].nan_to_num(0.0),
                                  streaming_at=streaming_at, retrieval_at=retrieval_at)}

    @property
    def map_bytes(self) -> int:
        """Bytes of the tensors this profile holds (what it costs beside the forward)."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def head_table(self, names=SHOWN, top: int | None = None, by: str | None = None) -> list[str]:
        """A row per profiled head (``layer.head``) of the per-head ``scores`` in ``names``;
        with ``by``, sorted by that score, largest first, and cut to ``top`` rows."""
        names = [x for x in names if x in self.scores]
        flat = {x: self.scores[x].reshape(-1).tolist() for x in names}
        rows = [(li, hi) for li in range(len(self.layers)) for hi in range(len(self.heads))]
        order = list(range(len(rows)))
        if by is not None:
            order.sort(key=lambda r: -flat[by][r])
        order = order[:top] if top is not None else order
        lines = ["  head   " + " ".join(f"{x:>13}" for x in names)]
        for r in order:
            li, hi = rows[r]
            label = f"{self.layers[li]}.{self.heads[hi]}"
            lines.append(f"  {label:<6} " + " ".join(f"{flat[x][r]:>13.4g}" for x in names))
        return lines

    def __repr__(self) -> str:
        head = (f"LongProfile n={self.n} block={self.block} layers={len(self.layers)} "
                f"heads={len(self.heads)} of {self.heads_per_layer} "
                f"(groups {self.groups_per_layer}) sinks={self.sinks} window={self.window}")
        return "\n".join([head, *self.head_table()])

    def _tensors(self) -> dict[str, torch.Tensor]:
        out = {name: getattr(self, name) for name in TENSORS}
        for kind in ("scores", "group_scores", "reduced"):
            out |= {f"{kind}/{k}": v for k, v in getattr(self, kind).items()}
        return {k: v.detach().to("cpu").clone() for k, v in out.items()}  # none shares memory

    def save(self, path: str | Path) -> Path:
        """Write the profile to ``path`` (a ``.safetensors`` file), atomically."""
        from safetensors.torch import save

        path = Path(path)
        if path.suffix != ".safetensors":
            raise ValueError(f"LongProfile.save: {str(path)!r} must end in .safetensors "
                             "(e.g. profile.safetensors)")
        meta = {name: getattr(self, name) for name in META}
        blob = save(self._tensors(), metadata={"format": FORMAT, "meta": json.dumps(meta)})
        return atomic_write(path, lambda f: f.write(blob))

    @classmethod
    def load(cls, path: str | Path) -> LongProfile:
        """Read a profile :meth:`save` wrote; a damaged or foreign file is one
        :class:`~headwise.errors.CheckpointError` line."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        path = Path(path)
        data = path.read_bytes()
        try:
            tensors = load(data)
            meta = _metadata(data)
        except (SafetensorError, ValueError, KeyError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: not a readable headwise long profile ({e}); "
                                  "make it again with headwise long --save") from None
        return _assemble(cls, tensors, meta, path)


def _metadata(data: bytes) -> dict:
    """The JSON metadata of a safetensors file's bytes (its header), checked for the format."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    meta = header.get("__metadata__") or {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
    return json.loads(meta["meta"])


def _assemble(cls, tensors: dict, meta: dict, path: Path) -> LongProfile:
    """The profile from a file's parts, every field and shape checked."""
    missing = [x for x in (*TENSORS,) if x not in tensors] + [x for x in META if x not in meta]
    if missing:
        raise CheckpointError(f"{path}: a headwise long profile without {missing[0]!r}; make "
                              "it again with headwise long --save")
    parts = {k: {name.split("/", 1)[1]: v for name, v in tensors.items()
                 if name.startswith(k + "/")} for k in ("scores", "group_scores", "reduced")}
    p = cls(**{x: meta[x] for x in META}, **{x: tensors[x] for x in TENSORS}, **parts)
    l, h = len(p.layers), len(p.heads)
    blocks = math.ceil(p.n / p.block) if p.block > 0 else -1
    want = {"maps": (l, h, blocks, blocks), "received": (l, h, p.n), "sink": (l, h),
            "local": (l, h), "distance": (l, h, p.distance_edges.numel() - 1)}
    want |= {f"scores/{k}": (l, h) for k in p.scores}
    got = {**{x: tuple(getattr(p, x).shape) for x in ("maps", "received", "sink", "local",
                                                       "distance")},
           **{f"scores/{k}": tuple(v.shape) for k, v in p.scores.items()}}
    bad = next((k for k in want if got[k] != want[k]), None)
    if bad is None and len(p.tokens) not in (0, p.n):
        bad = "tokens"
    if bad is not None:
        raise CheckpointError(f"{path}: {bad} of shape {got.get(bad, len(p.tokens))} does not "
                              f"fit n={p.n}, block={p.block}, {l} layers x {h} heads; the file "
                              "is damaged: make it again with headwise long --save")
    return p


def group_scores(scores: dict[str, torch.Tensor], heads: list[int], per_layer: int,
                 groups: int) -> dict[str, torch.Tensor]:
    """``{name: (l, g)}`` per key/value group from per-head ``scores (l, h)`` of the query
    ``heads`` profiled: a group is as streaming as its least streaming head (min over its heads,
    :data:`STREAMING_LIKE`), and as high on any other score as its highest head (max). A group
    none of whose heads was profiled is NaN."""
    per_group = per_layer // max(1, groups)
    owner = torch.tensor([x // per_group for x in heads], dtype=torch.long)
    out = {}
    for name, s in scores.items():
        if s.dim() != 2:
            continue
        s = s.double()
        fill = float("inf") if name in STREAMING_LIKE else float("-inf")
        g = torch.full((s.shape[0], groups), fill, dtype=s.dtype)
        reduce = "amin" if name in STREAMING_LIKE else "amax"
        g.scatter_reduce_(1, owner.expand(s.shape[0], -1), s, reduce=reduce)
        out[name] = g.masked_fill_(torch.isinf(g), float("nan")).float()
    return out


def classes(streaming: torch.Tensor, retrieval: torch.Tensor, *, streaming_at: float = 0.9,
            retrieval_at: float = 0.1) -> torch.Tensor:
    """``(l, h)`` (or ``(l, g)``) int8 class per head: 2 retrieval (``retrieval >=
    retrieval_at``), else 1 streaming (``streaming >= streaming_at``), else 0 full (neither
    claim holds: keep its whole cache). Retrieval wins: a head that reads a far pass key must
    keep far keys, whatever its mass on sinks and window."""
    out = torch.zeros(streaming.shape, dtype=torch.int8)
    out[streaming >= streaming_at] = 1
    out[retrieval >= retrieval_at] = 2
    return out
