"""Weights from the fused kernel's log-sum-exp: their cost, selections, streaming statistics,
long context and torch.compile.

Tables (interleaved rounds in one process, medians of per-round ratios; peak memory in a fresh
process per point):
  weights    b=4, embed 512, 8 heads, fp32, module forward (no_grad), n = 256 ... 4096:
             fused (headwise, no weights; the anchor), all weights (output = weights @ v, the
             default without autograd), all weights with the output from the fused kernel
             (strict mode's choice, and autograd's), one head, 16 query rows of every head,
             torch.nn.MultiheadAttention(need_weights=True, average_attn_weights=False)
             (n <= 2048)
  floor      where the time of all weights goes at n = 1024: the attention core's pieces
             (q k^T into a resident tensor, a softmax pass, writing a fresh 128 MiB tensor with
             4 KiB and with 2 MiB pages) against the module's fused forward
  memory     peak memory above the fused path's for each selection, against the full weights
             tensor (b, h, n, n)
  stats      headwise.stats.head_stats on (b=1, h=8, n, d=64), causal, with token ids: time,
             peak memory, fitted exponents, and its time over causal SDPA on the same q, k, v
             (same process, interleaved)
  long       MultiHeadAttention forward+backward without weights, b=1, embed 512, 8 heads:
             time, peak memory, fitted exponent
  compile    TransformerLM forward (no_grad) eager vs torch.compile (inductor), same process

    python benchmarks/weights.py [--quick] [--threads N] [--clock wall|cpu]
                                 [--tables weights floor memory stats long compile]

On a shared machine, ``--threads 1 --clock cpu`` times this process's own CPU time.

``--device cuda`` (issue #28's weights rows): embed 1024, 16 heads, no mask, inference mode,
TF32 off, bf16 and fp32, (b=4, n=1024) and (b=2, n=4096): headwise without weights ("fused",
the anchor), all weights, torch.nn.MultiheadAttention(need_weights=True,
average_attn_weights=False) with the same weights (and need_weights=False), one head, the last
16 query rows of every head, a 64-key range of every row; each measurement k calls then one
synchronisation. Then CUDA kernels and host syncs per forward (torch.profiler, the sync debug
mode) and the peak device memory of each selection over the bytes it returns (bf16, n=1024);
last, head_stats over the fused causal SDPA at n=16384 (b=1, 16 heads, d=64, bf16).
``--plumbing`` runs those tables at a tiny size on any device (checks the script).

    python benchmarks/weights.py --device cuda [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import _device as G  # noqa: E402
import headwise as hw  # noqa: E402
from headwise.fast import large as _large  # noqa: E402

B, H, E = 4, 8, 512
CHILD_FLAGS: list[str] = []  # --threads/--clock of this run, passed to each fresh process


def ceilings() -> dict:
    """The fp32 matmul rate and copy bandwidth run_all.py measured (or measured here)."""
    raw = os.environ.get("HEADWISE_BENCH_CEILINGS")
    return json.loads(raw) if raw else measure_ceilings()


def measure_ceilings(n: int = 2048, mb: int = 256) -> dict:
    """fp32 ``torch.mm`` GFLOP/s at n^3 and ``copy_`` GB/s (read + write) of resident buffers."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    x, y = torch.randn(mb * 2**18), torch.empty(mb * 2**18)
    y.copy_(x)
    t = C.interleave({"mm": lambda: torch.mm(a, b), "copy": lambda: y.copy_(x)},
                     min_rounds=5, budget_s=3.0)
    return {"gflops": 2 * n**3 / min(t["mm"]) / 1e9,
            "gbps": 2 * x.numel() * 4 / min(t["copy"]) / 1e9}


