"""headwise.MultiHeadAttention vs hand-written projections + SDPA and torch's MHA.

b=4, embed 512, 8 heads, fp32, n = 128 ... 4096; forward (no_grad) and forward+backward.
Candidates, interleaved in one process (medians of per-round ratios):
  raw          F.linear (fused QKV weight) + F.scaled_dot_product_attention + F.linear  (anchor)
  headwise     headwise.MultiHeadAttention, default backend
  torch        torch.nn.MultiheadAttention(need_weights=False)
  torch+w      torch.nn.MultiheadAttention(need_weights=True) (n <= 2048)
  hw pad       headwise with a key-padding mask (valid_lens)        vs headwise unmasked
  hw causal+pad headwise with causal=True and valid_lens             vs headwise unmasked
  hw no NaN check  headwise with the NaN policy switched off (what the check costs)
Peak memory (fresh process per point, n = 1024 and 4096) for raw, headwise and the masks.
Mask costs of the attention core alone (headwise.attention on (b, h, n, d), no projections),
the like-for-like comparison with the SDPA anchors (is_causal + a (b, 1, 1, j) padding mask):
projections are not causal, so at module level they dilute the causal saving.

    python benchmarks/attention.py [--seqs 128 256 ...] [--modes fwd fwdbwd] [--no-memory]
                                   [--core-seqs 1024 2048 4096] [--core-only]
                                   [--threads N] [--clock wall|cpu]

``--device cuda`` (issue #28's fused rows): b=4, embed 1024, 16 heads, causal, bf16 at
n = 1024 and 4096 and fp32 at n = 1024 (and 4096 without ``--quick``), forward (no_grad) and
forward+backward: headwise.MultiHeadAttention vs "raw" = F.linear x4 + causal SDPA on the same
weights (the anchor), TF32 off, each measurement k calls then one synchronisation; then CUDA
kernels and host syncs per call (torch.profiler, the sync debug mode) at n = 1024 bf16.
``--plumbing`` runs those tables at a tiny size on any device (checks the script).

    python benchmarks/attention.py --device cuda [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import _device as G  # noqa: E402
import headwise as hw  # noqa: E402
from headwise.attend import fused as _sdpa  # noqa: E402

B, H, E = 4, 8, 512


def valid_lens(n: int) -> torch.Tensor:
    """Batch element x has x * n / 8 padded keys at the end (as the anchors do)."""
    return torch.tensor([n - x * n // 8 for x in range(B)])


def build(name: str, n: int, mode: str, seed: int = 0):
    """Return ``step()`` running one forward (fwd) or forward+backward (fwdbwd)."""
    torch.manual_seed(seed)
    grad = mode == "fwdbwd"
    x = torch.randn(B, n, E, requires_grad=grad)
    gout = torch.randn(B, n, E)
    lens = valid_lens(n)
    if name == "raw":
        wqkv = nn.Parameter(torch.randn(3 * E, E) / E**0.5)
        wo = nn.Parameter(torch.randn(E, E) / E**0.5)

        def call():
            qkv = F.linear(x, wqkv).view(B, n, 3, H, -1).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
            return F.linear(o.transpose(1, 2).reshape(B, n, E), wo)
        params = [wqkv, wo]
    elif name.startswith("torch"):
        m = nn.MultiheadAttention(E, H, bias=False, batch_first=True)
        if not grad:
            m.eval()
        need = name == "torch+w"

        def call():
            return m(x, x, x, need_weights=need, average_attn_weights=False)[0]
        params = list(m.parameters())
    else:
        m = hw.MultiHeadAttention(E, H, bias=False)
        kwargs = {"hw pad": dict(valid_lens=lens),
                  "hw causal+pad": dict(valid_lens=lens, causal=True),
                  "hw causal": dict(causal=True)}.get(name, {})

        def call():
            return m(x, **kwargs)[0]
        if name == "hw no NaN check":  # what the NaN policy costs: the same call without it
            def call():
                with _no_nan_policy():
                    return m(x)[0]
        params = list(m.parameters())
    return _timed_step(call, [*params, x], gout, grad)


def _timed_step(call, leaves, gout, grad: bool):
    """``step()``: ``call()`` under no_grad, or forward and backward (``leaves``' gradients
    cleared first, so none accumulates)."""
    if grad:
        def step():
            for p in leaves:
                p.grad = None
            call().backward(gout)
    else:
        def step():
            with torch.no_grad():
                call()
    return step


@contextmanager
def _no_nan_policy():
    """The sdpa backend without its NaN policy (benchmark only: it measures the check)."""
    saved = _sdpa.checked
    _sdpa.checked = lambda q, k, v, *rest: (k, v, None, None)
    try:
        yield
    finally:
        _sdpa.checked = saved


def time_point(n: int, mode: str) -> dict:
    names = ["raw", "headwise", "hw no NaN check", "torch", "hw pad", "hw causal+pad"]
    if n <= 2048:
        names.append("torch+w")
    steps = {name: build(name, n, mode) for name in names}
    budget = 6.0 if n <= 1024 else 14.0
    times = C.interleave(steps, min_rounds=3 if n < 4096 else 2, budget_s=budget)
    row = {"n": n, "mode": mode, "raw ms": C.median_ms(times["raw"])}
    row["headwise/raw"] = C.ratio(times["headwise"], times["raw"])
    row["NaN check: hw/hw without"] = C.ratio(times["headwise"], times["hw no NaN check"])
    row["torch/raw"] = C.ratio(times["torch"], times["raw"])
    row["headwise/torch"] = C.ratio(times["headwise"], times["torch"])
    row["torch+w/raw"] = C.ratio(times["torch+w"], times["raw"]) if "torch+w" in times else "-"
    row["pad/unmasked"] = C.ratio(times["hw pad"], times["headwise"])
    row["causal+pad/unmasked"] = C.ratio(times["hw causal+pad"], times["headwise"])
    return row


def core_point(n: int, mode: str) -> dict:
    """Masked vs unmasked cost of the core: headwise.attention vs raw F.scaled_dot_product_attention."""
    grad = mode == "fwdbwd"
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, n, E // H, requires_grad=grad) for _ in range(3))
    gout = torch.randn(B, H, n, E // H)
    pad = hw.masks.from_valid_lens(valid_lens(n), n)
    calls = {
        "raw sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "raw is_causal+pad": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=pad,
                                                                    is_causal=True),
        "hw": lambda: hw.attention(q, k, v)[0],
        "hw pad": lambda: hw.attention(q, k, v, mask=pad)[0],
        "hw causal+pad": lambda: hw.attention(q, k, v, mask=pad, causal=True)[0],
    }

    def stepper(call):
        if not grad:
            def step():
                with torch.no_grad():
                    call()
            return step

        def step():
            for t in (q, k, v):
                t.grad = None
            call().backward(gout)
        return step

    times = C.interleave({name: stepper(c) for name, c in calls.items()},
                         min_rounds=3, budget_s=6.0 if n <= 1024 else 14.0)
    # flash attention's matmul flops: forward q k^T and p v; backward recomputes s and adds
    # dv, dp, dq, dk (5 matmuls)
    flops = (4 if not grad else 14) * B * H * n * n * (E // H)
    rate = flops / C.median_ms(times["raw sdpa"]) / 1e6
    return {"n": n, "mode": mode, "raw sdpa ms": C.median_ms(times["raw sdpa"]),
            "sdpa GFLOP/s (frac of mm)": f"{rate:.0f} ({rate / _ceilings()['gflops']:.2f})",
            "hw/raw": C.ratio(times["hw"], times["raw sdpa"]),
            "hw pad/hw": C.ratio(times["hw pad"], times["hw"]),
            "hw causal+pad/hw": C.ratio(times["hw causal+pad"], times["hw"]),
            "raw is_causal+pad/raw": C.ratio(times["raw is_causal+pad"], times["raw sdpa"])}


def _ceilings() -> dict:
    """The fp32 matmul rate run_all.py measured (or measured here once)."""
    global _CEIL
    if _CEIL is None:
        from weights import ceilings
        _CEIL = ceilings()
    return _CEIL


_CEIL = None


def memory_child(name: str, n: int, mode: str) -> None:
    step = build(name, n, mode)
    step()
    base = C.rss_mb()
    C.reset_peak()
    step()
    print(json.dumps({"peak_mb": C.rss_mb("VmHWM") - base}))


GPU_B, GPU_H, GPU_E = 4, 16, 1024


def gpu_step(name: str, n: int, mode: str, dtype, device, shape=(GPU_B, GPU_H, GPU_E)):
    """``step()``: one causal forward (no_grad) or forward+backward of headwise ("headwise")
    or of F.linear x4 + SDPA on the same weights ("raw"); ``step.out()`` its output."""
    b, h, e = shape
    torch.manual_seed(0)
    grad = mode == "fwdbwd"
    m = hw.MultiHeadAttention(e, h).to(device, dtype)
    x = torch.randn(b, n, e, device=device, dtype=dtype, requires_grad=grad)
    gout = torch.randn(b, n, e, device=device, dtype=dtype)

    def split(t):
        return t.view(b, n, h, e // h).transpose(1, 2)

    def raw():
        q, k, v = (split(F.linear(x, p.weight, p.bias)) for p in (m.q_proj, m.k_proj, m.v_proj))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, n, e), m.out_proj.weight, m.out_proj.bias)

    call = raw if name == "raw" else (lambda: m(x, causal=True)[0])
    step = _timed_step(call, [*m.parameters(), x], gout, grad)
    step.out = call
    return step


def gpu_main(args, device) -> None:
    """The fused rows of issue #28 (see the module docstring)."""
    G.setup(device)
    shape = (2, 2, 32) if args.plumbing else (GPU_B, GPU_H, GPU_E)
    seqs = [64, 128] if args.plumbing else [1024, 4096]
    print(f"# {G.describe(device)}; b={shape[0]}, embed={shape[2]}, heads={shape[1]}, causal; "
          f"raw = F.linear x4 + F.scaled_dot_product_attention(is_causal=True), same weights\n",
          flush=True)
    points = [(torch.bfloat16, n, mode) for n in seqs for mode in ("fwd", "fwdbwd")]
    points += [(torch.float32, n, mode) for n in (seqs[:1] if args.quick else seqs)
               for mode in ("fwd", "fwdbwd")]
    rows = []
    for dtype, n, mode in points:
        steps = {name: gpu_step(name, n, mode, dtype, device, shape)
                 for name in ("raw", "headwise")}
        with torch.no_grad():
            a, r = steps["headwise"].out().float(), steps["raw"].out().float()
            gap = ((a - r).abs().max() / r.abs().max()).item()
        k = G.repeats(steps["raw"], device)
        t = G.interleave(steps, device, k=k, min_rounds=5, max_rounds=15 if args.quick else 40,
                         budget_s=2.0 if args.quick else 6.0)
        rows.append({"dtype": {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype], "n": n, "mode": mode,
                     "raw ms": C.median_ms(t["raw"]), "headwise ms": C.median_ms(t["headwise"]),
                     "headwise / raw": C.ratio(t["headwise"], t["raw"]),
                     "goal": "<= 1.05", "max rel diff": f"{gap:.1e}", "rounds": len(t["raw"])})
        print(C.table(rows[-1:], list(rows[-1])), file=sys.stderr, flush=True)  # progress
        del steps
    print("\n## Fused MHA vs hand-written F.linear + SDPA (medians of per-round ratios)\n")
    print(C.table(rows, list(rows[0])), flush=True)
    n = seqs[0]
    count_rows = []
    for name, mode in (("headwise", "fwd"), ("raw", "fwd"), ("headwise", "fwdbwd"),
                       ("raw", "fwdbwd")):
        got = G.counts(gpu_step(name, n, mode, torch.bfloat16, device, shape), device)
        count_rows.append({"call": f"{name} {mode}", "n": n, **got})
    print(f"\n## CUDA kernels and host syncs per call (bf16, n={n}; goal: headwise forward "
          f"<= 12 kernels, 0 syncs)\n")
    print(C.table(count_rows, list(count_rows[0])) if count_rows[0].keys() - {"call", "n"}
          else "(no CUDA device: not counted)")
    print()
    for dtype in ("bf16", "fp32"):
        for mode in ("fwd", "fwdbwd"):
            mine = [r for r in rows if r["dtype"] == dtype and r["mode"] == mode]
            print(G.goal(f"headwise / raw, {dtype} {mode} (n = "
                         f"{', '.join(str(r['n']) for r in mine)})",
                         [r["headwise / raw"] for r in mine], 1.05))
    fwd = count_rows[0]
    print(G.goal("kernels per headwise forward", [fwd.get("kernels", "-")], 12))
    print(G.goal("host syncs per headwise forward", [fwd.get("syncs", "-")], 0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--mem-seqs", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--core-seqs", type=int, nargs="+", default=[1024, 2048, 4096])
    p.add_argument("--core-only", action="store_true")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=sorted(C.CLOCKS), default="wall",
                   help="cpu: this process's CPU time (for 1 thread on a shared machine)")
    p.add_argument("--child", nargs=3, metavar=("NAME", "N", "MODE"), help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help="cpu (the CPU tables) or cuda (issue #28's)")
    p.add_argument("--quick", action="store_true", help="--device cuda: fp32 at n=1024 only")
    p.add_argument("--plumbing", action="store_true",
                   help="the --device tables at a tiny size, on any device (checks the script)")
    args = p.parse_args()
    if args.child:
        return memory_child(args.child[0], int(args.child[1]), args.child[2])
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type != "cpu" or args.plumbing:
        return gpu_main(args, device)
    C.set_clock(args.clock)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, b={B}, embed={E}, "
          f"heads={H}, fp32\n")
    core_rows = [core_point(n, mode) for mode in args.modes for n in args.core_seqs]
    print("## Mask cost in the attention core (b, h, n, d); anchor: raw SDPA in the same run\n")
    print(C.table(core_rows, list(core_rows[0])) + "\n", flush=True)
    if args.core_only:
        return
    rows = []
    for mode in args.modes:
        for n in args.seqs:
            rows.append(time_point(n, mode))
            print(C.table(rows[-1:], list(rows[-1])), flush=True)
    print("\n## Time (medians of per-round ratios; < 1 is faster)\n")
    print(C.table(rows, list(rows[0])))
    if args.no_memory:
        return
    mem_rows = []
    for mode in args.modes:
        for n in args.mem_seqs:
            peaks = {name: C.peak_in_subprocess(__file__, "--child", name, str(n), mode)["peak_mb"]
                     for name in ("raw", "headwise", "hw pad", "hw causal+pad", "torch")}
            mem_rows.append({"n": n, "mode": mode, "raw MB": peaks["raw"],
                             **{f"{k}/raw": peaks[k] / peaks["raw"]
                                for k in ("headwise", "hw pad", "hw causal+pad", "torch")}})
    print("\n## Peak memory above the resting RSS (fresh process per point)\n")
    print(C.table(mem_rows, list(mem_rows[0])))


if __name__ == "__main__":
    main()
