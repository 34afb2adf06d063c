"""headwise.step.DecodeStep: the flattened one-token step computes what the module path computes
(every block variant, both families, one row and many), and generate uses it only when nothing
needs to see the modules (traces, hooks)."""

import itertools

import pytest
import torch

import headwise
from headwise.decoding import generate_with_logits
from headwise.models import LMConfig, Transformer, TransformerConfig, TransformerLM
from headwise.observe import Observer, observing, recording
from headwise.step import DecodeStep, usable

LM_VARIANTS = [
    dict(),
    dict(norm_first=False, activation="gelu", bias=False, tie_embeddings=True),
    dict(num_kv_heads=2, head_dim=6, activation="silu", positional="learned"),
    dict(num_kv_heads=1, scale_embeddings=True, activation="gelu_tanh", backend="eager"),
]


def _lm(**kw):
    args = dict(vocab_size=37, d_model=24, num_heads=4, num_layers=3, d_ff=40, max_len=40,
                dropout=0.0)
    args.update(kw)
    model = TransformerLM(LMConfig(**args)).eval()
    with torch.no_grad():  # LayerNorm starts at (1, 0): draw it so a skipped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
    return model


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("kw", LM_VARIANTS)
def test_lm_step_equals_module_path(kw, rows):
    torch.manual_seed(rows)
    model = _lm(**kw)
    prompt = torch.randint(0, 37, (rows, 6))
    nxt = torch.randint(0, 37, (rows, 5))
    with torch.inference_mode():
        ref_cache, step_cache = model.new_cache(rows, 16), model.new_cache(rows, 16)
        model(prompt, cache=ref_cache)
        model(prompt, cache=step_cache)
        step = DecodeStep(model, step_cache)
        for t in range(nxt.shape[1]):
            want, _ = model(nxt[:, t:t + 1], cache=ref_cache)
            got = step(nxt[:, t])
            torch.testing.assert_close(got, want[:, 0], atol=1e-5, rtol=0)
        assert step_cache.length == ref_cache.length == 11
        torch.testing.assert_close(step_cache.k, ref_cache.k, atol=1e-5, rtol=0)


# Every combination of the config axes the step must follow: norm, feed-forward, positions,
# biases, grouped-query groups (4 query heads over 4, 2 or 1 key/value heads), sliding window.
AXES = dict(norm=["layer", "rms"], ffn=["mlp", "glu"], positional=["sinusoidal", "learned", "rope"],
            bias=[True, False], num_kv_heads=[4, 2, 1], sliding_window=[None, 3])
COMBINATIONS = [dict(zip(AXES, values, strict=True)) for values in itertools.product(*AXES.values())]


def _step_matches_module_path(model, rows, prompt_len=5, steps=6, seed=0):
    """Prompt through the modules, then ``steps`` tokens both ways: logits and caches agree."""
    gen = torch.Generator().manual_seed(seed)
    v = model.config.vocab_size
    prompt = torch.randint(0, v, (rows, prompt_len), generator=gen)
    nxt = torch.randint(0, v, (rows, steps), generator=gen)
    with torch.inference_mode():
        ref_cache, step_cache = (model.new_cache(rows, prompt_len + steps) for _ in range(2))
        model(prompt, cache=ref_cache)
        model(prompt, cache=step_cache)
        step = DecodeStep(model, step_cache)
        for t in range(steps):
            want, _ = model(nxt[:, t:t + 1], cache=ref_cache)
            torch.testing.assert_close(step(nxt[:, t]), want[:, 0], atol=1e-5, rtol=0)
        torch.testing.assert_close(step_cache.k, ref_cache.k, atol=1e-5, rtol=0)
        torch.testing.assert_close(step_cache.v, ref_cache.v, atol=1e-5, rtol=0)


@pytest.mark.parametrize("axes", COMBINATIONS, ids=lambda a: "-".join(map(str, a.values())))
def test_step_equals_module_path_for_every_combination_of_the_config_axes(axes):
    """Each component's one-row form (RMSNorm, SwiGLU, RoPE at the cached position, grouped
    key/value heads, the window as a slice of the cache) against its forward, in every mix."""
    torch.manual_seed(len(str(axes)))
    model = _lm(d_model=16, num_heads=4, num_layers=2, d_ff=24, vocab_size=23, max_len=16,
                activation="silu", **axes)
    _step_matches_module_path(model, rows=2)


@pytest.mark.parametrize("extra", [dict(attn_softcap=2.0), dict(attention_sinks=True),
                                   dict(norm_first=False, rotary_dim=2, rope_theta=50.0)])
