"""Real checkpoints through attn_implementation="headwise", loaded by transformers itself
from local files: SmolLM2-135M-Instruct from its GGUF (``gguf_file=``) and all-MiniLM-L6-v2
from its folder. Logits / embeddings equal HF eager to 1e-5, every layer's weights to 1e-6."""

from __future__ import annotations

import pytest
import torch

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")


def _compare(model, inputs, field: str):
    real = inputs["attention_mask"].bool()
    runs = {}
    for implementation in ("headwise", "eager"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            runs[implementation] = model(**inputs, output_attentions=True)
    ours, eager = runs["headwise"], runs["eager"]
    torch.testing.assert_close(getattr(ours, field)[real], getattr(eager, field)[real],
                               atol=1e-5, rtol=0)
    assert len(ours.attentions) == len(eager.attentions) == len(hh.attention_layers(model))
    for a, b in zip(ours.attentions, eager.attentions, strict=True):
        torch.testing.assert_close(a.transpose(1, 2)[real], b.transpose(1, 2)[real],
                                   atol=1e-6, rtol=0)


def test_smollm2_from_its_gguf_equals_hf_eager(smollm2_path, hf_smollm2_tokenizer, transformers):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32,
        attn_implementation="headwise").eval()
    assert model.config._attn_implementation == "headwise"
    tok = hf_smollm2_tokenizer
    tok.padding_side = "left"
    inputs = tok(["The capital of France is Paris, and the capital of Italy is",
                  "Heads see"], return_tensors="pt", padding=True)
    _compare(model, inputs, "logits")


def test_minilm_through_hf_equals_hf_eager(minilm_folder, transformers):
    model = transformers.AutoModel.from_pretrained(minilm_folder, attn_implementation="headwise")
    tok = transformers.AutoTokenizer.from_pretrained(minilm_folder)
    inputs = tok(["A man is eating food.", "Attention heads, one by one, in a longer line."],
                 return_tensors="pt", padding=True)
    _compare(model.eval(), inputs, "last_hidden_state")
