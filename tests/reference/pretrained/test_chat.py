"""The GGUF's tokenizer rebuilt without transformers gives transformers' ids (ASCII, accented,
emoji, code, random text), and its chat template gives transformers' prompt ids."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

TEXTS = {
    "ascii": "What is the capital of France? It's Paris -- 2,148,000 people (2020).",
    "accented": "Héllo, café crème brûlée — naïve Zoë; ÅÄÖ ñ ß œ",
    "emoji": "I love 🤗🚀 and 👩‍👩‍👧‍👦, flags 🇫🇷 too!!",
    "code": "def f(x):\n\treturn x**2  # squared\n\n    if a != b: print({'k': [1, 2, 3]})\n",
    "cjk+rtl": "数学 日本語 한국어 العربية",
    "specials": "<|im_start|>user\nHi 123 éà  code<|im_end|>\n<|endoftext|>",
    "spaces": "  leading\n\n\n   trailing   ",
}


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_ids_match_transformers(smollm2_tokenizer, hf_smollm2_tokenizer, kind):
    text = TEXTS[kind]
    ids = smollm2_tokenizer.encode(text)
    assert ids == hf_smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert smollm2_tokenizer.decode(ids) == hf_smollm2_tokenizer.decode(
        ids, skip_special_tokens=True)


@given(st.text(max_size=60))
def test_random_text_ids_match_transformers(smollm2_tokenizer, hf_smollm2_tokenizer, text):
    assert smollm2_tokenizer.encode(text) == hf_smollm2_tokenizer.encode(
        text, add_special_tokens=False)


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": "Capital of Italy?"},
     {"role": "assistant", "content": "Rome."},
     {"role": "user", "content": "And of Spain? 🇪🇸"}],
]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_chat_template_matches_transformers(smollm2_tokenizer, hf_smollm2_tokenizer, index):
    messages = CONVERSATIONS[index]
    ours = smollm2_tokenizer.chat(messages)
    theirs = hf_smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                      tokenize=True)
    theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
    assert ours == list(theirs)
    assert ours[-4:] == smollm2_tokenizer.encode("<|im_start|>assistant\n")
