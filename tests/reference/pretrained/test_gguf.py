"""SmolLM2 from its GGUF in headwise against transformers' ``LlamaForCausalLM`` loaded from the
same file: the config it reads, the logits, every layer's per-head attention weights, greedy
generation."""

from __future__ import annotations

import pytest


def test_config_is_what_transformers_reads(smollm2_file, smollm2_path, transformers):
    hf = transformers.AutoConfig.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)
    c = smollm2_file.config
    assert hf.model_type == c.architecture == "llama"
    rope = getattr(hf, "rope_parameters", None) or {"rope_theta": hf.rope_theta}
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.d_model, c.head_dim, c.d_ff,
            c.rope_theta, c.rms_eps, c.context_length, c.vocab_size, c.tie_embeddings) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.hidden_size,
        hf.head_dim, hf.intermediate_size, rope["rope_theta"], hf.rms_norm_eps,
        hf.max_position_embeddings, hf.vocab_size, hf.tie_word_embeddings)
    assert c.rope_dim == c.head_dim
    assert set(smollm2_file.types.values()) == {"F32", "Q4_1", "Q8_0"}


# ------------------------------------------------------------------ the model against HF's
# Both models are loaded once for this module (30 layers in float32: ~0.5 GB each, ~10-60 s).
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You write Python."},
     {"role": "user", "content": "def fib(n):  # complete this, café ☕"}],
    [{"role": "user", "content": "Name three colours."},
     {"role": "assistant", "content": "Red, green and blue."},
     {"role": "user", "content": "And three more? 🎨"}],
]


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_path, transformers):
    """transformers' LlamaForCausalLM from the same GGUF, eager attention (returns weights)."""
    import torch

    model = transformers.LlamaForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32,
        attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    from headwise.pretrained import load_gguf
    return load_gguf(smollm2_path)


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_logits_match_transformers(smollm2, hf_smollm2, index):
    import torch

    ids = smollm2.prompt(PROMPTS[index])
    with torch.no_grad():
        ours, _ = smollm2.model(ids)
        theirs = hf_smollm2(ids).logits
    assert ours.shape == theirs.shape == (1, ids.shape[1], 49152)
    # the same float32 arithmetic in another order: 30 layers of sums over 576-1536 features
    # leave ~1e-6 of the logits' scale (seen 1e-4 at logits ~28 on torch's portable kernels);
    # 1e-5 of it is ~80 float32 epsilons, and far below any wrong weight or mask
    assert (ours - theirs).abs().max() < 1e-5 * theirs.abs().max()
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_every_layers_per_head_weights_match_transformers_eager(smollm2, hf_smollm2):
    import torch

    ids = smollm2.prompt(PROMPTS[1])
    with torch.no_grad():
        _, attentions = smollm2.model(ids, return_weights=True)
        theirs = hf_smollm2(ids, output_attentions=True).attentions
    ours = attentions["decoder_self"]
    assert len(ours) == len(theirs) == 30
    n = ids.shape[1]
    for layer, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.shape == b.shape == (1, 9, n, n), layer
        assert (a - b).abs().max() < 1e-5, layer
        assert torch.equal(a.triu(1), torch.zeros_like(a))  # causal: no later key


def test_64_greedy_tokens_match_transformers_generate(smollm2, hf_smollm2):
    import torch

    from headwise import generate

    ids = smollm2.prompt("Tell me a long story about a lighthouse keeper and a storm.")
    eos = smollm2.tokenizer.eos_id
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small decode-step ops on a shared 2-core box: 1 thread is faster
    hf_smollm2.set_attn_implementation("sdpa")  # same math as eager, ~2x faster per step
    try:
        ours = generate(smollm2.model, ids, max_new_tokens=64, eos_id=eos)
        with torch.no_grad():
            theirs = hf_smollm2.generate(ids, attention_mask=torch.ones_like(ids),
                                         do_sample=False, max_new_tokens=64, eos_token_id=eos)
    finally:
        hf_smollm2.set_attn_implementation("eager")
        torch.set_num_threads(threads)
    assert ours.shape == theirs.shape == (1, ids.shape[1] + 64)  # no <|im_end|> within 64
    assert torch.equal(ours, theirs)