@pytest.mark.parametrize("rows", [1, 3])
def test_step_follows_softcap_sinks_post_norm_and_partial_rotary(extra, rows):
    model = _lm(d_model=16, num_heads=4, num_layers=2, d_ff=24, vocab_size=23, max_len=16,
                positional="rope", norm="rms", ffn="glu", activation="silu", num_kv_heads=2,
                sliding_window=4, **extra)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.randn_like(p))
    _step_matches_module_path(model, rows=rows)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("kw", [dict(), dict(norm_first=False, num_kv_heads=2, bias=False),
                                dict(positional="rope", norm="rms", ffn="glu", num_kv_heads=1,
                                     sliding_window=2)])
def test_seq2seq_step_equals_module_path_with_source_padding(kw, rows):
    torch.manual_seed(rows)
    args = dict(src_vocab_size=19, tgt_vocab_size=23, d_model=24, num_heads=4, num_layers=2,
                d_ff=40, max_len=32, dropout=0.0)
    model = Transformer(TransformerConfig(**args, **kw)).eval()
    src = torch.randint(1, 19, (rows, 9))
    lens = torch.randint(1, 10, (rows,))
    tgt = torch.randint(0, 23, (rows, 6))
    with torch.inference_mode():
        memory, mask = model.encode(src, lens)
        dec = model.decoder
        ref_cache, step_cache = model.new_cache(rows, 16), model.new_cache(rows, 16)
        for cache in (ref_cache, step_cache):
            dec(tgt[:, :1], memory, memory_mask=mask, cache=cache)
        step = DecodeStep(model, step_cache, mask)
        got = []
        for t in range(1, tgt.shape[1]):
            want, _ = dec(tgt[:, t:t + 1], memory, memory_mask=mask, cache=ref_cache)
            got.append(step(tgt[:, t]))
            torch.testing.assert_close(got[-1], want[:, 0], atol=1e-5, rtol=0)
        torch.testing.assert_close(step_cache.k, ref_cache.k, atol=1e-5, rtol=0)
        # and the step's logits are the teacher-forced ones of the whole model
        full, _ = model(src, tgt, src_valid_lens=lens)
        torch.testing.assert_close(torch.stack(got, 1), full[:, 1:], atol=1e-5, rtol=0)


def test_step_restores_the_onednn_flag_even_on_error():
    model = _lm(activation="gelu")
    with torch.inference_mode():
        cache = model.new_cache(1, 8)
        model(torch.randint(0, 37, (1, 3)), cache=cache)
        step = DecodeStep(model, cache)
        before = torch._C._get_mkldnn_enabled()
        step(torch.tensor([5]))
        assert torch._C._get_mkldnn_enabled() == before
        with pytest.raises(IndexError):
            step(torch.tensor([37]))  # out of range: the step trusts generate's checks
        assert torch._C._get_mkldnn_enabled() == before


def _count_steps(monkeypatch):
    calls = []
    original = DecodeStep.__call__

    def spy(self, ids):
        calls.append(ids.shape)
        return original(self, ids)
    monkeypatch.setattr(DecodeStep, "__call__", spy)
    return calls


def test_generate_uses_the_step_unless_an_observer_or_hook_needs_the_modules(monkeypatch):
    model = _lm()
    prompt = torch.randint(0, 37, (2, 4))
    calls = _count_steps(monkeypatch)
    fast = headwise.generate(model, prompt, max_new_tokens=6)
    assert len(calls) == 5  # every token after the first comes from the step
    calls.clear()
    steps = []
    with recording(lambda step, *args, **info: steps.append(step)):
        recorded = headwise.generate(model, prompt, max_new_tokens=6)
    assert calls == [] and torch.equal(recorded, fast)
    assert steps.count("kv cache") == 6 * 3  # every step of every layer went through the modules
    calls_seen = []  # any observer, not only a trace: here one of the attention calls
    with observing(Observer(attention=lambda module, *args: calls_seen.append(module))):
        assert not usable(model)
        observed_run = headwise.generate(model, prompt, max_new_tokens=6)
    assert calls == [] and torch.equal(observed_run, fast) and len(calls_seen) == 6 * 3
    assert usable(model)
    seen = []
    handle = model.blocks[1].ff.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    try:
        hooked = headwise.generate(model, prompt, max_new_tokens=6)
    finally:
        handle.remove()
    assert calls == [] and torch.equal(hooked, fast) and len(seen) == 6


