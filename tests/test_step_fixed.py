"""The fixed-shape decoding step (a device's form of headwise.step.DecodeStep: tensor position,
cache written with index_copy_, attention over the whole cache under a mask), run on CPU tensors
with ``static=True``: it computes what the module path computes, in float64 (so any slip shows
far above rounding), for every component it touches; generate's eos test read every
EOS_EVERY tokens (the device's rule) gives the tokens of the per-token test; compile=True on the
CPU is refused with one clear error."""

import itertools

import pytest
import torch

import headwise
from headwise import fast
from headwise.decode import generation as decoding
from headwise.models import LMConfig, Transformer, TransformerConfig, TransformerLM
from headwise.step import DecodeStep

TOL = dict(atol=1e-10, rtol=0)  # float64 both ways: the same sums in another order


def _lm(**kw):
    args = dict(vocab_size=29, d_model=16, num_heads=4, num_layers=2, d_ff=24, max_len=40,
                dropout=0.0, activation="silu")
    args.update(kw)
    model = TransformerLM(LMConfig(**args)).eval().double()
    with torch.no_grad():  # norms start at (1, 0) and sinks at 0: draw them so a skip shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("sinks"):
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
    return model


def _check(model, rows, prompt_len=5, steps=7, max_len=16, seed=0):
    """Prompt through the modules, then ``steps`` tokens through the module path and through
    the fixed-shape step on a cache of ``max_len`` positions (the tail masked)."""
    gen = torch.Generator().manual_seed(seed)
    v = model.config.vocab_size
    prompt = torch.randint(0, v, (rows, prompt_len), generator=gen)
    nxt = torch.randint(0, v, (rows, steps), generator=gen)
    with torch.inference_mode():
        ref_cache, cache = model.new_cache(rows, max_len), model.new_cache(rows, max_len)
        model(prompt, cache=ref_cache)
        model(prompt, cache=cache)
        step = DecodeStep(model, cache, static=True)
        for t in range(steps):
            want, _ = model(nxt[:, t:t + 1], cache=ref_cache)
            torch.testing.assert_close(step(nxt[:, t]), want[:, 0], **TOL)
        assert int(step.pos) == cache.length == prompt_len + steps
        n = cache.length
        torch.testing.assert_close(cache.k[..., :n, :], ref_cache.k[..., :n, :], **TOL)
        torch.testing.assert_close(cache.v[..., :n, :], ref_cache.v[..., :n, :], **TOL)


AXES = dict(norm=["layer", "rms"], positional=["learned", "rope"], num_kv_heads=[4, 2, 1],
            sliding_window=[None, 3])
COMBINATIONS = [dict(zip(AXES, values, strict=True)) for values in itertools.product(*AXES.values())]


@pytest.mark.parametrize("axes", COMBINATIONS, ids=lambda a: "-".join(map(str, a.values())))
def test_fixed_step_equals_module_path(axes):
    """Norms, learned positions gathered at the position tensor, RoPE angles gathered at it,
    grouped query heads folded onto their key/value head, the window as a mask."""
    torch.manual_seed(len(str(axes)))
    _check(_lm(ffn="glu" if axes["norm"] == "rms" else "mlp", **axes), rows=2)


@pytest.mark.parametrize("extra", [dict(attn_softcap=2.0), dict(attention_sinks=True),
                                   dict(backend="eager"),
                                   dict(norm_first=False, rotary_dim=2, positional="rope"),
                                   dict(positional="sinusoidal", scale_embeddings=True,
                                        bias=False, tie_embeddings=True)])
def test_fixed_step_follows_the_eager_backends_and_the_other_variants(extra):
    """Soft-capping, sinks and a named eager backend take the dispatch with the boolean mask;
    post-norm, partial rotary, sinusoidal positions, scaled and tied embeddings."""
    torch.manual_seed(3)
    _check(_lm(num_kv_heads=2, sliding_window=4, **extra), rows=3, max_len=32)


def test_fixed_step_of_an_encoder_decoder_with_source_padding():
    torch.manual_seed(5)
    model = Transformer(TransformerConfig(src_vocab_size=19, tgt_vocab_size=23, d_model=24,
                                          num_heads=4, num_layers=2, d_ff=40, max_len=32,
                                          dropout=0.0, num_kv_heads=2)).eval().double()
    src, lens = torch.randint(1, 19, (3, 9)), torch.tensor([9, 4, 1])
    tgt = torch.randint(0, 23, (3, 6))
    with torch.inference_mode():
        memory, mask = model.encode(src, lens)
        cache = model.new_cache(3, 16)
        model.decoder(tgt[:, :1], memory, memory_mask=mask, cache=cache)
        step = DecodeStep(model, cache, mask, static=True)
        got = torch.stack([step(tgt[:, t]) for t in range(1, 6)], 1)
        full, _ = model(src, tgt, src_valid_lens=lens)  # teacher-forced, no cache
    torch.testing.assert_close(got, full[:, 1:], **TOL)


