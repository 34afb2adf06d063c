"""headwise.trace on every model family: outputs unchanged, the learner's LM shapes in order,
and which layers fell back when weights are asked for."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.models import Decoder, Encoder, LMConfig, TransformerConfig, build
from headwise.models.bert import BertConfig, BertModel


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def _tiny_transformer(**kw):
    kw.setdefault("dropout", 0.0)
    return TransformerConfig(src_vocab_size=50, tgt_vocab_size=60, d_model=16, num_heads=4,
                             num_layers=2, d_ff=32, **kw)


CASES = {
    "lm": lambda: (build(LMConfig(40, 16, 4, num_layers=2, d_ff=32, dropout=0.0)),
                   (torch.randint(0, 40, (2, 6)),), {}),
    "lm-grouped": lambda: (build(LMConfig(40, 16, 4, num_layers=2, d_ff=32, num_kv_heads=2,
                                          dropout=0.0)),
                           (torch.randint(0, 40, (2, 6)),), {"return_weights": True}),
    "encoder": lambda: (Encoder(_tiny_transformer()), (torch.randint(1, 50, (2, 7)),),
                        {"src_valid_lens": torch.tensor([7, 4])}),
    "decoder": lambda: (Decoder(_tiny_transformer()), (torch.randint(1, 60, (2, 5)),
                                                       torch.randn(2, 7, 16)),
                        {"src_valid_lens": torch.tensor([7, 3])}),
    "transformer": lambda: (build(_tiny_transformer(num_kv_heads=1)),
                            (torch.randint(1, 50, (2, 7)), torch.randint(1, 60, (2, 5))),
                            {"src_valid_lens": torch.tensor([7, 4]),
                             "return_weights": {"cross": [1]}}),
    "bert": lambda: (BertModel(BertConfig(vocab_size=30, d_model=16, num_heads=4, num_layers=2,
                                          d_ff=32, max_len=16)),
                     (torch.randint(1, 30, (2, 6)),), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tracing_changes_no_output(case):
    torch.manual_seed(0)
    model, args, kwargs = CASES[case]()
    model.eval()
    with torch.no_grad():
        expected = model(*args, **kwargs)
        t = hw.trace(model, *args, **kwargs)
    _same(t.output, expected)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert t.attention, "no attention call recorded"
    assert str(t)


def test_lm_shapes_in_the_order_learners_annotate_them():
    """The Trax TransformerLM example: vocab 33300, m 512, 8 heads, one sentence of 8 tokens."""
    torch.manual_seed(0)
    lm = build(LMConfig(33300, 512, 8, num_layers=2, dropout=0.0)).eval()
    tokens = torch.randint(0, 33300, (1, 8))
    with torch.no_grad():
        t = hw.trace(lm, tokens)
    steps = t.steps

    def first(pred, after=-1):
        for n, s in enumerate(steps):
            if n > after and pred(s):
                return n, s
        raise AssertionError("step not found")

    n0, tok = first(lambda s: s.name == "input tokens")
    assert (tok.shape, tok.axes) == ((1, 8), ("b", "n"))
    n1, emb = first(lambda s: s.path == "embed" and s.kind == "module", n0)
    assert emb.named_shape == "(b=1, n=8, m=512)"
    n2, q = first(lambda s: s.name == "split heads q", n1)
    n3, k = first(lambda s: s.name == "split heads k", n2)
    n4, v = first(lambda s: s.name == "split heads v", n3)
    for s, pos in ((q, "i"), (k, "j"), (v, "j")):
        assert s.shape == (1, 8, 8, 64) and s.axes == ("b", "h", pos, "d")
    n5, scores = first(lambda s: s.name == "scores", n4)
    assert scores.named_shape == "(b=1, h=8, i=8, j=8)"
    assert not scores.materialised  # fused kernel: logical shape only
    n6, merged = first(lambda s: s.name == "merge heads", n5)
    assert merged.named_shape == "(b=1, i=8, (h d)=512)"
    n7, proj = first(lambda s: s.name == "output projection", n6)
    assert proj.named_shape == "(b=1, i=8, m=512)"
    logits = steps[-1]
    assert logits.named_shape == "(b=1, n=8, vocab=33300)"


def test_weight_selection_names_the_layers_that_fell_back():
    torch.manual_seed(0)
    model = build(_tiny_transformer(backend="sdpa")).eval()
    src, tgt = torch.randint(1, 50, (1, 7)), torch.randint(1, 60, (1, 5))
    with torch.no_grad():
        fused = hw.trace(model, src, tgt)
        picked = hw.trace(model, src, tgt, return_weights={"cross": [1]})
    assert all(r.fused for r in fused.attention)
    assert len(fused.attention) == 2 + 2 * 2
    back = [r for r in picked.attention if not r.fused]
    assert [(r.path, r.kind, r.reason) for r in back] == [
        ("decoder.blocks.1.cross_attn", "cross", "weights requested")]
    assert "decoder.blocks.1.cross_attn  cross  eager" in picked.summary()


def test_identical_blocks_collapse_unless_full():
    torch.manual_seed(0)
    lm = build(LMConfig(40, 16, 4, num_layers=4, d_ff=32, dropout=0.0)).eval()
    with torch.no_grad():
        t = hw.trace(lm, torch.randint(0, 40, (1, 5)))
    short, full = t.render(), t.render(full=True)
    assert "blocks.1 … blocks.3" in short and "3 more DecoderBlock" in short
    assert "blocks.3: DecoderBlock" in full and "…" not in full
    assert short.count("split heads q") == 1 and full.count("split heads q") == 4


def test_kv_cache_decoding_shows_the_cached_key_length():
    torch.manual_seed(0)
    lm = build(LMConfig(40, 16, 4, num_layers=1, d_ff=32, num_kv_heads=2, dropout=0.0)).eval()
    prompt, step = torch.randint(0, 40, (1, 5)), torch.randint(0, 40, (1, 1))
    with torch.no_grad():
        reference = lm.new_cache(1, 16)
        lm(prompt, cache=reference)
        expected, _ = lm(step, cache=reference)
        cache = lm.new_cache(1, 16)
        lm(prompt, cache=cache)
        t = hw.trace(lm, step, cache=cache)
    assert torch.equal(t.output[0], expected)
    [cached] = t.find("kv cache")
    assert cached.named_shape == "(b=1, g=2, j=6, d=4)"
    [scores] = t.find("scores")
    assert scores.named_shape == "(b=1, h=4, i=1, j=6)" and not scores.materialised

    torch.manual_seed(1)
    model = build(_tiny_transformer()).eval()
    src, tgt = torch.randint(1, 50, (1, 7)), torch.randint(1, 60, (1, 1))
    with torch.no_grad():
        memory, memory_mask = model.encode(src)
        cache = model.new_cache(1, 8)
        model.decoder(tgt, memory, memory_mask=memory_mask, cache=cache)  # fills the cross cache
        t = hw.trace(model.decoder, tgt, memory, memory_mask=memory_mask, cache=cache)
    cross = [s for s in t.find("kv cache") if s.path.endswith("cross_attn")]
    assert [s.shape for s in cross] == [(1, 4, 7, 4)] * 2
    assert all(s.shape[-1] == 7 for s in t.find("scores") if s.path.endswith("cross_attn"))


def test_tracing_consumes_no_randomness_in_training_mode():
    """Dropout active (train mode): with the same seed, traced and untraced runs are equal,
    so tracing neither draws random numbers nor changes which kernel runs."""
    model = build(_tiny_transformer(dropout=0.2)).train()
    src, tgt = torch.randint(1, 50, (2, 7)), torch.randint(1, 60, (2, 5))
    torch.manual_seed(123)
    expected, _ = model(src, tgt)
    torch.manual_seed(123)
    t = hw.trace(model, src, tgt)
    assert torch.equal(t.output[0], expected)
    assert all(r.ran == "sdpa[MATH]" and "dropout > 0" in r.reason for r in t.attention)
    assert any(s.module == "Dropout" for s in t.steps), "active Dropout is listed in training"
    assert "dropout: Dropout(p=0.2)" in str(t)
