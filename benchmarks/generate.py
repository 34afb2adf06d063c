"""Generation speed: headwise's KV cache vs recomputation vs a plain preallocated cache.

Model: decoder-only LM, d_model 256, 4 layers, 4 heads, d_ff 1024, vocab 4096, learned positions,
GELU, tied embeddings, no biases; prompt 16 tokens; greedy; fp32; inference mode.
Candidates, interleaved in one process (rotating order, medians, ratios = medians of per-round
ratios):

  headwise cache     headwise.generate(model, ..., use_cache=True): the prompt through the
                     modules, then every token through headwise.step.DecodeStep
  headwise recompute headwise.generate(model, ..., use_cache=False): the whole prefix each step
  plain cache        ~40 lines of plain PyTorch (fused QKV, preallocated (b, h, L, d) buffers,
                     SDPA) holding the *same weights*: the anchor; its tokens must match ours

Recomputation costs O(n^2) per run; it is measured up to ``--recompute-max`` new tokens (default
512: the issue's 12x / 30x targets are at 512) and marked "-" beyond. Per-token time at the start
vs the end of a 1024-token run comes from timing every step of one cached run (medians of the
first and last 64 steps).

    python benchmarks/generate.py [--new 64 512 1024] [--batches 1 8] [--budget 6]
    python benchmarks/generate.py --model smollm2 [--threads 1 2] [--rounds 3] [--quick]
        [--variants fp32 bf16 q4]

``--model smollm2``: the real SmolLM2-135M-Instruct from its GGUF against Hugging Face's
``generate`` with the same weights, as same-dtype pairs (fp32, bf16) plus headwise's 4-bit
decode step on the file's own blocks (decode at batch 1 and 4, prefill of 512 tokens, fraction
of the memory-bandwidth limit, resident memory; see ``benchmarks/_smollm2.py``). ``--quick``:
one interleaved round (about 10 minutes on 2 idle cores).

``--device cuda``: the GPU tables of issue #28 (``benchmarks/_generate_gpu.py``): a 12-layer,
768-wide LM, batch 1 and 8, headwise eager and CUDA-graph decoding vs the plain loop below on the
same device; a SmolLM2-shaped Llama in bf16 vs HF ``generate`` (dynamic and static cache).
``--device cuda --quick``: under 2.5 minutes on an H100.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import headwise  # noqa: E402
from headwise.decode.generation import _Stepper  # noqa: E402
from headwise.models import LMConfig, TransformerLM  # noqa: E402

PROMPT = 16


class PlainGPT(nn.Module):
    """The same LM written plainly (nanoGPT style) with a preallocated KV cache."""

    def __init__(self, lm: TransformerLM):
        super().__init__()
        c = lm.config
        self.h, self.L = c.num_heads, c.num_layers
        self.wte, self.wpe = lm.embed.tokens.weight, lm.embed.positions.weight
        self.layers = []
        for blk in lm.blocks:
            a = blk.self_attn
            self.layers.append(dict(
                ln1=blk.attn_norm, ln2=blk.ff_norm, up=blk.ff.up.weight, down=blk.ff.down.weight,
                qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                out=a.out_proj.weight))
        self.ln_f, self.head = lm.final_norm, lm.lm_head.weight

    def forward(self, idx, cache=None, pos=0):
        b, t = idx.shape
        x = F.embedding(idx, self.wte) + self.wpe[pos:pos + t]
        for i, p in enumerate(self.layers):
            q, k, v = F.linear(p["ln1"](x), p["qkv"]).view(b, t, 3, self.h, -1).permute(
                2, 0, 3, 1, 4)
            if cache is not None:
                cache[0][i][:, :, pos:pos + t] = k
                cache[1][i][:, :, pos:pos + t] = v
                k, v = cache[0][i][:, :, :pos + t], cache[1][i][:, :, :pos + t]
            o = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
            x = x + F.linear(o.transpose(1, 2).reshape(b, t, -1), p["out"])
            x = x + F.linear(F.gelu(F.linear(p["ln2"](x), p["up"])), p["down"])
        return F.linear(self.ln_f(x[:, -1]), self.head)

    @torch.inference_mode()
    def generate(self, prompt, n_new):
        b, n = prompt.shape
        d = self.wte.shape[1] // self.h
        dev = self.wte.device
        cache = [[torch.zeros(b, self.h, n + n_new, d, device=dev) for _ in range(self.L)]
                 for _ in "kv"]
        out = torch.empty(b, n + n_new, dtype=torch.long, device=dev)
        out[:, :n] = prompt
        logits = self(prompt, cache, 0)
        for pos in range(n, n + n_new):
            out[:, pos] = logits.argmax(-1)
            if pos + 1 < n + n_new:
                logits = self(out[:, pos:pos + 1], cache, pos)
        return out


def build_model() -> TransformerLM:
    torch.manual_seed(0)
    cfg = LMConfig(4096, d_model=256, num_heads=4, num_layers=4, d_ff=1024, max_len=2048,
                   dropout=0.0, activation="gelu", positional="learned", tie_embeddings=True,
                   bias=False)
    return TransformerLM(cfg).eval()


def per_token_times(model, prompt, n_new) -> list[float]:
    """Seconds per decoding step of one cached run (prefill excluded)."""
    times, original = [], _Stepper.next

    def timed(self, out, pos):
        t0 = time.perf_counter()
        logits = original(self, out, pos)
        times.append(time.perf_counter() - t0)
        return logits
    _Stepper.next = timed
    try:
        headwise.generate(model, prompt, max_new_tokens=n_new)
    finally:
        _Stepper.next = original
    return times


def measure(model, plain, prompt, n: int, recompute: bool, budget: float) -> dict:
    """One table row. The two caches run interleaved (>= 5 rounds); recomputation, O(n^2) per
    run, runs in rounds of its own (>= 3 when cheap, else 1) between cached rounds."""
    b = prompt.shape[0]
    same = torch.equal(headwise.generate(model, prompt, max_new_tokens=n),
                       plain.generate(prompt, n))
    fns = {"cache": lambda: headwise.generate(model, prompt, max_new_tokens=n),
           "plain": lambda: plain.generate(prompt, n)}
    t = C.interleave(fns, warmup=1, min_rounds=5, budget_s=budget)
    med = {k: statistics.median(v) for k, v in t.items()}
    row = {"batch": b, "new tokens": n, "cache tok/s": b * n / med["cache"],
           "recompute tok/s": "-", "cache speedup": "-",
           "plain cache tok/s": b * n / med["plain"],
           "headwise / plain speed": C.ratio(t["plain"], t["cache"]),
           "rounds (cache, recompute)": f"{len(t['cache'])}, -", "same tokens as plain": same}
    if recompute:
        cheap = b == 1 and n <= 64
        slow = C.interleave({"recompute": lambda: headwise.generate(
            model, prompt, max_new_tokens=n, use_cache=False), **fns},
            warmup=1 if cheap else 0, min_rounds=3 if cheap else (2 if b == 1 else 1),
            budget_s=0)
        # recompute's median over the cache's median across every round it ran in (a single
        # same-round pair would hinge on one ~1 s cached run of a noisy machine)
        cache = t["cache"] + slow["cache"]
        recompute_s = statistics.median(slow["recompute"])
        row.update({"recompute tok/s": b * n / recompute_s,
                    "cache speedup": recompute_s / statistics.median(cache),
                    "rounds (cache, recompute)": f"{len(cache)}, {len(slow['recompute'])}"})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, nargs="+", default=[64, 512, 1024])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--recompute-max", type=int, default=512)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds per cached config")
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="torch threads (default: torch's; smollm2: 1 2)")
    ap.add_argument("--model", choices=("toy", "smollm2"), default="toy")
    ap.add_argument("--rounds", type=int, default=3, help="smollm2: interleaved rounds")
    ap.add_argument("--quick", action="store_true",
                    help="smollm2: one round; --device cuda: few rounds (< 2.5 min on an H100)")
    ap.add_argument("--device", default="cpu",
                    help="cpu (the tables above) or cuda (benchmarks/_generate_gpu.py)")
    ap.add_argument("--variants", nargs="+", choices=("fp32", "bf16", "q4"),
                    default=["fp32", "bf16", "q4"],
                    help="smollm2: headwise weights to run (each with its HF pair)")
    args = ap.parse_args()
    if args.device != "cpu":
        import _generate_gpu
        _generate_gpu.run(args.device, args.batches, args.quick)
        return
    if args.model == "smollm2":
        import _smollm2
        batches = args.batches if args.batches != [1, 8] else [1, 4]
        _smollm2.run(args.threads or [1, 2], 1 if args.quick else args.rounds, batches,
                     tuple(args.variants))
        return
    if args.threads:
        args.threads = args.threads[0]
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model()
    plain = PlainGPT(model)
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, model "
          f"{model.num_parameters() / 1e6:.2f}M params, prompt {PROMPT}, greedy fp32")
    rows = []
    for b in args.batches:
        prompt = torch.randint(0, 4096, (b, PROMPT), generator=torch.Generator().manual_seed(b))
        for n in args.new:
            rows.append(measure(model, plain, prompt, n, n <= args.recompute_max, args.budget))
            print(C.table(rows[-1:], list(rows[-1])), flush=True)
    print("\n## Tokens per second (greedy, prompt 16)\n")
    print(C.table(rows, list(rows[0])))
    if 1024 in args.new:
        prompt = torch.randint(0, 4096, (1, PROMPT), generator=torch.Generator().manual_seed(9))
        per_token_times(model, prompt, 64)  # warm-up
        ts = per_token_times(model, prompt, 1024)
        start, end = statistics.median(ts[:64]), statistics.median(ts[-64:])
        print("\n## Per-token time across one cached 1024-token run (batch 1)\n")
        print(C.table([{"first 64 steps ms/token": start * 1e3,
                        "last 64 steps ms/token": end * 1e3, "end / start": end / start}],
                      ["first 64 steps ms/token", "last 64 steps ms/token", "end / start"]))
    print(f"\nrecompute measured up to {args.recompute_max} new tokens ('-' beyond: O(n^2) "
          "per run), in rounds of its own (3 at batch 1 x 64, 2 at batch 1, else 1) that also "
          "run both caches; speedup = recompute median / cache median over all its rounds.")
    goals(rows, end / start if 1024 in args.new else None)


def goals(rows: list[dict], end_over_start: float | None) -> None:
    """The issue's targets. Its ">= 1,000 tokens/s at batch 1" was set when the plain
    preallocated cache made 962 tokens/s on this machine: as a same-process ratio that is
    >= 1.04x the plain cache (the machine's speed varies by 2-3x from day to day)."""
    print("\n## Goals\n")
    checks = []
    for b, n, key, target, label in ((1, 512, "cache speedup", 12, "cache vs recompute"),
                                     (8, 512, "cache speedup", 30, "cache vs recompute"),
                                     (1, 512, "headwise / plain speed", 1000 / 962,
                                      "headwise vs plain cache (the 1,000 tok/s goal)")):
        row = next((r for r in rows if r["batch"] == b and r["new tokens"] == n), None)
        if row is not None and row[key] != "-":
            checks.append((f"batch {b}, {n} tokens: {label} >= {target:.3g}x", row[key],
                           row[key] >= target))
    if end_over_start is not None:
        checks.append(("per-token time, end / start of a 1024-token run <= 2", end_over_start,
                       end_over_start <= 2))
    for label, value, ok in checks:
        print(f"- {label}: {value:.3g} {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
