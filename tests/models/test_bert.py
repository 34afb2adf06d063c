"""BertModel: readable input errors, head_mask, padding reaches the fused kernel as a key mask."""

from __future__ import annotations

import pytest
import torch

from headwise.models.bert import BertConfig, BertModel


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random, LayerNorms included (HF initialises them to 1 / 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0)
                    * torch.rand(()).item())

def _inputs(vocab: int, types: int, b: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (b, n), generator=g)
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    lengths[0] = n
    mask = (torch.arange(n) < lengths[:, None]).long()
    token_types = torch.randint(0, types, (b, n), generator=g)
    return ids, mask, token_types

def test_model_input_errors_are_readable():
    model = BertModel(BertConfig(vocab_size=20, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                                 max_len=6)).eval()
    ids = torch.randint(0, 20, (2, 5))
    with pytest.raises(ValueError, match=r"input_ids must be \(b, n\).*unsqueeze"):
        model(ids[0])
    with pytest.raises(TypeError, match="integer token ids"):
        model(ids.float())
    with pytest.raises(ValueError, match=r"must lie in \[0, 20\)"):
        model(ids + 20)
    with pytest.raises(ValueError, match="exceed max_len=6"):
        model(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask must be a \(b, n\)=\(2, 5\)"):
        model(ids, torch.ones(2, 4))
    with pytest.raises(ValueError, match="token_type_ids must lie"):
        model(ids, None, torch.full((2, 5), 2))
    with pytest.raises(ValueError, match=r"head_mask\['encoder_self'\] must be \(layers, h\)=\(1, 2\)"):
        model(ids, head_mask=torch.ones(2))
    with pytest.raises(ValueError, match="unknown kind 'cross'"):
        model(ids, return_weights={"cross"})
    with pytest.raises(ValueError, match="out of range"):
        model(ids, return_weights={"encoder_self": [3]})
    with pytest.raises(ValueError, match="not divisible"):
        BertConfig(d_model=10, num_heads=3)
    with pytest.raises(ValueError, match="unknown keys"):
        BertConfig.from_dict({"hidden_size": 8})
    assert BertConfig.from_dict(model.config.to_dict()) == model.config

def test_head_mask_removes_a_head(transformers):
    """``head_mask`` zeroes one head's output: the same as zeroing that head's value rows."""
    config = BertConfig(vocab_size=30, d_model=16, num_heads=4, num_layers=2, d_ff=20,
                        max_len=12)
    torch.manual_seed(1)
    model = BertModel(config).eval()
    _randomise(model, seed=2)
    ids, mask, _ = _inputs(30, 1, 2, 7, seed=3)
    head_mask = torch.ones(2, 4)
    head_mask[1, 2] = 0
    pruned = BertModel(config).eval()
    pruned.load_state_dict(model.state_dict())
    with torch.no_grad():
        v = pruned.layers[1].self_attn.v_proj
        v.weight[8:12] = 0
        v.bias[8:12] = 0
        a, _ = model(ids, mask, head_mask=head_mask)
        b, _ = pruned(ids, mask)
    assert (a - b)[mask.bool()].abs().max().item() <= 1e-5

def test_padding_reaches_the_fused_kernel_as_a_key_mask(monkeypatch):
    """The fast path: a (b, 1, 1, j) bool key mask, never (b, 1, i, j); no padding -> no mask."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append(None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype))
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = BertModel(BertConfig(vocab_size=30, d_model=16, num_heads=4, num_layers=2, d_ff=20,
                                 max_len=12)).eval()
    ids, mask, _ = _inputs(30, 1, 3, 9, seed=12)
    assert not mask.all()
    with torch.no_grad():
        model(ids, mask)
        model(ids, torch.ones_like(mask))
        model(ids)
    assert seen == [((3, 1, 1, 9), torch.bool)] * 2 + [None] * 4
