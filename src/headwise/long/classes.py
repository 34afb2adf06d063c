"""Head classes for a KV cache: a retrieval score from a synthetic needle prompt, the classes
from the streaming and retrieval scores, and the per-head sinks + window restriction that checks
what "streaming" claims.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value groups, ``l`` layers, ``i`` query
position, ``j`` key position, ``n`` tokens.

- **streaming score** (``profile.scores["streaming"]``): the mass on the first ``sinks`` keys or
  the last ``window`` keys up to each query. A head near 1 could keep only those keys
  (DuoAttention's streaming heads).
- **retrieval score** (:func:`retrieval`): the mass that the rows reading out a pass key put on
  the pass key's tokens far back in a long Austen passage (Wu et al.'s retrieval heads,
  measured with attention mass instead of copy events).

A key/value group is streaming only if every query head in it is (min over its heads), and
retrieves if any head does (max): :func:`headwise.long.group_scores`.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from headwise.kvplan import streaming_allowed
from headwise.layers import MultiHeadAttention
from headwise.long.checks import attention_layers, counts
from headwise.long.profile import classes

__all__ = ["Needle", "SpanMass", "classes", "needle_prompt", "restrict", "retrieval"]  # classes: from profile


class SpanMass:
    """``(h,)``: the mean over query ``rows`` of the mass on keys ``keys[0] <= j < keys[1]``: a
    user reduction (a per-key sum over a query range)."""

    def __init__(self, rows: list[int], keys: tuple[int, int], name: str = "retrieval"):
        self.rows, self.keys, self.name = sorted(rows), keys, name

    def shape(self, call):
        return (call.h,)

    def init(self, call):
        self.out = torch.zeros(call.b, call.h, dtype=torch.float64, device=call.device)
        self.rows_t = torch.tensor(self.rows, device=call.device)

    def update(self, tile):
        inside = self.rows_t[(self.rows_t >= tile.r0) & (self.rows_t < tile.r1)] - tile.r0
        if inside.numel():
            lo, hi = min(self.keys[0], tile.kj), min(self.keys[1], tile.kj)
            self.out += tile.probs[:, :, inside, lo:hi].sum((-1, -2)).double()

    def finish(self):
        return (self.out / max(1, len(self.rows))).mean(0)


@dataclass
class Needle:
    """A pass key hidden in Austen: ``ids (1, n)`` the prompt with the answer appended,
    ``key`` the pass key's token span (``[start, stop)``), ``rows`` the rows that read it out
    (the question's last token and the answer's tokens but the last), ``answer`` its ids."""

    ids: torch.Tensor
    key: tuple[int, int]
    rows: list[int]
    answer: list[int]
    passkey: str


def needle_prompt(tokenizer, n: int, *, depth: float = 0.5, seed: int = 0) -> Needle:
    """A synthetic needle prompt of ``n`` tokens: Austen's text with "The pass key is NNNNN.
    Remember it. NNNNN is the pass key." at ``depth`` of it, then "What is the pass key? The
    pass key is" and the answer."""
    from headwise.data.corpora import austen_text

    passkey = str(random.Random(seed).randint(10000, 99999))
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    before, key, after = enc(" The pass key is"), enc(f" {passkey}"), enc(
        f". Remember it. {passkey} is the pass key. ")
    question, answer = enc(" What is the pass key? The pass key is"), enc(f" {passkey}")
    room = n - len(before) - len(key) - len(after) - len(question) - len(answer)
    if room < 16:
        raise ValueError(f"needle_prompt: n={n} leaves no room for text around the needle; use "
                         "n >= 128")
    filler = enc(austen_text()[:room * 8])[:room]
    cut = int(room * depth)
    ids = filler[:cut] + before + key + after + filler[cut:] + question + answer
    start = cut + len(before)
    last = len(ids) - len(answer) - 1
    return Needle(torch.tensor([ids]), (start, start + len(key)),
                  list(range(last, last + len(answer))), answer, passkey)


def retrieval(model, tokenizer, *, n: int = 2048, depth: float = 0.5, seed: int = 0,
              progress: bool = False, **options):
    """``(profile, needle)``: :func:`headwise.long.profile` of a :func:`needle_prompt` with
    ``profile.scores["retrieval"] (l, h)`` (and its group scores) the mass the read-out rows
    put on the pass key."""
    from headwise.long.run import profile

    needle = needle_prompt(tokenizer, n, depth=depth, seed=seed)
    span = SpanMass(needle.rows, needle.key)
    prof = profile(model, needle.ids, reductions=[span, *options.pop("reductions", ())],
                   progress=progress, **options)
    return prof, needle


@contextmanager
def restrict(model, heads: dict[int, list[int]], *, sinks: int = 4, window: int = 64):
    """Inside the block the chosen heads (``{layer: [heads]}``) attend only to the first
    ``sinks`` keys and the last ``window`` keys up to each query (what a streaming KV cache
    keeps); every other head is unchanged. Each chosen layer gets a ``(b, h, i, j)`` bool mask
    (True = may attend) in place of its own mask, causality and padding kept (a forward
    pre-hook; the model's own layers, headwise's or a transformers model's on headwise)."""
    layers = attention_layers(model)
    hooks = [layers[x].register_forward_pre_hook(_masker(hs, sinks, window), with_kwargs=True)
             for x, hs in heads.items()]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def _masker(heads: list[int], sinks: int, window: int):
    def hook(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else kwargs.get("query"))
        b, n = hidden.shape[0], hidden.shape[1]
        h = counts(module)[0]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        allowed = (j <= i).expand(b, h, n, n).clone()
        allowed[:, heads] = streaming_allowed(i, j, sinks, window)  # the KV plan's one rule
        name = "mask" if isinstance(module, MultiHeadAttention) else "attention_mask"
        old = kwargs.get(name)
        if old is not None:
            allowed &= old if old.dtype == torch.bool else torch.isfinite(old) & (old == 0)
        kwargs[name] = allowed.to(hidden.device)
        return args, kwargs
    return hook
