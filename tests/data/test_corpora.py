"""The real corpora load, or a missing one says how to fetch it."""

import pytest

from headwise.data import (
    CorpusMissingError,
    austen_text,
    ding_pairs,
)


def test_missing_corpus_says_how_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADWISE_CORPORA", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CorpusMissingError, match="make corpora"):
        ding_pairs()

def test_real_corpora_load():
    """Needs `make corpora` (the Makefile's test target runs it)."""
    text = austen_text(("persuasion",))
    assert text.startswith("Persuasion") and "Anne Elliot" in text and len(text) > 400_000
    pairs = ding_pairs()
    assert len(pairs) > 10_000
    assert all(de[-1] in ".!?" and en[-1] in ".!?" for de, en in pairs)
