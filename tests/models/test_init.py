"""build: the model a config describes, refused for anything else or a model too large."""

import pytest

from headwise.models import CONFIGS, LMConfig, Transformer, TransformerConfig, TransformerLM, build


def test_each_config_builds_its_model():
    lm = build(LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_len=8))
    seq = build(TransformerConfig(src_vocab_size=10, tgt_vocab_size=12, d_model=8, num_heads=2,
                                  num_layers=1, d_ff=8, max_len=8))
    assert type(lm) is TransformerLM and type(seq) is Transformer
    assert {CONFIGS[k] for k in ("lm", "transformer")} == {LMConfig, TransformerConfig}


def test_build_refuses_other_objects_and_huge_models():
    with pytest.raises(TypeError, match="build expects an LMConfig or TransformerConfig, got dict"):
        build({"d_model": 8})
    with pytest.raises(ValueError, match="more than this machine's"):
        build(LMConfig(vocab_size=10, d_model=65536, num_heads=1, num_layers=1000, d_ff=8,
                       max_len=8))
