"""Physical head pruning: an empty selection changes nothing; pruning equals gating the same
heads to 0 in the unpruned model (self- and cross-attention, grouped heads, RoPE, sinks, the LM,
the encoder-decoder, BERT); pruning twice composes; cached generation equals uncached; pruned
checkpoints round-trip; bad selections and mismatched checkpoints are clear errors."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise.analysis.prune import prune_heads
from headwise.models import (
    LMConfig,
    Transformer,
    TransformerConfig,
    TransformerLM,
    attention_layers,
)
from headwise.models.bert import BertConfig, BertModel


def _randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random (biases, norms and sinks too), so no head is special."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return model.eval()


def lm(seed=0, **kw):
    args = dict(vocab_size=29, d_model=24, num_heads=6, num_layers=3, d_ff=40, max_len=48,
                dropout=0.0)
    return _randomise(TransformerLM(LMConfig(**{**args, **kw})), seed)


def seq2seq(seed=0, **kw):
    args = dict(src_vocab_size=23, tgt_vocab_size=19, d_model=24, num_heads=4, num_layers=2,
                d_ff=40, max_len=48, dropout=0.0, pad_id=0)
    return _randomise(Transformer(TransformerConfig(**{**args, **kw})), seed)


def bert(seed=0):
    config = BertConfig(vocab_size=31, d_model=24, num_heads=6, num_layers=2, d_ff=40,
                        max_len=16, dropout=0.0, attention_dropout=0.0)
    return _randomise(BertModel(config), seed)


LLAMA = dict(positional="rope", norm="rms", ffn="glu", activation="silu", bias=False)
MODELS = {
    "lm": lambda s: lm(s),
    "lm-gqa-llama": lambda s: lm(s, num_heads=6, num_kv_heads=2, **LLAMA),
    "lm-mqa-sinks": lambda s: lm(s, num_heads=4, num_kv_heads=1, attention_sinks=True,
                                 d_model=16),
    "seq2seq": lambda s: seq2seq(s),
    "seq2seq-gqa-rope": lambda s: seq2seq(s, num_kv_heads=2, positional="rope", bias=False),
    "bert": lambda s: bert(s),
}


@torch.no_grad()
def run(model, seed=1):
    """The model's main output on fixed random inputs (padding included)."""
    g = torch.Generator().manual_seed(seed)
    if isinstance(model, TransformerLM):
        return model(torch.randint(0, 29, (2, 9), generator=g))[0]
    if isinstance(model, Transformer):
        src = torch.randint(1, 23, (2, 7), generator=g)
        return model(src, torch.randint(0, 19, (2, 5), generator=g),
                     src_valid_lens=torch.tensor([7, 4]))[0]
    ids = torch.randint(0, 31, (2, 8), generator=g)
    return model(ids, torch.tensor([[1] * 8, [1] * 5 + [0] * 3]))[0]


