"""SmolLM2-135M-Instruct (its Q4_1 GGUF) on headwise vs Hugging Face transformers'
``LlamaForCausalLM`` loaded from the same file (sdpa attention, its own ``generate``).

Run by ``benchmarks/generate.py --model smollm2 [--quick]``. Weights, as pairs of the same
values in the same dtype (the fair "same weights" comparisons):

  fp32   headwise, dequantized float32          vs HF float32 (the same dequantized values)
  bf16   headwise, those weights in bfloat16    vs HF in bfloat16 (``.to(torch.bfloat16)``)
  q4     headwise ``load_gguf(q4=True)``: the prompt and the decode step multiply by the
         file's own 4-bit blocks (headwise's kernel, torch's int4 kernel where it declines;
         bfloat16 activations into those products, float32 elsewhere), and the step's
         vocabulary head by the file's 8-bit Q8_0 codes of the tied embedding (exactly the
         float32 table's values, :mod:`headwise.fast.q8`): vs HF float32 and vs HF bfloat16.
         HF has no 4-bit CPU path for this file.

All five models run interleaved in one process (rotating order; ratios are medians of per-round
ratios), at each thread count:

  decode     greedy, 256 new tokens after a 64-token chat prompt (no end-of-sequence token on
             either side), batch 1 and 4: tok/s =
             batch * 256 / time of the whole ``generate`` call (the 64-token prefill included:
             conservative for both); ``agree`` = leading new tokens equal to HF's in that row;
             ``ms/step`` = the same medians / 256 (per new token, the prefill included)
  prefill    one forward over 512 tokens (all logits), time ratio (>= 9 rounds)
  roof       the step's floor: the bytes one decode step reads, weights + KV cache
             (:func:`headwise.fast.roof.step_bytes`: every matrix it multiplies by once, in the
             form it reads: fp32 and bf16 every parameter, the tied embedding/head once, 513 and
             257 MiB; q4 the 4-bit codes + their float16 scales and minima and the head's Q8_0
             codes + scales, 92 MiB; the embedding's float32 table is only looked up, one row
             a token, and not counted; :func:`headwise.fast.roof.cache_bytes`: the keys and
             values at the timed steps' mean length, 192 positions, 8.4 MiB a row in float32
             (fp32, q4), 4.2 in bf16) over the machine's read bandwidth
             (:func:`headwise.fast.roof.read_bandwidth`: a sum over 512 MiB in huge pages)
             measured in the same run at the same thread count, or the rate the fastest step
             of the run read its bytes at where that is higher (at 2 threads torch's sum reads
             less than headwise's bf16 step streams). ``step ms`` is the decode steps alone: (the 256-token call - a 1-token call
             of the same prompt, both medians of the interleaved rounds) / 255; ``% roof`` =
             roof ms / step ms
  paths      bf16 and q4 run headwise's kernels on the widest path the CPU has
             (:func:`headwise.fast.native.isa`) and, where that is AVX512-BF16, again on the AVX2
             path (``@avx2`` rows: the fallback of a CPU without it, forced by
             :func:`headwise.fast.native.use_isa`), interleaved with the others
  memory     in a fresh process per variant (headwise only): resident set after loading and
             decoding 256 tokens at batch 4, minus the process before loading, / the float32
             weight bytes
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time

import torch

import _common as C

NEW, PROMPT, PREFILL = 256, 64, 512
KEYS = PROMPT + NEW // 2  # positions the timed steps attend, on average (roof)
WARM = 8  # new tokens of the untimed call each decode candidate makes first
AVX2 = "@avx2"  # suffix of a variant run on the AVX2 path
PREFILL_ROUNDS = 9
TEXT = ("Explain, step by step and with examples, how attention heads in a small language "
        "model decide which earlier words matter for the next word, and why grouped-query "
        "attention lets nine query heads share three key/value heads without losing much.")
# headwise variant -> the HF model(s) it is compared with
PAIRS = {"fp32": ("fp32",), "bf16": ("bf16",), "q4": ("fp32", "bf16")}


def chat_prompt(chat, n: int) -> torch.Tensor:
    """``(1, n)`` ids: the chat template around a long user message, cut to ``n`` tokens."""
    ids = chat.tokenizer.chat(TEXT * 20)
    assert len(ids) >= n
    return torch.tensor([ids[:n]])


def fp32_bytes(model) -> int:
    """The model's weights in float32 (tied: once; 4-bit matrices counted at 4 bytes each)."""
    return (sum(p.numel() * 4 for p in model.parameters())
            + sum(m.in_features * m.out_features * 4 for m in _coded(model)))


def _coded(model) -> list:
    return [m for m in model.modules() if getattr(m, "int4", None) is not None]


def load_hf(path):
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers.LlamaForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa").eval()


