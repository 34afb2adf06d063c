"""The layer-finder registry: the core reaches another library's models only through what that
library's wing registered (headwise.hf for transformers), and refuses such a model, naming the
fix, while nothing is registered."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import headwise.models.heads
from headwise import finders, stats
from headwise.finders import Finder


class Foreign(nn.Module):
    """A model of a made-up library: two attention layers of 3 and 5 heads, and a norm."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.norm = ForeignAttention(3), ForeignAttention(5), nn.LayerNorm(4)


class ForeignAttention(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads


@pytest.fixture
def registry(monkeypatch):
    """An empty registry for the test (the suite's own, with headwise.hf's finder, comes back)."""
    monkeypatch.setattr(finders, "_FINDERS", {})
    return finders


def foreign_finder(refuse: bool = False) -> Finder:
    def layers(model, where):
        if refuse:
            raise ValueError(f"{where}: switch it first")
        return [model.a, model.b]

    return Finder("made-up", owns=lambda m: isinstance(m, Foreign), layers=layers,
                  owns_layer=lambda m: isinstance(m, ForeignAttention),
                  head_count=lambda m: m.heads)


def test_the_head_tools_reach_a_registered_librarys_model_through_its_finder(registry):
    model = Foreign()
    with pytest.raises(TypeError, match="expected a headwise model"):
        headwise.models.heads.attention_layers(model)  # nothing registered: not a model we know
    registry.register(foreign_finder())
    assert registry.registered() == ["made-up"]
    assert headwise.models.heads.attention_layers(model) == {"layers": [model.a, model.b]}
    assert headwise.models.heads.head_counts(model) == {"layers": [3, 5]}
    with pytest.raises(ValueError, match="cannot tell how many heads LayerNorm has.*"
                                         r"registered: \['made-up'\]"):
        headwise.models.heads.head_count(model.norm)
    registry.register(foreign_finder(refuse=True))  # the same library again: replaced
    assert registry.registered() == ["made-up"]
    with pytest.raises(ValueError, match="headwise's head tools: switch it first"):
        headwise.models.heads.attention_layers(model)
    with pytest.raises(ValueError, match=r"headwise.stats.collect: switch it first"):
        with stats.collect(model):
            pass


def test_a_headwise_model_is_no_finders_business(registry):
    registry.register(foreign_finder())
    mha = headwise.MultiHeadAttention(8, 2)
    assert registry.layers(mha, "t") is None
    with stats.collect(mha) as found:
        mha(torch.randn(1, 3, 8))
    assert list(found) == [""]  # the module itself reported its one call


def test_a_transformers_model_with_no_finder_registered_is_refused_with_the_fix(registry):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2)
    model = transformers.LlamaForCausalLM(config)
    assert registry.transformers_model(model) and not registry.transformers_model(nn.Linear(1, 1))
    fix = r"import headwise.hf and call headwise.hf.use\(model\) first"
    with pytest.raises(ValueError, match="headwise's head tools: LlamaForCausalLM is a "
                                         f"transformers model.*{fix}"):
        headwise.models.heads.attention_layers(model)
    with pytest.raises(ValueError, match=f"headwise.stats.collect: .*{fix}"):
        with stats.collect(model):
            pass


def test_importing_headwise_hf_registers_its_finder():
    pytest.importorskip("transformers")
    import headwise.hf
    import headwise.hf.model

    assert "transformers" in finders.registered()
    assert headwise.hf.model.FINDER.layers is headwise.hf.model.running


def test_register_takes_a_finder_only(registry):
    with pytest.raises(TypeError, match="register expects a headwise.finders.Finder, got dict"):
        registry.register({"library": "x"})