def gated(model, heads) -> torch.Tensor:
    """``run(model)`` with the selected heads' outputs multiplied by 0 (each block's own
    ``head_mask``, passed in by a pre-hook: the unpruned model computes every head)."""
    handles = []
    for kind, layers in heads.items():
        for layer, chosen in layers.items():
            mha = attention_layers(model)[kind][layer]
            mask = torch.ones(mha.num_heads)
            mask[list(chosen)] = 0.0

            def hook(_module, args, kwargs, mask=mask):
                return args, {**kwargs, "head_mask": mask}
            handles.append(mha.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        return run(model)
    finally:
        for handle in handles:
            handle.remove()


@st.composite
def selections(draw, model):
    """A valid selection ``{kind: {layer: [heads]}}``: per layer, whole key/value groups and/or
    the same number of query heads from every other group, never every head."""
    out = {}
    for kind, mods in attention_layers(model).items():
        for layer, mha in enumerate(mods):
            if not draw(st.booleans()):
                continue
            h, g = mha.num_heads, mha.num_kv_heads
            r = h // g
            dropped = draw(st.sets(st.integers(0, g - 1), max_size=g - 1))
            per_group = draw(st.integers(0, r - 1))
            heads = [x for grp in dropped for x in range(grp * r, grp * r + r)]
            for grp in sorted(set(range(g)) - dropped):
                heads += [grp * r + i for i in draw(st.permutations(range(r)))[:per_group]]
            if heads:
                out.setdefault(kind, {})[layer] = draw(st.permutations(heads))
    return out


@pytest.mark.parametrize("name", list(MODELS))
@settings(max_examples=6, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_pruning_equals_gating_to_zero(name, data, seed):
    model = MODELS[name](seed)
    heads = data.draw(selections(model))
    want = gated(model, heads)
    pruned = prune_heads(copy.deepcopy(model), heads)
    # 1e-6 of the output's scale: the two paths sum the same products in another order
    torch.testing.assert_close(run(pruned), want, atol=1e-6 * max(1.0, want.abs().max().item()),
                               rtol=0)
    removed = sum(len(x) for layers in heads.values() for x in layers.values())
    before = sum(m.num_heads for mods in attention_layers(model).values() for m in mods)
    after = sum(m.num_heads for mods in attention_layers(pruned).values() for m in mods)
    assert after == before - removed
    if removed:  # genuinely smaller: fewer parameters, not masked ones
        assert sum(p.numel() for p in pruned.parameters()) < sum(
            p.numel() for p in model.parameters())


@pytest.mark.parametrize("empty", [{}, {"decoder_self": {}}, {"decoder_self": {1: []}}])
def test_empty_selection_is_a_no_op(empty):
    model = lm(3, num_kv_heads=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = model.config
    assert prune_heads(model, empty) is model
    assert model.config is config and config.pruned_heads is None
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_pruning_twice_composes_in_original_indices():
    model = lm(4, num_heads=6, num_kv_heads=3, **LLAMA)
    # layer 0: 6 heads in 3 groups of 2. First drop group 1 (heads 2, 3); the survivors are
    # heads 0, 1, 4, 5, now numbered 0..3: dropping "0 and 2" drops originals 0 and 4.
    once = prune_heads(copy.deepcopy(model), {"decoder_self": {0: [2, 3]}})
    assert once.config.pruned_heads == {"decoder_self": [[2, 3], [], []]}
    twice = prune_heads(once, {"decoder_self": {0: [0, 2], -1: [4, 5]}})
    assert twice.config.pruned_heads == {"decoder_self": [[0, 2, 3, 4], [], [4, 5]]}
    mha = twice.blocks[0].self_attn
    assert (mha.num_heads, mha.num_kv_heads) == (2, 2)
    want = gated(model, {"decoder_self": {0: [0, 2, 3, 4], 2: [4, 5]}})
    torch.testing.assert_close(run(twice), want, atol=1e-6 * max(1.0, want.abs().max().item()),
                               rtol=0)


@pytest.mark.parametrize("make", [lambda: lm(5, num_heads=6, num_kv_heads=3, **LLAMA),
                                  lambda: lm(6, positional="learned"),
                                  lambda: seq2seq(7, num_kv_heads=2)])
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_cached_generation_of_a_pruned_model_equals_uncached(make, strategy):
    model = make()
    kinds = attention_layers(model)
    # layers end with different head counts (and key/value head counts)
    heads = {kind: {0: [0, 1]} for kind in kinds}
    prune_heads(model, heads)
    counts = [m.num_heads for m in attention_layers(model)[next(iter(kinds))]]
    assert len(set(counts)) > 1
    g = torch.Generator().manual_seed(0)
    kw = dict(max_new_tokens=12, strategy=strategy, beam_size=3 if strategy == "beam" else 1)
    if isinstance(model, Transformer):
        kw.update(src=torch.randint(1, 23, (2, 6), generator=g),
                  src_valid_lens=torch.tensor([6, 3]))
        prompt = torch.ones(2, 1, dtype=torch.long)
    else:
        prompt = torch.randint(0, 29, (2, 4), generator=g)
    cached = hw.generate(model, prompt, use_cache=True, **kw)
    assert torch.equal(cached, hw.generate(model, prompt, use_cache=False, **kw))


@pytest.mark.parametrize("heads, match", [
    ({"cross": {0: [0]}}, r"unknown attention kind 'cross'; this model has \['decoder_self'\]"),
    ({"decoder_self": {3: [0]}}, r"decoder_self layer 3 does not exist \(there are 3: 0..2"),
    ({"decoder_self": {0: [6]}}, r"head 6 of decoder_self layer 0 does not exist \(there are "
                                 r"6: 0..5"),
    ({"decoder_self": {0: [-7]}}, r"head -7 of decoder_self layer 0 does not exist"),
    ({"decoder_self": {1: range(6)}}, r"decoder_self layer 1: pruning heads \[0, 1, 2, 3, 4, 5\]"
                                      r" would remove all 6 heads.*none would remain.*keep at "
                                      r"least one"),
    ({"decoder_self": {0: [0, 2]}}, r"6 query heads share 2 key/value heads in groups of 3; "
                                    r"removing heads \[0, 2\] leaves group 0 \(heads 0-2\): \[1\],"
                                    r" group 1 \(heads 3-5\): \[3, 4, 5\].*same number"),
])
def test_bad_selections_are_clear_errors_and_change_nothing(heads, match):
    model = lm(11, num_kv_heads=2)
    before = run(model)
    with pytest.raises(ValueError, match=match):
        prune_heads(model, heads)
    assert model.config.pruned_heads is None
    torch.testing.assert_close(run(model), before, atol=0, rtol=0)


def test_what_remains_is_said_after_earlier_pruning():
    model = prune_heads(lm(12), {"decoder_self": {0: [0, 1, 2, 3]}})
    with pytest.raises(ValueError, match=r"pruning heads \[0, 1, 2, 3, 4, 5\] would remove all"):
        prune_heads(model, {"decoder_self": {0: [0, 1]}})
    with pytest.raises(TypeError, match="expected a headwise model"):
        prune_heads(torch.nn.Linear(2, 2), {})
    with pytest.raises(TypeError, match=r"heads must be a dict \{kind: \{layer: \[heads\]\}\}"):
        prune_heads(model, [0, 1])


def test_trace_and_head_view_of_a_pruned_model(tmp_path):
    model = prune_heads(seq2seq(13), {"encoder_self": {0: [0, 1]}, "cross": {1: [3]}})
    src, tgt = torch.randint(1, 23, (1, 6)), torch.randint(0, 19, (1, 4))
    _, att = model(src, tgt, return_weights=True)
    assert [w.shape[1] for w in att["encoder_self"]] == [2, 4]
    assert [w.shape[1] for w in att["cross"]] == [4, 3]
    listing = hw.trace(model, src, tgt).render(full=True)
    assert "h=2" in listing and "h=3" in listing
    from headwise.viz import head_view
    tokens = {"src": [f"s{x}" for x in src[0].tolist()], "tgt": [f"t{x}" for x in tgt[0].tolist()]}
    head_view(att, tokens, tmp_path / "view.html")
    assert (tmp_path / "view.html").stat().st_size > 1000
