"""TransformerLM against torch's TransformerEncoder stack with a causal mask."""


import torch
from torch import nn

from tests.models.test_lm import tiny


def test_matches_torch_encoder_stack_with_causal_mask():
    """Pre-norm LM == embedding * 1 + sinusoidal table -> torch TransformerEncoder(causal) with
    a final LayerNorm -> linear head, after copying every weight."""
    model = tiny(activation="gelu")
    c = model.config
    layer = nn.TransformerEncoderLayer(c.d_model, c.num_heads, c.d_ff, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
    ref = nn.TransformerEncoder(layer, c.num_layers, norm=nn.LayerNorm(c.d_model),
                                enable_nested_tensor=False).eval()
    for ours, theirs in zip(model.blocks, ref.layers, strict=True):
        theirs.self_attn.load_state_dict(ours.self_attn.to_torch().state_dict())
        theirs.linear1.load_state_dict(ours.ff.up.state_dict())
        theirs.linear2.load_state_dict(ours.ff.down.state_dict())
        theirs.norm1.load_state_dict(ours.attn_norm.state_dict())
        theirs.norm2.load_state_dict(ours.ff_norm.state_dict())
    ref.norm.load_state_dict(model.final_norm.state_dict())
    tokens = torch.randint(0, 37, (3, 11))
    with torch.no_grad():
        x = model.embed.tokens(tokens) + model.embed.positions.pe[:11]
        h = ref(x, mask=nn.Transformer.generate_square_subsequent_mask(11), is_causal=True)
        want = h @ model.lm_head.weight.T
        got, _ = model(tokens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
