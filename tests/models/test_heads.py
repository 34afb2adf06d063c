"""Model-level head_mask on every model (LM, Llama-style grouped LM, encoder-decoder, Encoder,
Decoder, BERT): equal to scaling that head's columns of the out-projection in a copy of the
model (an independent reference); the head-selection check; bad masks and selections."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.models import (
    LMConfig,
    Transformer,
    TransformerConfig,
    TransformerLM,
    attention_layers,
    check_heads,
    head_counts,
)
from headwise.models.bert import BertConfig, BertModel

LLAMA = dict(positional="rope", norm="rms", ffn="glu", activation="silu", bias=False,
             num_kv_heads=2)


def lm(seed: int, llama: bool = False) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(LMConfig(vocab_size=29, d_model=32, num_heads=4, num_layers=2, d_ff=48,
                                  max_len=32, dropout=0.0, **(LLAMA if llama else {}))).eval()


def seq2seq(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(src_vocab_size=23, tgt_vocab_size=19, d_model=32,
                                         num_heads=4, num_layers=2, d_ff=48, max_len=32,
                                         dropout=0.0, pad_id=0)).eval()


def bert(seed: int) -> BertModel:
    torch.manual_seed(seed)
    return BertModel(BertConfig(vocab_size=31, d_model=32, num_heads=4, num_layers=2, d_ff=48,
                                max_len=32)).eval()


def scaled_copy(model, masks: dict[str, torch.Tensor]):
    """A copy whose out-projection columns of head x in layer l are multiplied by
    ``masks[kind][l, x]``: what multiplying the head's output by it must do."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for kind, mods in attention_layers(other).items():
            for layer, mha in enumerate(mods):
                if kind not in masks:
                    continue
                d = mha.head_dim
                for head in range(mha.num_heads):
                    mha.out_proj.weight[:, head * d:(head + 1) * d] *= masks[kind][layer, head]
    return other


def random_masks(model, gen) -> dict[str, torch.Tensor]:
    return {kind: torch.rand(len(hs), hs[0], generator=gen) * (torch.rand(len(hs), hs[0],
                                                                          generator=gen) > 0.3)
            for kind, hs in head_counts(model).items()}


@settings(max_examples=8)
@given(seed=st.integers(0, 2**16), llama=st.booleans(), b=st.integers(1, 3),
       n=st.integers(2, 9))
def test_lm_head_mask_equals_scaled_out_projection(seed, llama, b, n):
    model = lm(seed, llama)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 29, (b, n), generator=gen)
    masks = random_masks(model, gen)
    got, _ = model(tokens, head_mask=masks)
    want, _ = scaled_copy(model, masks)(tokens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    bare, _ = model(tokens, head_mask=masks["decoder_self"])  # one kind: the bare form
    torch.testing.assert_close(bare, got, atol=0, rtol=0)


@settings(max_examples=8)
@given(seed=st.integers(0, 2**16), b=st.integers(1, 3), kinds=st.sets(
    st.sampled_from(["encoder_self", "decoder_self", "cross"]), min_size=1))
def test_transformer_head_mask_per_kind(seed, b, kinds):
    model = seq2seq(seed)
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 23, (b, 7), generator=gen)
    tgt = torch.randint(1, 19, (b, 5), generator=gen)
    lens = torch.randint(2, 8, (b,), generator=gen)
    masks = {k: v for k, v in random_masks(model, gen).items() if k in kinds}
    got, _ = model(src, tgt, src_valid_lens=lens, head_mask=masks)
    ref = scaled_copy(model, masks)
    want, _ = ref(src, tgt, src_valid_lens=lens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # Encoder and Decoder alone take the same masks
    memory, _ = model.encoder(src, src_valid_lens=lens, head_mask=
                              {k: v for k, v in masks.items() if k == "encoder_self"})
    ref_memory, _ = ref.encoder(src, src_valid_lens=lens)
    torch.testing.assert_close(memory, ref_memory, atol=1e-5, rtol=1e-5)
    dec, _ = model.decoder(tgt, memory, src_valid_lens=lens,
                           head_mask={k: v for k, v in masks.items() if k != "encoder_self"})
    torch.testing.assert_close(dec, got, atol=1e-5, rtol=1e-5)


@settings(max_examples=8)
@given(seed=st.integers(0, 2**16))
def test_per_example_and_per_layer_list_forms(seed):
    """``(layers, b, h)`` masks example k like ``(layers, h)`` alone; a list with None leaves
    that layer unmasked."""
    model = bert(seed)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 31, (3, 6), generator=gen)
    per_example = torch.rand(2, 3, 4, generator=gen)
    got, _ = model(ids, head_mask=per_example)
    for k in range(3):
        row, _ = model(ids[k:k + 1], head_mask=per_example[:, k])
        torch.testing.assert_close(got[k:k + 1], row, atol=1e-5, rtol=1e-5)
    listed, _ = model(ids, head_mask={"encoder_self": [None, per_example[1, 0]]})
    one = torch.stack([torch.ones(4), per_example[1, 0]])
    torch.testing.assert_close(listed, model(ids, head_mask=one)[0], atol=0, rtol=0)


def test_bad_head_masks():
    model, tokens = seq2seq(0), torch.randint(1, 19, (2, 5))
    with pytest.raises(TypeError, match="dict {kind"):
        model(tokens, tokens, head_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="unknown kind 'decoder'"):
        model(tokens, tokens, head_mask={"decoder": torch.ones(2, 4)})
    with pytest.raises(ValueError, match=r"\(layers, h\)=\(2, 4\) or \(layers, b, h\)=\(2, 2, 4\)"):
        model(tokens, tokens, head_mask={"cross": torch.ones(3, 4)})
    with pytest.raises(ValueError, match=r"head_mask\['cross'\]\[1\] must be \(h,\)=\(4,\)"):
        model(tokens, tokens, head_mask={"cross": [None, torch.ones(5)]})
    with pytest.raises(TypeError, match="expected a headwise model"):
        attention_layers(torch.nn.Linear(2, 2))


def test_check_heads_normalises_and_refuses():
    model = seq2seq(0)
    layers = attention_layers(model)
    assert check_heads({"cross": {-1: [3, -1, 0], 0: 2}, "encoder_self": {1: True}}, layers,
                       "t") == {"cross": {1: [0, 3], 0: [2]}, "encoder_self": {1: [0, 1, 2, 3]}}
    with pytest.raises(ValueError, match="unknown attention kind 'self'"):
        check_heads({"self": {0: [0]}}, layers, "t")
    with pytest.raises(ValueError, match="cross layer 2 does not exist"):
        check_heads({"cross": {2: [0]}}, layers, "t")
    with pytest.raises(ValueError, match="head 4 of cross layer 0 does not exist"):
        check_heads({"cross": {0: [4]}}, layers, "t")
    with pytest.raises(TypeError, match="must be a dict {layer"):
        check_heads({"cross": [0]}, layers, "t")


def test_a_transformers_model_has_one_kind_layers_with_its_head_counts():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config)
    import headwise.hf  # registers the layer finder the models ask (headwise.finders)
    from headwise.models.heads import attention_layers, head_counts
    with pytest.raises(ValueError, match="runs attn_implementation='sdpa'; call "
                                         r"headwise.hf.use\(model\) first"):
        attention_layers(model)  # on sdpa its heads would be silently out of the tools' sight
    headwise.hf.use(model)
    assert list(attention_layers(model)) == ["layers"]
    assert head_counts(model) == {"layers": [4, 4]}
