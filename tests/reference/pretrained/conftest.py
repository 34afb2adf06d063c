"""The sentence-transformers reference model, shared by the tokenizer and sentence tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def st_model(minilm_folder):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(minilm_folder), device="cpu")
