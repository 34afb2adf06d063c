"""Token embeddings + positions: the module form, its one-row form, initialisation, output head."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.decode.forms import form_of
from headwise.models import LMConfig, build
from headwise.models.embedding import Embeddings, init_weights


@settings(max_examples=20, deadline=None)
@given(positional=st.sampled_from(["sinusoidal", "learned", "rope"]), scale=st.booleans(),
       n=st.integers(1, 6), offset=st.integers(0, 4), seed=st.integers(0, 2**31 - 1))
def test_forward_is_scaled_token_plus_position_and_the_row_form_agrees(positional, scale, n,
                                                                       offset, seed):
    torch.manual_seed(seed)
    emb = Embeddings(13, 8, 12, positional=positional, dropout=0.0, scale=scale).eval()
    ids = torch.randint(0, 13, (2, n))
    out = emb(ids, offset)
    want = emb.tokens.weight[ids] * (math.sqrt(8) if scale else 1.0)
    if positional != "rope":
        table = (emb.positions.weight if positional == "learned" else emb.positions.pe)
        want = want + table[offset:offset + n].reshape(1, n, 8)
    torch.testing.assert_close(out, want)
    row = form_of(emb)
    for p in range(n):
        torch.testing.assert_close(row(ids[:, p], offset + p), out[:, p])


def test_init_weights_gives_unit_size_scaled_embeddings():
    torch.manual_seed(0)
    plain = Embeddings(4000, 64, 8, positional="rope", dropout=0.0, scale=False)
    scaled = Embeddings(4000, 64, 8, positional="rope", dropout=0.0, scale=True)
    init_weights(plain)
    init_weights(scaled)
    assert plain.tokens.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert (scaled.tokens.weight * scaled.scale).std().item() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("tie", [False, True])
def test_the_output_head_is_tied_only_when_asked(tie):
    model = build(LMConfig(vocab_size=11, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                           max_len=8, tie_embeddings=tie))
    assert model.lm_head.weight.shape == (11, 8) and model.lm_head.bias is None
    assert (model.lm_head.weight is model.embed.tokens.weight) == tie


def test_build_stack_registers_embed_blocks_and_final_norm_in_that_order():
    from torch import nn

    from headwise.models import LMConfig
    from headwise.models.embedding import Embeddings, build_stack

    config = LMConfig(vocab_size=7, d_model=8, num_heads=2, num_layers=2, d_ff=16, max_len=8)
    model, made = nn.Module(), []

    def block(m, h, d_ff, **kwargs):
        made.append((m, h, d_ff, kwargs.pop("tag"), sorted(kwargs)))
        return nn.Linear(m, m)

    build_stack(model, config, 7, block, 3, tag="mine")
    assert model.config is config and isinstance(model.embed, Embeddings)
    assert [name for name, _ in model.named_children()] == ["embed", "blocks", "final_norm"]
    assert len(model.blocks) == 3 and model.embed.tokens.num_embeddings == 7
    assert [x[:4] for x in made] == [(8, 2, 16, "mine")] * 3
    assert "rope" in made[0][4] and "dropout" in made[0][4]  # every block gets block_args
    assert isinstance(model.final_norm, nn.Module) and not isinstance(model.final_norm, nn.Identity)
