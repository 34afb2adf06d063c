"""The real all-MiniLM-L6-v2 checkpoint on headwise attention reproduces Hugging Face
``transformers.BertModel`` (eager and sdpa) and sentence-transformers."""

from __future__ import annotations

import pytest
import torch

from headwise.models.bert import BertConfig, BertModel
from headwise.pretrained import (
    hf_name,
    load_bert,
    to_hf_state_dict,
)
from tests.models.test_bert import _inputs, _randomise

TOL = 5e-5


@pytest.fixture(scope="module")
def hf_models(transformers, minilm_folder):
    return {impl: transformers.BertModel.from_pretrained(str(minilm_folder),
                                                         attn_implementation=impl).eval()
            for impl in ("eager", "sdpa")}


@pytest.fixture(scope="module")
def batch(minilm, sentences):
    inputs = minilm.tokenizer.batch(sentences)
    lengths = inputs["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) == len(sentences), "want different lengths"
    assert int(lengths.min()) < inputs["input_ids"].shape[1] // 4  # plenty of padding
    return inputs


def _valid_max(a, b, mask):
    return (a - b)[mask.bool()].abs().max().item()


def test_last_hidden_state_matches_hf_eager_and_sdpa(minilm, hf_models, batch):
    model = minilm.model
    with torch.no_grad():
        fused, _ = model(**batch)                          # sdpa path, (b, 1, 1, j) mask
        seen, _ = model(**batch, return_weights=True)      # eager path (weights wanted)
        ref = {impl: m(**batch).last_hidden_state for impl, m in hf_models.items()}
    mask = batch["attention_mask"]
    figures = {
        "headwise sdpa vs HF sdpa (valid tokens)": _valid_max(fused, ref["sdpa"], mask),
        "headwise sdpa vs HF eager (valid tokens)": _valid_max(fused, ref["eager"], mask),
        "headwise eager vs HF eager (valid tokens)": _valid_max(seen, ref["eager"], mask),
        "headwise eager vs HF sdpa (valid tokens)": _valid_max(seen, ref["sdpa"], mask),
    }
    print("\nlast_hidden_state max|diff|, batch", tuple(mask.shape), figures)
    assert max(figures.values()) <= TOL, figures
    assert fused.shape == (len(mask), mask.shape[1], 384)
    # padded query rows are computed too (they attend to the real keys), as in HF
    assert (fused - ref["sdpa"]).abs().max().item() <= TOL


def test_every_attention_head_matches_hf_eager(minilm, hf_models, batch):
    with torch.no_grad():
        _, attentions = minilm.model(**batch, return_weights=True)
        ref = hf_models["eager"](**batch, output_attentions=True).attentions
    ours = attentions["encoder_self"]
    assert len(ours) == len(ref) == 6
    worst = max((a - b).abs().max().item() for a, b in zip(ours, ref, strict=True))
    print(f"\nattention weights, 6 layers x 12 heads, max|diff| vs HF eager: {worst:.3g}")
    assert worst <= TOL
    mask = batch["attention_mask"].bool()
    for w in ours:
        assert w.shape == (mask.shape[0], 12, mask.shape[1], mask.shape[1])
        assert torch.all(w[:, :, :, ~mask.any(0)] == 0)
        assert torch.all(w.masked_select(~mask[:, None, None, :].expand_as(w)) == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_float64_matches_hf_float64_tightly(transformers, minilm_folder, batch):
    from headwise.pretrained import load_bert

    ours = load_bert(minilm_folder, dtype=torch.float64, backend="eager")
    ref = transformers.BertModel.from_pretrained(str(minilm_folder),
                                                 attn_implementation="eager").double().eval()
    with torch.no_grad():
        got, _ = ours(**batch)
        want = ref(**batch).last_hidden_state
    diff = _valid_max(got, want, batch["attention_mask"])
    print(f"\nfloat64 last_hidden_state max|diff|: {diff:.3g}")
    assert diff < 1e-10


def test_selected_layers_keep_the_rest_fused(minilm, batch):
    with torch.no_grad():
        out_all, every = minilm.model(**batch, return_weights=True)
        out_sel, some = minilm.model(**batch, return_weights={"encoder_self": [2, -1]})
        out_none, nothing = minilm.model(**batch, return_weights=False)
    assert nothing is None
    got = some["encoder_self"]
    assert [i for i, w in enumerate(got) if w is not None] == [2, 5]
    # layers 0-1 ran fused, so layer 2 sees inputs equal only to float rounding
    assert (got[2] - every["encoder_self"][2]).abs().max().item() <= 1e-5
    mask = batch["attention_mask"]
    assert _valid_max(out_sel, out_all, mask) <= 1e-5
    assert _valid_max(out_none, out_all, mask) <= 1e-5


def test_padding_never_changes_real_tokens(minilm, sentences):
    """Each sentence alone equals its row in the padded batch; padded ids are never read."""
    inputs = minilm.tokenizer.batch(sentences)
    with torch.no_grad():
        batched, _ = minilm.model(**inputs)
        scrambled = dict(inputs, input_ids=torch.where(inputs["attention_mask"].bool(),
                                                       inputs["input_ids"],
                                                       torch.randint(1000, 2000,
                                                                     inputs["input_ids"].shape)))
        scrambled_out, _ = minilm.model(**scrambled)
        for row, text in enumerate(sentences):
            alone, _ = minilm.model(**minilm.tokenizer.batch([text]))
            n = alone.shape[1]
            assert (alone[0] - batched[row, :n]).abs().max().item() <= 1e-5
    mask = inputs["attention_mask"]
    assert _valid_max(scrambled_out, batched, mask) <= 1e-5


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