def weights_rows(seqs: list[int], budget: float) -> list[dict]:
    ceil = ceilings()
    rows = []
    for n in seqs:
        cand = _candidates(n)
        with torch.no_grad():
            t = C.interleave(cand, budget_s=budget, max_rounds=15)
        flops = 4 * B * H * n * n * (E // H) + 8 * B * n * E * E
        row = {"n": n, "fused ms": C.median_ms(t["fused"]),
               "fused GFLOP/s (frac of mm)": f"{flops / C.median_ms(t['fused']) / 1e6:.0f} "
               f"({flops / C.median_ms(t['fused']) / 1e6 / ceil['gflops']:.2f})",
               "all / fused": C.ratio(t["all"], t["fused"]),
               "all, fused out / fused": C.ratio(t["all fused out"], t["fused"]),
               "head / fused": C.ratio(t["head"], t["fused"]),
               "16 rows / fused": C.ratio(t["rows16"], t["fused"])}
        # the weights tensor written once: its bytes over the time all weights add
        extra = (C.median_ms(t["all"]) - C.median_ms(t["fused"])) / 1e3
        row["weights GB/s (frac of copy)"] = (
            f"{B * H * n * n * 4 / extra / 1e9:.1f} "
            f"({B * H * n * n * 4 / extra / 1e9 / ceil['gbps']:.2f})" if extra > 0 else "-")
        row["all / torch+w"] = C.ratio(t["all"], t["torch+w"]) if "torch+w" in t else "-"
        # the floor under that ratio: the fused path without any weights, against torch with them
        row["fused / torch+w"] = C.ratio(t["fused"], t["torch+w"]) if "torch+w" in t else "-"
        rows.append(row)
        print(C.table(rows[-1:], list(row)), flush=True)
        del cand
        gc.collect()
    return rows


def _candidates(n: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(B, n, E)
    mha = hw.MultiHeadAttention(E, H, bias=False).eval()
    strict = hw.MultiHeadAttention(E, H, bias=False, strict=True).eval()  # output: fused kernel
    strict.load_state_dict(mha.state_dict())
    tm = nn.MultiheadAttention(E, H, bias=False, batch_first=True).eval()
    cand = {
        "fused": lambda: mha(x),
        "all": lambda: mha(x, return_weights=True),
        "all fused out": lambda: strict(x, return_weights=True),
        "head": lambda: mha(x, return_weights=hw.Selection(heads=0)),
        "rows16": lambda: mha(x, return_weights=hw.Selection(rows=slice(-16, None))),
    }
    if n <= 2048:
        cand["torch+w"] = lambda: tm(x, x, x, need_weights=True, average_attn_weights=False)
    return cand


def floor_rows(n: int, budget: float) -> list[dict]:
    """The pieces of all weights at size n, each against the module's fused forward."""
    torch.manual_seed(0)
    x = torch.randn(B, n, E)
    mha = hw.MultiHeadAttention(E, H, bias=False).eval()
    q, k, v = (torch.randn(B, H, n, E // H) for _ in range(3))
    s, w = torch.randn(B, H, n, n), torch.empty(B, H, n, n)
    shape = (B, H, n, n)
    cand = {
        "module fused forward (anchor)": lambda: mha(x),
        "module, all weights (weights @ v)": lambda: mha(x, return_weights=True),
        "core: fused SDPA (flash)": lambda: F.scaled_dot_product_attention(q, k, v),
        "core: softmax_rows + weights @ v": lambda: hw.weights.softmax_rows(q, k, v),
        "q k^T into a resident tensor": lambda: torch.matmul(q, k.transpose(-1, -2), out=w),
        "softmax, resident to resident": lambda: torch.ops.aten._softmax.out(s, -1, False,
                                                                              out=w),
        "weights @ v (resident weights)": lambda: torch.matmul(s, v),
        "write a fresh tensor, 4 KiB pages": lambda: torch.empty(shape).fill_(1.0),
        "write a fresh tensor, 2 MiB pages": lambda: _large._fresh(shape, torch.float32,
                                                                       w.nbytes).fill_(1.0),
        "write a recycled tensor (headwise's)": lambda: _large.empty(shape, torch.float32,
                                                                     "cpu").fill_(1.0),
        "write a resident tensor": lambda: w.fill_(1.0),
    }
    with torch.no_grad():
        t = C.interleave(cand, budget_s=budget, max_rounds=15)
    anchor = t["module fused forward (anchor)"]
    label = f"piece (n={n}, {B * H * n * n * 4 >> 20} MiB of weights)"
    return [{label: name,
             "ms": C.median_ms(ts), "/ module fused": C.ratio(ts, anchor)}
            for name, ts in t.items()]


def memory_child(what: str, n: int) -> None:
    """One point in a fresh process: peak RSS above the resting level, in MB."""
    torch.manual_seed(0)
    if what in ("fused", "all", "head", "rows16"):
        x = torch.randn(B, n, E)
        mha = hw.MultiHeadAttention(E, H, bias=False).eval()
        want = {"fused": False, "all": True, "head": hw.Selection(heads=0),
                "rows16": hw.Selection(rows=slice(-16, None))}[what]
        call = lambda: mha(x, return_weights=want)  # noqa: E731
        ctx = torch.no_grad()
    elif what == "stats":
        q, k, v = (torch.randn(1, 8, n, 64) for _ in range(3))
        ids = torch.randint(0, 100, (1, n))
        call = lambda: hw.stats.head_stats(q, k, causal=True, token_ids=ids)  # noqa: E731
        ctx = torch.no_grad()
    else:  # long: forward + backward without weights
        x = torch.randn(1, n, E, requires_grad=True)
        mha = hw.MultiHeadAttention(E, H, bias=False)

        def call():
            out, _ = mha(x, causal=True)
            out.sum().backward()
        ctx = torch.enable_grad()
    with ctx:
        call()  # warm-up: allocator pools, kernels
        _large.release()  # the next call's weights are new memory, counted in its peak
        gc.collect()
        base = C.rss_mb()
        C.reset_peak()
        t0 = C.CLOCK()
        call()
        seconds = C.CLOCK() - t0
        point = {"peak_mb": C.rss_mb("VmHWM") - base, "s": seconds}
        if what == "stats":  # against the attention itself: causal SDPA on the same q, k, v
            t = C.interleave({"stats": call, "sdpa": lambda: F.scaled_dot_product_attention(
                q, k, v, is_causal=True)}, warmup=0, min_rounds=2, max_rounds=2)
            point["stats / sdpa"] = C.ratio(t["stats"], t["sdpa"])
    print(json.dumps(point))


def child(what: str, n: int) -> dict:
    """One point of :func:`memory_child` in a fresh process, with this run's threads and clock."""
    return C.peak_in_subprocess(__file__, "--child", what, str(n), *CHILD_FLAGS)


def memory_rows(seqs: list[int]) -> list[dict]:
    rows = []
    for n in seqs:
        peak = {w: child(w, n)["peak_mb"]
                for w in ("fused", "all", "head", "rows16")}
        full = B * H * n * n * 4 / 2**20
        row = {"n": n, "full weights MB": full, "fused MB": peak["fused"],
               "all MB (above fused)": peak["all"] - peak["fused"]}
        for w, label in (("head", "one head"), ("rows16", "16 rows")):
            extra = max(peak[w] - peak["fused"], 0.5)
            row[f"{label} MB (above fused)"] = extra
            row[f"full / {label}"] = full / extra
        rows.append(row)
        print(C.table(rows[-1:], list(row)), flush=True)
    return rows


def scaling_rows(kind: str, seqs: list[int]) -> list[dict]:
    rows = []
    for n in seqs:
        rows.append(dict(n=n, **child(kind, n)))
        print(C.table(rows[-1:], list(rows[-1])), flush=True)
    logs = [(math.log(r["n"]), math.log(max(r["peak_mb"], 1e-3))) for r in rows]
    slope = _fit(logs)
    time_slope = _fit([(math.log(r["n"]), math.log(r["s"])) for r in rows])
    return [{"n": r["n"], "seconds": r["s"], "peak MB": r["peak_mb"],
             **({"stats / causal sdpa": r["stats / sdpa"]} if "stats / sdpa" in r else {})}
            for r in rows] + [{"n": "fitted exponent", "seconds": time_slope, "peak MB": slope}]


def _fit(points: list[tuple[float, float]]) -> float:
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return (sum((x - mx) * (y - my) for x, y in points)
            / sum((x - mx) ** 2 for x, _ in points))


def compile_rows(budget: float) -> list[dict]:
    from headwise.models import LMConfig, TransformerLM
    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=512, d_model=256, num_heads=4, num_layers=4,
                                d_ff=1024, max_len=256)).eval()
    tokens = torch.randint(0, 512, (8, 256))
    t0 = time.perf_counter()
    compiled = torch.compile(lm, fullgraph=True)
    with torch.no_grad():
        compiled(tokens)
        first = time.perf_counter() - t0
        t = C.interleave({"eager": lambda: lm(tokens), "compiled": lambda: compiled(tokens)},
                         budget_s=budget, max_rounds=20)
    return [{"model": "TransformerLM d256 x4 layers, b=8, n=256, forward",
             "eager ms": C.median_ms(t["eager"]), "compiled ms": C.median_ms(t["compiled"]),
             "compiled / eager": C.ratio(t["compiled"], t["eager"]),
             "compile s (first call)": first}]


GPU_H, GPU_E = 16, 1024
GPU_POINTS = [(torch.bfloat16, 4, 1024), (torch.bfloat16, 2, 4096), (torch.float32, 4, 1024),
              (torch.float32, 2, 4096)]
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def gpu_candidates(b: int, n: int, dtype, device, h: int = GPU_H, e: int = GPU_E) -> dict:
    """Each candidate returns ``(output, weights or None)``; headwise is a copy of the torch
    module (:meth:`headwise.MultiHeadAttention.from_torch`), so their weights are comparable."""
    torch.manual_seed(0)
    tm = nn.MultiheadAttention(e, h, batch_first=True).to(device, dtype).eval()
    mha = hw.MultiHeadAttention.from_torch(tm).to(device, dtype).eval()
    x = torch.randn(b, n, e, device=device, dtype=dtype)
    mid = n // 2
    return {
        "fused": lambda: mha(x),
        "all": lambda: mha(x, return_weights=True),
        "torch+w": lambda: tm(x, x, x, need_weights=True, average_attn_weights=False),
        "torch": lambda: tm(x, x, x, need_weights=False),
        "one head": lambda: mha(x, return_weights=hw.Selection(heads=0)),
        "last 16 rows": lambda: mha(x, return_weights=hw.Selection(rows=slice(-16, None))),
        "64 keys": lambda: mha(x, return_weights=hw.Selection(keys=slice(mid, mid + 64))),
    }


def gpu_time_rows(points, device, quick: bool) -> list[dict]:
    rows = []
    for dtype, b, n in points:
        cand = gpu_candidates(b, n, dtype, device)
        with torch.inference_mode():
            w_hw, w_torch = cand["all"]()[1].float(), cand["torch+w"]()[1].float()
            gap = (w_hw - w_torch).abs().max().item()
            del w_hw, w_torch
            k = G.repeats(cand["fused"], device)
            t = G.interleave(cand, device, k=k, min_rounds=5, max_rounds=12 if quick else 30,
                             budget_s=3.0 if quick else 8.0)
        f = t["fused"]
        rows.append({"dtype": DTYPE_NAMES[dtype], "b": b, "n": n,
                     "fused ms": C.median_ms(f), "torch+w ms": C.median_ms(t["torch+w"]),
                     "all / torch+w (<= 1.0)": C.ratio(t["all"], t["torch+w"]),
                     "all / fused": C.ratio(t["all"], f),
                     "one head / fused (<= 1.15)": C.ratio(t["one head"], f),
                     "last 16 rows / fused (<= 1.15)": C.ratio(t["last 16 rows"], f),
                     "64 keys / fused (<= 1.3)": C.ratio(t["64 keys"], f),
                     "fused / torch need_weights=False": C.ratio(f, t["torch"]),
                     "max |w - torch w|": f"{gap:.1e}", "rounds": len(f)})
        print(C.table(rows[-1:], list(rows[-1])), file=sys.stderr, flush=True)  # progress
        del cand
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def gpu_count_rows(b: int, n: int, device) -> list[dict]:
    """Kernels and host syncs per forward, and (on CUDA) peak memory over the returned bytes."""
    cand = gpu_candidates(b, n, torch.bfloat16, device)
    rows = []
    for name in ("fused", "all", "one head", "last 16 rows", "64 keys", "torch+w", "torch"):
        with torch.inference_mode():
            row = {"forward (bf16)": name, "b": b, "n": n, **G.counts(cand[name], device)}
            if device.type == "cuda":
                peak, out = G.peak_extra(cand[name], device)
                weights = out[1]
                row["peak MiB"] = peak / 2**20
                row["peak / returned weights (all: <= 1.2)"] = (
                    peak / weights.nbytes if weights is not None else "-")
                del out, weights
        rows.append(row)
    return rows


def gpu_stats_rows(n: int, device, h: int = 16, d: int = 64) -> list[dict]:
    """``headwise.stats.head_stats`` (b=1, causal, bf16, token ids) over the fused causal SDPA
    forward on the same q, k, v (issue #28's statistics row; part C's own benchmark may add
    more)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, h, n, d, device=device, dtype=torch.bfloat16) for _ in range(3))
    ids = torch.randint(0, 1000, (1, n), device=device)
    cand = {"stats": lambda: hw.stats.head_stats(q, k, causal=True, token_ids=ids),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    with torch.inference_mode():
        k_rep = G.repeats(cand["sdpa"], device)
        t = G.interleave({"sdpa": lambda: [cand["sdpa"]() for _ in range(k_rep)],
                          "stats": cand["stats"]}, device, warmup=1, min_rounds=3,
                         max_rounds=5, budget_s=5.0)
        row = {"n": n, "heads": h, "d": d, "sdpa ms": C.median_ms(t["sdpa"]) / k_rep,
               "stats ms": C.median_ms(t["stats"]),
               "stats / fused (<= 5)": C.ratio(t["stats"], t["sdpa"]) * k_rep}
        if device.type == "cuda":
            row["stats peak MiB"] = G.peak_extra(cand["stats"], device)[0] / 2**20
            if row["stats ms"] < 200:  # (a profile of tens of thousands of kernels takes long)
                row.update({f"stats {key}": v for key, v in
                            G.counts(cand["stats"], device).items() if key in ("kernels", "syncs")})
    return [row]


def gpu_main(args, device) -> None:
    """The weights rows of issue #28 (see the module docstring)."""
    G.setup(device)
    global GPU_H, GPU_E
    points = GPU_POINTS
    if args.plumbing:
        GPU_H, GPU_E = 2, 32
        points = [(torch.bfloat16, 2, 64), (torch.float32, 1, 128)]
    print(f"# {G.describe(device)}; embed={GPU_E}, heads={GPU_H}, no mask, inference mode\n",
          flush=True)
    rows = gpu_time_rows(points, device, args.quick)
    print("\n## Weights vs torch need_weights and vs the fused path (medians of per-round "
          "ratios; goals in the headers)\n")
    print(C.table(rows, list(rows[0])), flush=True)
    b, n = points[0][1:]
    counts = gpu_count_rows(b, n, device)
    print(f"\n## CUDA kernels, host syncs and peak memory per forward (bf16, b={b}, n={n}; "
          f"goal: 0 syncs)\n")
    print(C.table(counts, list(counts[0])), flush=True)
    n = 256 if args.plumbing else 16384
    stats = gpu_stats_rows(n, device, *((2, 16) if args.plumbing else ()))
    print(f"\n## Streaming head statistics vs the fused causal kernel (b=1, bf16, n={n})\n")
    print(C.table(stats, list(stats[0])), flush=True)
    print()
    for column, limit in (("all / torch+w (<= 1.0)", 1.0), ("one head / fused (<= 1.15)", 1.15),
                          ("last 16 rows / fused (<= 1.15)", 1.15),
                          ("64 keys / fused (<= 1.3)", 1.3)):
        print(G.goal(column.split(" (")[0] + " (" + ", ".join(
            f"{r['dtype']} n={r['n']}" for r in rows) + ")", [r[column] for r in rows], limit))
    by = {r["forward (bf16)"]: r for r in counts}
    print(G.goal("host syncs per forward: fused / all / one head",
                 [by[k].get("syncs", "-") for k in ("fused", "all", "one head")], 0))
    print(G.goal("peak / returned weights, all",
                 [by["all"].get("peak / returned weights (all: <= 1.2)", "-")], 1.2))
    print(G.goal("head_stats / fused", [stats[0]["stats / fused (<= 5)"]], 5))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer sizes, shorter budgets")
    p.add_argument("--tables", nargs="+", default=["weights", "floor", "memory", "stats",
                                                    "long", "compile"])
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=sorted(C.CLOCKS), default="wall")
    p.add_argument("--seqs", type=int, nargs="+", help="n for the weights table")
    p.add_argument("--child", nargs=2, metavar=("WHAT", "N"), help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help="cpu (the CPU tables) or cuda (issue #28's)")
    p.add_argument("--plumbing", action="store_true",
                   help="the --device tables at a tiny size, on any device (checks the script)")
    args = p.parse_args()
    if args.device != "cpu" or args.plumbing:
        return gpu_main(args, torch.device(args.device))
    if args.threads:
        torch.set_num_threads(args.threads)
        CHILD_FLAGS.extend(["--threads", str(args.threads)])
    C.set_clock(args.clock)
    CHILD_FLAGS.extend(["--clock", args.clock])
    if args.child:
        return memory_child(args.child[0], int(args.child[1]))
    q = args.quick
    # the strict candidate asks for all weights above the default budget at n >= 2048
    os.environ.setdefault("HEADWISE_WEIGHTS_BUDGET_MB", str(1 << 20))
    seqs = args.seqs or ([256, 1024] if q else [256, 512, 1024, 2048, 4096])
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, clock {args.clock}; "
          f"b={B}, embed={E}, heads={H}, fp32\n")
    sections = {
        "weights": ("Weights from the LSE vs the fused path without weights (module forward)",
                    lambda: weights_rows(seqs, 3.0 if q else 8.0)),
        "floor": ("Where the time of all weights goes (same process; < 1 is cheaper)",
                  lambda: floor_rows(1024, 4.0 if q else 10.0)),
        "memory": ("Peak memory above the fused path, against the full weights tensor",
                   lambda: memory_rows([1024] if q else [1024, 4096])),
        "stats": ("Streaming statistics, b=1, h=8, d=64, causal (fresh process per n)",
                  lambda: scaling_rows("stats", [2048, 4096, 8192] if q
                                       else [4096, 8192, 16384])),
        "long": ("Long context forward+backward without weights, b=1, embed 512, 8 heads",
                 lambda: scaling_rows("long", [2048, 4096, 8192] if q
                                      else [4096, 8192, 16384])),
        "compile": ("torch.compile (inductor, fullgraph=True) vs eager, same process",
                    lambda: compile_rows(3.0 if q else 10.0)),
    }
    for name in args.tables:
        title, run = sections[name]
        print(f"## {title}\n", flush=True)
        rows = run()
        print("\n" + C.table(rows, list(rows[0])) + "\n", flush=True)


if __name__ == "__main__":
    main()
