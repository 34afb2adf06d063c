"""headwise.decode.config.GenerationConfig: generate's settings as one frozen dataclass, validated
once when it is made (and when a keyword overrides a field); the errors name what was expected
and the fix."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.decode.config import GenerationConfig
from headwise.decode.generation import generate
from headwise.models import LMConfig, TransformerLM


def lm(**kw):
    args = dict(vocab_size=41, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_len=64,
                dropout=0.0)
    args.update(kw)
    return TransformerLM(LMConfig(**args)).eval()


def test_the_config_is_frozen_and_derives_the_strategy_that_runs():
    config = GenerationConfig(max_new_tokens=2, beam_size=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_new_tokens = 5
    assert config.mode == "beam" and GenerationConfig(max_new_tokens=2).mode == "greedy"
    assert GenerationConfig.fields()[0] == "max_new_tokens"


BAD = [(dict(beam_size=0), ValueError, "beam_size must be an int >= 1, got 0"),
       (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be an int >= 0, got -1"),
       (dict(max_new_tokens=2.5), ValueError, "max_new_tokens must be an int >= 0"),
       (dict(strategy="nucleus"), ValueError, "strategy must be one of"),
       (dict(temperature=0.0), ValueError, "temperature must be > 0"),
       (dict(top_p=1.5), ValueError, r"top_p must be None or in \(0, 1\]"),
       (dict(top_k=0), ValueError, "top_k must be None or an int >= 1"),
       (dict(strategy="sample", beam_size=2), ValueError, "cannot be combined"),
       (dict(eos_id=-1), ValueError, r"eos_id must be None or a token id"),
       (dict(length_penalty="long"), TypeError, "length_penalty must be a number"),
       (dict(compile="yes"), TypeError, "compile must be True or False")]


@pytest.mark.parametrize("kw, err, match", BAD)
def test_bad_settings_are_refused_when_the_config_is_made_and_through_generate(kw, err, match):
    """The one validation: the config refuses them before any model is touched, and generate's
    keywords reach the same check."""
    full = dict(max_new_tokens=3) | kw
    with pytest.raises(err, match=match):
        GenerationConfig(**full)
    with pytest.raises(err, match=match):
        generate(lm(), torch.zeros(1, 2, dtype=torch.long), **full)
    with pytest.raises(err, match=match):  # an override is validated too
        generate(lm(), torch.zeros(1, 2, dtype=torch.long),
                 config=GenerationConfig(max_new_tokens=3), **full)


@settings(max_examples=40, deadline=None)
@given(top_k=st.one_of(st.none(), st.integers(-3, 60)),
       top_p=st.one_of(st.none(), st.floats(-1, 2), st.just(float("nan"))),
       temperature=st.one_of(st.floats(-1, 3), st.sampled_from([float("nan"), float("inf")])))
def test_the_config_accepts_exactly_the_settings_sampling_can_use(top_k, top_p, temperature):
    ok = ((top_k is None or top_k >= 1) and (top_p is None or 0 < top_p <= 1)
          and 0 < temperature < float("inf"))
    try:
        GenerationConfig(max_new_tokens=1, strategy="sample", top_k=top_k, top_p=top_p,
                         temperature=temperature)
    except ValueError:
        assert not ok
    else:
        assert ok