def load_all(variants=tuple(PAIRS)):
    """``(chat, ours: name -> model, theirs: name -> HF model)``, every weight from one file:
    the headwise ``variants`` (keys of :data:`PAIRS`) and the HF models they are compared with."""
    from headwise.pretrained.gguf import attach_q4, build_model, find_smollm2, load_gguf, read_gguf

    path = find_smollm2()
    file = read_gguf(path)
    chat = load_gguf(file)
    ours = {"fp32": chat.model}
    if "bf16" in variants:
        ours["bf16"] = copy.deepcopy(chat.model).to(torch.bfloat16)
    if "q4" in variants:
        ours["q4"] = build_model(file)
        attach_q4(ours["q4"], file)
    ours = {name: ours[name] for name in variants}
    hf = load_hf(path)
    # no end-of-sequence token: both sides decode exactly NEW tokens with nothing suppressed
    # (min_new_tokens would mask <|im_end|> on HF's side only), so the tokens stay comparable
    hf.generation_config.eos_token_id = None
    theirs = {"fp32": hf}
    if any("bf16" in PAIRS[name] for name in variants):
        theirs["bf16"] = copy.deepcopy(hf).to(torch.bfloat16)
    return chat, ours, theirs


def decode_rows(threads, b, prompt, ours, theirs, rounds, paths) -> list[dict]:
    from headwise import generate
    from headwise.fast import native

    ids = prompt.expand(b, -1).contiguous()
    mask, out = torch.ones_like(ids), {}
    names = [n for n in ours] + [n + AVX2 for n in ours if n != "fp32" and "avx2" in paths]

    def hw(name, new=NEW):
        model = ours[name.removesuffix(AVX2)]

        def run():
            native.use_isa("avx2" if name.endswith(AVX2) else "auto")
            tokens = generate(model, ids, max_new_tokens=new)
            if new == NEW:
                out["hw " + name] = tokens
        return run

    def hf(name, new=NEW):
        def run():
            with torch.inference_mode():
                out["HF " + name] = theirs[name].generate(
                    ids, attention_mask=mask, do_sample=False, max_new_tokens=new)
        return run

    # a few tokens each first, so that the first timed call (with --quick: the only one) pays
    # no first-call costs (thread pool, allocator) that the others do not
    for warm in [hw(n, WARM) for n in names] + [hf(n, WARM) for n in theirs]:
        warm()
    fns = ({f"hw {n}": hw(n) for n in names} | {f"HF {n}": hf(n) for n in theirs}
           | {f"prefill {n}": hw(n, 1) for n in names})
    times = C.interleave(fns, warmup=0, min_rounds=rounds, max_rounds=rounds)
    native.use_isa("auto")
    rows = []
    for name in names:
        step_s = (statistics.median(times[f"hw {name}"])
                  - statistics.median(times[f"prefill {name}"])) / (NEW - 1)
        for anchor in PAIRS[name.removesuffix(AVX2)]:
            mine, ref = times[f"hw {name}"], times[f"HF {anchor}"]
            rows.append(dict(
                threads=threads, batch=b, what=f"decode {NEW} after {PROMPT}",
                headwise=name, HF=anchor,
                **{"headwise tok/s": b * NEW / statistics.median(mine),
                   "HF tok/s": b * NEW / statistics.median(ref)},
                **{"ms/step headwise / HF": f"{1e3 * statistics.median(mine) / NEW:.1f} / "
                                            f"{1e3 * statistics.median(ref) / NEW:.1f}"},
                ratio=1 / C.ratio(mine, ref), goal=">= 1.5x",
                agree=f"{_agree(out[f'hw {name}'], out[f'HF {anchor}'], PROMPT)}/{NEW}",
                path=(native.isa() if name != "fp32" and not name.endswith(AVX2)
                      else "avx2" if name.endswith(AVX2) else "fp32 kernels"),
                _step_s=step_s, _model=name.removesuffix(AVX2)))
    return rows


def _agree(a: torch.Tensor, b: torch.Tensor, start: int) -> int:
    """New tokens equal in every row before the first difference."""
    same = (a[:, start:] == b[:, start:]).all(0)
    return int(same.long().cumprod(0).sum())


def prefill_rows(threads, ids, ours, theirs, rounds) -> list[dict]:
    fns, names = {}, [n for n in ("fp32", "bf16") if n in ours]
    if not names:
        return []
    for name in names:
        fns[f"hw {name}"] = lambda m=ours[name]: m(ids)
        fns[f"HF {name}"] = lambda m=theirs[name]: m(ids)
    # a forward takes seconds, not minutes: at least PREFILL_ROUNDS rounds even with --quick (one
    # round put fp32 at 2 threads at 1.09 where five give 0.96; five rounds in a row of one
    # session gave 0.977 and 1.00 at 2 threads, the two sides ~2% apart: nine narrow that)
    rounds = max(rounds, PREFILL_ROUNDS)
    with torch.inference_mode():
        times = C.interleave(fns, warmup=1, min_rounds=rounds, max_rounds=rounds)
    return [dict(threads=threads, batch=1, what=f"prefill {PREFILL}", headwise=n, HF=n,
                 **{"headwise tok/s": PREFILL / statistics.median(times[f"hw {n}"]),
                    "HF tok/s": PREFILL / statistics.median(times[f"HF {n}"])},
                 ratio=C.ratio(times[f"hw {n}"], times[f"HF {n}"]), goal="<= 1.0x (time)")
            for n in names]


