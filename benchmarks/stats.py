"""Streaming head statistics at long context against the fused attention kernel (issue #28 item 3).

One table, every row timed interleaved in one process against the fused kernel's forward on the
same q, k, v (``F.scaled_dot_product_attention(q, k, v, is_causal=True)``; medians of
per-round ratios; on CUDA each call is followed by a synchronize):

  stats.head_stats / fused kernel forward   the default path (CUDA: the Triton kernel,
                                            headwise.fast.stats_triton, two key passes)
  ... with the kernel's LSE                 the fused kernel's own log-sum-exp given (CUDA,
                                            bf16/fp16: aten._scaled_dot_product_flash_attention;
                                            one key pass; the fused call itself not counted)
  ... torch path (HEADWISE_TRITON=0)        the plain torch path in device-sized blocks
and, on CUDA, kernels per call (torch.profiler) and peak memory above the inputs.

The issue's goal: <= 5x at n=16384, b=1, 16 heads, d=64, causal, bf16 on an H100 (it was 509x,
~70,000 kernels, 186 MiB peak). The CPU default is a size this 2-core CPU handles (n=2048).

    python benchmarks/stats.py --device cuda            # n=16384, bf16
    python benchmarks/stats.py                          # CPU: n=2048, float32
    python benchmarks/stats.py --device cuda --n 4096 16384 --dtype bf16 --budget 3
    python benchmarks/stats.py --device cuda --quick    # the GPU script's call (~20 s)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import headwise as hw  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
B, H, D = 1, 16, 64


def _synced(fn, device):
    if device.type != "cuda":
        return fn

    def call():
        fn()
        torch.cuda.synchronize()
    return call


def _kernels(fn) -> int | str:
    """CUDA kernels one call launches (torch.profiler), or 'n/a'."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as e:  # a profiler that cannot run here is not a benchmark failure
        return f"n/a ({type(e).__name__})"


def _peak_mib(fn, device) -> float | str:
    if device.type != "cuda":
        return "n/a"
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _without_triton(fn):
    def call():
        old = os.environ.get("HEADWISE_TRITON")
        os.environ["HEADWISE_TRITON"] = "0"
        try:
            return fn()
        finally:
            if old is None:
                del os.environ["HEADWISE_TRITON"]
            else:
                os.environ["HEADWISE_TRITON"] = old
    return call


def rows_for(n: int, dtype: torch.dtype, device: torch.device, budget: float) -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(n)
    q, k, v = (torch.randn(B, H, n, D, generator=gen, device=device, dtype=dtype)
               for _ in range(3))
    ids = torch.randint(0, 100, (B, n), generator=gen, device=device)
    fused = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    candidates = {"head_stats": lambda: hw.stats.head_stats(q, k, causal=True, token_ids=ids)}
    if device.type == "cuda" and dtype != torch.float32:
        lse = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=D ** -0.5)[1]
        candidates["head_stats, kernel's LSE"] = lambda: hw.stats.head_stats(
            q, k, causal=True, token_ids=ids, lse=lse)
    if device.type == "cuda":
        candidates["head_stats, torch path"] = _without_triton(candidates["head_stats"])
    fns = {"fused": _synced(fused, device),
           **{name: _synced(fn, device) for name, fn in candidates.items()}}
    t = C.interleave(fns, warmup=1, min_rounds=3, max_rounds=15, budget_s=budget)
    rows = []
    for name, fn in candidates.items():
        row = {"n": n, "dtype": str(dtype).removeprefix("torch."), "path": name,
               "fused ms": C.median_ms(t["fused"]), "stats ms": C.median_ms(t[name]),
               "stats.head_stats / fused kernel forward": C.ratio(t[name], t["fused"])}
        if device.type == "cuda":
            row["kernels"] = _kernels(fn)
            row["peak MiB"] = _peak_mib(fn, device)
        rows.append(row)
        print(C.table(rows[-1:], list(row)), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--n", type=int, nargs="+", help="sequence lengths (default: 16384 on "
                   "cuda, 2048 on the CPU)")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default: bf16 on cuda, fp32 on "
                   "the CPU")
    p.add_argument("--budget", type=float, help="seconds of timing per n (default 4; 1.5 "
                   "with --quick)")
    p.add_argument("--quick", action="store_true", help="shorter timing (the GPU script's "
                   "mode); the sizes stay")
    p.add_argument("--threads", type=int, help="torch threads (CPU)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = device.type == "cuda"
    seqs = args.n or ([16384] if cuda else [2048])
    dtype = DTYPES[args.dtype or ("bf16" if cuda else "fp32")]
    where = (f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}" if cuda
             else f"CPU, threads {torch.get_num_threads()}")
    print(f"torch {torch.__version__}, {where}; b={B}, heads={H}, d={D}, causal, token ids\n")
    print("## Streaming statistics vs the fused kernel's forward (same process, interleaved)\n")
    budget = args.budget or (1.5 if args.quick else 4.0)
    rows = [row for n in seqs for row in rows_for(n, dtype, device, budget)]
    print("\n" + C.table(rows, list(rows[0])) + "\n", flush=True)


if __name__ == "__main__":
    main()
