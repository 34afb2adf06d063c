"""The BERT loader is general (any size saved by transformers loads and matches) and strict
(a wrong folder, architecture or state dict fails with one line naming what is wrong)."""

from __future__ import annotations

import json

import pytest
import torch

from headwise.errors import CheckpointError
from headwise.models.bert import BertConfig, BertModel
from headwise.pretrained import (
    bert_config_from_hf,
    from_hf_state_dict,
    hf_name,
    load_bert,
    to_hf_state_dict,
)

TOL = 5e-5


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


HF_CONFIGS = [
    dict(num_hidden_layers=3, num_attention_heads=4, hidden_size=64, intermediate_size=96,
         vocab_size=211, max_position_embeddings=40, type_vocab_size=3, layer_norm_eps=1e-7,
         hidden_act="gelu"),
    dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=24, intermediate_size=50,
         vocab_size=97, max_position_embeddings=16, type_vocab_size=1, layer_norm_eps=1e-5,
         hidden_act="gelu_new", pad_token_id=3),
    dict(num_hidden_layers=1, num_attention_heads=8, hidden_size=32, intermediate_size=32,
         vocab_size=50, max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12,
         hidden_act="relu"),
]


@pytest.mark.parametrize("index", range(len(HF_CONFIGS)))
def test_random_hf_bert_of_other_sizes_loads_and_matches(transformers, tmp_path, index):
    kwargs = HF_CONFIGS[index]
    hf_config = transformers.BertConfig(**kwargs)
    torch.manual_seed(index)
    ref = transformers.BertModel(hf_config, add_pooling_layer=index != 2)
    ref.set_attn_implementation("eager")  # output_attentions needs the eager path
    _randomise(ref, seed=index)
    ref.save_pretrained(tmp_path)  # config.json + model.safetensors
    assert (tmp_path / "model.safetensors").is_file()

    ours = load_bert(tmp_path)
    cfg = ours.config
    assert (cfg.num_layers, cfg.num_heads, cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.max_len,
            cfg.type_vocab_size, cfg.layer_norm_eps, cfg.pad_id) == (
        kwargs["num_hidden_layers"], kwargs["num_attention_heads"], kwargs["hidden_size"],
        kwargs["intermediate_size"], kwargs["vocab_size"], kwargs["max_position_embeddings"],
        kwargs["type_vocab_size"], kwargs["layer_norm_eps"], kwargs.get("pad_token_id", 0))
    assert cfg.pooler == (index != 2)
    assert not ours.training

    ids, mask, types = _inputs(kwargs["vocab_size"], kwargs["type_vocab_size"], 4,
                               min(12, kwargs["max_position_embeddings"]), seed=10 + index)
    ref.eval()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, token_type_ids=types,
                   output_attentions=True)
        fused, _ = ours(ids, mask, types)
        seen, attentions = ours(ids, mask, types, return_weights=True)
    valid = mask.bool()
    assert (fused - want.last_hidden_state)[valid].abs().max().item() <= TOL
    assert (seen - want.last_hidden_state)[valid].abs().max().item() <= TOL
    for a, b in zip(attentions["encoder_self"], want.attentions, strict=True):
        assert a.shape == b.shape == (4, kwargs["num_attention_heads"], ids.shape[1],
                                      ids.shape[1])
        assert (a - b).abs().max().item() <= TOL
    if cfg.pooler:
        assert (ours.pool(fused) - want.pooler_output).abs().max().item() <= TOL
    else:
        with pytest.raises(ValueError, match="no pooler"):
            ours.pool(fused)


def test_task_model_checkpoint_strips_prefix_and_heads(transformers, tmp_path):
    """A BertForMaskedLM folder (``bert.`` prefix, ``cls.*`` head, no pooler) loads its
    encoder."""
    hf_config = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2,
                                        hidden_size=16, intermediate_size=24, vocab_size=40,
                                        max_position_embeddings=20)
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM(hf_config).eval()
    _randomise(mlm, seed=3)
    mlm.save_pretrained(tmp_path)
    ours = load_bert(tmp_path)
    assert ours.config.pooler is False and ours.pooler is None
    # the same weights as a single file, and sharded (model.safetensors.index.json)
    single = load_bert(tmp_path / "model.safetensors")
    sharded_dir = tmp_path / "sharded"
    mlm.save_pretrained(sharded_dir, max_shard_size="20KB")
    assert (sharded_dir / "model.safetensors.index.json").is_file()
    sharded = load_bert(sharded_dir)
    for other in (single, sharded):
        for (n1, t1), (n2, t2) in zip(ours.state_dict().items(), other.state_dict().items(),
                                      strict=True):
            assert n1 == n2 and torch.equal(t1, t2), n1
    ids, mask, types = _inputs(40, 2, 3, 9, seed=4)
    with torch.no_grad():
        want = mlm.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
        got, _ = ours(ids, mask, types)
    assert (got - want.last_hidden_state)[mask.bool()].abs().max().item() <= TOL


