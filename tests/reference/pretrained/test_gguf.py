"""SmolLM2 from its GGUF in headwise against transformers' ``LlamaForCausalLM`` loaded from the
same file: the config it reads, the logits, every layer's per-head attention weights, greedy
generation."""

from __future__ import annotations


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
