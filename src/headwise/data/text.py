"""Real text: a UTF-8 file for language modelling, and tab-separated sentence pairs for
translation. Both are deterministic in ``(seed, step)`` and keep a held-out split that training
never sees (the last 10% of the text; every 20th pair after a seeded shuffle)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from headwise.data.batches import LMBatch, Seq2SeqBatch, collate_seq2seq
from headwise.data.tokenizers import ByteTokenizer, CharTokenizer

__all__ = ["PairsTask", "TextLMTask", "make_tokenizer", "read_pairs", "read_text"]

_TRAIN, _EVAL = 0, 1
MAX_CONTEXT = 1 << 16  # longest language-model window
MAX_PAIR_LEN = 4096  # longest sentence (tokens) a pairs task keeps


def _check_size(name: str, value, low: int, high: int, flag: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int; got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high:,}]; got {value:,}; pass {flag} "
                         f"within it")


def read_text(path: str | Path) -> str:
    """The UTF-8 text of ``path``; one-line errors for missing, undecodable or empty files."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"text file {str(p)!r} does not exist (or is not a file)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p} is not UTF-8 text (byte {exc.start}); convert it with iconv "
                         f"or pass a UTF-8 file") from None
    if not text.strip():
        raise ValueError(f"text file {p} is empty; a language model needs some text")
    return text


def read_pairs(path: str | Path) -> list[tuple[str, str]]:
    """``source<TAB>target`` lines of ``path`` (blank lines skipped)."""
    text = read_text(path)
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise ValueError(f"{path}:{number}: expected 'source<TAB>target', got a line "
                             f"without a tab: {line[:60]!r}")
        src, tgt = line.split("\t", 1)
        if not src.strip() or not tgt.strip():
            raise ValueError(f"{path}:{number}: empty source or target in {line[:60]!r}")
        pairs.append((src.strip(), tgt.strip()))
    return pairs


def make_tokenizer(kind: str, text: str) -> CharTokenizer | ByteTokenizer:
    if kind == "char":
        return CharTokenizer.from_text(text)
    if kind == "byte":
        return ByteTokenizer()
    raise ValueError(f"unknown tokenizer {kind!r}; expected 'char' or 'byte'")


class TextLMTask:
    """Random windows of ``context + 1`` tokens from the first 90% of the text (training);
    evenly spaced windows from the last 10% (held out). Metric: perplexity."""

    kind = "lm"
    metric = "perplexity"

    def __init__(self, text: str, *, name: str = "text", context: int = 256,
                 tokenizer: str = "char", seed: int = 0, source: str = ""):
        _check_size("context", context, 2, MAX_CONTEXT, "--context")
        self.name, self.context, self.seed, self.source = name, context, seed, source
        self.tokenizer = make_tokenizer(tokenizer, text)
        ids = np.asarray(self.tokenizer.encode(text), dtype=np.int64)
        cut = int(len(ids) * 0.9)
        self.train_ids, self.eval_ids = ids[:cut], ids[cut:]
        if len(self.eval_ids) < context + 1 or len(self.train_ids) < context + 1:
            raise ValueError(
                f"the text has {len(ids)} tokens: too short for context {context} (need "
                f"{10 * (context + 1)} so that the held-out 10% holds one window); pass a "
                f"smaller --context or a longer file")

    def _windows(self, ids: np.ndarray, starts: np.ndarray) -> LMBatch:
        idx = starts[:, None] + np.arange(self.context + 1)[None, :]
        rows = torch.from_numpy(ids[idx])
        b, n = rows.shape[0], self.context
        return LMBatch(inputs=rows[:, :-1].contiguous(), labels=rows[:, 1:].contiguous(),
                       valid_lens=torch.full((b,), n, dtype=torch.long),
                       scored=torch.ones(b, n, dtype=torch.bool))

    def batch(self, step: int, size: int) -> LMBatch:
        rng = np.random.default_rng([self.seed, _TRAIN, step])
        starts = rng.integers(0, len(self.train_ids) - self.context, size=size)
        return self._windows(self.train_ids, starts)

    def eval_set(self, size: int) -> LMBatch:
        last = len(self.eval_ids) - self.context - 1
        starts = np.unique(np.linspace(0, last, num=size).astype(np.int64))
        return self._windows(self.eval_ids, starts)

    def describe(self) -> str:
        return (f"{self.name}: {len(self.train_ids) + len(self.eval_ids):,} "
                f"{self.tokenizer.kind} tokens{' from ' + self.source if self.source else ''}, "
                f"context {self.context}")


class PairsTask:
    """Sentence pairs (source, target) for an encoder-decoder; metric: BLEU (sacrebleu) of
    greedy translations of the held-out pairs. One character- (or byte-) tokenizer for both
    sides, built from all the text."""

    kind = "transformer"
    metric = "bleu"

    def __init__(self, pairs: list[tuple[str, str]], *, name: str = "pairs", max_len: int = 64,
                 tokenizer: str = "char", seed: int = 0, source: str = ""):
        _check_size("max_len", max_len, 1, MAX_PAIR_LEN, "--max-len")
        self.name, self.seed, self.source = name, seed, source
        self.tokenizer = make_tokenizer(tokenizer, "".join(s + t for s, t in pairs))
        tok = self.tokenizer
        kept = [(s, t) for s, t in pairs
                if len(tok.encode(s)) <= max_len and len(tok.encode(t)) <= max_len]
        if len(kept) < 40:
            raise ValueError(f"only {len(kept)} of {len(pairs)} pairs have both sides within "
                             f"max_len={max_len} tokens; need at least 40 (raise --max-len)")
        order = np.random.default_rng([seed, _EVAL]).permutation(len(kept))
        heldout = order % 20 == 0
        self.train_pairs = [kept[k] for k in order[~heldout]]
        self.eval_pairs = [kept[k] for k in order[heldout]]
        self.max_len = max_len

    def _collate(self, pairs: list[tuple[str, str]]) -> Seq2SeqBatch:
        tok = self.tokenizer
        return collate_seq2seq([tok.encode(s) for s, _ in pairs], [tok.encode(t) for _, t in pairs],
                               pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)

    def batch(self, step: int, size: int) -> Seq2SeqBatch:
        """Epoch-wise shuffles: step ``s`` takes its rows from the permutation of its epoch."""
        n = len(self.train_pairs)
        rows = []
        for pos in range(step * size, (step + 1) * size):
            epoch, k = divmod(pos, n)
            perm = self._perm(epoch)
            rows.append(self.train_pairs[perm[k]])
        return self._collate(rows)

    def _perm(self, epoch: int) -> np.ndarray:
        if getattr(self, "_cached", (None,))[0] != epoch:
            self._cached = (epoch, np.random.default_rng([self.seed, _TRAIN, epoch]).permutation(
                len(self.train_pairs)))
        return self._cached[1]

    def eval_set(self, size: int) -> Seq2SeqBatch:
        return self._collate(self.eval_pairs[:size])

    def references(self, size: int) -> list[str]:
        return [t for _, t in self.eval_pairs[:size]]

    def describe(self) -> str:
        return (f"{self.name}: {len(self.train_pairs):,} training / {len(self.eval_pairs):,} "
                f"held-out sentence pairs{' from ' + self.source if self.source else ''}")
