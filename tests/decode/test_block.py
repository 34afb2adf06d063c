"""headwise.decode.block: a decoder block's one-row form (its sublayers' forms in its residual
order) equals the block's forward over a cache, position by position, pre- and post-norm, with
and without cross-attention."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.cache import KVCache
from headwise.decode.forms import form_of
from headwise.models.blocks import DecoderBlock


@settings(max_examples=20, deadline=None)
@given(norm_first=st.booleans(), cross=st.booleans(), norm=st.sampled_from(["layer", "rms"]),
       ffn=st.sampled_from(["mlp", "glu"]), g=st.sampled_from([1, 2, 4]), transpose=st.booleans(),
       fuse=st.booleans(), n=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_the_block_form_is_the_blocks_forward_position_by_position(norm_first, cross, norm, ffn,
                                                                   g, transpose, fuse, n, seed):
    torch.manual_seed(seed)
    block = DecoderBlock(16, 4, 24, norm_first=norm_first, norm=norm, ffn=ffn, num_kv_heads=g,
                         activation="silu", cross_attention=cross).eval()
    with torch.no_grad():  # norms start at (1, 0): draw them so a skipped norm would show
        for name, p in block.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    x, memory = torch.randn(2, n, 16), (torch.randn(2, 3, 16) if cross else None)
    ref, mine = (KVCache(1, 2, g, 4, n, cross_attention=cross) for _ in range(2))
    with torch.inference_mode():
        want = []
        for p in range(n):  # the module over its cache, one position at a time
            out, _ = block(x[:, p:p + 1], memory, cache=ref.layers[0])
            ref.advance(1)
            want.append(out[:, 0])
        if cross:  # the prompt step stores the encoder's keys/values; the form reads them
            block(x[:, :1], memory, cache=KVCache(1, 2, g, 4, n, cross_attention=True).layers[0])
            attn = block.cross_attn
            mine.layers[0].cross_attn.update(attn._split(attn.k_proj(memory), "k", g),
                                             attn._split(attn.v_proj(memory), "v", g))
        form = form_of(block, cache=mine.layers[0], transpose=transpose, fuse=fuse)
        for p in range(n):
            got = form(x[:, p], None, None)
            mine.advance(1)
            torch.testing.assert_close(got, want[p], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.k, ref.k, atol=1e-5, rtol=1e-5)
