"""Configs: JSON round trip, unknown keys rejected, every bad value a clear error."""

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwise.layers import AttentionConfig
from headwise.models import CONFIGS, LMConfig, TransformerConfig, config_from_dict
from headwise.models.config import FLAT_ATTENTION_KEYS


def test_round_trip_through_json():
    for cfg in (LMConfig(300, d_model=64, num_heads=4, num_kv_heads=2, positional="learned",
                         tie_embeddings=True),
                TransformerConfig(100, 120, d_model=32, num_heads=2, num_layers=2, d_ff=64,
                                  max_len=40, dropout=0.0, num_decoder_layers=3, pad_id=1)):
        d = json.loads(json.dumps(cfg.to_dict()))
        assert type(cfg).from_dict(d) == cfg
        assert config_from_dict(cfg.kind, d) == cfg
        assert CONFIGS[cfg.kind] is type(cfg)
    assert TransformerConfig(5, 6, num_layers=2, num_decoder_layers=3).decoder_layers == 3
    assert LMConfig(10, d_model=64, num_heads=4, num_kv_heads=2).kv_heads == 2
    assert LMConfig(10, d_model=64, num_heads=4).head_size == 16


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LMConfig(10).d_model = 4


def test_from_dict_rejects_unknown_and_missing_keys():
    with pytest.raises(ValueError, match=r"unknown keys \['n_layers'\]"):
        LMConfig.from_dict({"vocab_size": 10, "n_layers": 3})
    with pytest.raises(ValueError, match=r"missing required keys \['vocab_size'\]"):
        LMConfig.from_dict({"d_model": 8})
    with pytest.raises(ValueError, match="unknown model kind 'gpt'"):
        config_from_dict("gpt", {})


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=30, num_heads=4), "not divisible by num_heads=4; pass head_dim=7"),
    (dict(num_heads=8, num_kv_heads=3), "not a multiple of num_kv_heads=3"),
    (dict(activation="swish"), "activation must be one of"),
    (dict(positional="alibi"), "positional must be one of"),
    (dict(norm="batch"), "norm must be one of"),
    (dict(ffn="moe"), "ffn must be one of"),
    (dict(rope_theta=0.0), "rope_theta must be > 0"),
    (dict(rotary_dim=16), "rotary_dim=16 needs positional='rope'"),
    (dict(positional="rope", rotary_dim=7), "rotary_dim must be even and <= the head size 64"),
    (dict(positional="rope", rotary_dim=66), "rotary_dim must be even and <= the head size 64"),
    (dict(sliding_window=0), "window must be >= 1"),
    (dict(attention={"window": 0}), "window must be >= 1"),
    (dict(attn_softcap=-1.0), "softcap must be None or > 0"),
    (dict(attention={"softcap": -1.0}), "softcap must be None or > 0"),
    (dict(attention={"num_kv_heads": 3}, num_heads=8), "not a multiple of num_kv_heads=3"),
    (dict(attention={"rotary_dim": 16}), "rotary_dim=16 needs positional='rope'"),
    (dict(attention={"window": 4, "windw": 4}), r"unknown attention keys \['windw'\]"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
    (dict(num_layers=0), "num_layers must be >= 1"),
    (dict(pad_id=50), r"pad_id must be None or an id in \[0, 50\)"),
    (dict(backend="flash9"), "unknown backend 'flash9'"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps must be > 0"),
])
def test_bad_values_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LMConfig(50, **kwargs)


def test_bad_types_are_type_errors():
    with pytest.raises(TypeError, match="d_model must be an int"):
        LMConfig(50, d_model=64.0)
    with pytest.raises(TypeError, match="tie_embeddings must be True or False"):
        TransformerConfig(5, 5, tie_embeddings="yes")
    with pytest.raises(ValueError, match=r"pad_id must be None or an id in \[0, 5\)"):
        TransformerConfig(5, 9, pad_id=7)  # must be valid in both vocabularies


def test_one_base_config_for_every_family():
    """The shared fields, checks and (de)serialisation are written once, in ModelConfig."""
    from headwise.models.bert import BertConfig
    from headwise.models.config import ModelConfig

    shared = {f.name for f in dataclasses.fields(ModelConfig)}
    assert {"d_model", "num_heads", "num_layers", "d_ff", "max_len", "dropout", "activation",
            "layer_norm_eps", "pad_id", "attention"} <= shared
    for cls in (LMConfig, TransformerConfig, BertConfig):
        assert issubclass(cls, ModelConfig)
        for method in ("to_dict", "from_dict", "replace", "_check"):
            assert method not in vars(cls), f"{cls.__name__} redefines {method}"
    # keyword-only past the vocabulary sizes: no silent swap of d_model and num_heads
    with pytest.raises(TypeError, match="positional"):
        LMConfig(10, 64, 4)
    with pytest.raises(TypeError, match="positional"):
        TransformerConfig(10, 12, 64)
    with pytest.raises(TypeError, match="positional"):
        BertConfig(100, 64)
    # one name per concept: head_size is the per-head size in use on every config
    assert BertConfig(100, d_model=64, num_heads=4).head_size == 16
    assert LMConfig(10, d_model=64, num_heads=4, head_dim=5).head_size == 5