def test_headwise_weights_export_to_hf_and_back(transformers):
    config = BertConfig(vocab_size=60, d_model=32, num_heads=4, num_layers=2, d_ff=40,
                        max_len=24, type_vocab_size=2, layer_norm_eps=1e-6)
    torch.manual_seed(5)
    ours = BertModel(config).eval()
    _randomise(ours, seed=6)
    hf = transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=40,
        vocab_size=60, max_position_embeddings=24, layer_norm_eps=1e-6)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours), strict=False)
    # strict except for HF's derived buffers
    assert not unexpected and set(missing) <= {"embeddings.position_ids",
                                               "embeddings.token_type_ids"}
    back = load_bert(to_hf_state_dict(ours), config)
    ids, mask, types = _inputs(60, 2, 3, 10, seed=7)
    with torch.no_grad():
        a, _ = ours(ids, mask, types)
        b = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        c, _ = back(ids, mask, types)
    assert torch.equal(a, c)
    assert (a - b)[mask.bool()].abs().max().item() <= TOL


# ------------------------------------------------------------------------------- bad input
def _hf_dict(**changes):
    base = dict(model_type="bert", architectures=["BertModel"], vocab_size=30, hidden_size=8,
                num_attention_heads=2, num_hidden_layers=1, intermediate_size=12,
                max_position_embeddings=10)
    base.update(changes)
    return base


def test_folder_without_weights_names_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_hf_dict()))
    with pytest.raises(CheckpointError, match=r"has no model\.safetensors \(found \['config"):
        load_bert(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*pickle"):
        load_bert(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_bert(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_bert(empty)


def test_config_of_another_architecture_is_refused(tmp_path):
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 8,
            "n_head": 2, "n_layer": 1, "vocab_size": 30}
    with pytest.raises(CheckpointError, match=r"model_type='gpt2'.*GPT2LMHeadModel.*not a BERT"):
        bert_config_from_hf(gpt2)
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    with pytest.raises(CheckpointError, match="model_type='gpt2'"):
        load_bert(tmp_path)
    with pytest.raises(CheckpointError, match="position_embedding_type='relative_key'"):
        bert_config_from_hf(_hf_dict(position_embedding_type="relative_key"))
    with pytest.raises(CheckpointError, match="hidden_act='mish'"):
        bert_config_from_hf(_hf_dict(hidden_act="mish"))
    with pytest.raises(CheckpointError, match="missing key 'hidden_size'"):
        bert_config_from_hf({k: v for k, v in _hf_dict().items() if k != "hidden_size"})
    with pytest.raises(CheckpointError, match="not divisible by num_heads=3"):
        bert_config_from_hf(_hf_dict(num_attention_heads=3))


def test_state_dict_with_missing_or_unexpected_keys_names_them(transformers):
    hf = transformers.BertModel(transformers.BertConfig(**{
        k: v for k, v in _hf_dict().items() if k not in ("model_type", "architectures")}))
    state = hf.state_dict()
    config = bert_config_from_hf(_hf_dict())
    assert set(from_hf_state_dict(state, config)) == set(BertModel(config).state_dict())

    broken = dict(state)
    del broken["encoder.layer.0.attention.self.key.weight"]
    del broken["embeddings.LayerNorm.bias"]
    broken["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError) as info:
        load_bert(broken, _hf_dict())
    message = str(info.value)
    assert "missing keys (headwise names): embeddings.norm.bias, " \
           "layers.0.self_attn.k_proj.weight" in message
    assert "unexpected keys: encoder.layer.0.attention.self.rotary.weight" in message
    assert "\n" not in message

    extra_layer = dict(state)
    extra_layer["encoder.layer.1.output.dense.bias"] = torch.zeros(8)
    with pytest.raises(CheckpointError, match=r"unexpected keys: layers\.1\.ff\.down\.bias"):
        load_bert(extra_layer, _hf_dict())

    wrong_shape = dict(state)
    wrong_shape["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(13, 8)
    with pytest.raises(CheckpointError, match=r"layers\.0\.ff\.up\.weight \(13, 8\) "
                                              r"\(expected \(12, 8\)\)"):
        load_bert(wrong_shape, _hf_dict())
    with pytest.raises(TypeError, match="needs config="):
        load_bert(state)
    with pytest.raises(TypeError, match="BertConfig or a config.json dict"):
        load_bert(state, config=3)


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
    with pytest.raises(ValueError, match=r"head_mask must be \(layers, h\)=\(1, 2\)"):
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


def test_gradients_match_hf_in_training_mode(transformers, tmp_path):
    """Fine-tuning works the same: every parameter's gradient equals HF's (dropout 0)."""
    hf_config = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=4,
                                        hidden_size=32, intermediate_size=48, vocab_size=70,
                                        max_position_embeddings=16, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)
    torch.manual_seed(8)
    ref = transformers.BertModel(hf_config)
    _randomise(ref, seed=9)
    ref.save_pretrained(tmp_path)
    ours = load_bert(tmp_path).train()
    ref.train()
    ids, mask, types = _inputs(70, 2, 3, 11, seed=10)
    probe = torch.randn(3, 11, 32, generator=torch.Generator().manual_seed(11))
    valid = mask[..., None].float()
    (ref(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
     * probe * valid).sum().backward()
    (ours(ids, mask, types)[0] * probe * valid).sum().backward()
    grads = {name: p.grad for name, p in ours.named_parameters()}
    theirs = {name: p.grad for name, p in ref.named_parameters()}
    worst = 0.0
    for name in grads:
        if theirs[hf_name(name)] is None:  # the pooler is not on this loss's path
            assert grads[name] is None
            continue
        worst = max(worst, (grads[name] - theirs[hf_name(name)]).abs().max().item())
    print(f"\nmax|grad diff| vs HF over {len(grads)} parameters: {worst:.3g}")
    assert worst <= 1e-5, worst


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
