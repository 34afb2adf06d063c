"""attn_implementation="headwise" vs Hugging Face's own attention on a real checkpoint:
SmolLM2-135M-Instruct, loaded by transformers from its GGUF (``gguf_file=``, dequantized to
float32), one forward over b x n tokens (all logits), CPU.

Candidates, on one model whose implementation is switched per call:

  sdpa           HF sdpa, no weights                                     (the time anchor)
  headwise       attn_implementation="headwise", no weights              vs sdpa
  eager+w        HF eager, output_attentions=True                        (the weights anchor)
  headwise+w     headwise, output_attentions=True (every layer's weights: whole rows as their
                 softmax, the output from the same blocks)               vs eager+w
  headwise 1h    headwise, ``headwise.hf.weights(model, {"layers": [L], "heads": [H]})``: one
                 (layer, head)'s weights, every other layer without      vs sdpa (time),
                                                                          eager+w (memory)

Time: each (batch, n) cell interleaved in this one process (rotating order; medians of
per-round ratios), for each thread count in ``--threads``. The floor column of headwise+w is
sdpa's time over eager+w's: the same forward without any weights, which a forward that also
computes and writes them cannot beat.

Peak memory: one fresh child process per (batch, n, candidate), glibc's mmap threshold fixed
(every large buffer really mapped and unmapped), loading the model from a float32 safetensors
copy written once by this process; the child resets VmHWM (``/proc/self/clear_refs``), makes
its one call (after an 8-token call that pages the model in) and reports VmHWM minus the
resident set before the call: the peak above the loaded model, the returned weights and logits
included. The floor column (rows measured against eager+w) is what the call returns, the
logits ``(b, n, vocab)`` and, with output_attentions, every layer's ``(b, h, n, n)`` float32
weights, over eager+w's peak: all of it is held at the end of the call, so no implementation's
peak ratio goes below it. A cell whose estimated need exceeds MemAvailable is not run, and the table says so.

    python benchmarks/hf.py [--seqs 512 2048] [--batches 1 4] [--threads 1 2] [--budget 20]
                            [--clock wall|cpu] [--no-peaks]

The full default table (both sizes, batches 1 and 4, 1 and 2 threads) takes about 45 minutes
on a quiet 2-core AMD EPYC, most of it in batch 4 at 2048 tokens; ``--batches 1`` about 10.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

LAYER, HEAD = 15, 3
# name -> (attn_implementation, output_attentions, a headwise.hf.weights selection or None)
CANDIDATES = {
    "sdpa": ("sdpa", False, None),
    "headwise": ("headwise", False, None),
    "eager+w": ("eager", True, None),
    "headwise+w": ("headwise", True, None),
    "headwise 1h": ("headwise", False, {"layers": [LAYER], "heads": [HEAD]}),
}
TIME_ANCHOR = {"sdpa": "sdpa", "headwise": "sdpa", "eager+w": "sdpa", "headwise+w": "eager+w",
               "headwise 1h": "sdpa"}
MEMORY_ANCHOR = {**TIME_ANCHOR, "headwise 1h": "eager+w"}
GiB = 2**30


def load(directory: str | None = None):
    """SmolLM2 from its GGUF (or from a float32 copy in ``directory``), HF sdpa to start."""
    import transformers

    import headwise.hf  # noqa: F401  (registers "headwise")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if directory is not None:
        return transformers.LlamaForCausalLM.from_pretrained(
            directory, dtype=torch.float32, attn_implementation="sdpa").eval()
    from headwise.pretrained import find_smollm2
    path = find_smollm2()
    return transformers.LlamaForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa").eval()


def float32_copy(model, directory: str) -> None:
    """Write ``model`` (from the GGUF) as float32 safetensors for the child processes. The GGUF
    tensors were dequantized to float32 at load; transformers' GGUF quantizer only marks the
    model, and save_pretrained refuses a marked model, so the mark is dropped first (a child's
    logits then equal this process's exactly)."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(directory)


def forward(model, ids, name: str):
    """One forward of candidate ``name`` on ``ids (b, n)``, without autograd."""
    import headwise.hf as hh

    implementation, weights, select = CANDIDATES[name]
    model.set_attn_implementation(implementation)
    scope = hh.weights(model, select) if select is not None else nullcontext()
    with torch.no_grad(), scope:
        return model(input_ids=ids, output_attentions=weights)


def tokens(b: int, n: int) -> torch.Tensor:
    return torch.randint(100, 40000, (b, n), generator=torch.Generator().manual_seed(0))


def weights_bytes(config, b: int, n: int) -> int:
    """Bytes of every layer's float32 ``(b, h, n, n)`` weights: what output_attentions returns."""
    return config.num_hidden_layers * b * config.num_attention_heads * n * n * 4


def need_bytes(config, b: int, n: int, name: str) -> int:
    """An estimate of a call's peak above the loaded model: the logits, the returned weights,
    two of eager's per-layer score tensors (measured at 1 x 2048: eager's peak was 105 MiB
    above what it returned, under one layer's), 512 MiB for the rest."""
    layer = b * config.num_attention_heads * n * n * 4
    logits = b * n * config.vocab_size * 4
    returned = weights_bytes(config, b, n) if CANDIDATES[name][1] else 0
    return logits + returned + (2 * layer if name == "eager+w" else 0) + GiB // 2


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not in /proc/meminfo")


def runnable(config, b: int, n: int) -> dict[str, str]:
    """name -> "" when it and its anchors fit in MemAvailable now, else why it is not run."""
    free = mem_available()
    why = {name: "" if need_bytes(config, b, n, name) < free else
           f"not run: needs ~{need_bytes(config, b, n, name) / GiB:.1f} GiB, MemAvailable "
           f"{free / GiB:.1f} GiB" for name in CANDIDATES}
    return {name: why[name] or why[TIME_ANCHOR[name]] or why[MEMORY_ANCHOR[name]]
            for name in CANDIDATES}


def time_cell(model, b: int, n: int, budget: float, warmup: int) -> list[dict]:
    ids = tokens(b, n)
    why = runnable(model.config, b, n)
    fns = {name: (lambda name=name: forward(model, ids, name).logits.shape)
           for name in CANDIDATES if not why[name]}
    times = C.interleave(fns, warmup=warmup, min_rounds=3, budget_s=budget)
    rows = []
    for name in CANDIDATES:
        base = TIME_ANCHOR[name]
        row = {"batch": b, "n": n, "what": name, "vs": base}
        if name not in times or base not in times:
            rows.append({**row, "note": why[name] or why[base]})
            continue
        row.update({"ms": C.median_ms(times[name]), "time ratio":
                    C.ratio(times[name], times[base]), "rounds": len(times[name])})
        if name == "headwise+w" and "sdpa" in times:
            row["floor"] = C.ratio(times["sdpa"], times[base])
        rows.append(row)
    return rows


def peak_rows(directory: str, config, b: int, n: int) -> list[dict]:
    why = runnable(config, b, n)
    got = {name: C.peak_in_subprocess(__file__, "--peak-child", directory, str(b), str(n), name)
           for name in CANDIDATES if not why[name]}
    rows = []
    for name in CANDIDATES:
        base = MEMORY_ANCHOR[name]
        row = {"batch": b, "n": n, "what": name, "vs": base}
        if name not in got or base not in got:
            rows.append({**row, "note": why[name] or why[base]})
            continue
        row.update({"peak MiB": got[name]["peak"], "peak ratio":
                    got[name]["peak"] / max(got[base]["peak"], 1e-9),
                    "returned MiB": got[name]["returned"]})
        if base == "eager+w":  # what the call returns, over eager's peak
            row["floor"] = got[name]["returned"] / max(got[base]["peak"], 1e-9)
        rows.append(row)
    return rows


def peak_child(directory: str, b: int, n: int, name: str) -> None:
    """In a fresh process: the peak (MiB) of one call above the loaded model, and the MiB it
    returned (logits and weights); one JSON line."""
    model = load(directory)
    for warm in ("sdpa", name):  # the weights' pages (safetensors maps them lazily), lazy inits
        forward(model, tokens(1, 8), warm)
    ids = tokens(b, n)
    gc.collect()
    C.reset_peak()
    before = C.rss_mb()
    out = forward(model, ids, name)
    peak = C.rss_mb("VmHWM") - before
    returned = out.logits.nbytes + sum(w.nbytes for w in (out.attentions or ()) if w is not None)
    print(json.dumps({"peak": peak, "returned": returned / 2**20}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--peak-child":
        directory, b, n, name = sys.argv[2:6]
        return peak_child(directory, int(b), int(n), name)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--budget", type=float, default=20.0, help="seconds of timing per cell")
    p.add_argument("--clock", choices=sorted(C.CLOCKS), default="wall",
                   help="cpu: this process's CPU time (with --threads 1 on a shared machine)")
    p.add_argument("--no-peaks", action="store_true", help="time only")
    args = p.parse_args()
    C.set_clock(args.clock)
    model = load()
    cells = [(b, n) for b in args.batches for n in args.seqs]
    print(f"SmolLM2-135M-Instruct (HF, float32, from its GGUF), CPU, {args.clock} clock, "
          f"layer {LAYER} head {HEAD} for '1h'")
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows = [r for x, (b, n) in enumerate(cells)  # the first cell warms the process up
                for r in time_cell(model, b, n, args.budget, warmup=int(x == 0))]
        print(f"\nTime, {threads} thread{'s' * (threads > 1)} (floor: sdpa / eager+w, the "
              "forward without weights)")
        print(C.table(rows, ["batch", "n", "what", "ms", "vs", "time ratio", "floor", "rounds",
                             "note"]))
    if args.no_peaks:
        return
    with tempfile.TemporaryDirectory() as directory:
        float32_copy(model, directory)
        rows = [r for b, n in cells for r in peak_rows(directory, model.config, b, n)]
    print("\nPeak memory above the loaded model, MiB, one child process per cell (returned: "
          "logits and weights; floor: returned / eager+w's peak)")
    print(C.table(rows, ["batch", "n", "what", "peak MiB", "vs", "peak ratio", "returned MiB",
                         "floor", "note"]))


if __name__ == "__main__":
    main()
