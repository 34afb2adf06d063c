"""The bfloat16 product kernel alone (``headwise_rows_matmul_bf16``, ``step_kernels_bf16.c``):
bytes of W read per second, per SmolLM2 matrix shape, against the kernel of an earlier commit
built from its own sources, interleaved in one process (rotating order; best of the rounds, and
the median of the per-round ratios).

Shapes: SmolLM2-135M's products (q and o 576x576, k and v 192x576, gate and up 1536x576, down
576x1536), random bfloat16 weights (the time does not depend on their values):

  in cache   one matrix called again and again (L2): the kernel's arithmetic
  streaming  as many distinct matrices of the shape as make 64 MiB (more than the 32 MiB L3),
             each called once per pass: what a decoding step sees
  model      the 210 products of SmolLM2's 30 layers in the step's order (127 MiB)

Both kernels are called through ``ctypes`` with the same arguments.

    python benchmarks/bf16_kernel.py [--threads 1 2] [--batches 1 2 4] [--budget 2]
        [--against REV] [--clock wall|cpu]

About 4 minutes with the defaults.
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

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"q/o": (576, 576), "k/v": (192, 576), "gate/up": (1536, 576), "down": (576, 1536)}
LAYER = ("q/o", "k/v", "k/v", "q/o", "gate/up", "gate/up", "down")  # one layer's products
STREAM_BYTES = 64 << 20
KERNEL = "headwise_rows_matmul_bf16"


def library(sources: list[Path], tmp: Path, name: str):
    path = tmp / f"{name}.so"
    failed = build.compile_library("cc", sources, native.FLAGS, path, {}, 300)
    if failed:
        raise SystemExit(f"building {name}: {failed}")
    return build.open_library(path, {KERNEL: native.SIGNATURES[KERNEL]})


def old_library(rev: str, tmp: Path):
    folder = tmp / "old"
    folder.mkdir()
    for p in native.SOURCES:
        text = subprocess.run(["git", "-C", str(ROOT), "show",
                               f"{rev}:{p.relative_to(ROOT).as_posix()}"], check=True,
                              capture_output=True).stdout
        (folder / p.name).write_bytes(text)
    return library([folder / p.name for p in native.SOURCES], tmp, "old")


def caller(lib, mats, x: dict, y: dict, threads: int, wide: int, repeat: int = 1):
    fn = getattr(lib, KERNEL)
    args = [(x[n].data_ptr(), n, w.data_ptr(), n, y[out].data_ptr(), out, None, 0, None,
             x[n].shape[0], out, n, threads, wide) for w in mats for out, n in [w.shape]]

    def run():
        for _ in range(repeat):
            for a in args:
                fn(*a)
    return run


def row(label, libs, mats, repeat, x, y, threads, b, wide, budget) -> None:
    fns = {k: caller(libs[k], mats, x, y, threads, wide, repeat) for k in ("old", "new")}
    times = interleave(fns, warmup=2, min_rounds=5, max_rounds=400, budget_s=budget)
    nbytes = sum(w.numel() * 2 for w in mats) * repeat
    gbs = {k: nbytes / min(t) / 1e9 for k, t in times.items()}
    print(f"| {threads} | {b} | {label} | {gbs['old']:.1f} | {gbs['new']:.1f} | "
          f"{ratio(times['new'], times['old']):.3f} |", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--budget", type=float, default=2.0, help="seconds per row")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: this process's CPU time (1 thread on a shared machine)")
    p.add_argument("--against", default="52720a5", help="the earlier commit (session 15's)")
    args = p.parse_args(argv)
    set_clock(args.clock)
    gen = torch.Generator().manual_seed(0)

    def matrix(out, n):
        return torch.randn(out, n, generator=gen).to(torch.bfloat16)

    with tempfile.TemporaryDirectory() as tmp:
        libs = {"old": old_library(args.against, Path(tmp)),
                "new": library(list(native.SOURCES), Path(tmp), "new")}
        wide = int(native.isa() == "avx512-bf16")  # (HEADWISE_NATIVE_ISA=avx2: the AVX2 path)
        print(f"# bf16 kernel: {args.against} (old) vs the working tree (new); path "
              f"{'AVX512-BF16' if wide else 'AVX2'}, torch {torch.__version__}\n")
        print("| threads | batch | rows | old GB/s | new GB/s | new / old time |")
        print("|---|---|---|---|---|---|")
        model = [matrix(*SHAPES[s]) for _ in range(30) for s in LAYER]
        for threads in args.threads:
            for b in args.batches:
                x = {n: torch.randn(b, n, generator=gen).to(torch.bfloat16) for n in (576, 1536)}
                y = {o: torch.empty(b, o, dtype=torch.bfloat16) for o in (192, 576, 1536)}
                for name, (out, n) in SHAPES.items():
                    one = matrix(out, n)
                    reps = max(1, (4 << 20) // (one.numel() * 2))
                    row(f"{name} {out}x{n} in cache", libs, [one], reps, x, y, threads, b,
                        wide, args.budget)
                    many = [matrix(out, n) for _ in range(STREAM_BYTES // (out * n * 2) + 1)]
                    row(f"{name} {out}x{n} streaming", libs, many, 1, x, y, threads, b, wide,
                        args.budget)
                    del many
                row("model: 210 products", libs, model, 1, x, y, threads, b, wide, args.budget)


if __name__ == "__main__":
    main()
