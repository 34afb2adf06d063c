"""AttentionConfig: the attention options as one frozen dataclass, checked once, taken by
MultiHeadAttention (``config=``, or its fields as keywords) and the blocks."""

import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise.layers import AttentionConfig, MultiHeadAttention
from headwise.models import DecoderBlock, EncoderBlock

FIELDS = [f.name for f in dataclasses.fields(AttentionConfig)]

configs = st.builds(
    AttentionConfig,
    num_kv_heads=st.none() | st.sampled_from([1, 2, 4]),
    head_dim=st.none() | st.integers(1, 12),
    window=st.none() | st.integers(1, 64),
    softcap=st.none() | st.floats(0.5, 100.0),
    sinks=st.booleans(),
    rope_theta=st.floats(1.0, 1e6),
    rotary_dim=st.none() | st.sampled_from([2, 4]),
    backend=st.sampled_from(["auto", "eager", "sdpa"]),
)


@given(configs)
def test_round_trip_through_json(cfg):
    d = json.loads(json.dumps(cfg.to_dict()))
    assert AttentionConfig.from_dict(d) == cfg
    assert AttentionConfig.build(d) == cfg
    assert AttentionConfig.build(cfg) is cfg


@given(configs, configs)
def test_build_sets_the_keywords_over_the_config(base, other):
    changes = {name: getattr(other, name) for name in FIELDS[::2]}
    built = AttentionConfig.build(base, **changes)
    for name in FIELDS:
        assert getattr(built, name) == (changes[name] if name in changes else getattr(base, name))


def test_frozen_and_one_name_per_option():
    cfg = AttentionConfig(window=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.window = 8
    assert FIELDS == ["num_kv_heads", "head_dim", "window", "softcap", "sinks", "rope_theta",
                      "rotary_dim", "backend"]
    # the module keeps each option under its field's name (the decoding forms read these)
    mha = MultiHeadAttention(16, 4, config=AttentionConfig(num_kv_heads=2, head_dim=3, window=5,
                                                           softcap=2.0, sinks=True,
                                                           backend="eager"))
    assert (mha.num_kv_heads, mha.head_dim, mha.window, mha.softcap, mha.backend) == (
        2, 3, 5, 2.0, "eager")
    assert mha.sinks.shape == (4,)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(window=0), ValueError, "AttentionConfig: window must be >= 1, got 0"),
    (dict(window=2.0), TypeError, "window must be an int"),
    (dict(window=True), TypeError, "window must be an int"),
    (dict(num_kv_heads=0), ValueError, "num_kv_heads must be >= 1"),
    (dict(head_dim=2.5), TypeError, "head_dim must be an int"),
    (dict(rotary_dim=0), ValueError, "rotary_dim must be >= 1"),
    (dict(softcap=0.0), ValueError, "softcap must be None or > 0, got 0.0"),
    (dict(softcap=float("inf")), ValueError, "softcap must be None or > 0"),
    (dict(softcap="1"), ValueError, "softcap must be None or > 0"),
    (dict(sinks=1), TypeError, "sinks must be True or False, got 1"),
    (dict(rope_theta=-1.0), ValueError, "rope_theta must be > 0"),
    (dict(backend="flash9"), ValueError, "unknown backend 'flash9'"),
])
def test_bad_values_are_errors_naming_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        AttentionConfig(**kwargs)


def test_unknown_options_and_keys_name_the_known_ones():
    with pytest.raises(TypeError, match=r"MultiHeadAttention: unknown attention option\(s\) "
                                         r"\['windw'\]; the options are \["):
        MultiHeadAttention(16, 4, windw=4)
    with pytest.raises(ValueError, match=r"unknown attention keys \['sliding_window'\]"):
        AttentionConfig.from_dict({"sliding_window": 4})
    with pytest.raises(TypeError, match="must be an AttentionConfig or a dict"):
        MultiHeadAttention(16, 4, config=4)


@pytest.mark.parametrize("cfg, sizes, match", [
    (AttentionConfig(), (510, 8), "embed_dim=510 is not divisible by num_heads=8; pass "
                                  "head_dim=63 or use num_heads="),
    (AttentionConfig(num_kv_heads=3), (16, 4), "num_heads=4 is not a multiple of "
                                               "num_kv_heads=3"),
    (AttentionConfig(rotary_dim=6), (16, 4), "rotary_dim must be even and <= the head size 4"),
    (AttentionConfig(rotary_dim=3, head_dim=8), (16, 4), "rotary_dim must be even"),
])
def test_checks_that_need_the_sizes(cfg, sizes, match):
    with pytest.raises(ValueError, match=match):
        cfg.check_heads(*sizes, "MultiHeadAttention")
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(*sizes, config=cfg)


def test_for_cross_drops_only_the_window():
    cfg = AttentionConfig(num_kv_heads=2, window=4, softcap=3.0, sinks=True, backend="eager")
    assert cfg.for_cross() == dataclasses.replace(cfg, window=None)
    assert AttentionConfig(softcap=3.0).for_cross() == AttentionConfig(softcap=3.0)


@settings(max_examples=20, deadline=None)
@given(cfg=configs, seed=st.integers(0, 2**16))
def test_config_and_keywords_build_the_same_module(cfg, seed):
    """``config=cfg`` and cfg's fields as keywords: the same parameters, the same output."""
    cfg = dataclasses.replace(cfg, rotary_dim=None)  # RoPE is the model's (rope=)
    h = 4
    if cfg.num_kv_heads is not None and h % cfg.num_kv_heads:
        cfg = dataclasses.replace(cfg, num_kv_heads=None)
    torch.manual_seed(seed)
    a = MultiHeadAttention(8, h, config=cfg)
    torch.manual_seed(seed)
    b = MultiHeadAttention(8, h, **cfg.to_dict())
    assert a.state_dict().keys() == b.state_dict().keys()
    for name, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[name]), name
    x = torch.randn(2, 5, 8)
    assert torch.equal(a(x, causal=True)[0], b(x, causal=True)[0])
    assert repr(a) == repr(b)


def test_the_blocks_take_the_config_or_its_keywords():
    cfg = AttentionConfig(num_kv_heads=2, head_dim=3, window=4, softcap=5.0, sinks=True,
                          backend="eager")
    for block in (EncoderBlock, DecoderBlock):
        torch.manual_seed(0)
        a = block(16, 4, 32, attention=cfg)
        torch.manual_seed(0)
        b = block(16, 4, 32, num_kv_heads=2, head_dim=3, window=4, softcap=5.0, sinks=True,
                  backend="eager")
        assert repr(a) == repr(b)
        assert all(torch.equal(t, b.state_dict()[k]) for k, t in a.state_dict().items())
        assert (a.self_attn.window, a.self_attn.softcap, a.self_attn.num_kv_heads) == (4, 5.0, 2)
    # cross-attention: the same options without the window (its keys are the encoder's)
    cross = DecoderBlock(16, 4, 32, attention=cfg).cross_attn
    assert (cross.window, cross.softcap, cross.num_kv_heads, cross.head_dim) == (None, 5.0, 2, 3)
    assert cross.sinks is not None and cross.rope is None
    with pytest.raises(TypeError, match=r"EncoderBlock: unknown attention option\(s\) \['wndow'"):
        EncoderBlock(16, 4, 32, wndow=4)


def test_exported_at_the_top():
    assert hw.AttentionConfig is AttentionConfig is hw.models.AttentionConfig
