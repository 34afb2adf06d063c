"""The head-wise KV cache on SmolLM2-135M-Instruct: KV bytes, decoding ms/step and held-out loss,
full cache against plans that stream a share of the key/value groups (sinks + window), and
kvpress's StreamingLLMPress and DuoAttentionPress on the same model and prompts.

Run: ``python benchmarks/kv.py [--quick]`` (1 thread). Real Austen text (``make corpora``);
kvpress from ``make kvpress`` (``.kvpress/``, its own environment):

  rank     each of the 90 key/value groups' measured cost: the next-token loss on a
           ``--rank-tokens`` calibration passage (after the longest prompt, disjoint from it)
           when that group alone streams (sinks 4, window ``--rank-window``), minus the full
           cache's; the plans stream the cheapest first (``--rank-file`` keeps the ranking)
  prompts  ``--lengths`` n fill the context: prompt + held-out tokens are n - 128 tokens, the
           timed steps after them stay within n (SmolLM2's context is 8192)
  plans    ``--budgets`` shares of the groups streaming, sinks 4 and window ``--window``
  loss     next-token loss on the ``--heldout`` tokens that end each prompt, the prompt and
           the held-out tokens in one forward through the cache (what decoding with the plan
           sees at each of them)
  KV MiB   the cache's exact tensor bytes (``nbytes``) after prompt + held-out tokens
  peak     the rise of the process's VmHWM over that forward (the cache, the prefill's work;
           after a warm-up prefill at that length), batch 1; a batch of b rows repeats that
           one-row cache (the same prompt in every row: one prefill, not b; its loss is the
           same) and has no peak of its own
  ms/step  the decoding step (:class:`headwise.decode.step.DecodeStep`) after those, median of
           interleaved rounds (rotating order, same process, CPU time), speed = full / plan
  kvpress  in a child process of the ``.kvpress`` interpreter (``_kvpress_cells.py``), on the
           same float32 weights in transformers (sdpa): the prompt's prefill under the press,
           then the held-out tokens over the compressed cache; StreamingLLMPress (4 sinks) at
           each plan's KV bytes (``= <plan>``: the same bytes at that prompt), and
           DuoAttentionPress (head ratio 0.5) with its published patterns, with its on-the-fly
           scores (BookSum, downloaded) and with those scores on 50 Austen passages of 1000
           characters instead (``fly/Austen``); ratios against transformers' own full cache
  passkey  a random 5-digit key stated at ``--depths`` of an 8k Austen passage, then asked
           (greedy, 8 new tokens), full cache and each plan

Goals at 8k (the longest prompt): a plan with >= 1.6x less KV memory and >= 1.3x faster step at
a loss within +1% (relative) of the full cache; at equal KV bytes a lower loss (relative to its
own full cache) than StreamingLLMPress; the passkey answered by the plan wherever the full
cache answers it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from _common import interleave, median_ms, ratio, reset_peak, rss_mb, set_clock, table  # noqa: E402
from headwise._io import atomic_write  # noqa: E402
from headwise.analysis.kv import group_costs, plan_loss  # noqa: E402
from headwise.decode.generation import generate  # noqa: E402
from headwise.decode.ragged import headwise_cache  # noqa: E402
from headwise.decode.step import DecodeStep  # noqa: E402
from headwise.kvplan import KVPlan  # noqa: E402

RESERVE = 128  # positions left after prompt + held-out for the timed steps
KVPRESS = HERE.parent / ".kvpress" / "bin" / "python"


def austen_ids(tokenizer, n: int) -> torch.Tensor:
    from headwise.data import austen_text

    text = austen_text()
    start = len(text) // 3  # (past the first novel's front matter)
    return torch.tensor(tokenizer.encode(text[start:start + 8 * n])[:n])


def ranked(model, ids: torch.Tensor, window: int) -> list[tuple[int, int]]:
    costs = group_costs(model, ids[None], sinks=4, window=window)
    return sorted(((i, c) for i in range(30) for c in range(3)), key=lambda ic: costs[ic[0]][ic[1]])


def plan_of(order, share: float, window: int) -> KVPlan:
    rows = [[] for _ in range(30)]
    for i, c in order[:round(share * len(order))]:
        rows[i].append(c)
    return KVPlan(30, 3, 64, 4, window, tuple(map(tuple, rows)), budget=share)


@contextlib.contextmanager
def tail_logits(model, keep: int):
    """Only the last ``keep`` positions reach the vocabulary head (an 8k prompt's whole logits
    would be 1.6 GB a row)."""
    hook = model.final_norm.register_forward_hook(lambda m, a, out: out[:, -keep:])
    try:
        yield
    finally:
        hook.remove()


def prefill(model, x, plan, heldout: int, n: int):
    """``(cache, loss)``: ``x (1, m)`` through a fresh cache of ``n`` positions (None: full)."""
    with torch.inference_mode(), tail_logits(model, heldout + 1):
        cache = model.new_cache(1, n) if plan is None else headwise_cache(model, plan, 1, n)
        logits = model(x, cache=cache)[0]
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), x[0, -heldout:]).item()
    return cache, loss


def tiled(model, plan, cache, batch: int):
    """The one-row ``cache`` repeated to ``batch`` rows: what a prefill of the same prompt in
    every row writes (so batch 4 costs one prefill, not four)."""
    if batch == 1:
        return cache
    n = cache.max_len
    new = model.new_cache(batch, n) if plan is None else headwise_cache(model, plan, batch, n)
    if plan is None:
        new.k.copy_(cache.k.expand_as(new.k))
        new.v.copy_(cache.v.expand_as(new.v))
        new.filled.n = cache.filled.n
    for mine, theirs in zip(new.layers, cache.layers, strict=True):
        a, c = mine.self_attn, theirs.self_attn
        if plan is not None:
            for name in ("kf", "vf", "kr", "vr"):
                getattr(a, name).copy_(getattr(c, name).expand_as(getattr(a, name)))
            a.n, a.clean, a.uniform = c.n, c.clean, c.uniform
        a.vouch = c.vouch
    return new


def measure(model, ids, plans, args) -> list[dict]:
    """Rows for one prompt: loss, KV bytes, peak, ms/step of each plan (None: full cache) at
    each batch of ``args.batches``."""
    x = ids[None]
    n = x.shape[1] + RESERVE
    if args.warmup:  # (the prefill's buffers at this length, before the peaks)
        prefill(model, x, None, args.heldout, n)
    rows, made = [], {}
    for name, plan in plans.items():
        reset_peak()
        base = rss_mb("VmRSS")
        cache, loss = prefill(model, x, plan, args.heldout, n)
        made[name] = (plan, cache, loss, rss_mb("VmHWM") - base)
    for b in args.batches:
        steppers = {}
        for name, (plan, cache, loss, peak) in made.items():
            with torch.inference_mode():
                c = tiled(model, plan, cache, b)
            step, token = DecodeStep(model, c, steps=RESERVE), x[:, -1].expand(b).clone()
            steppers[name] = lambda step=step, token=token: [step(token)
                                                             for _ in range(args.steps)]
            rows.append(dict(plan=name, batch=b, loss=loss, kv=c.nbytes() / 2**20,
                             peak=peak if b == 1 else "—"))
        with torch.inference_mode():
            times = interleave(steppers, warmup=1, min_rounds=3, max_rounds=12,
                               budget_s=args.budget)
        for row in rows[-len(steppers):]:
            row["ms/step"] = median_ms(times[row["plan"]]) / args.steps
            row["speed"] = ratio(times["full"], times[row["plan"]])
    return rows


def passkey(chat, ids: torch.Tensor, plans: dict, depths, n: int) -> list[dict]:
    """Greedy answers to a passkey question after ``n`` tokens: one row per plan and depth."""
    tok = chat.tokenizer
    key = random.Random(43).randint(10000, 99999)
    needle = tok.encode(f" The pass key is {key}. Remember it. {key} is the pass key. ")
    ask = tok.encode(" What is the pass key? The pass key is")
    body = ids[:n - len(needle) - len(ask) - 8].tolist()
    rows = []
    for depth in depths:
        at = round(depth * len(body))
        prompt = torch.tensor([body[:at] + needle + body[at:] + ask])
        for name, plan in plans.items():
            out = generate(chat.model, prompt, max_new_tokens=8, kv_plan=plan)
            said = tok.decode(out[0, prompt.shape[1]:].tolist())
            rows.append(dict(depth=depth, plan=name, answer=" ".join(said.split()),
                             ok=str(key) in said))
    return rows


def kvpress_rows(args, ids, plans) -> tuple[list[dict], str]:
    """kvpress's rows from its child process, or none and the reason."""
    if not KVPRESS.exists():
        return [], "kvpress: not run: .kvpress/ absent (make kvpress)"
    from hf import float32_copy, load

    presses = [["full", "full", 0.0]]
    for name, plan in plans.items():
        if plan is not None:  # StreamingLLMPress keeping the plan's bytes at each prompt
            full = KVPlan.uniform(30, 3, 64, streaming=False)
            keep = {str(n): plan.kv_bytes(1, n, 1) / full.kv_bytes(1, n, 1)
                    for n in args.lengths}
            presses.append([f"StreamingLLM = {name}", "streaming",
                            {k: 1 - v for k, v in keep.items()}])
    presses += [["DuoAttention 0.5", "duo", 0.5], ["DuoAttention 0.5 fly", "duo-fly", 0.5]]
    if args.duo_austen:
        presses.append(["DuoAttention 0.5 fly/Austen", "duo-austen", 0.5])
    with tempfile.TemporaryDirectory() as folder:
        float32_copy(load(), folder)
        tokenizer(folder)
        spec = dict(model_dir=folder, ids=ids.tolist(), texts=passages(50, 1000),
                    lengths=args.lengths, dtypes=args.dtypes, batches=args.batches,
                    heldout=args.heldout, reserve=RESERVE, steps=args.steps,
                    warmup=args.warmup, budget=args.budget, presses=presses)
        path = Path(folder) / "spec.json"
        path.write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        out = subprocess.run([str(KVPRESS), str(HERE / "_kvpress_cells.py"), str(path)],
                             capture_output=True, text=True, env=env)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return [], f"kvpress: failed: {last[:200]}"
    got = json.loads(out.stdout.strip().splitlines()[-1])
    v = got["versions"]
    return got["rows"], (f"kvpress {v['kvpress']} (transformers {v['transformers']}, torch "
                         f"{v['torch']}), sdpa, 1 thread")


