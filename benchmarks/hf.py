"""attn_implementation="headwise" vs Hugging Face's own attention on a real checkpoint:
SmolLM2-135M-Instruct, loaded by transformers from its GGUF (``gguf_file=``, dequantized to
float32), one forward over n tokens (all logits), CPU.

Candidates, interleaved in one process on one model (the implementation is switched per call;
medians of per-round ratios):

  sdpa           HF sdpa, no weights                                     (the anchor)
  headwise       attn_implementation="headwise", no weights              vs sdpa
  eager+w        HF eager, output_attentions=True                        (the weights anchor)
  headwise+w     headwise, output_attentions=True (every layer's weights from the LSE recompute)
                                                                          vs eager+w
  headwise 1h    headwise, ``headwise.hf.weights(model, {"layers": [L], "heads": [H]})``:
                 one (layer, head)'s weights, every other layer without    vs sdpa

Peak memory: the same process re-executed with glibc's mmap threshold fixed (every large
buffer really allocated and returned), VmHWM reset before each candidate's one call; the
column is the peak above the resident set before the call (the weights returned included).

    python benchmarks/hf.py [--seqs 512 2048] [--batches 1 4] [--budget 20] [--threads N]
                            [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

LAYER, HEAD = 15, 3


def load():
    import transformers

    import headwise.hf  # noqa: F401  (registers "headwise")
    from headwise.pretrained import find_smollm2
    path = find_smollm2()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers.LlamaForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa").eval()


def candidates(model, ids) -> dict:
    """name -> one forward (no_grad) on ``ids (b, n)``, switching the implementation first."""
    import headwise.hf as hh

    def call(implementation, weights=False, select=None):
        def run():
            model.set_attn_implementation(implementation)
            scope = hh.weights(model, select) if select is not None else nullcontext()
            with torch.no_grad(), scope:
                out = model(input_ids=ids, output_attentions=weights)
            return out.logits.shape
        return run
    return {"sdpa": call("sdpa"), "headwise": call("headwise"),
            "eager+w": call("eager", True), "headwise+w": call("headwise", True),
            "headwise 1h": call("headwise", select={"layers": [LAYER], "heads": [HEAD]})}


def peaks(fns: dict) -> dict:
    """MiB above the resident set before each candidate's one call (Linux)."""
    out = {}
    for name, fn in fns.items():
        gc.collect()
        C.reset_peak()
        before = C.rss_mb()
        fn()
        out[name] = C.rss_mb("VmHWM") - before
        gc.collect()
    return out


def rows_for(model, b: int, n: int, budget: float) -> list[dict]:
    ids = torch.randint(100, 40000, (b, n), generator=torch.Generator().manual_seed(0))
    fns = candidates(model, ids)
    times = C.interleave(fns, warmup=1, min_rounds=3, budget_s=budget)
    mem = peaks(fns)
    anchor = {"headwise": "sdpa", "headwise+w": "eager+w", "headwise 1h": "sdpa",
              "eager+w": "sdpa", "sdpa": "sdpa"}
    rows = []
    for name, ts in times.items():
        base = anchor[name]
        rows.append({"batch": b, "n": n, "what": name, "ms": C.median_ms(ts),
                     "vs": base, "time ratio": C.ratio(ts, times[base]),
                     "peak MiB": mem[name], "peak ratio": mem[name] / max(mem[base], 1e-9),
                     "rounds": len(ts)})
    return rows


def main() -> None:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "131072":  # see C.peak_in_subprocess
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072"))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[512])
    p.add_argument("--batches", type=int, nargs="+", default=[1])
    p.add_argument("--budget", type=float, default=20.0, help="seconds of timing per point")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--clock", choices=sorted(C.CLOCKS), default="wall",
                   help="cpu: this process's CPU time (with --threads 1 on a shared machine)")
    args = p.parse_args()
    C.set_clock(args.clock)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load()
    rows = [r for b in args.batches for n in args.seqs for r in rows_for(model, b, n, args.budget)]
    print(f"SmolLM2-135M-Instruct (HF, float32), CPU, {torch.get_num_threads()} threads, "
          f"{args.clock} clock, layer {LAYER} head {HEAD} for '1h'")
    print(C.table(rows, ["batch", "n", "what", "ms", "vs", "time ratio", "peak MiB",
                         "peak ratio", "rounds"]))


if __name__ == "__main__":
    main()
