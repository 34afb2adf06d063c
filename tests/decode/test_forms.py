"""headwise.decode.forms: one table maps each module class a decoder holds to its one-row form;
every class the models build has one (over every combination of the config axes), and a decoder
holding a module without one is refused by the step, naming the class, while generate takes the
module path for it and gives the same tokens."""

import pytest
import torch
from torch import nn

import headwise
from headwise.decode import forms
from headwise.decode.forms import FORMS, form_of, missing
from headwise.decode.step import DecodeStep, usable
from headwise.models import Transformer, TransformerConfig
from headwise.models.feedforward import GatedFeedForward
from headwise.models.norms import RMSNorm
from tests.test_step import COMBINATIONS, _lm


class TweakedFeedForward(GatedFeedForward):
    """A subclass whose forward differs: the table must not hand it its parent's form."""

    def forward(self, x):
        return 2 * super().forward(x)


class OwnNorm(RMSNorm):
    pass


@pytest.mark.parametrize("axes", COMBINATIONS[::5], ids=lambda a: "-".join(map(str, a.values())))
def test_every_module_the_models_build_has_a_form(axes):
    model = _lm(d_model=16, num_heads=4, num_layers=2, d_ff=24, vocab_size=23, max_len=16,
                activation="silu", **axes)
    assert missing(model) == []
    names = [name for name, _ in forms.parts(model)]
    assert names[0] == "embed" and names[-1] == "lm_head"
    assert {"blocks.1.self_attn", "blocks.1.ff", "blocks.1.ff_norm", "final_norm"} <= set(names)
    s2s = Transformer(TransformerConfig(src_vocab_size=11, tgt_vocab_size=13, d_model=16,
                                        num_heads=4, num_layers=1, d_ff=24, max_len=16))
    assert missing(s2s.decoder) == []
    assert "blocks.0.cross_attn" in {name for name, _ in forms.parts(s2s.decoder)}


def test_a_module_class_without_a_form_is_refused_by_name():
    with pytest.raises(TypeError, match=r"no one-row form for torch\.nn\.modules\.activation"
                                         r"\.ReLU.*headwise\.decode\.forms\.FORMS"):
        form_of(nn.ReLU())
    assert nn.ReLU not in FORMS and GatedFeedForward in FORMS


@pytest.mark.parametrize("where", ["ff", "norm"])
def test_a_decoder_holding_a_module_without_a_form_is_refused_and_generate_takes_the_modules(
        where):
    torch.manual_seed(0)
    model = _lm(ffn="glu", norm="rms", activation="silu", positional="rope")
    prompt = torch.randint(0, 37, (2, 4))
    plain = headwise.generate(model, prompt, max_new_tokens=5)
    block = model.blocks[1]
    if where == "ff":
        swapped = TweakedFeedForward(24, 40, activation="silu")
        swapped.load_state_dict(block.ff.state_dict())
        block.ff, name, cls = swapped, "blocks.1.ff", "TweakedFeedForward"
    else:
        swapped = OwnNorm(24, eps=block.ff_norm.eps)
        swapped.load_state_dict(block.ff_norm.state_dict())
        block.ff_norm, name, cls = swapped, "blocks.1.ff_norm", "OwnNorm"
    assert [n for n, _ in missing(model)] == [name] and not usable(model)
    with torch.inference_mode():
        cache = model.new_cache(2, 16)
        model(prompt, cache=cache)
        with pytest.raises(TypeError, match=rf"no one-row form for {name} \(.*{cls}\)"):
            DecodeStep(model, cache)
    got = headwise.generate(model, prompt, max_new_tokens=5)  # through the modules
    want = headwise.generate(model, prompt, max_new_tokens=5, use_cache=False)
    assert torch.equal(got, want)
    if where == "norm":  # (the same arithmetic as before the swap, through the modules)
        assert torch.equal(got, plain)
