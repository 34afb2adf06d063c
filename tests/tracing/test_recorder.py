"""headwise.trace (the recorder) on MultiHeadAttention and every model family: outputs
unchanged, every step with the right named shape, honest about what the fused kernel
materialised, hooks cleaned up, the learner's LM shapes in order, and which layers fell back
when weights are asked for."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
from headwise import observe as _record
from headwise.models import Decoder, Encoder, LMConfig, TransformerConfig, build
from headwise.models.bert import BertConfig, BertModel


def _by_name(t, name):
    found = t.find(name)
    assert found, f"no step {name!r} in {[s.name for s in t.steps]}"
    return found[0]


@st.composite
def configs(draw):
    h = draw(st.sampled_from([1, 2, 3, 4]))
    g = draw(st.sampled_from([x for x in (1, 2, 4) if h % x == 0] + [h]))
    d = draw(st.integers(1, 6))
    m = draw(st.integers(2, 12))
    cross = draw(st.booleans())
    kdim = draw(st.integers(1, 7)) if cross else None
    vdim = draw(st.integers(1, 7)) if cross else None
    b, nq = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    nk = draw(st.integers(1, 6)) if cross else nq
    backend = draw(st.sampled_from(["auto", "eager", "sdpa"]))
    weights = draw(st.booleans())
    causal = draw(st.booleans())
    return dict(h=h, g=g, d=d, m=m, kdim=kdim, vdim=vdim, b=b, nq=nq, nk=nk, backend=backend,
                weights=weights, causal=causal, cross=cross)


@given(configs(), st.integers(0, 2**31 - 1))
def test_trace_keeps_outputs_and_names_every_shape(c, seed):
    torch.manual_seed(seed)
    mha = hw.MultiHeadAttention(c["m"], c["h"], head_dim=c["d"], kdim=c["kdim"], vdim=c["vdim"],
                                num_kv_heads=c["g"], backend=c["backend"])
    b, nq, nk, h, g, d = c["b"], c["nq"], c["nk"], c["h"], c["g"], c["d"]
    q = torch.randn(b, nq, c["m"])
    args = (q,) if not c["cross"] else (q, torch.randn(b, nk, mha.kdim),
                                        torch.randn(b, nk, mha.vdim))
    lens = torch.randint(1, nk + 1, (b,))
    kwargs = dict(valid_lens=lens, causal=c["causal"], return_weights=c["weights"])
    expected = mha(*args, **kwargs)
    t = hw.trace(mha, *args, **kwargs)
    out, w = t.output
    assert torch.equal(out, expected[0])
    assert (w is None) == (expected[1] is None)
    if w is not None:
        assert torch.equal(w, expected[1])
    assert not _record.observed()
    assert not mha._forward_hooks and not mha._forward_pre_hooks

    heads_kv = "h" if g == h else "g"
    want = {
        "input": ((b, nq, c["m"]), ("b", "i", "m")),
        "q projection": ((b, nq, h * d), ("b", "i", "(h d)")),
        "split heads q": ((b, h, nq, d), ("b", "h", "i", "d")),
        "k projection": ((b, nk, g * d), ("b", "j", f"({heads_kv} d)")),
        "split heads k": ((b, g, nk, d), ("b", heads_kv, "j", "d")),
        "split heads v": ((b, g, nk, d), ("b", heads_kv, "j", "d")),
        "scores": ((b, h, nq, nk), ("b", "h", "i", "j")),
        "merge heads": ((b, nq, h * d), ("b", "i", "(h d)")),
        "output projection": ((b, nq, c["m"]), ("b", "i", "m")),
    }
    for name, (shape, axes) in want.items():
        step = _by_name(t, name)
        assert step.shape == shape, name
        assert step.axes == axes, name
        assert step.named_shape == "(" + ", ".join(
            f"{a}={s}" for a, s in zip(axes, shape, strict=True)) + ")"
    order = [s.name for s in t.steps]
    assert order.index("split heads q") < order.index("scores") < order.index("merge heads") \
        < order.index("output projection")
    eager = c["backend"] == "eager"  # weights alone stay fused (recomputed from the LSE)
    scores = _by_name(t, "scores")
    assert scores.materialised == eager
    assert bool(t.find("softmax")) == eager
    [run] = t.attention
    assert run.fused == (not eager and run.ran != "sdpa[MATH]")
    assert run.kind == ("cross" if c["cross"] else "self")


def test_fused_kernel_is_reported_and_fallback_reasons_are_given():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 32)
    mha = hw.MultiHeadAttention(32, 4, backend="sdpa")
    fused = hw.trace(mha, x)
    [run] = fused.attention
    assert run.fused and run.ran == "sdpa[FLASH_ATTENTION]" and run.memory == "O(n)"
    assert "not materialised" in str(fused)
    assert "1 fused" in fused.summary()
    assert not _by_name(fused, "scores").materialised

    weights = hw.trace(mha, x, return_weights=True)
    [run] = weights.attention
    assert run.fused and run.ran == "sdpa[FLASH_ATTENTION]" and run.memory == "O(n)"
    assert run.reason == "fused kernel" and run.weights.method == "rows"
    assert run.weights.chunk_rows == 8
    assert not _by_name(weights, "scores").materialised
    assert "weights recomputed exactly as the softmax of whole rows, 8-row chunks" \
        in str(weights)
    with torch.no_grad():  # nothing for autograd: the output is the returned weights @ v
        [run] = hw.trace(mha, x, return_weights=True).attention
    assert not run.fused and run.ran == "sdpa[weights @ v]" and run.memory == "O(n^2)"
    assert run.verdict.startswith("output = weights @ v: all weights asked for, no autograd")
    assert run.verdict.endswith("; weights recomputed exactly as the softmax of whole rows, "
                                "8-row chunks")
    [run] = hw.trace(mha, x, return_weights=hw.Selection(keys=[0, 1])).attention
    assert run.fused and run.weights.method == "lse" and run.weights.kernel == "flash"

    mha_drop = hw.MultiHeadAttention(32, 4, dropout=0.5, backend="sdpa").train()
    dropped = hw.trace(mha_drop, x)
    [run] = dropped.attention
    assert run.ran == "sdpa[MATH]" and not run.fused and "dropout > 0" in run.reason
    assert "fell back to sdpa's math kernel" in run.verdict

    eager = hw.trace(hw.MultiHeadAttention(32, 4, backend="eager"), x)
    assert eager.attention[0].verdict.startswith("eager (chosen)")


def test_masks_and_grouped_heads_are_described():
    torch.manual_seed(1)
    mha = hw.MultiHeadAttention(16, 4, num_kv_heads=2)
    x = torch.randn(1, 5, 16)
    t = hw.trace(mha, x, mask=hw.masks.from_valid_lens(torch.tensor([3]), 5), causal=True)
    text = str(t)
    assert "mask bool (b=1, h=1, i=1, j=5) = key padding" in text
    assert "causal" in text
    split_k = _by_name(t, "split heads k")
    assert split_k.axes == ("b", "g", "j", "d") and split_k.shape == (1, 2, 5, 4)
    assert split_k.info["kv_heads"] == 2 and split_k.info["query_heads"] == 4
    assert "b n (g d) -> b g n d; 2 key/value heads, each shared by 2 query heads" in text
    mha.backend = "eager"
    eager = hw.trace(mha, x, mask=hw.masks.from_valid_lens(torch.tensor([3]), 5),
                     return_weights=True)
    mask = _by_name(eager, "mask")
    assert mask.info == {"form": "bool", "shape": [1, 1, 1, 5]}
    assert "bool (1, 1, 1, 5)" in str(eager)


def test_unfused_per_head_loop_is_traced_head_by_head():
    torch.manual_seed(2)
    mha = hw.MultiHeadAttention(4, 2, head_dim=3, kdim=3, vdim=2)
    per_head = hw.unfuse(mha)
    q, k, v = torch.randn(1, 5, 4), torch.randn(1, 6, 3), torch.randn(1, 6, 2)
    t = hw.trace(per_head, q, k, v)
    assert torch.equal(t.output[0], per_head(q, k, v)[0])
    projections = [s for s in t.steps if s.path.startswith("q_heads.")]
    assert [s.path for s in projections] == ["q_heads.0", "q_heads.1"]
    assert all(s.shape == (1, 5, 3) for s in projections)
    # one attention per head; with "auto" each runs fused (weights from the kernel's LSE), so
    # the scores are named but not materialised
    scores = t.find("scores")
    assert [s.axes for s in scores] == [("b", "h", "i", "j")] * 2
    assert all(not s.to_dict()["materialised"] for s in scores)
    eager = hw.unfuse(mha)
    eager.backend = "eager"
    assert [s.shape for s in hw.trace(eager, q, k, v).find("scores")] == [(1, 1, 5, 6)] * 2


def test_exports_and_errors_leave_no_hooks():
    mha = hw.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="features"):
        hw.trace(mha, torch.randn(1, 3, 5))
    assert not _record.observed()
    assert not mha._forward_hooks
    with pytest.raises(TypeError, match="nn.Module"):
        hw.trace(lambda x: x, torch.randn(1))


def test_markdown_and_json_carry_every_step():
    torch.manual_seed(3)
    mha = hw.MultiHeadAttention(8, 2)
    t = hw.trace(mha, torch.randn(1, 3, 8), return_weights=True)
    data = json.loads(t.to_json())
    assert [s["name"] for s in data["steps"]] == [s.name for s in t.steps]
    assert data["steps"][2]["shape"] == list(t.steps[2].shape)
    assert data["attention"][0]["weights"]["method"] == "rows"
    md = t.to_markdown()
    rows = [line for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(t.steps)
    assert "`(b=1, h=2, i=3, d=4)`" in md


def test_head_mask_step_and_argument_axes():
    torch.manual_seed(4)
    mha = hw.MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    head_mask = torch.tensor([1.0, 0.0])
    t = hw.trace(mha, x, mask=torch.ones(3, 3, dtype=torch.bool).tril(), head_mask=head_mask)
    assert torch.equal(t.output[0], mha(x, mask=torch.ones(3, 3, dtype=torch.bool).tril(),
                                        head_mask=head_mask)[0])
    step = _by_name(t, "head mask")
    assert step.named_shape == "(b=2, h=2, i=3, d=4)"
    assert _by_name(t, "input mask").axes == ("i", "j")
    assert "mask bool (i=3, j=3) = causal" in str(t)


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
    "lm": lambda: (build(LMConfig(40, d_model=16, num_heads=4, num_layers=2, d_ff=32, dropout=0.0)),
                   (torch.randint(0, 40, (2, 6)),), {}),
    "lm-grouped": lambda: (build(LMConfig(40, d_model=16, num_heads=4, num_layers=2, d_ff=32, num_kv_heads=2,
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
    lm = build(LMConfig(33300, d_model=512, num_heads=8, num_layers=2, dropout=0.0)).eval()
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
    asked = [(r.path, r.kind) for r in picked.attention if r.weights is not None]
    assert asked == [("decoder.blocks.1.cross_attn", "cross")]
    # the other layers stay fused; the asked one (all heads, no autograd) reuses its weights
    assert [r.ran for r in picked.attention if not r.fused] == ["sdpa[weights @ v]"]

def test_identical_blocks_collapse_unless_full():
    torch.manual_seed(0)
    lm = build(LMConfig(40, d_model=16, num_heads=4, num_layers=4, d_ff=32, dropout=0.0)).eval()
    with torch.no_grad():
        t = hw.trace(lm, torch.randint(0, 40, (1, 5)))
    short, full = t.render(), t.render(full=True)
    assert "blocks.1 … blocks.3" in short and "3 more DecoderBlock" in short
    assert "blocks.3: DecoderBlock" in full and "…" not in full
    assert short.count("split heads q") == 1 and full.count("split heads q") == 4

def test_kv_cache_decoding_shows_the_cached_key_length():
    torch.manual_seed(0)
    lm = build(LMConfig(40, d_model=16, num_heads=4, num_layers=1, d_ff=32, num_kv_heads=2, dropout=0.0)).eval()
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


@pytest.mark.parametrize("args, kwargs", [((), {}), ((), {"bogus": 1}),
                                          ((torch.randn(1, 3, 8),) * 4, {})])
def test_trace_with_inputs_the_forward_cannot_take_is_one_type_error(args, kwargs):
    """hw.trace(mha) with no input raised forward's bare 'missing 1 required positional
    argument' after the hooks were attached; now one TypeError naming the fix, and no hook is
    left on the module."""
    mha = hw.MultiHeadAttention(8, 2)
    with pytest.raises(TypeError, match=r"trace: MultiHeadAttention\.forward cannot take these "
                                        r"inputs .* e\.g\. hw\.trace\(mha, x\)"):
        hw.trace(mha, *args, **kwargs)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in mha.modules())
    assert hw.trace(mha, torch.randn(1, 3, 8)).output[0].shape == (1, 3, 8)