def test_long_single_row_generation_takes_the_transposed_path_and_matches_recompute(
        monkeypatch):
    model = _lm(max_len=160, activation="gelu")
    prompt = torch.randint(0, 37, (1, 5))
    layouts = []
    original = DecodeStep.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        layouts.append(self.head[2])  # (matrix, bias, transposed)
    monkeypatch.setattr(DecodeStep, "__init__", spy)
    a, la = generate_with_logits(model, prompt, max_new_tokens=130)
    b, lb = generate_with_logits(model, prompt, max_new_tokens=130, use_cache=False)
    short, _ = generate_with_logits(model, prompt, max_new_tokens=20)
    assert layouts == [True, False]  # 130 steps: transposed copies; 20 steps: none
    assert torch.equal(a, b) and torch.equal(short, a[:, :25])
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)


@pytest.mark.parametrize("ffn", ["mlp", "glu"])
def test_a_larger_model_is_laid_out_for_its_rows_in_place(monkeypatch, tmp_path, ffn):
    """Over COPY_BUDGET no copies: one row stores the wide matrices (q/k/v and gate/up each
    joined into one, up, the vocabulary head) as W^T, 2-4 rows as (out, in); tokens and logits
    equal the recomputed module path; a checkpoint of the laid-out model loads back equal."""
    from headwise import checkpoint
    from headwise.decode import step
    from headwise.fast import rows as _rows
    monkeypatch.setattr(step, "COPY_BUDGET", 0)
    model = _lm(max_len=60, activation="silu", ffn=ffn, norm="rms", positional="rope",
                tie_embeddings=True, num_kv_heads=2, bias=True)
    params = list(model.parameters())
    groups = [(model.lm_head,)]
    for block in model.blocks:
        a, f = block.self_attn, block.ff
        groups += [(a.q_proj, a.k_proj, a.v_proj), (a.out_proj,), (f.down,),
                   (f.gate, f.up) if ffn == "glu" else (f.up,)]
    wide = [g for g in groups if sum(m.out_features for m in g) > g[0].in_features]
    assert len(wide) >= 5 and model.lm_head.weight is model.embed.tokens.weight
    for rows, transposed in ((1, True), (3, False), (1, True)):
        prompt = torch.randint(0, 37, (rows, 5))
        a, la = generate_with_logits(model, prompt, max_new_tokens=40)
        with torch.no_grad():  # (joined views are for products autograd does not follow)
            stored = [_rows.joined(g) for g in groups]  # each group one matrix, no copy
            attn = model.blocks[0].self_attn  # the module path's fused projection: no copy
            assert attn.qkv_weight()[0].data_ptr() == attn.q_proj.weight.data_ptr()
        assert all(w is not None and _rows.stored_transposed(w[0]) is (transposed and g in wide)
                   and w[0].is_contiguous() is not (transposed and g in wide)
                   for w, g in zip(stored, groups, strict=True))
        b, lb = generate_with_logits(model, prompt, max_new_tokens=40, use_cache=False)
        assert torch.equal(a, b)
        torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)
    assert list(model.parameters()) == params
    assert model.lm_head.weight is model.embed.tokens.weight
    checkpoint.save(tmp_path / "ck", model, model.config)
    loaded = checkpoint.load(tmp_path / "ck").model
    for (name, p), q in zip(model.named_parameters(), loaded.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("budget", ["copies", "laid out"])
def test_one_row_split_across_two_threads_matches_the_module_path(monkeypatch, budget):
    """Without the C kernel (which splits its products over the threads itself), at two
    threads every one-row product is split across the threads as one batched product
    (SPLIT_MIN lowered so this small model's matrices qualify): over the transposed copies of
    a small model and over the joined, laid-out storage of a larger one, tokens and logits
    equal the module path."""
    from headwise.decode import step
    from headwise.fast import native as _native
    from headwise.fast import rows as _rows
    monkeypatch.setattr(_rows, "SPLIT_MIN", 1)
    monkeypatch.setattr(_native, "rows_matmul", lambda *args, **kw: None)
    if budget == "laid out":
        monkeypatch.setattr(step, "COPY_BUDGET", 0)
    torch.manual_seed(5)
    model = _lm(max_len=160, activation="silu", ffn="glu", norm="rms", positional="rope",
                num_kv_heads=2, tie_embeddings=True, vocab_size=38)  # every width even
    prompt = torch.randint(0, 38, (1, 5))
    calls = []
    split = _rows._split_product

    def spy(*args):
        out = split(*args)
        calls.append(out is not None)
        return out
    monkeypatch.setattr(_rows, "_split_product", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a, la = generate_with_logits(model, prompt, max_new_tokens=130)
    finally:
        torch.set_num_threads(before)
    b, lb = generate_with_logits(model, prompt, max_new_tokens=130, use_cache=False)
    assert calls and all(calls)  # every product of the step was split
    assert torch.equal(a, b)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)


@pytest.mark.parametrize("where", ["prompt", "step"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_cached_key_gives_nan_in_the_step_as_in_the_module_path(where, bad):
    """The step's NaN policy reads only the new cache positions (SelfAttentionCache.all_finite),
    yet a NaN or inf key in the cache still gives NaN where the module path does: one planted in
    the prompt's keys (that row only), or keys a step itself computes as non-finite. (A -inf
    key feature can give a -inf score, which the kernel alone would just skip.)"""
    torch.manual_seed(3)
    model = _lm(num_kv_heads=2, positional="rope", norm="rms", ffn="glu", activation="silu")
    prompt, nxt = torch.randint(0, 37, (2, 6)), torch.randint(0, 37, (2, 3))
    with torch.inference_mode():
        ref_cache, step_cache = model.new_cache(2, 16), model.new_cache(2, 16)
        model(prompt, cache=ref_cache)
        model(prompt, cache=step_cache)
        if where == "prompt":
            for cache in (ref_cache, step_cache):  # layer 1, row 1, kv head 0, position 2
                cache.k[1, 1, 0, 2, 0] = bad
        else:  # layer 1's first key feature is non-finite from the first step on
            model.blocks[1].self_attn.k_proj.weight[0] = bad
        step = DecodeStep(model, step_cache)
        for t in range(nxt.shape[1]):
            want, _ = model(nxt[:, t:t + 1], cache=ref_cache)
            got = step(nxt[:, t])
            assert torch.isnan(got[1]).all()
            assert torch.isfinite(got[0]).all() == (where == "prompt")
            torch.testing.assert_close(got, want[:, 0], atol=1e-5, rtol=0, equal_nan=True)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_bf16_step_is_at_least_as_close_to_float64_as_the_bf16_module_path(monkeypatch, rows,
                                                                           isa):
    """A Llama-style LM in bfloat16 (RoPE, RMSNorm, SwiGLU, grouped key/value heads, the tied
    vocabulary head), the same tokens fed three ways: the decoding step (headwise's bfloat16
    kernels on either CPU path: float32 sums rounded once, the residual added before that
    rounding, attention in float32), torch's bfloat16 module path over the whole sequence, and
    float64 on the same bfloat16 weights. Both paths round every activation between kernels to
    bfloat16 (norms, RoPE, the residual stream), which is most of their error, so the two
    errors are near each other: measured, the step's mean error 0.90-1.04x the module path's,
    its largest 0.87-1.11x: bounds of 1.1x and 1.25x."""
    from headwise.fast import native

    monkeypatch.setenv(native.ISA_ENV, isa)
    monkeypatch.setattr(native, "_state", {})
    torch.manual_seed(11 + rows)
    kw = dict(vocab_size=96, d_model=192, num_heads=6, num_kv_heads=2, d_ff=512, num_layers=4,
              norm="rms", ffn="glu", activation="silu", positional="rope", bias=False,
              tie_embeddings=True, max_len=64)
    model, exact = _lm(**kw).to(torch.bfloat16), _lm(**kw).double()
    exact.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    gen = torch.Generator().manual_seed(rows)
    prompt, feed = (torch.randint(0, 96, (rows, n), generator=gen) for n in (7, 12))
    whole = torch.cat((prompt, feed), 1)
    with torch.inference_mode():
        cache = model.new_cache(rows, whole.shape[1])
        model(prompt, cache=cache)
        step = DecodeStep(model, cache)
        got = torch.stack([step(feed[:, t]) for t in range(feed.shape[1])], 1).double()
        module = model(whole)[0][:, prompt.shape[1]:].double()  # after each fed token
        want = exact(whole)[0][:, prompt.shape[1]:]
    step_err, module_err = (got - want).abs(), (module - want).abs()
    assert (step_err.mean() <= 1.1 * module_err.mean()
            and step_err.max() <= 1.25 * module_err.max()), (
        step_err.mean(), module_err.mean(), step_err.max(), module_err.max())
    assert step_err.mean() > 0  # (bfloat16: not float64 by accident)
