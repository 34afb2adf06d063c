"""Pruning real checkpoints loaded by transformers itself: SmolLM2-135M-Instruct (9 query heads
in 3 key/value groups, from its GGUF) and all-MiniLM-L6-v2 (BERT). The pruned model equals the
unpruned one with those heads gated by hw.ablate to 1e-6 x max(1, |output|) (SmolLM2: in
float64; in float32 to float32's own rounding over 30 layers). (transformers refuses to
save_pretrained a model it loaded from a GGUF, pruned or not: the round trip is tested on the
tiny models, tests/hf/test_prune.py.)"""

from __future__ import annotations

import copy

import pytest
import torch

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
import headwise as hw  # noqa: E402

# SmolLM2: a whole group in layer 0, one head of every group in layer 7, two of every group in
# the last layer (query head x reads key/value head x // 3)
SMOLLM2 = {"layers": {0: [3, 4, 5], 7: [0, 4, 8], -1: [0, 1, 3, 5, 6, 7]}}
MINILM = {"layers": {0: [0, 11], 3: [5], 5: list(range(1, 12))}}


def _run(model, selection, inputs, field, gate: bool):
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        if gate:
            with hw.ablate(model, selection):
                return getattr(model(**inputs), field)[real]
        return getattr(model(**inputs), field)[real]


def _error(got, want):
    """Elementwise |got - want| / max(1, |want|), its max."""
    return ((got - want).abs() / want.abs().clamp(min=1)).max().item()


def test_pruned_smollm2_equals_gated_smollm2(smollm2_path, hf_smollm2_tokenizer, transformers):
    """float64: equal to 1e-6 x max(1, |logits|) (measured: 0). float32 through 30 layers: the
    unpruned model's own rounding is ~6e-5 of max(1, |logits|) away from float64 (measured), so
    pruned and gated agree only to that; pruning must stay as close to the float64 logits as
    the gated float32 model is (measured 4.5e-5 against 5.8e-5)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32,
        attn_implementation="headwise").eval()
    tok = hf_smollm2_tokenizer
    tok.padding_side = "left"
    inputs = tok(["The capital of France is Paris, and the capital of Italy is", "Heads see"],
                 return_tensors="pt", padding=True)
    gated32 = _run(model, SMOLLM2, inputs, "logits", gate=True)
    assert (_run(model, SMOLLM2, inputs, "logits", gate=False) - gated32).abs().max() > 1e-3
    pruned = hh.prune_heads(copy.deepcopy(model), SMOLLM2)
    got32 = _run(pruned, SMOLLM2, inputs, "logits", gate=False)
    layers = hh.attention_layers(pruned)
    assert [layers[x].num_heads for x in (0, 7, 29)] == [6, 6, 3]
    assert [layers[x].num_key_value_heads for x in (0, 7, 29)] == [2, 3, 3]
    del pruned, layers
    model.double()  # in place: one copy of the weights at a time
    gated64 = _run(model, SMOLLM2, inputs, "logits", gate=True)
    got64 = _run(hh.prune_heads(model, SMOLLM2), SMOLLM2, inputs, "logits", gate=False)
    assert _error(got64, gated64) <= 1e-6
    assert _error(got32.double(), gated64) <= 1.5 * _error(gated32.double(), gated64)


def test_pruned_minilm_equals_gated_minilm(minilm_folder, transformers):
    model = transformers.AutoModel.from_pretrained(minilm_folder,
                                                   attn_implementation="headwise").eval()
    tok = transformers.AutoTokenizer.from_pretrained(minilm_folder)
    inputs = tok(["A man is eating food.", "Attention heads, one by one, in a longer line."],
                 return_tensors="pt", padding=True)
    gated = _run(model, MINILM, inputs, "last_hidden_state", gate=True)
    pruned = hh.prune_heads(copy.deepcopy(model), MINILM)
    assert _error(_run(pruned, MINILM, inputs, "last_hidden_state", gate=False), gated) <= 1e-6
    assert (_run(model, MINILM, inputs, "last_hidden_state", gate=False) - gated).abs().max() > 1e-3
    assert [hw.hf.model.head_count(m) for m in hh.attention_layers(pruned)] == [10, 12, 12, 11,
                                                                                12, 1]
