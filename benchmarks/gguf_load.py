"""How long ``headwise.hf.load`` takes on SmolLM2-135M-Instruct's GGUF against transformers'
own load of the same file.

    python benchmarks/gguf_load.py [--rounds 5] [--threads 1] [--clock wall|cpu]

Candidates, each a fresh process per round (imports done before the clock starts, so only the
load is timed), alternated round by round with the order rotating:

  transformers          AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)
                        (the model alone: the anchor)
  transformers+tok      the same and AutoTokenizer.from_pretrained(dir, gguf_file=...)
  headwise.hf.load      headwise.hf.load(file): (model, tokenizer) on attn_implementation="headwise"

Ratios are medians of per-round ratios to the anchor; the goal line: headwise.hf.load within
1.2x transformers' own load of the model. ``--clock cpu`` times the child's CPU
(``time.process_time``: steadier on a shared machine, blind to waiting on the disk).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

GOAL = 1.2
ANCHOR = "transformers"
CANDIDATES = ("transformers", "transformers+tok", "headwise.hf.load")


def child(name: str, threads: int, clock: str) -> None:
    """One load of ``name`` in this process; prints ``{"s": seconds}``."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import transformers

    import headwise.hf
    from headwise.installed import MODELS

    torch.set_num_threads(threads)
    path = MODELS["smollm2"].path()
    where = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name,
             "local_files_only": True}
    now = time.process_time if clock == "cpu" else time.perf_counter
    start = now()
    if name == "headwise.hf.load":
        headwise.hf.load(path)
    else:
        transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
        if name == "transformers+tok":
            transformers.AutoTokenizer.from_pretrained(**where)
    print(json.dumps({"s": now() - start}))


def run_child(name: str, threads: int, clock: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", name, "--threads", str(threads),
                          "--clock", clock], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--child", choices=CANDIDATES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.threads, args.clock)
    times: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    for r in range(args.rounds):
        order = CANDIDATES[r % len(CANDIDATES):] + CANDIDATES[:r % len(CANDIDATES)]
        for name in order:
            times[name].append(run_child(name, args.threads, args.clock))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n} {times[n][-1]:.1f} s" for n in CANDIDATES), file=sys.stderr, flush=True)
    print(f"SmolLM2-135M-Instruct Q4_1 GGUF, float32, {args.threads} thread(s), "
          f"{args.rounds} alternated rounds (fresh process each, load only), {args.clock} "
          f"clock\n")
    print("| candidate | median s | ratio to transformers |")
    print("|---|---|---|")
    ratios = {}
    for name in CANDIDATES:
        ratios[name] = statistics.median(t / a for t, a in zip(times[name], times[ANCHOR],
                                                               strict=True))
        print(f"| {name} | {statistics.median(times[name]):.2f} | {ratios[name]:.2f}x |")
    ok = ratios["headwise.hf.load"] <= GOAL
    print(f"\ngoal gguf load: ratio <= {GOAL} {'PASS' if ok else 'FAIL'} "
          f"({ratios['headwise.hf.load']:.2f}x)")


if __name__ == "__main__":
    main()
