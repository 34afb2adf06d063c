"""What the kernel-alone benchmarks (``q4_kernel.py``, ``bf16_kernel.py``) share: the working
tree's step kernels and an earlier commit's, each built from its own sources into a library
called through ``ctypes`` with the same arguments, and one table of GB/s per SmolLM2 matrix
shape (in cache, streaming, the step's 120 products), old and new interleaved in one process
(rotating order; best of the rounds, and the median of the per-round ratios)."""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from _common import interleave, ratio, set_clock
from headwise.fast import build, native

ROOT = Path(__file__).resolve().parents[1]
# a SmolLM2 step's products: q|k|v and gate|up are one product each (headwise.fast.int4.share,
# headwise.fast.rows.lay_out), so a layer makes four
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate+up": (3072, 576), "down": (576, 1536)}
LAYER = ("qkv", "o", "gate+up", "down")  # one layer's products, in the step's order
HEAD = (49152, 576)  # SmolLM2's vocabulary head (its tied embedding)
STREAM_BYTES = 64 << 20  # more than the 32 MiB L3
AGAINST = "52720a5"  # session 15's kernels


def parser(doc: str, batches: list[int]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="+", default=batches)
    p.add_argument("--budget", type=float, default=2.0, help="seconds per row")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: this process's CPU time (1 thread on a shared machine)")
    p.add_argument("--against", default=AGAINST, help="the earlier commit")
    return p


def repeated(fn, args: list[tuple], repeat: int):
    """A function calling ``fn(*a)`` for every ``a`` in ``args``, ``repeat`` times over."""
    def run():
        for _ in range(repeat):
            for a in args:
                fn(*a)
    return run


def _library(sources: list[Path], path: Path, symbols: list[str]):
    failed = build.compile_library("cc", sources, native.FLAGS, path, {}, 300)
    if failed:
        raise SystemExit(f"building {path.name}: {failed}")
    return build.open_library(path, {s: native.SIGNATURES[s] for s in symbols})


def libraries(rev: str, tmp: Path, symbols: list[str]) -> dict:
    """``{"old": rev's kernels, "new": the working tree's}``."""
    folder = tmp / "old"
    folder.mkdir()
    old = []
    for p in native.SOURCES:  # (those the earlier commit has: its library was built from them)
        got = subprocess.run(["git", "-C", str(ROOT), "show",
                              f"{rev}:{p.relative_to(ROOT).as_posix()}"], capture_output=True)
        if got.returncode == 0:
            (folder / p.name).write_bytes(got.stdout)
            old.append(folder / p.name)
    return {"old": _library(old, tmp / "old.so", symbols),
            "new": _library(list(native.SOURCES), tmp / "new.so", symbols)}


def sweep(args, title: str, symbols: list[str], make: Callable, caller: Callable,
          dtype: torch.dtype, head: bool = False) -> None:
    """Print the table. ``make(out, n, gen)``: a matrix with ``nbytes``; ``caller(lib, variant,
    mats, x, y, threads, wide, repeat)``: a function calling the kernel on every matrix.
    ``head``: also a row for the vocabulary head (:data:`HEAD`, larger than the L3 on its own),
    where the kernel is also the head's (bf16: the tied embedding in bfloat16)."""
    set_clock(args.clock)
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        libs = libraries(args.against, Path(tmp), symbols)
        wide = int(native.isa() == "avx512-bf16")  # (HEADWISE_NATIVE_ISA=avx2: the AVX2 path)
        print(f"# {title}: {args.against} (old) vs the working tree (new); path "
              f"{'AVX512-BF16' if wide else 'AVX2'}, torch {torch.__version__}\n")
        print("| threads | batch | rows | old GB/s | new GB/s | new / old time |")
        print("|---|---|---|---|---|---|")
        model = [make(*SHAPES[s], gen) for _ in range(30) for s in LAYER]

        def row(label, mats, repeat, x, y, threads, b):
            fns = {k: caller(libs[k], k, mats, x, y, threads, wide, repeat) for k in libs}
            times = interleave(fns, warmup=2, min_rounds=5, max_rounds=400,
                               budget_s=args.budget)
            nbytes = sum(m.nbytes for m in mats) * repeat
            gbs = {k: nbytes / min(t) / 1e9 for k, t in times.items()}
            print(f"| {threads} | {b} | {label} | {gbs['old']:.1f} | {gbs['new']:.1f} | "
                  f"{ratio(times['new'], times['old']):.3f} |", flush=True)

        for threads in args.threads:
            for b in args.batches:
                x = {n: torch.randn(b, n, generator=gen).to(dtype) for n in (576, 1536)}
                y = {o: torch.empty(b, o, dtype=dtype) for o, _ in SHAPES.values()}
                for name, (out, n) in SHAPES.items():
                    one = make(out, n, gen)
                    row(f"{name} {out}x{n} in cache", [one], max(1, (4 << 20) // one.nbytes),
                        x, y, threads, b)
                    many = [make(out, n, gen) for _ in range(STREAM_BYTES // one.nbytes + 1)]
                    row(f"{name} {out}x{n} streaming", many, 1, x, y, threads, b)
                    del many
                row(f"model: {len(model)} products", model, 1, x, y, threads, b)
                if head:
                    out, n = HEAD
                    y[out] = torch.empty(b, out, dtype=dtype)
                    row(f"head {out}x{n}", [make(out, n, gen)], 1, x, y, threads, b)
