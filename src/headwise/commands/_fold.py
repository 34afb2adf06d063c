"""``headwise trace mha --explain``: the head split as reshape, transpose and (optionally) the fold
to ``(b*h, n, d)``, with the user's numbers and the tutorials' names; then proof, computed in the
same run, that folded and unfolded attention give the same output, and the measured cost of the
folded layout on the fused kernel.

Why headwise does not fold: softmax runs over ``j`` for each ``(b, h)`` row separately, so the
fold is exact (``h`` separate softmaxes; heads are an independent batch axis, not one big head),
but ``F.scaled_dot_product_attention`` on CPU takes its flash kernel only for 4-D inputs; the
folded 3-D layout drops it to the math kernel, which materialises the ``(b*h, i, j)`` scores.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import rearrange

from headwise.attend import sdpa_kernel_name
from headwise.heads import MERGE, SPLIT

FOLD = "b h n d -> (b h) n d"
UNFOLD = "(b h) n d -> b h n d"
ROUNDS = 5


def explain(b: int, n: int, m: int, h: int, d: int, measure_n: int, seed: int = 0) -> str:
    """The whole explanation as text (``measure_n`` = sequence length of the timed part)."""
    return "\n".join([*_steps(b, n, m, h, d), "", *_equivalence(b, n, h, d, seed), "",
                      *_cost(b, measure_n, h, d, seed)])


def _steps(b: int, n: int, m: int, h: int, d: int) -> list[str]:
    hd = h * d
    rows = [
        ("1. project", f"x ({b}, {n}, {m})", f"({b}, {n}, {hd})",
         f"b n m -> b n (h d)  one Linear({m}, {hd}) per q, k, v: all heads side by side"),
        ("2. reshape", f"({b}, {n}, {hd})", f"({b}, {n}, {h}, {d})",
         "b n (h d) -> b n h d  d2l transpose_qkv: X.reshape(b, n, h, -1)"),
        ("3. transpose", f"({b}, {n}, {h}, {d})", f"({b}, {h}, {n}, {d})",
         "b n h d -> b h n d   d2l: X.permute(0, 2, 1, 3)"),
        ("4. fold (optional)", f"({b}, {h}, {n}, {d})", f"({b * h}, {n}, {d})",
         "b h n d -> (b h) n d  d2l: X.reshape(-1, n, d); Trax AttnHeads; torch "
         "nn.MultiheadAttention's (b*h, n, d) inside"),
    ]
    lines = [f"The head split with your numbers: b={b}, n={n}, m={m}, h={h}, d={d} "
             f"(hidden size h*d={hd})"]
    for step, src, dst, note in rows:
        lines.append(f"  {step:<19} {src:<17} -> {dst:<17} {note}")
    lines += [f"  headwise does steps 2-3 in one einops line, {SPLIT!r}, and stops there.",
              f"  the merge undoes it: {MERGE!r} (d2l transpose_output, Trax AttnOutput; "
              "from the fold, (b h) n d -> b h n d first).",
              "  the output projection then maps (h d) to the output size: headwise returns to "
              "the query size m (out_dim), d2l to num_hiddens."]
    return lines


def _qkv(b: int, n: int, h: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=gen) for _ in range(3))


def _equivalence(b: int, n: int, h: int, d: int, seed: int) -> list[str]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(b, n, h, d, seed)
    fold = [rearrange(t, FOLD) for t in (q, k, v)]
    unfolded = F.scaled_dot_product_attention(q, k, v)
    folded = rearrange(F.scaled_dot_product_attention(*fold), UNFOLD, b=b)
    diff = (folded - unfolded).abs().max().item()
    with sdpa_kernel(SDPBackend.MATH):  # the same kernel on both layouts
        same = torch.equal(rearrange(F.scaled_dot_product_attention(q, k, v), FOLD),
                           F.scaled_dot_product_attention(*fold))
    big = [rearrange(t, "b h n d -> b 1 n (h d)") for t in (q, k, v)]
    one_head = rearrange(F.scaled_dot_product_attention(*big), "b 1 n (h d) -> b h n d", h=h)
    big_diff = (one_head - unfolded).abs().max().item()
    equal = torch.allclose(folded, unfolded, rtol=0, atol=1e-6)
    kernels = f"{sdpa_kernel_name(q, k, v)} on 4-D, {sdpa_kernel_name(*fold)} on 3-D"
    return [
        f"Folded == unfolded, computed now on random q, k, v of shape ({b}, {h}, {n}, {d}):",
        f"  unfolded: SDPA on (b={b}, h={h}, i={n}, d={d})",
        f"  folded:   SDPA on ((b h)={b * h}, i={n}, d={d}), then {UNFOLD!r}",
        f"  folded == unfolded: {'yes' if equal else 'NO'} (max |difference| = {diff:.1e}, "
        f"float32 rounding: {kernels})",
        f"  same kernel (math) on both layouts, bit for bit: {'yes' if same else 'no'}",
        f"  one big head of size h*d={h * d} instead: max |difference| = {big_diff:.2f} "
        "(a different function)",
        "  why: softmax runs over j for each (b, h) row on its own, so the fold keeps h separate",
        "  softmaxes; heads are an independent batch axis, not one huge head. A big head would",
        "  take one softmax of the summed dot product over all h*d features.",
    ]


def _cost(b: int, n: int, h: int, d: int, seed: int) -> list[str]:
    q, k, v = _qkv(b, n, h, d, seed)
    fold = [rearrange(t, FOLD).contiguous() for t in (q, k, v)]
    calls = {"4-D (b, h, n, d)": lambda: F.scaled_dot_product_attention(q, k, v),
             "3-D (b*h, n, d) folded": lambda: F.scaled_dot_product_attention(*fold)}
    kernels = [sdpa_kernel_name(q, k, v), sdpa_kernel_name(*fold)]
    times = _interleaved(list(calls.values()))
    _return_freed_memory()
    peaks = [max(_peak_mb(call) for _ in range(3)) for call in calls.values()]
    lines = [f"What the fold costs on the fused kernel, measured now: b={b}, h={h}, n={n}, d={d}, "
             f"fp32, median of {ROUNDS} interleaved rounds (--explain-seq sets n):",
             f"  {'layout':<24} {'kernel':<16} {'time':>10} {'ratio':>7} {'peak MB':>9}"]
    for (name, _), kernel, t, peak in zip(calls.items(), kernels, times, peaks, strict=True):
        lines.append(f"  {name:<24} {kernel:<16} {t * 1e3:>7.2f} ms {t / times[0]:>6.2f}x "
                     f"{peak:>9.1f}")
    scores_mb = b * h * n * n * 4 / 2 ** 20
    lines += [f"  the folded layout takes SDPA's math kernel, which stores the (b*h, i, j) "
              f"scores: {scores_mb:.1f} MB here,",
              "  growing as n^2; the 4-D layout keeps the flash kernel (O(n) memory). That is "
              "why headwise never folds."]
    return lines


def _interleaved(calls: list[Callable[[], torch.Tensor]]) -> list[float]:
    """Median seconds per call, the calls alternating within every round."""
    for call in calls:
        call()  # warm-up
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(ROUNDS):
        for s, call in zip(samples, calls, strict=True):
            start = time.perf_counter()
            call()
            s.append(time.perf_counter() - start)
    return [statistics.median(s) for s in samples]


def _return_freed_memory() -> None:
    """Make glibc hand every large block back to the system when freed (a fixed mmap threshold
    instead of the dynamic one), so the resident high-water mark sees each call's own peak
    rather than memory reused from earlier calls. Process-wide; harmless for a CLI run."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD = 64 KiB
    except (OSError, AttributeError):  # not glibc: peaks are then upper-bounded by reuse
        pass


def _peak_mb(call: Callable[[], torch.Tensor]) -> float:
    """Peak resident memory above the start while ``call`` runs (Linux), in MB."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark to the current RSS
        before = _status_mb("VmRSS")
        out = call()
        peak = _status_mb("VmHWM") - before
        del out
        return max(peak, 0.0)
    except OSError:
        return float("nan")


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise OSError(f"/proc/self/status has no {field}")
