"""Blocks against references: torch's Transformer layers and Hugging Face's BertLayer after a
weight copy, float64 math for the feed-forward and the sinusoidal table."""


import pytest
import torch

from headwise.models import (
    EncoderBlock,
    FeedForward,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
)


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


# ---------------------------------------------------------------- in place under inference
@pytest.mark.parametrize("ffn", ["mlp", "glu"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_inference_writes_in_place_with_the_same_bits_as_the_autograd_path(
        ffn, activation, norm_first):
    """Under no_grad, in a forward that reuses its buffers (headwise.fast.reuse.scope, which
    every model's forward enters), the feed-forward's activation and gating and the residual
    additions write in place: the block's output is bit for bit the one autograd's
    out-of-place path gives, and the input is left as it was."""
    from headwise.fast import reuse
    from headwise.models import DecoderBlock
    torch.manual_seed(len(ffn) + len(activation) + norm_first)
    block = DecoderBlock(16, 4, 40, dropout=0.0, norm_first=norm_first, activation=activation,
                         ffn=ffn, norm="rms", cross_attention=False).eval()
    x = torch.randn(2, 7, 16)
    keep = x.clone()
    want, _ = block(x)  # grad on: out of place
    with torch.no_grad(), reuse.scope(block) as on:
        got, _ = block(x)
    assert on and want.requires_grad and torch.equal(got, want.detach()) and torch.equal(x, keep)


@pytest.mark.parametrize("where", ["ff.gate", "ff.down", "ff", "self_attn.out_proj", "self_attn",
                                   "global"])
def test_a_forward_hook_keeps_what_it_was_handed(where):
    """An activation cache (a forward hook) holds the outputs it saw: with a hook on the
    feed-forward's gate, its output projection, the feed-forward, attention's output
    projection, attention itself, or a global hook, nothing is overwritten after the hook ran,
    so the cached tensor still equals that module's output recomputed alone."""
    from headwise.fast import reuse
    from headwise.models import DecoderBlock
    torch.manual_seed(3)
    block = DecoderBlock(16, 4, 40, dropout=0.0, activation="silu", ffn="glu",
                         cross_attention=False).eval()
    seen = {}

    def keep(module, args, out):
        seen["in"], seen["out"] = args, out[0] if isinstance(out, tuple) else out

    if where == "global":
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, a, o: keep(m, a, o) if m is block.ff.gate else None)
        module = block.ff.gate
    else:
        module = block.get_submodule(where)
        handle = module.register_forward_hook(keep)
    with torch.no_grad():
        with reuse.scope(block) as on:
            block(torch.randn(2, 5, 16))
        assert not on
        handle.remove()  # (before recomputing: the hook would replace what it kept)
        again = module(*seen["in"], **({"causal": True} if where == "self_attn" else {}))
    again = again[0] if isinstance(again, tuple) else again
    assert torch.equal(seen["out"], again)
