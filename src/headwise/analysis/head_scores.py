"""One score per head: a ``(layers, heads)`` table per attention kind, with ranking, JSON and a
plot. :func:`headwise.importance` returns one; anything that scores heads can build one.

Layers with fewer heads than the widest layer of their kind (pruned models) hold NaN in the
missing places; NaN means "no score" everywhere and is left out of every ranking.

Every table says how far it can be trusted: its method, how many examples it was computed on,
and (when computed) ``agreement``, the Spearman correlation of its ranking with single-head
zero ablation on the same data (:func:`spearman`), the reference of what removing a head does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

__all__ = ["HeadScores", "as_heads", "spearman"]


@dataclass(frozen=True)
class HeadScores:
    """Per-head scores of one model.

    Attributes:
        method: how they were computed (``"gradient"``, ``"ablation"``, ``"prev_token"``, ...).
        scores: ``{kind: (layers, heads) float64 tensor}``; larger = more important (or, for a
            behavioural score, more of that behaviour).
        details: what else the method reports (baseline loss, ablation mode, batches, ...).
        examples: how many examples (sequences) the scores were computed on (None: unknown).
        agreement: Spearman correlation of this ranking with single-head zero ablation on the
            same data (None: not computed; see :meth:`with_agreement`).
    """

    method: str
    scores: dict[str, torch.Tensor]
    details: dict = field(default_factory=dict)
    examples: int | None = None
    agreement: float | None = None

    def __post_init__(self):
        if not isinstance(self.scores, Mapping) or not self.scores:
            raise ValueError("HeadScores: scores must be a non-empty dict kind -> (layers, heads)")
        fixed = {}
        for kind, table in self.scores.items():
            t = torch.as_tensor(table).detach().to("cpu", torch.float64)
            if t.dim() != 2:
                raise ValueError(f"HeadScores: scores[{kind!r}] must be (layers, heads), got "
                                 f"shape {tuple(t.shape)}")
            fixed[kind] = t
        object.__setattr__(self, "scores", fixed)

    def __getitem__(self, kind: str) -> torch.Tensor:
        if kind not in self.scores:
            raise KeyError(f"no scores for kind {kind!r}; this model has {sorted(self.scores)}")
        return self.scores[kind]

    @property
    def kinds(self) -> list[str]:
        return list(self.scores)

    def flat(self) -> torch.Tensor:
        """Every cell, kind after kind, layers then heads (NaN where a head has no score)."""
        return torch.cat([t.flatten() for t in self.scores.values()])

    def spearman(self, other: HeadScores) -> float:
        """Spearman correlation of the two rankings over the heads both score."""
        if {k: tuple(t.shape) for k, t in self.scores.items()} != \
                {k: tuple(t.shape) for k, t in other.scores.items()}:
            raise ValueError(f"HeadScores.spearman: the tables differ ({self.method}: "
                             f"{_shapes(self)}, {other.method}: {_shapes(other)}); compare "
                             "scores of the same model")
        a, b = self.flat(), other.flat()
        both = ~(a.isnan() | b.isnan())
        return spearman(a[both], b[both])

    def with_agreement(self, reference: HeadScores) -> HeadScores:
        """A copy whose ``agreement`` is its Spearman correlation with ``reference`` (single-head
        zero ablation on the same data)."""
        return replace(self, agreement=self.spearman(reference))

    def describe(self) -> str:
        """One line: how the scores were made and how far they can be trusted."""
        mode = self.details.get("ablation")
        removing = self.method in ("ablation", "greedy", "attribution")
        made = f"{self.method} ({mode})" if mode and removing else self.method
        size = "examples unknown" if self.examples is None else f"{self.examples} examples"
        parts = [f"{made} on {size}"]
        if self.method == "ablation" and mode == "zero":
            parts.append("measured: the loss change when each head alone is zeroed")
        elif self.method == "greedy" and mode == "zero":
            parts.append("measured: heads zeroed one by one, each time the one whose removal "
                         "raises the loss least; score = the step it goes at (0 = first)")
        if self.agreement is not None:
            parts.append(f"agreement with single-head zero ablation: Spearman "
                         f"{self.agreement:.2f}")
        elif len(parts) == 1:
            parts.append("agreement with ablation not computed")
        return "; ".join(parts)

    def ranked(self, *, descending: bool = True) -> list[tuple[str, int, int, float]]:
        """Every scored head as ``(kind, layer, head, score)``, highest first (ties: in kind,
        layer, head order)."""
        rows = [(kind, l, h, float(v)) for kind, t in self.scores.items()
                for (l, h), v in zip(_cells(t), t.flatten().tolist(), strict=True)
                if not math.isnan(v)]
        return sorted(rows, key=lambda r: -r[3] if descending else r[3])

    def most(self, k: int) -> dict[str, dict[int, list[int]]]:
        """The ``k`` highest-scoring heads as ``{kind: {layer: [heads]}}``."""
        return as_heads(self.ranked()[:_count(k, "most")])

    def least(self, k: int) -> dict[str, dict[int, list[int]]]:
        """The ``k`` lowest-scoring heads as ``{kind: {layer: [heads]}}`` (the selection form of
        :func:`headwise.ablate` and of pruning)."""
        return as_heads(self.ranked(descending=False)[:_count(k, "least")])

    def to_dict(self) -> dict:
        return {"method": self.method,
                "scores": {kind: [[None if math.isnan(v) else v for v in row]
                                  for row in t.tolist()] for kind, t in self.scores.items()},
                "details": self.details, "examples": self.examples,
                "agreement": self.agreement}

    def to_json(self, path: str | Path | None = None) -> str:
        """The scores as JSON (NaN as null); written to ``path`` too when given."""
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_json(cls, text: str) -> HeadScores:
        d = json.loads(text)
        nan = float("nan")
        return cls(d["method"], {kind: torch.tensor([[nan if v is None else v for v in row]
                                                     for row in rows], dtype=torch.float64)
                                 for kind, rows in d["scores"].items()}, d.get("details", {}),
                   d.get("examples"), d.get("agreement"))

    def plot(self, path: str | Path, *, title: str | None = None) -> Path:
        """Write :meth:`figure` to ``path`` (.png, .svg or .pdf); returns the path."""
        import matplotlib.pyplot as plt

        path = Path(path)
        fig = self.figure(title=title)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def figure(self, *, title: str | None = None):
        """The tables as one heatmap per kind (layers down, heads across, each cell labelled
        with its score), on one colour scale: one rank orders every kind's heads, so one
        colour is one score in every panel, read off the one colour bar."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import Normalize

        kinds = self.kinds
        widest = max(t.shape[1] for t in self.scores.values())
        fig, axes = plt.subplots(1, len(kinds), squeeze=False, layout="constrained",
                                 figsize=(1.6 + 0.7 * widest * len(kinds),
                                          1.6 + 0.5 * max(t.shape[0] for t in self.scores.values())))
        finite = torch.cat([t[~t.isnan()].flatten() for t in self.scores.values()])
        lo, hi = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 1.0)
        norm = Normalize(lo, hi if hi > lo else lo + 1)
        images = [_draw(ax, kind, self.scores[kind], norm)
                  for ax, kind in zip(axes[0], kinds, strict=True)]
        fig.colorbar(images[0], ax=axes[0].tolist(), fraction=0.046, pad=0.04, label="score")
        fig.suptitle(title or f"head importance: {self.describe()}", fontsize=9)
        return fig


