"""The 4-bit kernel alone (``headwise_q4_matmul``, ``step_kernels_q4.c``): bytes of codes, scales
and minima read per second, per matrix shape, against the kernel of an earlier commit built from
its own sources, interleaved in one process (rotating order; best of the rounds, and the median
of the per-round ratios).

Shapes: SmolLM2-135M's seven products per layer (q and o 576x576, k and v 192x576, gate and up
1536x576, down 576x1536), random codes, scales and minima (the kernel's time does not depend
on their values):

  in cache   one matrix called again and again (L2): the kernel's arithmetic
  streaming  as many distinct matrices of the shape as make 64 MiB (more than the 32 MiB L3),
             each called once per pass: what a decoding step sees
  model      the 210 products of SmolLM2's 30 layers in the step's order (63 MiB), once per pass

The earlier kernel (``--against``, default 52720a5: session 15's kernel, which reads the codes in
llama.cpp's nibble order, low nibbles weights 0-15, high 16-31) gets its codes in that order;
the working tree's kernel gets :class:`headwise.fast.int4.Int4`'s. Both are called through
``ctypes`` with the same arguments, so the call's own cost is the same for both.

    python benchmarks/q4_kernel.py [--threads 1 2] [--batches 1 4] [--budget 2] [--against REV]
        [--clock wall|cpu]

About 5 minutes with the defaults (2 thread counts x 2 batches x 9 rows, 2 s each, plus making
64 MiB sets of random matrices).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleave, ratio, set_clock  # noqa: E402
from headwise.fast import build, native  # noqa: E402
from headwise.fast.int4 import GROUP, Int4  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"q/o": (576, 576), "k/v": (192, 576), "gate/up": (1536, 576), "down": (576, 1536)}
LAYER = ("q/o", "k/v", "k/v", "q/o", "gate/up", "gate/up", "down")  # one layer's products
STREAM_BYTES = 64 << 20


def old_codes(q: torch.Tensor) -> torch.Tensor:
    """``q (out, in)`` in llama.cpp's order: per group, byte i = weight i | weight 16 + i << 4."""
    out, n = q.shape
    g = q.to(torch.uint8).view(out, n // GROUP, 2, GROUP // 2)
    return (g[:, :, 0] | g[:, :, 1] << 4).reshape(out, n // 2).contiguous()


def library(sources: list[Path], tmp: Path, name: str):
    path = tmp / f"{name}.so"
    failed = build.compile_library("cc", sources, native.FLAGS, path, {}, 300)
    if failed:
        raise SystemExit(f"building {name}: {failed}")
    return build.open_library(path, {"headwise_q4_matmul": native.SIGNATURES["headwise_q4_matmul"],
                                     "headwise_features": ":i"})


def old_library(rev: str, tmp: Path):
    folder = tmp / "old"
    folder.mkdir()
    for p in native.SOURCES:
        rel = p.relative_to(ROOT).as_posix()
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], check=True,
                              capture_output=True).stdout
        (folder / p.name).write_bytes(text)
    return library([folder / p.name for p in native.SOURCES], tmp, "old")


class Matrix:
    """One random 4-bit matrix in both layouts."""

    def __init__(self, out: int, n: int, gen: torch.Generator):
        q = torch.randint(0, 16, (out, n), generator=gen)
        w = Int4(q, torch.rand(out, n // GROUP, generator=gen) * 0.01,
                 -torch.rand(out, n // GROUP, generator=gen) * 0.1)
        self.out, self.n, self.scales, self.mins = out, n, w.scales, w.mins
        self.codes = {"old": old_codes(q), "new": w.codes}
        self.nbytes = w.nbytes()


def caller(lib, mats: list[Matrix], layout: str, x: dict, y: dict, threads: int, wide: int,
           repeat: int = 1):
    fn = lib.headwise_q4_matmul
    args = [(x[m.n].data_ptr(), m.n, m.codes[layout].data_ptr(), m.scales.data_ptr(),
             m.mins.data_ptr(), y[m.out].data_ptr(), m.out, None, 0, None, x[m.n].shape[0],
             m.out, m.n, threads, wide) for m in mats]

    def run():
        for _ in range(repeat):
            for a in args:
                fn(*a)
    return run


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--budget", type=float, default=2.0, help="seconds per row")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: this process's CPU time (1 thread on a shared machine)")
    p.add_argument("--against", default="52720a5", help="the earlier commit (llama.cpp order)")
    args = p.parse_args(argv)
    set_clock(args.clock)
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"old": old_library(args.against, Path(tmp)),
                "new": library(list(native.SOURCES), Path(tmp), "new")}
        wide = int(native.isa() == "avx512-bf16")  # (HEADWISE_NATIVE_ISA=avx2: the AVX2 path)
        print(f"# q4 kernel: {args.against} (old) vs the working tree (new); path "
              f"{'AVX512-BF16' if wide else 'AVX2'} torch {torch.__version__}\n")
        print("| threads | batch | rows | old GB/s | new GB/s | new / old time |")
        print("|---|---|---|---|---|---|")
        model = [Matrix(*SHAPES[s], gen) for _ in range(30) for s in LAYER]
        for threads in args.threads:
            for b in args.batches:
                x = {n: torch.randn(b, n, generator=gen) for n in (576, 1536)}
                y = {o: torch.empty(b, o) for o in (192, 576, 1536)}
                for name, (out, n) in SHAPES.items():
                    one = Matrix(out, n, gen)
                    reps = max(1, (4 << 20) // one.nbytes)
                    row(f"{name} {out}x{n} in cache", libs, [one], reps, x, y, threads, b,
                        wide, args.budget)
                    many = [Matrix(out, n, gen) for _ in range(STREAM_BYTES // one.nbytes + 1)]
                    row(f"{name} {out}x{n} streaming", libs, many, 1, x, y, threads, b, wide,
                        args.budget)
                    del many
                row("model: 210 products", libs, model, 1, x, y, threads, b, wide, args.budget)


def row(label, libs, mats, repeat, x, y, threads, b, wide, budget) -> None:
    fns = {k: caller(libs[k], mats, k, x, y, threads, wide, repeat) for k in ("old", "new")}
    times = interleave(fns, warmup=2, min_rounds=5, max_rounds=400, budget_s=budget)
    nbytes = sum(m.nbytes for m in mats) * repeat
    gbs = {k: nbytes / min(t) / 1e9 for k, t in times.items()}
    print(f"| {threads} | {b} | {label} | {gbs['old']:.1f} | {gbs['new']:.1f} | "
          f"{ratio(times['new'], times['old']):.3f} |", flush=True)


if __name__ == "__main__":
    main()