def test_fixed_step_refuses_a_position_past_the_cache():
    model = _lm()
    with torch.inference_mode():
        cache = model.new_cache(1, 4)
        model(torch.randint(0, 29, (1, 4)), cache=cache)
        with pytest.raises(ValueError, match="does not fit a cache of max_len=4"):
            DecodeStep(model, cache, static=True)(torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("keep_logits", [False, True])
def test_eos_read_every_few_tokens_gives_the_tokens_of_the_per_token_read(monkeypatch,
                                                                          keep_logits):
    """Off the CPU generate reads 'has every row stopped?' every EOS_EVERY tokens: the same
    tokens (pad after each row's eos) and the same end as reading it every token."""
    torch.manual_seed(11)
    model = _lm(vocab_size=5, num_layers=1).float()  # 5 ids: eos comes soon, at varied steps
    prompt = torch.randint(0, 5, (6, 3))
    kw = dict(max_new_tokens=33, eos_id=2, pad_id=0, strategy="sample", seed=4)

    def run():
        if keep_logits:
            return decoding.generate_with_logits(model, prompt, **kw)
        return headwise.generate(model, prompt, **kw), None

    want, want_logits = run()
    assert want.shape[1] < 3 + 33  # every row stopped: the early end is what is compared
    monkeypatch.setattr(decoding, "host", lambda *t: False)  # the device's rule
    got, got_logits = run()
    assert torch.equal(got, want)
    if keep_logits:
        torch.testing.assert_close(got_logits, want_logits, atol=0, rtol=0)


def test_stopped_finds_where_the_last_row_emitted_its_first_eos():
    out = torch.tensor([[7, 1, 2, 0, 0, 0], [7, 1, 1, 1, 2, 2], [7, 2, 0, 0, 0, 0]])
    assert decoding._stopped(out, 1, 6, eos_id=2) == 5  # row 1's eos at column 4


def test_compile_on_the_cpu_is_one_clear_error():
    model = _lm()
    with pytest.raises(ValueError, match=r"CUDA graph; the model is on cpu.*drop compile=True"):
        headwise.generate(model, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=3,
                          compile=True)
    with pytest.raises(TypeError, match="compile must be True or False"):
        headwise.generate(model, torch.zeros(1, 2, dtype=torch.long), max_new_tokens=3,
                          compile="yes")
    with pytest.raises(ValueError, match="graph=True replays a fixed-shape step"):
        DecodeStep(model, model.new_cache(1, 8), graph=True)


@pytest.mark.parametrize("kind", ["lm", "encoder-decoder"])
def test_generation_under_bf16_autocast_writes_the_float32_cache_on_the_device_path(kind):
    """Evaluation inside bfloat16 autocast (the training loop's) on a float32 model: the fixed
    step's k and v come out of the projections in bfloat16 and go into the float32 cache (the
    H100 run found index_copy_ refusing the mix); the tokens are the CPU path's."""
    torch.manual_seed(3)
    if kind == "lm":
        model, kw = _lm(vocab_size=11).float(), {}
    else:
        model = Transformer(TransformerConfig(11, 11, d_model=16,
                                              num_heads=2, num_layers=1, d_ff=24,
                                              dropout=0.0)).eval()
        kw = dict(src=torch.randint(0, 11, (3, 6)))
    prompt = torch.randint(0, 11, (3, 2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, want_logits = decoding.generate_with_logits(model, prompt, max_new_tokens=6, **kw)
        with fast.as_device():
            got, got_logits = decoding.generate_with_logits(model, prompt, max_new_tokens=6,
                                                            **kw)
    # bfloat16 sums in another order may flip a near tie: compare up to the first step where
    # the tokens part (its logits included), at bfloat16's resolution (8 bits, logits ~1)
    same = (got == want).all(0)[2:]
    upto = int(same.int().argmin()) + 1 if not bool(same.all()) else same.numel()
    assert upto >= 1
    torch.testing.assert_close(got_logits[:, :upto].float(), want_logits[:, :upto].float(),
                               atol=3e-2, rtol=3e-2)