def measure(threads: int, rounds: int, batches, chat, ours, theirs, paths) -> list[dict]:
    from headwise.fast.roof import cache_bytes, read_bandwidth, step_bytes

    torch.set_num_threads(threads)
    prompt = chat_prompt(chat, PROMPT)
    bws, rows = [read_bandwidth()], []
    for b in batches:
        new = decode_rows(threads, b, prompt, ours, theirs, rounds, paths)
        rows += new
        bws.append(read_bandwidth())  # between the rows too: the best of the run's readings
        print(C.table(new, COLS), flush=True)  # partial results survive an interruption
    rows += prefill_rows(threads, chat_prompt(chat, PREFILL), ours, theirs, rounds)
    steps = [row for row in rows if "_step_s" in row]
    for row in steps:
        model, step_s = ours[row.pop("_model")], row.pop("_step_s")
        # the cache at the timed steps' mean length (step k attends PROMPT + k keys)
        weights, cache = step_bytes(model), cache_bytes(model, row["batch"], KEYS)
        row["_read"] = weights, cache, step_s
    # A step that read faster than the probe shows the machine can (at 2 threads torch's sum
    # reads less than the bf16 step streams): the roof is the best of both
    streamed = max((sum(r["_read"][:2]) / r["_read"][2] for r in steps), default=0.0)
    bw = max(*bws, streamed)
    print(f"read bandwidth at {threads} thread(s): {bw / 1e9:.1f} GB/s (best of the probe's "
          f"{', '.join(f'{x / 1e9:.1f}' for x in bws)} and the fastest step's "
          f"{streamed / 1e9:.1f})", flush=True)
    for row in steps:
        weights, cache, step_s = row.pop("_read")
        read = weights + cache
        row["step ms"] = f"{step_s * 1e3:.1f}"
        row["roof ms"] = (f"{read / bw * 1e3:.1f} ({weights / 2**20:.0f} + "
                          f"{cache / 2**20:.0f} MiB, {bw / 1e9:.1f} GB/s)")
        row["% roof"] = f"{read / bw / step_s:.0%}"
    return rows


COLS = ["threads", "batch", "what", "headwise", "path", "HF", "headwise tok/s", "HF tok/s",
        "ms/step headwise / HF", "ratio", "goal", "agree", "step ms", "roof ms", "% roof"]


def memory_child(batch: int, variant: str) -> dict:
    """In a fresh process: RSS growth from loading + decoding, over the fp32 weight bytes."""
    from headwise import generate
    from headwise.pretrained import load_smollm2

    torch.set_num_threads(1)
    before = C.rss_mb()
    chat = load_smollm2(dtype=torch.bfloat16 if variant == "bf16" else torch.float32,
                        q4=variant == "q4")
    ids = chat_prompt(chat, PROMPT).expand(batch, -1).contiguous()
    generate(chat.model, ids, max_new_tokens=NEW)
    return dict(rss_mb=C.rss_mb() - before, peak_mb=C.rss_mb("VmHWM") - before,
                weights_mb=fp32_bytes(chat.model) / 2**20)


def run(threads_list, rounds: int, batches, variants=tuple(PAIRS)) -> None:
    from headwise.fast import native
    from headwise.fast.roof import cpu

    t0 = time.perf_counter()
    chat, ours, theirs = load_all(variants)
    paths = ("auto", "avx2") if native.isa() == "avx512-bf16" else ("auto",)
    print(f"# torch {torch.__version__}, loaded in {time.perf_counter() - t0:.0f} s; "
          f"{rounds} interleaved round(s); tok/s and ms are medians\n# CPU: {cpu()}; "
          f"headwise kernels: {native.status()}, bf16/q4 path {native.isa()}"
          f"{' (and @avx2 rows)' if len(paths) > 1 else ''}", flush=True)
    rows = []
    for threads in threads_list:
        rows += measure(threads, rounds, batches, chat, ours, theirs, paths)
    print("\n## SmolLM2-135M-Instruct (Q4_1 GGUF): headwise vs HF LlamaForCausalLM\n")
    print(C.table(rows, COLS))
    print("\nratio: decode = headwise tok/s over HF's (median of per-round ratios); prefill = "
          "headwise time over HF's. agree: leading new tokens equal to HF's in every row. "
          "% roof: the step's floor (bytes read / read bandwidth) over its time.")
    del chat, ours, theirs
    print(f"\n## Resident memory (fresh process, batch {max(batches)}, {NEW} tokens decoded; "
          "goal <= 1.25x the fp32 weights)\n")
    mem = []
    for variant in variants:
        m = C.peak_in_subprocess(__file__, "--memory-child", str(max(batches)), variant)
        mem.append({"headwise": variant, "after MiB": m["rss_mb"], "peak MiB": m["peak_mb"],
                    "fp32 weights MiB": m["weights_mb"],
                    "after / fp32 weights": m["rss_mb"] / m["weights_mb"],
                    "peak / fp32 weights": m["peak_mb"] / m["weights_mb"]})
    print(C.table(mem, list(mem[0])))


if __name__ == "__main__" and sys.argv[1:2] == ["--memory-child"]:
    import json
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps(memory_child(int(sys.argv[2]), sys.argv[3])))
