"""Where each hook lives: the blocks and modules found in transformers' GPT-2 and Llama and in
headwise's language model, the per-head split of the output projection, the q/k/v sites."""

from __future__ import annotations

import pytest
import torch

from headwise.lens import sites
from headwise.models import LMConfig, TransformerConfig, TransformerLM, build
from tests.hf.tiny import build as hf_build


def lm() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(LMConfig(vocab_size=20, d_model=16, num_heads=4, num_layers=2, d_ff=24,
                                  max_len=16, dropout=0.0)).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "headwise"])
def test_each_layer_names_its_block_mlp_norm_and_output_projection(kind):
    model = lm() if kind == "headwise" else hf_build(kind, "headwise")
    layers = sites.layers_of(model)
    assert len(layers) == 2 and [layer.index for layer in layers] == [0, 1]
    blocks = {"gpt2": lambda: model.transformer.h, "llama": lambda: model.model.layers,
              "headwise": lambda: model.blocks}[kind]()
    for layer, block in zip(layers, blocks, strict=True):
        assert layer.block is block
        assert layer.mlp is (block.ff if kind == "headwise" else block.mlp)
        assert layer.mid is {"gpt2": getattr(block, "ln_2", None),
                             "llama": getattr(block, "post_attention_layernorm", None),
                             "headwise": getattr(block, "ff_norm", None)}[kind]
        assert layer.heads == 4 and layer.kv_heads == (2 if kind == "llama" else 4)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "headwise"])
def test_the_heads_shares_of_the_output_projection_sum_to_it(kind):
    model = lm() if kind == "headwise" else hf_build(kind, "headwise")
    layer = sites.layers_of(model)[1]
    w = sites.result_weight(layer)  # (m, h, d)
    z = torch.randn(2, 3, layer.heads, w.shape[2], generator=torch.Generator().manual_seed(1))
    shares = torch.einsum("bihd,mhd->bihm", z, w)
    out = layer.out(z.flatten(-2))
    bias = getattr(layer.out, "bias", None)
    assert torch.allclose(shares.sum(2) + (0 if bias is None else bias), out, atol=1e-5)


def test_headwise_projections_are_taken_again_from_the_attention_input():
    layer = sites.layers_of(lm())[0]
    assert sites.qkv_sites(layer) == []
    x = torch.randn(2, 3, 16)
    got = sites.project(layer, x)
    assert torch.allclose(got["q"].flatten(-2), layer.attn.q_proj(x))
    assert got["k"].shape == (2, 3, 4, 4)
    gpt2 = sites.layers_of(hf_build("gpt2", "headwise"))[0]
    assert sites.qkv_sites(gpt2) == [(gpt2.attn.c_attn, "qkv")]


def test_a_model_with_encoder_or_cross_attention_is_one_line():
    seq2seq = build(TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=8,
                                      num_heads=2, num_layers=1, d_ff=8, max_len=8))
    with pytest.raises(TypeError, match="expected a language model") as e:
        sites.layers_of(seq2seq)
    assert "\n" not in str(e.value)
