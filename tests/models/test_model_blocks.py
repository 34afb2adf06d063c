"""Blocks against references: torch's Transformer layers and Hugging Face's BertLayer after a
weight copy, float64 math for the feed-forward and the sinusoidal table."""

import math

import pytest
import torch
from torch import nn

from headwise import MultiHeadAttention
from headwise.models import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
)


def _copy_attn(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    ours.load_state_dict(MultiHeadAttention.from_torch(theirs).state_dict())


def _copy_ff(ours: FeedForward, lin1: nn.Linear, lin2: nn.Linear) -> None:
    ours.up.load_state_dict(lin1.state_dict())
    ours.down.load_state_dict(lin2.state_dict())


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_feedforward_matches_float64_math(activation):
    torch.manual_seed(0)
    ff = FeedForward(12, 40, activation=activation).double()
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    h = x @ ff.up.weight.T + ff.up.bias
    ref_act = {"relu": torch.clamp(h, min=0),
               "gelu": 0.5 * h * (1 + torch.erf(h / math.sqrt(2))),
               "gelu_tanh": 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi)
                                                      * (h + 0.044715 * h ** 3))),
               "silu": h * torch.sigmoid(h)}[activation]
    ref = ref_act @ ff.down.weight.T + ff.down.bias
    torch.testing.assert_close(ff(x), ref, rtol=1e-12, atol=1e-12)


def test_feedforward_rejects_unknown_activation():
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(4, 8, activation="swish")


def test_sinusoidal_table_is_the_paper_formula():
    pe = SinusoidalPositionalEncoding(10, 50)
    n, k = torch.meshgrid(torch.arange(50.0, dtype=torch.float64),
                          torch.arange(5.0, dtype=torch.float64), indexing="ij")
    angle = n / 10000 ** (2 * k / 10)
    torch.testing.assert_close(pe.pe[:, 0::2].double(), torch.sin(angle), atol=1e-6, rtol=0)
    torch.testing.assert_close(pe.pe[:, 1::2].double(), torch.cos(angle), atol=1e-6, rtol=0)
    assert "pe" not in pe.state_dict()  # derived: never saved


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnedPositionalEncoding])
def test_positional_offset_continues_the_sequence(cls):
    torch.manual_seed(0)
    pe = cls(8, 20)
    x = torch.randn(2, 9, 8)
    whole = pe(x)
    torch.testing.assert_close(torch.cat([pe(x[:, :4]), pe(x[:, 4:], offset=4)], 1), whole)
    with pytest.raises(ValueError, match="exceed max_len=20"):
        pe(torch.randn(1, 5, 8), offset=16)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_matches_torch_layer(norm_first, activation):
    torch.manual_seed(1)
    ref = nn.TransformerEncoderLayer(16, 4, 40, dropout=0.0, activation=activation,
                                     batch_first=True, norm_first=norm_first).eval()
    ours = EncoderBlock(16, 4, 40, norm_first=norm_first, activation=activation).eval()
    _copy_attn(ours.self_attn, ref.self_attn)
    _copy_ff(ours.ff, ref.linear1, ref.linear2)
    ours.attn_norm.load_state_dict(ref.norm1.state_dict())
    ours.ff_norm.load_state_dict(ref.norm2.state_dict())
    x = torch.randn(3, 7, 16)
    lens = torch.tensor([7, 4, 2])
    keep = torch.arange(7)[None] < lens[:, None]  # True = may attend
    with torch.no_grad():
        want = ref(x, src_key_padding_mask=~keep)
        got, w = ours(x, mask=keep[:, None, None, :])
        got_w, w2 = ours(x, mask=keep[:, None, None, :], return_weights=True)
    assert w is None and w2.shape == (3, 4, 7, 7)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, got, atol=1e-5, rtol=1e-5)
    assert (w2[1, :, :, 4:] == 0).all()
    torch.testing.assert_close(w2.sum(-1), torch.ones(3, 4, 7))


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_matches_torch_layer(norm_first):
    torch.manual_seed(2)
    ref = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True,
                                     norm_first=norm_first).eval()
    ours = DecoderBlock(16, 2, 32, norm_first=norm_first).eval()
    _copy_attn(ours.self_attn, ref.self_attn)
    _copy_attn(ours.cross_attn, ref.multihead_attn)
    _copy_ff(ours.ff, ref.linear1, ref.linear2)
    for mine, theirs in ((ours.attn_norm, ref.norm1), (ours.cross_norm, ref.norm2),
                         (ours.ff_norm, ref.norm3)):
        mine.load_state_dict(theirs.state_dict())
    x, memory = torch.randn(2, 6, 16), torch.randn(2, 9, 16)
    src_keep = torch.arange(9)[None] < torch.tensor([9, 5])[:, None]
    with torch.no_grad():
        want = ref(x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(6),
                   memory_key_padding_mask=~src_keep)
        got, (sw, cw) = ours(x, memory, memory_mask=src_keep[:, None, None, :],
                             return_weights=True)
        only_cross, (sw2, cw2) = ours(x, memory, memory_mask=src_keep[:, None, None, :],
                                      return_weights=(False, True))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(only_cross, got, atol=1e-5, rtol=1e-5)
    assert sw2 is None and cw2.shape == (2, 2, 6, 9)
    assert (sw.triu(1) == 0).all()  # causal
    assert (cw[1, :, :, 5:] == 0).all()  # source padding


