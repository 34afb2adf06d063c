"""Run benchmarks and write their current results into benchmarks/RESULTS.md.

Each benchmark script prints its own tables of ratios against anchors measured interleaved in
its process; this runner measures the machine's fp32 matmul rate and copy bandwidth first (in
the same run, handed to the scripts that report fractions of them through the environment
variable HEADWISE_BENCH_CEILINGS), runs each script, and after each one replaces that
benchmark's section for this machine in RESULTS.md (see ``_results.py``): the CPU model,
threads, torch version, date, load average, commit and exact command, then the script's output.
Sections of other benchmarks and other machines stay. A benchmark that fails keeps its previous
section; its error is printed here and the exit status is 1.

    python benchmarks/run_all.py [--quick] [--only attention weights ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
import _results as R  # noqa: E402
from headwise import limits  # noqa: E402
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
    "busy": ([], ["--rounds", "1", "--settings", "default", "threads1", "--train-seconds", "20"]),
    "importance": (["--threads", "2"], ["--quick", "--models", "reverse,minilm"]),
    "hf": ([], ["--seqs", "512", "--batches", "1", "--threads", "1", "--budget", "10"]),
    "gguf_load": ([], ["--rounds", "3"]),
    "peers": ([], ["--quick"]),
    "long": ([], ["--quick"]),
    "kv": ([], ["--quick"]),
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
    here = R.machine(limits.cpu_model(), limits.cpu_count())
    order = R.ORDER
    commit = R.commit(HERE.parent)

    def section(name: str, command: str, seconds: float, output: str, load: float):
        return R.make(name, here, command=command, threads=torch.get_num_threads(),
                      torch_version=torch.__version__, load=load, commit=commit,
                      seconds=seconds, output=output,
                      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))

    load, start = os.getloadavg()[0], time.perf_counter()
    ceil = measure_ceilings()
    env = dict(os.environ, HEADWISE_BENCH_CEILINGS=json.dumps(ceil))
    ceilings = ("| fp32 torch.mm 2048^3 GFLOP/s | copy_ GB/s (read + write, 256 MiB) |\n"
                f"|---|---|\n| {ceil['gflops']:.0f} | {ceil['gbps']:.1f} |")
    this_run = " ".join(["python", "benchmarks/run_all.py", *sys.argv[1:]])
    R.update(args.out, [section("ceilings", this_run, time.perf_counter() - start, ceilings,
                                load)], order)
    failed = []
    for name in args.only:
        full, quick = BENCHMARKS[name]
        argv = quick if args.quick else full
        print(f"running {name} {' '.join(argv)}", flush=True)
        load = os.getloadavg()[0]
        text, seconds, code = run(name, argv, env)
        if code:
            failed.append(name)
            print(f"{name} failed; its section in {args.out} is unchanged:\n{text}", flush=True)
            continue
        command = " ".join(["python", f"benchmarks/{name}.py", *argv])
        R.update(args.out, [section(name, command, seconds, text, load)], order)
    print(f"wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