def test_four_rows_decode_like_transformers_generate(smollm2, hf_smollm2):
    """Batch 4 through the decode step (its rows-as-columns products, headwise.fast.rows): every
    row's 24 greedy tokens equal HF's batch-4 ``generate`` and the logits they were chosen from
    agree within 1e-4."""
    import torch

    from headwise.decoding import generate_with_logits

    texts = [m[-1]["content"] for m in PROMPTS] + ["Tell me about lighthouses."]
    rows = [smollm2.prompt([{"role": "user", "content": t}])[0] for t in texts]
    n = min(len(r) for r in rows)
    ids = torch.stack([r[:n] for r in rows])  # (4, n): no padding, every row its own text
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    hf_smollm2.set_attn_implementation("sdpa")
    try:
        ours, logits = generate_with_logits(smollm2.model, ids, max_new_tokens=24)
        with torch.no_grad():
            theirs = hf_smollm2.generate(ids, attention_mask=torch.ones_like(ids),
                                         do_sample=False, max_new_tokens=24, eos_token_id=None,
                                         output_logits=True, return_dict_in_generate=True)
    finally:
        hf_smollm2.set_attn_implementation("eager")
        torch.set_num_threads(threads)
    assert torch.equal(ours, theirs.sequences)
    want = torch.stack(theirs.logits, 1)  # (4, 24, v)
    assert logits.shape == want.shape == (4, 24, want.shape[-1])
    assert (logits - want).abs().max() < 1e-4


def test_bf16_weights_stay_close_to_float32(smollm2):
    """How exact bf16 is: measured max |logit difference| ~1.2 on logits up to ~38 (bound: 2),
    the same top token at >= 93% of prompt positions, and a greedy answer whose every token is
    one float32, reading the same text, scores within twice the bound of its own top token. Not
    float32's answer token for token: this prompt's first answer token is a close call (top two
    logits under 4 apart), which sums in another order (AVX2, AVX-512) may rightly flip."""
    import copy

    import torch

    from headwise import generate

    bound = 2.0
    bf16 = copy.deepcopy(smollm2.model).to(torch.bfloat16)
    ids = smollm2.prompt(PROMPTS[0])
    with torch.no_grad():
        full, _ = smollm2.model(ids)
        half, _ = bf16(ids)
    assert half.dtype == torch.bfloat16
    assert (full - half.float()).abs().max() < bound
    assert (full.argmax(-1) == half.argmax(-1)).float().mean() >= 0.9
    n = ids.shape[1]
    got = generate(bf16, ids, max_new_tokens=12, eos_id=smollm2.tokenizer.eos_id)
    assert torch.equal(got[:, :n], ids) and got.shape[1] > n
    with torch.no_grad():
        logits, _ = smollm2.model(got)  # float32 reading bf16's answer
    scores = logits[0, n - 1:got.shape[1] - 1]  # (new, vocab): what predicted each new token
    chosen = scores.gather(-1, got[0, n:, None])[:, 0]
    assert (scores.max(-1).values - chosen).max() < 2 * bound


@pytest.fixture(scope="module")
def smollm2_q4(smollm2, smollm2_file):
    """The same model whose decode step multiplies by the file's own Q4_1 blocks."""
    import copy

    from headwise.pretrained.gguf import attach_q4

    model = copy.deepcopy(smollm2.model)
    assert attach_q4(model, smollm2_file) == 7 * 30  # every block matrix; the Q8_0 table is not
    return model


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_q4_decode_step_stays_close_to_float32(smollm2, smollm2_q4, index):
    """How exact ``load_gguf(q4=True)`` is, the same 32 tokens fed to both decode steps.
    Measured: max |logit difference| 0.31-0.86 on logits up to ~42 (full bf16: 0.65-0.94),
    the same top token at 98-100% of steps."""

    from headwise import generate
    from tests.pretrained.test_q4 import _step_logits

    ids = smollm2.prompt(PROMPTS[index])
    feed = generate(smollm2.model, ids, max_new_tokens=32)[:, ids.shape[1]:]
    want, got = _step_logits(smollm2.model, ids, feed), _step_logits(smollm2_q4, ids, feed)
    assert 0 < (want - got).abs().max() < 1.5
    assert (want.argmax(-1) == got.argmax(-1)).float().mean() >= 0.9


def test_q4_answers_like_float32(smollm2, smollm2_q4):
    """Measured: the first 64 greedy tokens of this answer are identical."""
    import torch

    from headwise import generate

    ids = smollm2.prompt(PROMPTS[0])
    ours = generate(smollm2_q4, ids, max_new_tokens=64)
    assert torch.equal(ours, generate(smollm2.model, ids, max_new_tokens=64))
    assert smollm2.tokenizer.decode(ours[0, ids.shape[1]:].tolist()).startswith(
        "The capital of France is Paris.")