def test_config_json_keys_of_saved_runs_still_load():
    """The dict keys written before the shared base (kept here verbatim) build the same
    configs: the field names are the JSON keys, so none was renamed."""
    from headwise.models.bert import BertConfig

    lm = {"activation": "silu", "backend": "auto", "bias": True, "d_ff": 20, "d_model": 12,
          "dropout": 0.0, "head_dim": 5, "layer_norm_eps": 1e-05, "max_len": 24,
          "norm_first": False, "num_heads": 3, "num_kv_heads": None, "num_layers": 2,
          "pad_id": 0, "positional": "learned", "scale_embeddings": False,
          "tie_embeddings": True, "vocab_size": 24}
    bert = {"vocab_size": 30522, "d_model": 384, "num_heads": 12, "num_layers": 6,
            "d_ff": 1536, "max_len": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
            "dropout": 0.1, "attention_dropout": 0.1, "activation": "gelu", "pad_id": 0,
            "pooler": True, "backend": "auto"}
    # every old key comes back with its value (fields added since take their defaults), the
    # attention's under their names in ``attention``
    for cls, old in ((LMConfig, lm), (BertConfig, bert)):
        new = cls.from_dict(old).to_dict()
        flat = {**new, **{k: new["attention"][v] for k, v in FLAT_ATTENTION_KEYS.items()}}
        assert flat.items() >= old.items()
    with pytest.raises(ValueError, match=r"BertConfig: unknown keys \['hidden_size'\].*"
                                         "bert_config_from_hf"):
        BertConfig.from_dict({"hidden_size": 8})
    with pytest.raises(ValueError, match=r"pad_id must be an id in \[0, 10\)"):
        BertConfig(10, d_model=8, num_heads=2, pad_id=None)


# ------------------------------------------------------- the attention options, one field
FLAT_VALUES = {"num_kv_heads": st.none() | st.sampled_from([1, 2, 4]),
               "head_dim": st.none() | st.integers(2, 16),
               "sliding_window": st.none() | st.integers(1, 64),
               "attn_softcap": st.none() | st.floats(0.5, 50.0),
               "attention_sinks": st.booleans(), "rope_theta": st.floats(1.0, 1e6),
               "rotary_dim": st.none() | st.just(2),
               "backend": st.sampled_from(["auto", "eager", "sdpa"])}


@given(flat=st.fixed_dictionaries({}, optional=FLAT_VALUES),
       cls=st.sampled_from([LMConfig, TransformerConfig]))
def test_old_keywords_build_the_attention_config(flat, cls):
    """User code that passes the flat keywords gets the config with them in ``attention``;
    saved dicts with those keys load to it; ``replace`` takes them too."""
    vocab = (10,) if cls is LMConfig else (10, 12)
    sizes = dict(d_model=64, num_heads=4, positional="rope")
    moved = {FLAT_ATTENTION_KEYS[k]: v for k, v in flat.items()}
    cfg = cls(*vocab, **sizes, **flat)
    assert cfg == cls(*vocab, **sizes, attention=AttentionConfig(**moved))
    assert cfg.attention == AttentionConfig(**moved)
    d = {**cls(*vocab, **sizes).to_dict(), **flat}
    del d["attention"]  # as saved before the field
    assert cls.from_dict(d) == cfg
    # replace: a flat keyword changes that option and keeps the others
    changed = cfg.replace(sliding_window=7, d_model=32)
    assert changed.attention == cfg.attention.replace(window=7) and changed.d_model == 32
    assert changed.replace(attention=cfg.attention) == cfg.replace(d_model=32)


def test_old_attribute_reads_warn_and_read_the_attention():
    cfg = LMConfig(10, d_model=64, num_heads=4, attention=AttentionConfig(window=8,
                                                                          num_kv_heads=2))
    for old, new in FLAT_ATTENTION_KEYS.items():
        with pytest.warns(DeprecationWarning, match=rf"LMConfig.{old} is now .attention.{new}"):
            assert getattr(cfg, old) == getattr(cfg.attention, new)
    with pytest.raises(AttributeError, match="no attribute 'windw'"):
        cfg.windw  # noqa: B018


def test_the_attention_field_of_every_family():
    from headwise.models.bert import BertConfig

    for cfg in (LMConfig(10), TransformerConfig(5, 6), BertConfig(100)):
        assert cfg.attention == AttentionConfig()
        assert "attention" in cfg.to_dict() and "backend" not in cfg.to_dict()
    bert = BertConfig(100, d_model=64, num_heads=4, backend="eager")
    assert bert.attention.backend == "eager"
    assert BertConfig.from_dict(bert.to_dict()) == bert
    with pytest.raises(ValueError, match="rotary_dim=8 needs positional='rope', got "
                                         "positional=None"):
        BertConfig(100, d_model=64, num_heads=4, rotary_dim=8)
    # a dict of the attention's fields is taken for the field, and stored as the dataclass
    cfg = LMConfig(10, attention={"window": 4})
    assert cfg.attention == AttentionConfig(window=4) and cfg == LMConfig(10, sliding_window=4)
    with pytest.raises(TypeError, match="must be an AttentionConfig or a dict"):
        LMConfig(10, attention=4)
    # the model's derived sizes read it
    gqa = LMConfig(10, d_model=64, num_heads=4, attention=AttentionConfig(num_kv_heads=2,
                                                                          head_dim=5))
    assert (gqa.kv_heads, gqa.head_size, gqa.layer_kv_heads("decoder_self")) == (2, 5, [2] * 6)
