"""Synthetic tasks generated on the fly, deterministic in ``(seed, step)``.

Sequence-to-sequence: ``reverse`` (``abcd -> dcba``), ``copy`` (``abcd -> abcd``), ``sort``
(``dbca -> abcd``), with source lengths drawn uniformly from ``[min_len, max_len]``.
Language modelling: ``induction`` — a random segment followed by its repetition
(``x y z w | x y z w``): once the segment repeats, each next token is predictable only by
looking back at what followed the same token earlier (an induction head, Olsson et al. 2022).

Held-out split: a sequence belongs to the evaluation set iff a hash of it falls in one bucket
out of ``1 / eval_fraction``; training batches redraw such rows, so evaluation sequences are
never trained on.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from headwise.data.batches import LMBatch, Seq2SeqBatch, collate_lm, collate_seq2seq
from headwise.data.tokenizers import CharTokenizer

__all__ = ["MAX_LEN", "SEQ2SEQ_TASKS", "InductionTask", "SyntheticSeq2Seq"]

SEQ2SEQ_TASKS = ("reverse", "copy", "sort")
MAX_LEN = 4096  # longest synthetic sequence (the model's attention is O(n^2) in it)
_EVAL_BUCKETS = 10  # 1 sequence in 10 is held out
_TRAIN, _EVAL = 0, 1


def _rng(seed: int, stream: int, step: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, step])


def _is_heldout(rows: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """(b,) bool: the rows (padded (b, n) int arrays) whose hash lands in the eval bucket."""
    n = rows.shape[1]
    weights = np.array([pow(1_000_003, k, 2**61 - 1) for k in range(n)], dtype=np.uint64)
    valid = np.arange(n)[None, :] < lens[:, None]
    h = ((rows.astype(np.uint64) + 1) * valid * weights[None, :]).sum(axis=1) + lens.astype(np.uint64)
    h = (h ^ (h >> np.uint64(29))) * np.uint64(0x9E3779B97F4A7C15)
    return (h >> np.uint64(40)) % np.uint64(_EVAL_BUCKETS) == 0


def _draw(rng: np.random.Generator, count: int, min_len: int, max_len: int, vocab: int,
          heldout: bool) -> tuple[np.ndarray, np.ndarray]:
    """``count`` rows of symbol ids (padded to max_len) on the requested side of the split."""
    lens = rng.integers(min_len, max_len + 1, size=count)
    rows = rng.integers(0, vocab, size=(count, max_len))
    todo = _is_heldout(rows, lens) != heldout
    while todo.any():  # redraw the symbols (not the length) of rows on the wrong side
        rows[todo] = rng.integers(0, vocab, size=(int(todo.sum()), max_len))
        todo = _is_heldout(rows, lens) != heldout
    return rows, lens


@dataclass
class _Synthetic:
    min_len: int
    max_len: int
    num_symbols: int
    seed: int

    def __post_init__(self):
        for name in ("min_len", "max_len", "num_symbols", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int; got {value!r}")
        if self.max_len > MAX_LEN:
            raise ValueError(f"max_len={self.max_len:,} is over the maximum {MAX_LEN:,} for a "
                             f"synthetic task; pass --max-len <= {MAX_LEN}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len; got min_len={self.min_len}, "
                             f"max_len={self.max_len}")
        if not 2 <= self.num_symbols <= 52:
            raise ValueError(f"num_symbols must be in 2..52 (letters a-z, A-Z); got "
                             f"{self.num_symbols}")
        if self.num_symbols ** self.min_len < 20 * _EVAL_BUCKETS:
            raise ValueError(
                f"only {self.num_symbols}**{self.min_len} distinct sequences of the shortest "
                f"length: too few to hold any out; raise min_len or num_symbols")
        self.tokenizer = CharTokenizer(string.ascii_letters[:self.num_symbols])
        self._first = self.tokenizer.encode(self.tokenizer.alphabet[0])[0]

    def batch(self, step: int, size: int) -> Seq2SeqBatch | LMBatch:
        """The global training batch of ``step`` (never contains a held-out sequence)."""
        return self._batch(_rng(self.seed, _TRAIN, step), size, heldout=False)

    def eval_set(self, size: int) -> Seq2SeqBatch | LMBatch:
        """``size`` held-out sequences (the same for every call and every training step)."""
        return self._batch(_rng(self.seed, _EVAL, 0), size, heldout=True)


class SyntheticSeq2Seq(_Synthetic):
    """``reverse`` / ``copy`` / ``sort`` on random strings over the first ``num_symbols``
    letters. ``batch(step, size)`` is the training batch of ``step``; ``eval_set(size)`` the
    fixed held-out set."""

    kind = "transformer"
    metric = "exact_match"

    def __init__(self, name: str, *, min_len: int = 4, max_len: int = 16, num_symbols: int = 20,
                 seed: int = 0):
        if name not in SEQ2SEQ_TASKS:
            raise ValueError(f"unknown synthetic task {name!r}; expected one of {SEQ2SEQ_TASKS}")
        self.name = name
        super().__init__(min_len, max_len, num_symbols, seed)

    def target(self, src: list[int]) -> list[int]:
        if self.name == "reverse":
            return src[::-1]
        if self.name == "sort":
            return sorted(src)
        return list(src)

    def _batch(self, rng: np.random.Generator, size: int, heldout: bool) -> Seq2SeqBatch:
        rows, lens = _draw(rng, size, self.min_len, self.max_len, self.num_symbols, heldout)
        src = [(rows[k, :lens[k]] + self._first).tolist() for k in range(size)]
        tok = self.tokenizer
        return collate_seq2seq(src, [self.target(s) for s in src], pad_id=tok.pad_id,
                               bos_id=tok.bos_id, eos_id=tok.eos_id)

    def describe(self) -> str:
        return (f"{self.name}: strings of {self.min_len}-{self.max_len} symbols over "
                f"{self.tokenizer.alphabet!r}")


class InductionTask(_Synthetic):
    """Random segment of ``min_len..max_len`` symbols, then the same segment again.

    Labels of the second copy (after its first token) are the ``scored`` ones: they are the
    only predictable tokens. Metric: per-sequence exact match over them, plus token accuracy.
    """

    kind = "lm"
    metric = "exact_match"
    name = "induction"

    def __init__(self, *, min_len: int = 8, max_len: int = 32, num_symbols: int = 26,
                 seed: int = 0):
        super().__init__(min_len, max_len, num_symbols, seed)

    def _batch(self, rng: np.random.Generator, size: int, heldout: bool) -> LMBatch:
        rows, lens = _draw(rng, size, self.min_len, self.max_len, self.num_symbols, heldout)
        seqs, scored = [], []
        for k in range(size):
            seg = (rows[k, :lens[k]] + self._first).tolist()
            n = len(seg)
            seqs.append(seg + seg)
            # label t predicts token t + 1; tokens n + 1 .. 2n - 1 are copies of known context
            scored.append([t >= n for t in range(2 * n - 1)])
        return collate_lm(seqs, pad_id=self.tokenizer.pad_id, scored=scored)

    def describe(self) -> str:
        return (f"induction: a random segment of {self.min_len}-{self.max_len} symbols, "
                f"then repeated")
