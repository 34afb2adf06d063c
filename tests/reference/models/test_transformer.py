"""Encoder-decoder Transformer against torch.nn.Transformer after a weight copy."""


import pytest
import torch
from torch import nn

from tests.models.test_transformer import S, T, tiny


def test_matches_torch_transformer():
    """Pre-norm with final norms == torch.nn.Transformer(norm_first=True) on the embedded
    inputs, with source padding and a causal target mask."""
    model = tiny(num_decoder_layers=3)
    c = model.config
    with pytest.warns(UserWarning, match="enable_nested_tensor"):  # torch's, about itself
        ref = nn.Transformer(c.d_model, c.num_heads, c.num_layers, 3, c.d_ff, dropout=0.0,
                             batch_first=True, norm_first=True).eval()
    for ours, theirs in zip(model.encoder.blocks, ref.encoder.layers, strict=True):
        theirs.self_attn.load_state_dict(ours.self_attn.to_torch().state_dict())
        for a, b in ((ours.ff.up, theirs.linear1), (ours.ff.down, theirs.linear2),
                     (ours.attn_norm, theirs.norm1), (ours.ff_norm, theirs.norm2)):
            b.load_state_dict(a.state_dict())
    for ours, theirs in zip(model.decoder.blocks, ref.decoder.layers, strict=True):
        theirs.self_attn.load_state_dict(ours.self_attn.to_torch().state_dict())
        theirs.multihead_attn.load_state_dict(ours.cross_attn.to_torch().state_dict())
        for a, b in ((ours.ff.up, theirs.linear1), (ours.ff.down, theirs.linear2),
                     (ours.attn_norm, theirs.norm1), (ours.cross_norm, theirs.norm2),
                     (ours.ff_norm, theirs.norm3)):
            b.load_state_dict(a.state_dict())
    ref.encoder.norm.load_state_dict(model.encoder.final_norm.state_dict())
    ref.decoder.norm.load_state_dict(model.decoder.final_norm.state_dict())
    src, tgt = torch.randint(0, S, (3, 9)), torch.randint(0, T, (3, 7))
    lens = torch.tensor([9, 4, 6])
    pad = torch.arange(9)[None] >= lens[:, None]  # torch: True = ignore
    with torch.no_grad():
        def embed(e, ids):
            return e.tokens(ids) * e.scale + e.positions.pe[: ids.shape[1]]
        h = ref(embed(model.encoder.embed, src), embed(model.decoder.embed, tgt),
                tgt_mask=nn.Transformer.generate_square_subsequent_mask(7),
                src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True)
        want = h @ model.decoder.lm_head.weight.T
        got, _ = model(src, tgt, src_valid_lens=lens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
