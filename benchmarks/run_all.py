"""Run every benchmark and write benchmarks/RESULTS.md.

Each benchmark script prints its own tables of ratios against anchors measured interleaved in
its process; this runner measures the machine's fp32 matmul rate and copy bandwidth first (in
the same run, handed to the scripts that report fractions of them through the environment
variable HEADWISE_BENCH_CEILINGS), runs each script, and writes one section per benchmark with
the exact command, the machine line and the load average (the box may be shared: read ratios,
not milliseconds).

    python benchmarks/run_all.py [--quick] [--only attention weights ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from weights import measure_ceilings  # noqa: E402

# name -> (full arguments, --quick arguments)
BENCHMARKS = {
    "attention": ([], ["--seqs", "512", "1024", "--mem-seqs", "1024", "--core-seqs", "1024"]),
    "weights": ([], ["--quick"]),
    "generate": ([], ["--new", "64", "--batches", "1", "--budget", "1.5"]),
    "train": ([], ["--budget", "20"]),
    "bert": ([], ["--batch", "8", "--budget", "8", "--random-weights"]),
    "head_view": ([], ["--rounds", "1"]),
    "cli_startup": ([], ["--rounds", "3"]),
    "llama_decode": ([], ["--threads", "2", "--batches", "1", "--new", "16", "--layers", "4",
                          "--budget", "5"]),
    "prune": ([], ["--quick"]),
    "importance": ([], ["--quick", "--models", "reverse,minilm"]),
}


def run(name: str, args: list[str], env: dict) -> tuple[str, float, int]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *args], capture_output=True,
                          text=True, env=env, timeout=3600)
    text = proc.stdout.strip()
    if proc.returncode:
        text += "\n\n(exit " + str(proc.returncode) + ")\n```\n" + proc.stderr[-3000:] + "\n```"
    return text, time.perf_counter() - start, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and shorter budgets")
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), default=list(BENCHMARKS))
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = ap.parse_args()
    ceil = measure_ceilings()
    env = dict(os.environ, HEADWISE_BENCH_CEILINGS=json.dumps(ceil))
    load = os.getloadavg()
    lines = ["# Benchmark results", "",
             f"`python benchmarks/run_all.py{' --quick' if args.quick else ''}`, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} CPUs; load average at the start {load[0]:.1f} "
             "(a shared machine: every row is a ratio against an anchor measured interleaved in "
             "the same process; milliseconds are only indicative).", "",
             "## Machine ceilings (measured in this run)", "",
             "| fp32 torch.mm 2048^3 GFLOP/s | copy_ GB/s (read + write, 256 MiB) |",
             "|---|---|", f"| {ceil['gflops']:.0f} | {ceil['gbps']:.1f} |", ""]
    failed = []
    for name in args.only:
        full, quick = BENCHMARKS[name]
        argv = quick if args.quick else full
        print(f"running {name} {' '.join(argv)}", flush=True)
        text, seconds, code = run(name, argv, env)
        if code:
            failed.append(name)
        command = " ".join(["python", f"benchmarks/{name}.py", *argv])
        lines += [f"## {name}", "", f"`{command}` ({seconds:.0f} s)", "",
                  _demote(text), ""]
        args.out.write_text("\n".join(lines) + "\n")  # partial results survive a later failure
    print(f"wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _demote(text: str) -> str:
    """A script's ``## title`` lines become ``###`` under the benchmark's own section."""
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())


if __name__ == "__main__":
    sys.exit(main())
