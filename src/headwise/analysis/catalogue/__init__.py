"""The head catalogue: what every head does over a whole dataset, from streaming statistics.

Axis legend: ``b`` batch, ``h`` heads, ``i`` query position, ``j`` key position, ``c`` a chunk
of query rows, ``v`` vocabulary, ``o`` relative-offset bucket, ``g`` position bin.

:func:`catalogue` runs a model over batches and, for every attention kind, layer and head,
reduces the weights chunk by chunk (:func:`headwise.stats.head_stats` and
:func:`headwise.weights.from_lse`: never ``(i, j)`` for all heads at once) into dataset-level
numbers, each a mean over the real query rows of every input (padding left out):

- the scores of :mod:`headwise.stats`: ``entropy``, ``max_weight``, ``sink``, ``prev_token``,
  ``induction`` (self-attention), ``distance``;
- ``next_token`` (weight on the key just after the query) and ``self`` (on the query's own
  position), read from the relative-offset profile (self-attention);
- ``mirror``: weight on the mirrored key ``n_k - 1 - i`` (``n_k`` the input's key length): the
  anti-diagonal a model that reverses its input must read (decoder position ``t`` predicts
  ``y[t] = x[n-1-t]``);
- a typical pattern: the mean weight at each key offset ``-window..window`` (self-attention),
  and a ``grid x grid`` heatmap of weights on positions scaled to the input's length (each
  row sums to 1), averaged over the dataset;
- the tokens each head attends to most: its share of the head's attention mass per key token,
  and the lift over what uniform attention over the same keys would give.

The page and JSON are written by :func:`headwise.viz.catalogue_page` / :meth:`Catalogue.save`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from headwise import fast as _fast
from headwise import stats as _stats
from headwise import weights as _weights
from headwise.analysis.catalogue.inputs import Prepared, attention_modules, prepare
from headwise.analysis.catalogue.result import SCORES, SELF_ONLY, Catalogue
from headwise.kinds import KINDS
from headwise.models.heads import head_count

__all__ = ["Catalogue", "catalogue", "SCORES"]

_FROM_STATS = ("entropy", "max_weight", "sink", "prev_token", "induction", "distance")


@dataclass
class _Layer:
    """Running sums of one layer of one kind, all ``float64``, on the device of the model's
    attention calls (:meth:`to` moves them once, at the end: a GPU is never read back inside
    the per-layer collection)."""

    heads: int
    offsets: int
    grid: int
    rows: torch.Tensor = None      # (h,) query rows counted
    mirror_rows: torch.Tensor = None  # (h,) rows that have a mirrored key
    sums: dict = field(default_factory=dict)   # score -> (h,)
    profile: torch.Tensor = None   # (h, o) summed weights per key offset bucket
    pattern: torch.Tensor = None   # (h, g, g) summed binned rows
    pattern_rows: torch.Tensor = None  # (g,) rows per query bin
    mass: torch.Tensor = None      # (h, v) attention mass per key token
    uniform: torch.Tensor = None   # (v,) mass uniform attention would put on each token
    seen: torch.Tensor = None      # (v,) occurrences of each token as a real key

    def __post_init__(self):
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.rows, self.mirror_rows = z(self.heads), z(self.heads)
        self.profile = z(self.heads, self.offsets)
        self.pattern, self.pattern_rows = z(self.heads, self.grid, self.grid), z(self.grid)
        self.mass, self.uniform, self.seen = z(self.heads, 0), z(0), z(0)

    def to(self, device) -> _Layer:
        """Every running sum moved to ``device`` (in place; returns self)."""
        for name in ("rows", "mirror_rows", "profile", "pattern", "pattern_rows", "mass",
                     "uniform", "seen"):
            setattr(self, name, getattr(self, name).to(device))
        self.sums = {key: value.to(device) for key, value in self.sums.items()}
        return self

    def grow(self, vocab: int) -> None:
        """Widen the token tables to ``vocab`` ids (a Python int: no device read)."""
        grow = vocab - self.mass.shape[1]
        if grow > 0:
            pad = torch.nn.functional.pad
            self.mass, self.uniform = pad(self.mass, (0, grow)), pad(self.uniform, (0, grow))
            self.seen = pad(self.seen, (0, grow))


@torch.no_grad()
def catalogue(model: torch.nn.Module, batches, *, tokens: Callable | None = None,
              window: int = 8, grid: int = 16, top_tokens: int = 10,
              importance: Mapping | None = None, name: str | None = None,
              dataset: str | None = None, budget: int | None = None) -> Catalogue:
    """Run ``model`` over ``batches`` and describe every head (see the module docstring).

    Args:
        model: a headwise :class:`~headwise.models.Transformer`, :class:`TransformerLM` or
            :class:`BertModel`.
        batches: an iterable of batches (or one batch): :class:`~headwise.data.Seq2SeqBatch`
            (encoder-decoder), :class:`~headwise.data.LMBatch` or ``(b, n)`` token ids
            (language model), ``{"input_ids", "attention_mask"}`` dicts or ``(b, n)`` ids (BERT).
        tokens: ``ids (list[int]) -> names (list[str])`` for the token lists (default: ids).
        window: the relative-offset profile covers keys ``-window..window`` from the query
            (plus one bucket for each side beyond).
        grid: side of the averaged, length-scaled heatmap of each head.
        top_tokens: tokens listed per head.
        importance: optional ``{kind: (layers, heads)}`` scores (e.g. ``headwise.importance``'s
            table) shown as one more column.
        name, dataset: labels for the page and the JSON.
        budget: elements of one chunk of recomputed weights (default: the device's,
            :func:`headwise.fast.block_elements`).
    """
    _check_args(window, grid, top_tokens)
    modules = attention_modules(model)
    acc = {(kind, l): _Layer(head_count(m), 2 * window + 3, grid)
           for kind, layers in modules.items() for l, m in enumerate(layers)}
    where = {id(m): (kind, l) for kind, layers in modules.items() for l, m in enumerate(layers)}
    current: list[Prepared] = []
    counts = {"inputs": 0, "batches": 0}

    def observe(module, q, k, mask, causal, scale, self_attention):
        if id(module) in where:
            kind, layer = where[id(module)]
            _add_call(acc[kind, layer], current[0], kind, q, k, mask, causal, scale, window,
                      budget)

    device = next(model.parameters()).device
    for layer in acc.values():
        layer.to(device)
    with _stats.observing(observe):
        for batch in _iterate(batches):
            current[:] = [prepare(model, batch)]
            # the one read of a value per batch, before the model runs: the token tables' width
            vocab = 1 + max(int(ids.max()) for ids, _ in current[0].sides.values())
            for layer in acc.values():
                layer.grow(vocab)
            current[0].run()
            counts["inputs"] += current[0].size
            counts["batches"] += 1
    if counts["inputs"] == 0:
        raise ValueError("catalogue: no data: batches is empty; pass at least one batch "
                         "(e.g. task.eval_set(256) or a (b, n) tensor of token ids)")
    for layer in acc.values():
        layer.to("cpu")  # the one read back of the sums, at the end
    return Catalogue._build(acc, modules, tokens or (lambda ids: [str(i) for i in ids]),
                            window=window, grid=grid, top_tokens=top_tokens,
                            importance=importance, name=name or type(model).__name__,
                            dataset=dataset or "", counts=counts)


def _iterate(batches):
    from headwise.data import LMBatch, Seq2SeqBatch
    if isinstance(batches, (torch.Tensor, Seq2SeqBatch, LMBatch, Mapping)):
        yield batches
        return
    if isinstance(batches, (str, bytes)) or not hasattr(batches, "__iter__"):
        raise TypeError(f"catalogue: batches must be a batch or an iterable of batches, got "
                        f"{type(batches).__name__}")
    yield from batches


def _check_args(window, grid, top_tokens) -> None:
    for label, value, low in (("window", window, 1), ("grid", grid, 2),
                              ("top_tokens", top_tokens, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"catalogue: {label} must be an int >= {low}, got {value!r}")


def _add_call(layer: _Layer, inp: Prepared, kind: str, q, k, mask, causal, scale, window,
              budget) -> None:
    """Reduce one attention call ``q (b, h, i, d)``, ``k (b, g, j, d)`` into ``layer``."""
    q_lens, k_lens, k_ids = inp.lengths(kind, q.shape[2], k.shape[2])
    budget = _fast.block_elements(q, k, cpu=_weights.CHUNK_ELEMENTS) if budget is None \
        else budget
    is_self = KINDS[kind].is_self
    st = _stats.head_stats(q, k, mask=mask, causal=causal, scale=scale, budget=budget,
                           token_ids=k_ids if is_self else None, top_k=1)
    valid = (torch.arange(q.shape[2], device=q.device)[None] < q_lens[:, None])  # (b, i)
    rows = (st.live & valid[:, None]).to(torch.float32)  # (b, h, i)
    layer.rows += rows.sum((0, 2)).double()
    for name in _FROM_STATS:
        x = getattr(st, name)
        if x is not None and (is_self or name not in SELF_ONLY):
            layer.sums[name] = layer.sums.get(name, 0) + (x * rows).sum((0, 2)).double()
    lse = _weights.logsumexp(q, k, mask=mask, causal=causal, scale=scale, budget=budget)
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    col = torch.zeros(b, h, nk, device=q.device)   # (b, h, j) mass on each key
    uni = torch.zeros(b, nk, device=q.device)      # (b, j) uniform attention's mass
    for r0, r1 in _weights.row_chunks(nq, b * h * nk, budget):
        w = _weights.from_lse(q, k, lse, mask=mask, causal=causal, scale=scale, budget=budget,
                              selection=_weights.Selection(rows=slice(r0, r1))).float()
        w = w * rows[:, :, r0:r1, None]  # padded query rows and dead rows count for nothing
        col += w.sum(2)
        uni += _uniform(r0, r1, nq, nk, k_lens, causal, mask, valid[:, r0:r1]).sum(1)
        _add_mirror(layer, w, r0, k_lens)
        _add_pattern(layer, w, r0, q_lens, k_lens, valid[:, r0:r1])
        if is_self:
            _add_profile(layer, w, r0, nq, nk, window)
    _add_tokens(layer, col, uni, k_ids, k_lens)


def _uniform(r0, r1, nq, nk, k_lens, causal, mask, valid) -> torch.Tensor:
    """``(b, c, j)`` the weights of uniform attention over the keys each row may see (the
    input's keys; with ``causal`` only those up to the query; with a mask, only those it allows:
    a Hugging Face model's mask carries causality itself, ``causal`` is then False)."""
    keys = torch.arange(nk, device=k_lens.device)
    allowed = (keys[None, None] < k_lens[:, None, None]).expand(-1, r1 - r0, -1)
    if causal:
        pos = torch.arange(r0, r1, device=keys.device) + (nk - nq)
        allowed = allowed & (keys[None, :] <= pos[:, None])[None]
    if mask is not None:  # broadcastable to (b, h, i, j); its first head (masks hold one)
        may = mask if mask.dtype == torch.bool else mask > float("-inf")
        may = torch.broadcast_to(may, (allowed.shape[0], may.shape[1], nq, nk))
        allowed = allowed & may[:, 0, r0:r1]
    u = allowed.float() / allowed.sum(-1, keepdim=True).clamp(min=1)
    return u * valid[..., None]


def _add_mirror(layer: _Layer, w, r0, k_lens) -> None:
    """Weight of each row on the mirrored key ``n_k - 1 - i`` (0 where there is none)."""
    c, nk = w.shape[2], w.shape[3]
    target = k_lens[:, None] - 1 - torch.arange(r0, r0 + c, device=w.device)[None]  # (b, c)
    ok = (target >= 0) & (target < nk)
    picked = w.gather(-1, target.clamp(0, nk - 1)[:, None, :, None].expand(-1, w.shape[1], -1, 1))
    value = (picked[..., 0] * ok[:, None]).sum((0, 2))
    layer.sums["mirror"] = layer.sums.get("mirror", 0) + value.double()
    live = (w.sum(-1) > 0.5) & ok[:, None]  # rows counted (weights of dropped rows were zeroed)
    layer.mirror_rows += live.sum((0, 2)).double()


def _add_pattern(layer: _Layer, w, r0, q_lens, k_lens, valid) -> None:
    """Spread query and key positions over ``g`` bins of the input's length: position ``p`` of
    ``n`` covers ``[p/n, (p+1)/n)``, and each bin gets its overlap (so inputs of every length
    fill the grid, and each row of the averaged pattern sums to 1)."""
    g, c, nk = layer.grid, w.shape[2], w.shape[3]
    kfrac = _overlap(torch.arange(nk, device=w.device), k_lens, g) * k_lens[:, None, None]
    qfrac = _overlap(torch.arange(r0, r0 + c, device=w.device), q_lens, g) * g
    qfrac = qfrac * valid[..., None]  # (b, c, g)
    by_key = torch.einsum("bhcj,bjk->bhck", w, kfrac)  # (b, h, c, g) each row's mass per bin
    layer.pattern += torch.einsum("bhck,bcq->hqk", by_key, qfrac).double()
    layer.pattern_rows += qfrac.sum((0, 1)).double()


def _overlap(pos: torch.Tensor, lens: torch.Tensor, g: int) -> torch.Tensor:
    """``(b, p, g)`` length of ``[p/n, (p+1)/n) & [k/g, (k+1)/g)`` (0 for ``p >= n``)."""
    n = lens.clamp(min=1).to(torch.float32)[:, None, None]
    start, end = pos[None, :, None] / n, (pos[None, :, None] + 1) / n
    bins = torch.arange(g, device=pos.device, dtype=torch.float32)
    lo, hi = bins / g, (bins + 1) / g
    out = (torch.minimum(end, hi) - torch.maximum(start, lo)).clamp(min=0)
    return out * (pos[None, :, None] < lens[:, None, None])


def _add_profile(layer: _Layer, w, r0, nq, nk, window) -> None:
    """Sum weights by key offset ``j - pos(i)``, clamped to ``-window-1..window+1``."""
    c = w.shape[2]
    pos = torch.arange(r0, r0 + c, device=w.device) + (nk - nq)
    offset = torch.arange(nk, device=w.device)[None] - pos[:, None]  # (c, j)
    bucket = offset.clamp(-window - 1, window + 1) + window + 1
    out = torch.zeros(*w.shape[:3], 2 * window + 3, device=w.device)
    out.scatter_add_(-1, bucket[None, None].expand_as(w), w)
    layer.profile += out.sum((0, 2)).double()


def _add_tokens(layer: _Layer, col, uni, ids, k_lens) -> None:
    """Scatter each key's mass onto its token id (``(h, v)``), with the uniform baseline."""
    real = torch.arange(ids.shape[1], device=ids.device)[None] < k_lens[:, None]  # (b, j)
    ids = ids.masked_fill(~real, 0)  # the tables are as wide as the batch's ids (grow)
    h, flat = col.shape[1], ids.reshape(-1)
    per_key = (col * real[:, None]).permute(1, 0, 2).reshape(h, -1).double()
    layer.mass.index_add_(1, flat, per_key)
    layer.uniform.index_add_(0, flat, (uni * real).reshape(-1).double())
    layer.seen.index_add_(0, flat, real.reshape(-1).double())

