"""headwise.generate: the KV cache changes nothing but speed (same tokens, logits within 1e-5,
both families, grouped-query attention, beams), sampling follows its distribution, beam search
finds the exact best sequence when the beam covers every prefix, eos/padding, bad input."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise
from headwise.decode.generation import _argmax, _sample, generate, generate_with_logits
from headwise.models import LMConfig, Transformer, TransformerConfig, TransformerLM


def lm(seed=0, **kw) -> TransformerLM:
    args = dict(vocab_size=41, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_len=64,
                dropout=0.0)
    args.update(kw)
    torch.manual_seed(seed)
    return TransformerLM(LMConfig(**args)).eval()


def seq2seq(seed=0, **kw) -> Transformer:
    args = dict(src_vocab_size=19, tgt_vocab_size=23, d_model=32, num_heads=4, num_layers=2,
                d_ff=64, max_len=48, dropout=0.0)
    args.update(kw)
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(**args)).eval()


LLAMA = dict(positional="rope", norm="rms", ffn="glu", activation="silu", bias=False,
             num_kv_heads=2, tie_embeddings=True)
LM_VARIANTS = [dict(), dict(num_kv_heads=2), dict(num_kv_heads=1, positional="learned"),
               LLAMA, dict(LLAMA, sliding_window=4, rope_theta=500.0, rotary_dim=4),
               dict(norm_first=False, activation="gelu", tie_embeddings=True)]


@pytest.mark.parametrize("kw", LM_VARIANTS)
def test_lm_cached_equals_recomputed(kw):
    model = lm(**kw)
    prompt = torch.randint(0, 41, (3, 5))
    a, la = generate_with_logits(model, prompt, max_new_tokens=30)
    b, lb = generate_with_logits(model, prompt, max_new_tokens=30, use_cache=False)
    assert torch.equal(a, b) and a.shape == (3, 35) and torch.equal(a[:, :5], prompt)
    assert la.shape == (3, 30, 41)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)
    # and the logits are the model's own: a plain forward over the result agrees
    with torch.no_grad():
        full, _ = model(a[:, :-1])
    torch.testing.assert_close(la, full[:, 4:], atol=1e-5, rtol=0)
    assert torch.equal(a[:, 5:], la.argmax(-1))


@pytest.mark.parametrize("kw", [dict(), dict(num_kv_heads=2, norm_first=False, pad_id=0)])
def test_seq2seq_cached_equals_recomputed(kw):
    model = seq2seq(**kw)
    src = torch.randint(1, 19, (3, 9))
    lens = torch.tensor([9, 4, 6])
    start = torch.zeros(3, 1, dtype=torch.long)
    a, la = generate_with_logits(model, start, max_new_tokens=20, src=src, src_valid_lens=lens)
    b, lb = generate_with_logits(model, start, max_new_tokens=20, src=src, src_valid_lens=lens,
                                 use_cache=False)
    assert torch.equal(a, b) and a.shape == (3, 21)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)
    with torch.no_grad():
        full, _ = model(src, a[:, :-1], src_valid_lens=lens)
    torch.testing.assert_close(la, full, atol=1e-5, rtol=0)


def test_batched_rows_equal_single_rows():
    model = seq2seq(num_kv_heads=2)
    src = torch.randint(1, 19, (3, 7))
    lens = torch.tensor([7, 2, 5])
    start = torch.zeros(3, 1, dtype=torch.long)
    batched = generate(model, start, max_new_tokens=12, src=src, src_valid_lens=lens)
    for i, n in enumerate(lens.tolist()):  # a padded row == its unpadded source alone
        alone = generate(model, start[i:i + 1], max_new_tokens=12, src=src[i:i + 1, :n])
        assert torch.equal(batched[i:i + 1], alone)


def test_eos_stops_rows_and_pads_them():
    model = lm()
    prompt = torch.randint(0, 41, (4, 3))
    free = generate(model, prompt, max_new_tokens=20)
    eos = int(free[0, 3 + 5])  # row 0 emits this at step 5 (maybe earlier too)
    out = generate(model, prompt, max_new_tokens=20, eos_id=eos, pad_id=40)
    assert out.shape[1] <= 23
    for row_free, row in zip(free, out, strict=True):
        new_free, new = row_free[3:], row[3:]
        hits = (new_free == eos).nonzero()
        if len(hits):
            stop = int(hits[0]) + 1
            assert torch.equal(new[:stop], new_free[:stop])
            assert (new[stop:] == 40).all()
        else:
            assert torch.equal(new, new_free[: len(new)])
    # all rows stop -> generation ends early, with the cache or without
    one = generate(model, prompt[:1], max_new_tokens=20, eos_id=eos)
    assert one.shape[1] == 3 + int((free[0, 3:] == eos).nonzero()[0]) + 1
    assert torch.equal(one, generate(model, prompt[:1], max_new_tokens=20, eos_id=eos,
                                     use_cache=False))


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = lm(num_kv_heads=2)
    prompt = torch.randint(0, 41, (2, 4))
    state = torch.get_rng_state()
    s1 = generate(model, prompt, max_new_tokens=15, strategy="sample", seed=7)
    s2 = generate(model, prompt, max_new_tokens=15, strategy="sample", seed=7, use_cache=False)
    s3 = generate(model, prompt, max_new_tokens=15, strategy="sample", seed=8)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    assert torch.equal(s1, s2) and not torch.equal(s1, s3)
    greedy = generate(model, prompt, max_new_tokens=15)
    assert torch.equal(generate(model, prompt, max_new_tokens=15, strategy="sample", top_k=1,
                                seed=1), greedy)
    assert torch.equal(generate(model, prompt, max_new_tokens=15, strategy="sample",
                                top_p=1e-6, seed=1), greedy)


def test_sampling_distribution_temperature_top_k_top_p():
    torch.manual_seed(0)
    logits = torch.randn(1, 8) * 2
    n = 40000
    gen = torch.Generator().manual_seed(0)
    for temperature, top_k, top_p in ((1.0, None, None), (0.5, 3, None), (2.0, None, 0.8)):
        scaled = logits[0] / temperature
        probs = scaled.softmax(-1)
        keep = torch.ones(8, dtype=torch.bool)
        if top_k is not None:
            keep &= scaled >= scaled.topk(top_k).values[-1]
        if top_p is not None:
            order = probs.argsort(descending=True)
            before = probs[order].cumsum(0) - probs[order]
            keep[order[before >= top_p]] = False
        want = torch.where(keep, probs, 0.0)
        want = want / want.sum()
        draws = _sample(logits.expand(n, 8), temperature, top_k, top_p, gen)
        freq = torch.bincount(draws, minlength=8).float() / n
        assert (freq[~keep] == 0).all()
        torch.testing.assert_close(freq, want, atol=0.012, rtol=0)


def _logp_of(model, prompt, seq):
    with torch.no_grad():
        logits, _ = model(torch.cat([prompt, seq], 1)[:, :-1])
    logp = logits[:, prompt.shape[1] - 1:].log_softmax(-1)
    return logp.gather(-1, seq[..., None]).sum((1, 2))


def test_beam_search_is_exact_when_the_beam_covers_every_prefix():
    model = lm(vocab_size=5, d_model=16, num_heads=2, seed=3)
    prompt = torch.randint(0, 5, (1, 3))
    every = torch.tensor(list(itertools.product(range(5), repeat=3)))  # (125, 3)
    scores = _logp_of(model, prompt.expand(125, 3), every)
    best = every[scores.argmax()]
    out = generate(model, prompt, max_new_tokens=3, beam_size=25, length_penalty=0.0)
    assert torch.equal(out[0, 3:], best)
    # a narrow beam can only do as well as exact search, and never worse than greedy
    beam2 = generate(model, prompt, max_new_tokens=3, beam_size=2)
    greedy = generate(model, prompt, max_new_tokens=3)
    s_beam, s_greedy = (_logp_of(model, prompt, x[:, 3:]) for x in (beam2, greedy))
    assert s_greedy <= s_beam + 1e-6 <= scores.max() + 2e-6


@pytest.mark.parametrize("family", ["lm", "seq2seq"])
def test_beam_cached_equals_recomputed_and_beam_1_is_greedy(family):
    if family == "lm":
        model, kw = lm(num_kv_heads=2), {}
        start = torch.randint(0, 41, (2, 4))
    else:
        model = seq2seq(num_kv_heads=1)
        kw = dict(src=torch.randint(1, 19, (2, 6)), src_valid_lens=torch.tensor([6, 3]))
        start = torch.zeros(2, 1, dtype=torch.long)
    greedy = generate(model, start, max_new_tokens=10, **kw)
    assert torch.equal(generate(model, start, max_new_tokens=10, strategy="beam", **kw), greedy)
    a = generate(model, start, max_new_tokens=10, beam_size=3, eos_id=2, **kw)
    b = generate(model, start, max_new_tokens=10, beam_size=3, eos_id=2, use_cache=False, **kw)
    assert torch.equal(a, b)
    c = generate(model, start, max_new_tokens=10, beam_size=3, **kw)
    assert c.shape == greedy.shape


def test_bad_input_is_a_clear_error():
    model, s2s = lm(), seq2seq()
    p = torch.randint(0, 41, (2, 4))
    cases = [
        (dict(beam_size=0), ValueError, "beam_size must be an int >= 1, got 0"),
        (dict(strategy="nucleus"), ValueError, "strategy must be one of"),
        (dict(strategy="sample", temperature=0.0), ValueError, "temperature must be > 0"),
        (dict(strategy="sample", top_p=1.5), ValueError, r"top_p must be None or in \(0, 1\]"),
        (dict(strategy="sample", top_k=0), ValueError, "top_k must be None or an int >= 1"),
        (dict(strategy="sample", beam_size=2), ValueError, "cannot be combined"),
        (dict(eos_id=41), ValueError, r"eos_id must be None or an id in \[0, 41\)"),
        (dict(src=torch.zeros(2, 3, dtype=torch.long)), ValueError, "only for encoder-decoder"),
    ]
    for kwargs, err, match in cases:
        with pytest.raises(err, match=match):
            generate(model, p, max_new_tokens=3, **kwargs)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        generate(model, p, max_new_tokens=-1)
    with pytest.raises(ValueError, match="4 \\+ max_new_tokens 61 = 65 exceeds max_len=64; ask "
                                         "for at most 60"):
        generate(model, p, max_new_tokens=61)
    with pytest.raises(ValueError, match=r"contains id 41, outside the vocabulary \[0, 41\)"):
        generate(model, p.clone().fill_(41), max_new_tokens=3)
    with pytest.raises(ValueError, match="needs src="):
        generate(s2s, p % 19, max_new_tokens=3)
    with pytest.raises(ValueError, match=r"batch sizes differ \(tokens 2, src 3\)"):
        generate(s2s, p % 19, max_new_tokens=3, src=torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="TransformerLM or Transformer"):
        generate(torch.nn.Linear(2, 2), p, max_new_tokens=3)


def test_generation_keeps_training_mode_and_is_exported():
    model = lm(dropout=0.3).train()
    p = torch.randint(0, 41, (1, 3))
    a = generate(model, p, max_new_tokens=5)
    assert model.training  # restored
    assert torch.equal(a, generate(model.eval(), p, max_new_tokens=5))  # ran in eval mode
    assert headwise.generate is generate
    assert torch.equal(generate(model, p, max_new_tokens=0), p)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       rows=st.integers(1, 4), v=st.integers(1, 300), levels=st.integers(1, 4),
       nans=st.integers(0, 3), infs=st.integers(0, 3), seed=st.integers(0, 2**31 - 1))
def test_greedy_choice_is_argmax_with_ties_nans_and_infs(dtype, rows, v, levels, nans, infs,
                                                         seed):
    """_argmax takes ``max``'s index: the same as ``argmax`` (the first of tied maxima, the first
    NaN), which few distinct values (ties everywhere), NaNs and infinities would tell apart."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-levels, levels + 1, (rows, v), generator=gen).to(dtype)
    for count, value in ((nans, float("nan")), (infs, float("inf")), (infs, -float("inf"))):
        at = torch.randint(0, rows * v, (count,), generator=gen)
        logits.view(-1)[at] = value
    assert torch.equal(_argmax(logits), logits.argmax(-1))
