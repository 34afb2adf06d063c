"""Blocks against torch's layers (and Hugging Face's BertLayer) after a weight copy; the feed-forward against float64 math."""

import math

import pytest
import torch
from torch import nn

from headwise import MultiHeadAttention
from headwise.models import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
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
