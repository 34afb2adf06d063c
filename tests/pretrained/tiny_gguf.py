"""Write small llama-architecture GGUF files for the loader's tests (with ``gguf.GGUFWriter``).

The weights are given under Hugging Face's ``LlamaForCausalLM`` names (rotate-half row order);
this applies llama.cpp's converter permutation to q and k, as ``convert_hf_to_gguf.py`` does, so
the loader has to undo it. The vocabulary is the 256 byte tokens of GPT-2's alphabet, three
ChatML control tokens and two merges.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def vocabulary() -> tuple[list[str], list[str], list[int]]:
    from headwise.pretrained.chat import byte_alphabet

    merges = ["Ġ t", "h e"]
    tokens = [*SPECIALS, *byte_alphabet().values(), "Ġt", "he"]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, merges, types


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute``: rotate-half rows -> adjacent pairs."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def random_weights(layers=2, d_model=32, heads=4, kv_heads=2, d_ff=48, vocab=261, seed=0,
                   tied=True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = d_model // heads

    def mat(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(vocab, d_model),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(d_model)).astype(np.float32)}
    if not tied:
        w["lm_head.weight"] = mat(vocab, d_model)
    for n in range(layers):
        p = f"model.layers.{n}."
        w |= {p + "self_attn.q_proj.weight": mat(heads * d, d_model),
              p + "self_attn.k_proj.weight": mat(kv_heads * d, d_model),
              p + "self_attn.v_proj.weight": mat(kv_heads * d, d_model),
              p + "self_attn.o_proj.weight": mat(d_model, heads * d),
              p + "mlp.gate_proj.weight": mat(d_ff, d_model),
              p + "mlp.up_proj.weight": mat(d_ff, d_model),
              p + "mlp.down_proj.weight": mat(d_model, d_ff),
              p + "input_layernorm.weight": (1 + 0.1 * rng.standard_normal(d_model)).astype(
                  np.float32),
              p + "post_attention_layernorm.weight": (1 + 0.1 * rng.standard_normal(d_model))
              .astype(np.float32)}
    return w


_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, n, rest = hf.split(".", 3)
    module = rest.removesuffix(".weight")
    return f"blk.{n}.{_GGUF_NAMES[module]}.weight"


def write(path: str | Path, weights: dict[str, np.ndarray] | None = None, *,
          arch: str = "llama", heads: int = 4, kv_heads: int = 2, context: int = 64,
          chat_template: str | None = CHATML, types: dict[str, object] | None = None) -> Path:
    """A GGUF at ``path``; ``types`` maps a GGUF tensor name to a GGMLQuantizationType (the
    tensor is quantized with ``gguf.quants`` or, for types it cannot write, zero-filled)."""
    import gguf

    weights = random_weights(heads=heads, kv_heads=kv_heads) if weights is None else weights
    layers = 1 + max(int(k.split(".")[2]) for k in weights if k.startswith("model.layers."))
    d_model = weights["model.embed_tokens.weight"].shape[1]
    d_ff = weights["model.layers.0.mlp.up_proj.weight"].shape[0]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(d_model // heads)
    w.add_layer_norm_rms_eps(1e-5)
    tokens, merges, token_types = vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(token_types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for hf, array in weights.items():
        name = gguf_name(hf)
        if name.endswith("attn_q.weight"):
            array = llama_cpp_permute(array, heads)
        elif name.endswith("attn_k.weight"):
            array = llama_cpp_permute(array, kv_heads)
        kind = (types or {}).get(name)
        if kind is None:
            w.add_tensor(name, array)
            continue
        try:
            raw = gguf.quants.quantize(array, kind)
        except NotImplementedError:
            block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = np.zeros((*array.shape[:-1], array.shape[-1] // block * size), np.uint8)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
