"""Tiny random-weight Hugging Face models built from configs (nothing downloads), one per
attention family that goes through transformers' attention interface, fp32 and in eval."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import headwise.hf  # noqa: E402,F401  (registers attn_implementation="headwise")

VOCAB = 64
TOKENS = dict(bos_token_id=1, eos_token_id=2)
SMALL = dict(TOKENS, vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4)
ROPE = dict(SMALL, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def _configs() -> dict:
    t = transformers
    return {
        "llama": (t.LlamaConfig, t.LlamaForCausalLM, ROPE),
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, ROPE),
        "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM, ROPE),
        "mistral": (t.MistralConfig, t.MistralForCausalLM, dict(ROPE, sliding_window=3)),
        "gemma2": (t.Gemma2Config, t.Gemma2ForCausalLM,
                   dict(ROPE, sliding_window=3, attn_logit_softcapping=2.0,
                        query_pre_attn_scalar=8, layer_types=["sliding_attention",
                                                              "full_attention"])),
        "gemma3": (t.Gemma3TextConfig, t.Gemma3ForCausalLM,
                   dict(ROPE, sliding_window=3, query_pre_attn_scalar=8,
                        layer_types=["sliding_attention", "full_attention"])),
        "gpt_oss": (t.GptOssConfig, t.GptOssForCausalLM,
                    dict(ROPE, num_local_experts=2, num_experts_per_tok=1, sliding_window=3,
                         layer_types=["sliding_attention", "full_attention"])),
        "phi3": (t.Phi3Config, t.Phi3ForCausalLM, dict(ROPE, pad_token_id=0)),
        "gpt2": (t.GPT2Config, t.GPT2LMHeadModel,
                 dict(TOKENS, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
        "bert": (t.BertConfig, t.BertForMaskedLM,
                 dict(SMALL, max_position_embeddings=64)),
        "modernbert": (t.ModernBertConfig, t.ModernBertForMaskedLM,
                       dict(SMALL, num_hidden_layers=3, local_attention=4,
                            global_attn_every_n_layers=2, max_position_embeddings=64,
                            pad_token_id=0, cls_token_id=1, sep_token_id=2)),
    }


FAMILIES = sorted(_configs())
ENCODERS = {"bert", "modernbert"}


def build(name: str, implementation: str = "eager", seed: int = 0):
    """A tiny random ``name`` model on ``implementation``, in eval, fp32."""
    config_class, model_class, kwargs = _configs()[name]
    config = config_class(**kwargs)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    model.set_attn_implementation(implementation)
    # random weights are small: scale the scores up so softmax rows are not near-uniform
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and p.shape[0] != VOCAB:
                p.mul_(4.0)
        for layer in headwise.hf.attention_layers(model):
            if hasattr(layer, "sinks"):
                layer.sinks.normal_()
    return model


def batch(padding: str, b: int = 2, n: int = 9, seed: int = 1):
    """``(input_ids (b, n), attention_mask (b, n))``: row 0 has 3 pads on ``padding``'s side,
    row 1 none."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long)
    if padding == "left":
        mask[0, :3] = 0
    elif padding == "right":
        mask[0, -3:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


WORDS = ("the cat sat on mat a dog ran to house heads see one by in line and it was".split())


def tokenizer():
    """A word-level tokenizer over :data:`WORDS` built offline (the ``tokenizers`` library),
    wrapped as transformers' PreTrainedTokenizerFast: ids 0-3 are [PAD] [BOS] [EOS] [UNK]
    (``TOKENS``' ids), words from 4; it adds [BOS] in front of each text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3}
    vocab.update({w: 4 + n for n, w in enumerate(WORDS)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="[BOS] $A",
                                                        special_tokens=[("[BOS]", 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]",
                                                bos_token="[BOS]", eos_token="[EOS]",
                                                unk_token="[UNK]")


def save(name: str, folder, seed: int = 0):
    """``build(name)`` and :func:`tokenizer` written to ``folder`` with ``save_pretrained``
    (config.json, model.safetensors, tokenizer files); returns the model."""
    model = build(name, seed=seed)
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return model