def test_decoder_block_without_cross_attention_is_a_causal_lm_block():
    torch.manual_seed(3)
    ref = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                     norm_first=True).eval()
    ours = DecoderBlock(8, 2, 16, cross_attention=False).eval()
    assert ours.cross_attn is None and not any("cross" in k for k in ours.state_dict())
    _copy_attn(ours.self_attn, ref.self_attn)
    _copy_ff(ours.ff, ref.linear1, ref.linear2)
    ours.attn_norm.load_state_dict(ref.norm1.state_dict())
    ours.ff_norm.load_state_dict(ref.norm2.state_dict())
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        want = ref(x, src_mask=nn.Transformer.generate_square_subsequent_mask(5), is_causal=True)
        got, (_, cross) = ours(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert cross is None
    with pytest.raises(ValueError, match="cross_attention=False"):
        ours(x, torch.randn(2, 3, 8))


def test_post_norm_encoder_block_is_a_bert_layer():
    import transformers

    torch.manual_seed(4)
    cfg = transformers.BertConfig(hidden_size=24, num_attention_heads=3, intermediate_size=48,
                                  hidden_act="gelu", layer_norm_eps=1e-12,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                  attn_implementation="eager")
    ref = transformers.models.bert.modeling_bert.BertLayer(cfg).eval()
    ours = EncoderBlock(24, 3, 48, norm_first=False, activation="gelu",
                        layer_norm_eps=1e-12).eval()
    a = ours.self_attn
    for mine, theirs in ((a.q_proj, ref.attention.self.query), (a.k_proj, ref.attention.self.key),
                         (a.v_proj, ref.attention.self.value),
                         (a.out_proj, ref.attention.output.dense),
                         (ours.attn_norm, ref.attention.output.LayerNorm),
                         (ours.ff.up, ref.intermediate.dense), (ours.ff.down, ref.output.dense),
                         (ours.ff_norm, ref.output.LayerNorm)):
        mine.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 6, 24)
    with torch.no_grad():
        want = ref(x)
        want = want[0] if isinstance(want, tuple) else want
        got, _ = ours(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_gqa_block_and_head_mask():
    torch.manual_seed(5)
    block = EncoderBlock(16, 4, 32, num_kv_heads=2).eval()
    assert block.self_attn.k_proj.out_features == 8
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        base, _ = block(x)
        masked, _ = block(x, head_mask=torch.tensor([1.0, 0.0, 1.0, 1.0]))
        # removing head 1 by hand: zero its slice of out_proj's input columns
        manual = EncoderBlock(16, 4, 32, num_kv_heads=2).eval()
        manual.load_state_dict(block.state_dict())
        manual.self_attn.out_proj.weight[:, 4:8] = 0
        want, _ = manual(x)
    torch.testing.assert_close(masked, want, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(masked, base)


def test_dropout_is_used_in_training_only():
    torch.manual_seed(6)
    block = EncoderBlock(8, 2, 16, dropout=0.5)
    x = torch.randn(2, 4, 8)
    assert not torch.allclose(block(x)[0], block(x)[0])
    block.eval()
    torch.testing.assert_close(block(x)[0], block(x)[0])
