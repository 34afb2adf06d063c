"""SmolLM2-135M-Instruct (GGUF, dequantized to float32) on headwise vs Hugging Face transformers'
``LlamaForCausalLM`` loaded from the same file (sdpa attention, its own ``generate``).

Run by ``benchmarks/generate.py --model smollm2``. Interleaved in one process (rotating order,
medians; ratios are medians of per-round ratios):

  decode     greedy, 256 new tokens after a 64-token chat prompt, batch 1 and 4:
             headwise.generate vs HF generate (min_new_tokens=256 so neither stops early);
             tok/s = batch * 256 / time of the whole call (the 64-token prefill included)
  prefill    one forward over 512 tokens (all logits) vs HF's forward
  bandwidth  bytes of weights one decode step reads (every fp32 parameter once, the tied
             matrix once) * steps/s / the copy bandwidth (read + write bytes of a 256 MiB
             tensor copy) measured in the same run
  memory     in a fresh process (headwise only): resident set after loading and decoding 256
             tokens at batch 4, minus the process before loading, / the fp32 weight bytes
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import _common as C

NEW, PROMPT, PREFILL = 256, 64, 512
TEXT = ("Explain, step by step and with examples, how attention heads in a small language "
        "model decide which earlier words matter for the next word, and why grouped-query "
        "attention lets nine query heads share three key/value heads without losing much.")


def chat_prompt(chat, n: int) -> torch.Tensor:
    """``(1, n)`` ids: the chat template around a long user message, cut to ``n`` tokens."""
    ids = chat.tokenizer.chat(TEXT * 8)
    assert len(ids) >= n
    return torch.tensor([ids[:n]])


def copy_bandwidth() -> float:
    """Bytes per second of a large tensor copy (read + write), best of 5."""
    src = torch.randn(64 * 2**20)  # 256 MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied: once


def load_hf(path):
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers.LlamaForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa").eval()


def measure(threads: int, rounds: int, batches) -> list[dict]:
    from headwise import generate
    from headwise.pretrained import find_smollm2, load_gguf

    torch.set_num_threads(threads)
    path = find_smollm2()
    chat, hf = load_gguf(path), load_hf(path)
    prompt = chat_prompt(chat, PROMPT)
    rows = []
    for b in batches:
        ids = prompt.expand(b, -1).contiguous()
        mask = torch.ones_like(ids)
        out = {}

        def ours(ids=ids, out=out):
            out["ours"] = generate(chat.model, ids, max_new_tokens=NEW)

        def theirs(ids=ids, mask=mask, out=out):
            with torch.inference_mode():
                out["hf"] = hf.generate(ids, attention_mask=mask, do_sample=False,
                                        max_new_tokens=NEW, min_new_tokens=NEW)

        times = C.interleave({"headwise": ours, "HF": theirs}, warmup=0, min_rounds=rounds,
                             max_rounds=rounds)
        same = out["ours"].shape == out["hf"].shape and bool((out["ours"] == out["hf"]).all())
        tok_s = {k: b * NEW / min(v) for k, v in times.items()}
        rows.append(dict(threads=threads, batch=b, what=f"decode {NEW} after {PROMPT}",
                         headwise=f"{tok_s['headwise']:.1f} tok/s", HF=f"{tok_s['HF']:.1f} tok/s",
                         ratio=1 / C.ratio(times["headwise"], times["HF"]),
                         goal=">= 1.5x", same_tokens=same,
                         _steps_s=NEW / statistics.median(times["headwise"])))
    ids = _long_ids(chat, PREFILL)
    with torch.inference_mode():
        times = C.interleave({"headwise": lambda: chat.model(ids), "HF": lambda: hf(ids)},
                             warmup=1, min_rounds=rounds, max_rounds=rounds + 2)
    rows.append(dict(threads=threads, batch=1, what=f"prefill {PREFILL}",
                     headwise=f"{C.median_ms(times['headwise']):.0f} ms",
                     HF=f"{C.median_ms(times['HF']):.0f} ms",
                     ratio=C.ratio(times["headwise"], times["HF"]), goal="<= 1.0x (time)"))
    bw, wb = copy_bandwidth(), weight_bytes(chat.model)
    for row in rows:
        if "_steps_s" in row:
            row["bandwidth"] = f"{wb * row.pop('_steps_s') / bw:.0%} of {bw / 1e9:.1f} GB/s"
    return rows


def _long_ids(chat, n: int) -> torch.Tensor:
    ids = chat.tokenizer.chat(TEXT * 20)
    return torch.tensor([ids[:n]])


def memory_child(batch: int) -> dict:
    """In a fresh process: RSS growth from loading + decoding, over the fp32 weight bytes."""
    from headwise import generate
    from headwise.pretrained import load_smollm2

    torch.set_num_threads(1)
    before = C.rss_mb()
    chat = load_smollm2()
    ids = chat_prompt(chat, PROMPT).expand(batch, -1).contiguous()
    generate(chat.model, ids, max_new_tokens=NEW)
    weights_mb = weight_bytes(chat.model) / 2**20
    return dict(rss_mb=C.rss_mb() - before, peak_mb=C.rss_mb("VmHWM") - before,
                weights_mb=weights_mb)


def run(threads_list, rounds: int, batches) -> None:
    rows, cols = [], ["threads", "batch", "what", "headwise", "HF", "ratio", "goal",
                      "same_tokens", "bandwidth"]
    for threads in threads_list:
        rows += measure(threads, rounds, batches)
        print(C.table(rows, cols), flush=True)  # partial results survive an interrupted run
    print("\n## SmolLM2-135M-Instruct (Q4_1 GGUF -> fp32): headwise vs HF LlamaForCausalLM\n")
    print(C.table(rows, cols))
    mem = C.peak_in_subprocess(__file__, "--memory-child", str(max(batches)))
    print(f"\nresident memory (fresh process, batch {max(batches)}, {NEW} tokens decoded): "
          f"{mem['rss_mb']:.0f} MiB after, {mem['peak_mb']:.0f} MiB peak, over fp32 weights "
          f"{mem['weights_mb']:.0f} MiB: {mem['rss_mb'] / mem['weights_mb']:.2f}x after, "
          f"{mem['peak_mb'] / mem['weights_mb']:.2f}x peak (goal <= 1.25x)")


if __name__ == "__main__" and sys.argv[1:2] == ["--memory-child"]:
    import json
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps(memory_child(int(sys.argv[2]))))
