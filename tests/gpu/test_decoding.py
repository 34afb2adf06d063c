"""Decoding on CUDA (skipped without a GPU): the fixed-shape step and its CUDA-graph replay
(generate(..., compile=True)) give the module path's tokens and logits; values against a float64
CPU reference. Each test takes a second or two on an H100."""

import pytest
import torch

import headwise
from headwise.decode import generation as decoding
from headwise.models import LMConfig, Transformer, TransformerConfig, TransformerLM
from headwise.step import DecodeStep

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GPT = dict(positional="learned", activation="gelu")
LLAMA = dict(positional="rope", num_kv_heads=2, norm="rms", ffn="glu", activation="silu",
             bias=False, tie_embeddings=True)


def _lm(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = LMConfig(101, d_model=64, num_heads=4, num_layers=3, d_ff=128, max_len=128,
                   dropout=0.0, **kw)
    return TransformerLM(cfg).eval()


@pytest.mark.parametrize("kw", [GPT, LLAMA, dict(LLAMA, sliding_window=5)],
                         ids=["gpt", "llama", "window"])
def test_cached_equals_uncached_and_compiled_on_cuda(kw):
    model = _lm(**kw).cuda()
    prompt = torch.randint(0, 101, (3, 9), device="cuda")
    args = dict(max_new_tokens=40)
    plain = headwise.generate(model, prompt, use_cache=False, **args)
    eager = headwise.generate(model, prompt, **args)
    graph = headwise.generate(model, prompt, compile=True, **args)
    assert torch.equal(eager, plain)
    assert torch.equal(graph, eager)


@pytest.mark.parametrize("kw", [GPT, LLAMA], ids=["gpt", "llama"])
def test_fixed_step_on_cuda_matches_float64_cpu_logits(kw):
    """The device step (fixed shapes, float32) against the CPU module path in float64, teacher
    forced: rounding of float32 sums over 64 features, ~1e-6 of the logits' size."""
    model = _lm(seed=1, **kw)
    ref = _lm(seed=1, **kw).double()
    prompt, nxt = torch.randint(0, 101, (2, 6)), torch.randint(0, 101, (2, 12))
    with torch.inference_mode():
        ref_cache = ref.new_cache(2, 32)
        ref(prompt, cache=ref_cache)
        want = torch.cat([ref(nxt[:, t:t + 1], cache=ref_cache)[0] for t in range(12)], 1)
        model = model.cuda()
        cache = model.new_cache(2, 32)
        model(prompt.cuda(), cache=cache)
        step = DecodeStep(model, cache)
        assert step.static
        got = torch.stack([step(nxt[:, t].cuda()) for t in range(12)], 1)
    torch.testing.assert_close(got.double().cpu(), want, atol=2e-5, rtol=1e-5)


def test_graph_replay_equals_the_eager_fixed_step():
    model = _lm(seed=2, **LLAMA).cuda()
    prompt, nxt = torch.randint(0, 101, (4, 5), device="cuda"), torch.randint(0, 101, (4, 20))
    with torch.inference_mode():
        logits = []
        for graph in (False, True):
            cache = model.new_cache(4, 32)
            model(prompt, cache=cache)
            step = DecodeStep(model, cache, graph=graph)
            logits.append(torch.stack([step(nxt[:, t].cuda()) for t in range(20)], 1))
        assert step._graph is not None  # captured, and replayed for steps 2..20
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)


def test_eos_read_every_16_tokens_on_cuda_gives_the_cpu_tokens():
    """float64 on both devices (the same greedy choices); eos comes at different steps per row:
    pad after each row's eos, and the output ends where the last row stopped."""
    model = _lm(seed=3, **GPT).double()
    prompt = torch.randint(0, 101, (6, 4))
    with torch.inference_mode():
        free = headwise.generate(model, prompt, max_new_tokens=60)
    eos = int(free[0, 10])  # a token the first row emits: it stops there
    want = headwise.generate(model, prompt, max_new_tokens=60, eos_id=eos, pad_id=0)
    got = headwise.generate(model.cuda(), prompt.cuda(), max_new_tokens=60, eos_id=eos,
                            pad_id=0)
    assert torch.equal(got.cpu(), want)
    graph = headwise.generate(model, prompt.cuda(), max_new_tokens=60, eos_id=eos, pad_id=0,
                              compile=True)
    assert torch.equal(graph.cpu(), want)


def test_compiled_sampling_bf16_matches_eager_sampling():
    """The sampler's generator runs outside the graph: the same seed, the same draws."""
    model = _lm(seed=4, **LLAMA).to("cuda", torch.bfloat16)
    prompt = torch.randint(0, 101, (2, 7), device="cuda")
    args = dict(max_new_tokens=30, strategy="sample", temperature=0.8, top_p=0.9, seed=5)
    tokens, logits = decoding.generate_with_logits(model, prompt, **args)
    g_tokens, g_logits = decoding.generate_with_logits(model, prompt, compile=True, **args)
    assert torch.equal(g_tokens, tokens)
    # (cuBLAS may pick another algorithm inside a capture: a bf16 rounding or two apart)
    torch.testing.assert_close(g_logits, logits, atol=3e-2, rtol=2e-2)


def test_encoder_decoder_compiled_equals_eager_on_cuda():
    torch.manual_seed(6)
    model = Transformer(TransformerConfig(src_vocab_size=41, tgt_vocab_size=43, d_model=64,
                                          num_heads=4, num_layers=2, d_ff=128, max_len=64,
                                          dropout=0.0)).eval().cuda()
    src = torch.randint(1, 41, (3, 11), device="cuda")
    lens = torch.tensor([11, 6, 2], device="cuda")
    start = torch.zeros(3, 1, dtype=torch.long, device="cuda")
    args = dict(src=src, src_valid_lens=lens, max_new_tokens=25)
    plain = headwise.generate(model, start, use_cache=False, **args)
    assert torch.equal(headwise.generate(model, start, **args), plain)
    assert torch.equal(headwise.generate(model, start, compile=True, **args), plain)
