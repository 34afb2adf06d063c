"""Training data: synthetic tasks, tokenizers, text files, sentence pairs and real corpora.

Every task exposes ``kind`` (``"transformer"`` or ``"lm"``), ``tokenizer``, ``metric``,
``batch(step, size)`` (the global training batch of ``step``, a pure function of the seed and
the step) and ``eval_set(size)`` (fixed held-out examples).

``make_task(name, ...)`` builds one by name:

=============  ===========  =====================================================
name           model kind   data
=============  ===========  =====================================================
reverse        transformer  random strings -> reversed (also ``copy``, ``sort``)
induction      lm           random segment, then repeated
text           lm           ``text=FILE`` (UTF-8), char- or byte-level
austen         lm           Jane Austen's novels (``make corpora``)
pairs          transformer  ``pairs=FILE`` of ``source<TAB>target`` lines
de-en          transformer  Ding German-English sentence pairs (``make corpora``)
=============  ===========  =====================================================

May import (the rule and its check: the table in ``tests/test_wings.py``): torch, :mod:`headwise.errors` and the standard library only; the models,
the trainer and the tools import it.
"""

from __future__ import annotations

from typing import Any

from headwise.data.batches import LMBatch, Seq2SeqBatch, collate_lm, collate_seq2seq
from headwise.data.corpora import CorpusMissingError, austen_text, corpora_dir, ding_pairs
from headwise.data.synthetic import SEQ2SEQ_TASKS, InductionTask, SyntheticSeq2Seq
from headwise.data.text import PairsTask, TextLMTask, read_pairs, read_text
from headwise.data.tokenizers import ByteTokenizer, CharTokenizer, tokenizer_from_dict

__all__ = [
    "TASKS", "ByteTokenizer", "CharTokenizer", "CorpusMissingError", "InductionTask", "LMBatch",
    "PairsTask", "Seq2SeqBatch", "SyntheticSeq2Seq", "TextLMTask", "austen_text",
    "collate_lm", "collate_seq2seq", "corpora_dir", "ding_pairs", "make_task", "read_pairs",
    "read_text", "tokenizer_from_dict",
]

TASKS = (*SEQ2SEQ_TASKS, "induction", "text", "austen", "pairs", "de-en")


def make_task(name: str, *, seed: int = 0, min_len: int | None = None,
              max_len: int | None = None, num_symbols: int | None = None,
              context: int = 256, tokenizer: str = "char", text: str | None = None,
              pairs: str | None = None) -> Any:
    """Build the task ``name`` (see the module table). ``min_len``/``max_len``/``num_symbols``
    shape the synthetic tasks (``max_len`` also caps sentence-pair length); ``context`` and
    ``tokenizer`` the text ones."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"make_task: seed must be an int, got {seed!r}; pass e.g. seed=0")
    if not 0 <= seed < 2**63:  # numpy's and torch's generators take no negative seed
        raise ValueError(f"make_task: seed must be in 0 .. 2**63 - 1, got {seed}; pass e.g. "
                         "seed=0")
    sizes = {k: v for k, v in (("min_len", min_len), ("max_len", max_len),
                               ("num_symbols", num_symbols)) if v is not None}
    if name in SEQ2SEQ_TASKS:
        return SyntheticSeq2Seq(name, seed=seed, **sizes)
    if name == "induction":
        return InductionTask(seed=seed, **sizes)
    if name in ("text", "austen"):
        if name == "text" and not text:
            raise ValueError("task 'text' needs a file: pass --text FILE (UTF-8)")
        body = read_text(text) if name == "text" else austen_text()
        source = text if name == "text" else "Jane Austen's six novels (r-cran-janeaustenr)"
        return TextLMTask(body, name=name, context=context, tokenizer=tokenizer, seed=seed,
                          source=source)
    if name in ("pairs", "de-en"):
        if name == "pairs" and not pairs:
            raise ValueError("task 'pairs' needs a file: pass --pairs FILE (source<TAB>target "
                             "lines)")
        rows = read_pairs(pairs) if name == "pairs" else ding_pairs()
        source = pairs if name == "pairs" else "the Ding dictionary (trans-de-en)"
        return PairsTask(rows, name=name, max_len=max_len or 64, tokenizer=tokenizer, seed=seed,
                         source=source)
    raise ValueError(f"unknown task {name!r}; expected one of: {', '.join(TASKS)}")