def tokenizer(folder: str) -> None:
    """SmolLM2's tokenizer saved beside the float32 copy (DuoAttention's scoring loads it)."""
    import transformers

    from headwise.pretrained import find_smollm2

    path = find_smollm2()
    transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(
        folder)


def passages(count: int, chars: int) -> list[str]:
    """``count`` Austen passages from the first third of the text (before every prompt)."""
    from headwise.data import austen_text

    text = austen_text()
    step = len(text) // 3 // count
    return [text[i * step:i * step + chars] for i in range(count)]


def relative(rows: list[dict], key: str) -> None:
    """Each row's KV and loss against its own full cache (same dtype, prompt, batch)."""
    full = {(r["dtype"], r["prompt"], r["batch"]): r for r in rows if r[key] == "full"}
    for r in rows:
        f = full.get((r["dtype"], r["prompt"], r["batch"]))
        if f is not None and "kv" in r:
            r["KV less"] = f["kv"] / r["kv"]
            r["loss +%"] = 100 * (r["loss"] / f["loss"] - 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2k and 8k, float32")
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.75, 0.9])
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--rank-tokens", type=int, default=512)
    ap.add_argument("--rank-window", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    ap.add_argument("--rank-file", help="reuse (or save) the ranking here (JSON)")
    ap.add_argument("--no-kvpress", action="store_true")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="no warm-up prefill before the peaks (the first row's peak then "
                         "includes the buffers made once)")
    ap.add_argument("--no-duo-austen", dest="duo_austen", action="store_false",
                    help="skip DuoAttentionPress with on-the-fly scores on Austen passages")
    ap.add_argument("--budget", type=float, default=10.0, help="seconds of timing per prompt")
    args = ap.parse_args()
    if args.quick:
        args.lengths, args.dtypes = [2048, 8192], ["fp32"]
        args.budgets, args.budget = [0.5, 0.75], 6.0
    torch.set_num_threads(1)
    set_clock("cpu")
    from headwise.pretrained import find_smollm2, load_gguf

    chat = load_gguf(find_smollm2())
    ids = austen_ids(chat.tokenizer, max(args.lengths) + args.rank_tokens)
    order = ranking(chat.model, ids[-args.rank_tokens:], args)
    rank_loss = plan_loss(chat.model, ids[-args.rank_tokens:][None], None)
    plans = {"full": None} | {f"stream {s:.0%}": plan_of(order, s, args.window)
                              for s in args.budgets}
    print(f"# head-wise KV cache, SmolLM2-135M-Instruct, 1 thread\n\nranked on "
          f"{args.rank_tokens} Austen tokens (full-cache loss {rank_loss:.3f}); cheapest "
          f"streaming groups (layer, group): {order[:8]}\n")
    keys = passkey(chat, ids, plans, args.depths, max(args.lengths) - RESERVE)  # (fp32)
    rows = []
    for dtype in args.dtypes:
        model = chat.model.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        for n in args.lengths:
            for row in measure(model, ids[:n - RESERVE], plans, args):
                rows.append(dict(row, dtype=dtype, prompt=n))
    relative(rows, "plan")
    cols = ["dtype", "prompt", "batch", "kv", "KV less", "peak", "loss", "loss +%", "ms/step",
            "speed"]
    print("## headwise\n\n" + table(rows, cols[:3] + ["plan"] + cols[3:]))
    presses, note = ([], "kvpress: not run (--no-kvpress)") if args.no_kvpress else \
        kvpress_rows(args, ids, plans)
    relative(presses, "press")
    print(f"\n## kvpress\n\n{note}\n\n" + table(presses, cols[:3] + ["press"] + cols[3:]
                                                + ["note"]))
    print(f"\n## passkey at {max(args.lengths) - RESERVE} tokens\n\n"
          + table(keys, ["depth", "plan", "ok", "answer"]))
    print("\n(kv: KV MiB; peak: MiB the process's VmHWM rose over the prefill; speed: full / "
          "plan step time; loss +%: against the same engine's full cache)\n")
    goals(rows, presses, keys, max(args.lengths))
    return 0


