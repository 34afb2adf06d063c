"""Tokenizers: byte- and char-level round-trips, serialisation, readable errors."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwise.data import (
    ByteTokenizer,
    CharTokenizer,
    tokenizer_from_dict,
)


@given(st.text(min_size=0, max_size=50))
def test_byte_tokenizer_round_trips_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_id, *ids]) == text  # stops at <eos>
    assert len(tok.tokens(ids)) == len(ids)
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.encode(text) == ids

@given(st.text(alphabet="abcxyz ÄÖ.", min_size=1, max_size=40))
def test_char_tokenizer_round_trips_and_serialises(text):
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert min(ids) >= 4 and tok.decode(ids) == text
    assert tok.tokens([tok.bos_id, *ids[:1]]) == ["<bos>", text[0]]
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.encode(text) == ids and again.vocab_size == tok.vocab_size
    assert tok.encode("\u2603") == [tok.unk_id]

def test_tokenizer_errors_name_the_problem():
    with pytest.raises(ValueError, match="outside"):
        CharTokenizer("ab").decode([99])
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_dict({"kind": "bpe"})
    with pytest.raises(ValueError, match="non-empty"):
        CharTokenizer("")


@given(before=st.text(max_size=5), after=st.text(max_size=5),
       surrogate=st.integers(0xD800, 0xDFFF).map(chr))
def test_a_lone_surrogate_is_a_value_error_naming_its_position(before, after, surrogate):
    """ByteTokenizer().encode('\\ud800') raised a raw UnicodeEncodeError from str.encode."""
    text = before + surrogate + after
    first = next(x for x, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
    with pytest.raises(ValueError, match=rf"at position {first}, a lone surrogate .* clean it"):
        ByteTokenizer().encode(text)
