"""Decoding a SmolLM2-shaped Llama: headwise (DecodeStep) vs Hugging Face ``LlamaForCausalLM``.

Model: SmolLM2-135M's shape with random weights (30 layers, hidden 576, 9 query heads over 3
key/value heads, head dim 64, SwiGLU 1536, RoPE theta 1e5, RMSNorm, tied 49152-token embedding,
no biases), fp32, built by transformers and copied into headwise by name, so both hold the same
weights (checked: logits within 1e-4, identical greedy tokens). It needs no GGUF file; the real
SmolLM2 rows (same weights as the GGUF) are benchmarks/generate.py's.

Candidates, interleaved in one process (rotating order, medians of per-round ratios):

  hf generate    transformers' ``generate(do_sample=False)`` with its KV cache
  headwise       ``headwise.generate``: the prompt through the modules, then every token
                 through ``headwise.step.DecodeStep``

Both decode ``--new`` tokens after a ``--prompt``-token prompt; tok/s counts new tokens over
the whole call (prefill included, as a user sees it).

    python benchmarks/llama_decode.py [--threads 1 2] [--batches 1 4] [--new 64] [--layers 30]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import headwise  # noqa: E402
from headwise.models import LMConfig, TransformerLM  # noqa: E402

HF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm",
            "self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.k_proj",
            "self_attn.v_proj": "self_attn.v_proj", "self_attn.o_proj": "self_attn.out_proj",
            "mlp.gate_proj": "ff.gate", "mlp.up_proj": "ff.up", "mlp.down_proj": "ff.down"}


def build(layers: int):
    """``(hf, headwise)``: the same random SmolLM2-shaped weights in both."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192)).eval()
    ours = TransformerLM(LMConfig(
        vocab_size=49152, d_model=576, num_heads=9, num_kv_heads=3, num_layers=layers,
        d_ff=1536, max_len=8192, dropout=0.0, positional="rope", rope_theta=100000.0,
        norm="rms", layer_norm_eps=1e-5, ffn="glu", activation="silu", bias=False,
        tie_embeddings=True, pad_id=None)).eval()
    src, dst = hf.state_dict(), ours.state_dict()
    names = {"model.embed_tokens.weight": "embed.tokens.weight",
             "model.norm.weight": "final_norm.weight"}
    for i in range(layers):
        for a, b in HF_NAMES.items():
            names[f"model.layers.{i}.{a}.weight"] = f"blocks.{i}.{b}.weight"
    with torch.no_grad():
        for a, b in names.items():
            dst[b].copy_(src[a])
    return hf, ours


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--budget", type=float, default=20.0)
    args = ap.parse_args()
    hf, ours = build(args.layers)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for b in args.batches:
            prompt = torch.randint(0, 49152, (b, args.prompt),
                                   generator=torch.Generator().manual_seed(b))
            with torch.inference_mode():
                diff = (hf(prompt).logits - ours(prompt)[0]).abs().max().item()
                want = hf.generate(prompt, max_new_tokens=args.new, min_new_tokens=args.new,
                                   do_sample=False)
            got = headwise.generate(ours, prompt, max_new_tokens=args.new)
            assert diff < 1e-4 and torch.equal(got, want), (diff, "greedy tokens differ")

            def run_hf(prompt=prompt):
                with torch.inference_mode():
                    hf.generate(prompt, max_new_tokens=args.new, min_new_tokens=args.new,
                                do_sample=False)
            times = C.interleave({"hf": run_hf, "headwise": lambda prompt=prompt: headwise.generate(
                ours, prompt, max_new_tokens=args.new)}, warmup=1, min_rounds=3,
                budget_s=args.budget)
            n = b * args.new
            rows.append({"threads": threads, "batch": b, "hf tok/s": n / (C.median_ms(times["hf"]) / 1e3),
                         "headwise tok/s": n / (C.median_ms(times["headwise"]) / 1e3),
                         "speedup": C.ratio(times["hf"], times["headwise"]),
                         "rounds": len(times["hf"]), "logits diff": diff})
            print(C.table(rows[-1:], list(rows[-1])), flush=True)
    print(f"\nSmolLM2-shaped, {args.layers} layers, prompt {args.prompt}, {args.new} new tokens, "
          f"fp32, greedy; torch {torch.__version__}")
    print(C.table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