def ranking(model, ids, args) -> list[tuple[int, int]]:
    saved = Path(args.rank_file) if args.rank_file else None
    if saved is not None and saved.exists():
        return [tuple(ic) for ic in json.loads(saved.read_text())]
    order = ranked(model, ids, args.rank_window)
    if saved is not None:
        atomic_write(saved, lambda f: f.write(json.dumps(order)), binary=False)
    return order


def goals(rows: list[dict], presses: list[dict], keys: list[dict], n: int) -> None:
    print("## Goals\n")
    at = [r for r in rows if r["prompt"] == n and r["plan"] != "full"]
    good = [r for r in at if r["loss +%"] <= 1.0]
    best = max(good, key=lambda r: r["KV less"], default=None)
    if best is None:
        print(f"goal at {n}: a plan within +1% loss: none of {sorted({r['plan'] for r in at})} "
              f"(losses {[round(r['loss +%'], 2) for r in at]} %) FAIL")
    else:
        where = f"{best['dtype']} batch {best['batch']} {best['plan']}"
        print(f"goal at {n}, {where} (loss {best['loss +%']:+.2f}%): KV memory >= 1.6x less: "
              f"{best['KV less']:.2f}x {'PASS' if best['KV less'] >= 1.6 else 'FAIL'}")
        print(f"goal at {n}, {where}: decoding step >= 1.3x faster: {best['speed']:.2f}x "
              f"{'PASS' if best['speed'] >= 1.3 else 'FAIL'}")
    same = {(p["dtype"], p["batch"], p["press"].split("= ")[-1]): p for p in presses
            if p["prompt"] == n and "loss +%" in p}
    for r in at:
        p = same.get((r["dtype"], r["batch"], r["plan"]))
        if p is None:
            print(f"goal at {n}, {r['dtype']} batch {r['batch']} {r['plan']}: lower loss than "
                  f"StreamingLLMPress at equal KV bytes: not measured (no kvpress row) FAIL")
            continue
        print(f"goal at {n}, {r['dtype']} batch {r['batch']} {r['plan']} ({r['kv']:.1f} MiB) "
              f"vs StreamingLLMPress ({p['kv']:.1f} MiB): loss {r['loss +%']:+.2f}% < "
              f"{p['loss +%']:+.2f}% {'PASS' if r['loss +%'] < p['loss +%'] else 'FAIL'}")
    full = {k["depth"] for k in keys if k["plan"] == "full" and k["ok"]}
    for name in sorted({k["plan"] for k in keys} - {"full"}):
        mine = {k["depth"] for k in keys if k["plan"] == name and k["ok"]}
        void = "" if full else " (the full cache answers at no depth: says nothing)"
        print(f"goal passkey, {name}: answered at depths {sorted(mine)} where the full cache "
              f"answers at {sorted(full)}{void} {'PASS' if full <= mine else 'FAIL'}")


if __name__ == "__main__":
    sys.exit(main())
