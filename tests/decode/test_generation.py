"""headwise.decode.generation: generate takes one GenerationConfig or its fields as keywords; a
config and the same keywords give the same tokens, a keyword overrides the config's field, and
what is not a setting is a clear error. (Decoding itself: tests/test_decoding.py.)"""

import pytest
import torch

import headwise
from headwise.decode.config import GenerationConfig
from headwise.decode.generation import generate, generate_with_logits
from tests.decode.test_config import lm

SETTINGS = [dict(max_new_tokens=6),
            dict(max_new_tokens=6, strategy="sample", temperature=0.7, top_k=5, top_p=0.9,
                 seed=3),
            dict(max_new_tokens=5, beam_size=3, eos_id=2, length_penalty=0.5),
            dict(max_new_tokens=5, eos_id=1, pad_id=0, use_cache=False)]


@pytest.mark.parametrize("kw", SETTINGS)
def test_a_config_and_the_same_keywords_give_the_same_tokens(kw):
    torch.manual_seed(0)
    model, prompt = lm(), torch.randint(0, 41, (2, 4))
    by_config = generate(model, prompt, config=GenerationConfig(**kw))
    assert torch.equal(by_config, generate(model, prompt, **kw))
    assert torch.equal(by_config, headwise.generate(model, prompt, GenerationConfig(**kw)))
    assert headwise.GenerationConfig is GenerationConfig


def test_a_keyword_overrides_the_configs_field():
    torch.manual_seed(1)
    model, prompt = lm(), torch.randint(0, 41, (1, 3))
    config = GenerationConfig(max_new_tokens=3, strategy="sample", seed=5)
    longer = generate(model, prompt, config=config, max_new_tokens=7)
    assert longer.shape == (1, 10)
    assert torch.equal(longer, generate(model, prompt, max_new_tokens=7, strategy="sample",
                                        seed=5))
    greedy = generate(model, prompt, config=config, strategy="greedy")
    assert torch.equal(greedy, generate(model, prompt, max_new_tokens=3))
    tokens, logits = generate_with_logits(model, prompt, config=config, max_new_tokens=4)
    assert tokens.shape == (1, 7) and logits.shape == (1, 4, 41)
    assert config.max_new_tokens == 3  # (the config itself is unchanged)


def test_what_is_not_a_setting_is_a_clear_error():
    model, prompt = lm(), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(TypeError, match="unknown setting.*beams.*the generation settings are "
                                        "max_new_tokens, strategy"):
        generate(model, prompt, max_new_tokens=2, beams=3)
    with pytest.raises(TypeError, match="say how many tokens to add: max_new_tokens=N"):
        generate(model, prompt)
    with pytest.raises(TypeError, match="config must be a headwise.GenerationConfig, got dict"):
        generate(model, prompt, config=dict(max_new_tokens=2))
    with pytest.raises(ValueError, match=r"eos_id must be None or an id in \[0, 41\)"):
        generate(model, prompt, config=GenerationConfig(max_new_tokens=2, eos_id=41))