def _draw(ax, kind: str, t: torch.Tensor, norm):
    image = ax.imshow(t.numpy(), cmap="viridis", norm=norm, aspect="auto")
    ax.set_title(kind)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(t.shape[1]))
    ax.set_yticks(range(t.shape[0]))
    for (l, h), v in zip(_cells(t), t.flatten().tolist(), strict=True):
        if not math.isnan(v):  # dark text on the light (upper) half of viridis
            ax.text(h, l, f"{v:.2g}", ha="center", va="center", fontsize=8,
                    color="black" if norm(v) > 0.5 else "white")
    return image


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two 1-d tensors (Pearson of the ranks; ties are broken by
    position)."""
    if a.dim() != 1 or a.shape != b.shape or len(a) < 2:
        raise ValueError(f"spearman: expected two 1-d tensors of one length >= 2, got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    ra = a.argsort().argsort().double()
    rb = b.argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def _shapes(scores: HeadScores) -> dict:
    return {k: tuple(t.shape) for k, t in scores.scores.items()}


def _cells(t: torch.Tensor):
    return [(l, h) for l in range(t.shape[0]) for h in range(t.shape[1])]


def _count(k, name: str) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"HeadScores.{name}: k must be an int >= 0, got {k!r}")
    return k


def as_heads(rows) -> dict[str, dict[int, list[int]]]:
    """``(kind, layer, head, ...)`` rows as the selection ``{kind: {layer: [heads]}}``."""
    out: dict[str, dict[int, list[int]]] = {}
    for kind, layer, head, *_ in rows:
        out.setdefault(kind, {}).setdefault(layer, []).append(head)
    return {kind: {l: sorted(hs) for l, hs in sorted(per.items())} for kind, per in out.items()}

