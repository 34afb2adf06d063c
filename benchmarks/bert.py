"""BERT inference: headwise vs ``transformers.BertModel`` (eager and sdpa) on the same weights.

The all-MiniLM-L6-v2 checkpoint (6 layers, 12 heads, hidden 384, intermediate 1536) runs a
batch of 32 x 128 random tokens under ``torch.no_grad()``, without and with a padding mask (a
quarter of the rows padded to half length). Every candidate runs once per round in a rotating
order, in one process, so machine noise hits all alike; the table shows medians and the median
of per-round ratios. Goal: headwise at least as fast as HF sdpa (ratio ``sdpa/this >= 1``).

    python benchmarks/bert.py [--batch 32] [--seq 128] [--budget 40] [--random-weights]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402


def interleave(fns: dict, *, warmup: int = 2, min_rounds: int = 5, max_rounds: int = 60,
               budget_s: float = 40.0) -> dict:
    """Run every candidate once per round (rotating order); name -> list of seconds."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    start, r = time.perf_counter(), 0
    while r < max_rounds:
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
        r += 1
        if r >= min_rounds and time.perf_counter() - start >= budget_s:
            break
    return times


def ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a / b."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def build(random_weights: bool):
    import transformers

    from headwise.pretrained import find_minilm, load_bert, to_hf_state_dict
    transformers.logging.set_verbosity_error()
    if random_weights:  # same sizes, no checkpoint needed
        from headwise.models.bert import BertConfig, BertModel
        torch.manual_seed(0)
        ours = BertModel(BertConfig(30522, d_model=384, num_heads=12, num_layers=6,
                                    d_ff=1536)).eval()
        hf_config = transformers.BertConfig(hidden_size=384, num_attention_heads=12,
                                            num_hidden_layers=6, intermediate_size=1536)
        hf = {}
        for impl in ("eager", "sdpa"):
            m = transformers.BertModel(hf_config)
            m.set_attn_implementation(impl)
            m.load_state_dict(to_hf_state_dict(ours), strict=True)
            hf[impl] = m.eval()
        return ours, hf, "random weights (MiniLM sizes)"
    folder = find_minilm()
    ours = load_bert(folder)
    hf = {impl: transformers.BertModel.from_pretrained(str(folder),
                                                       attn_implementation=impl).eval()
          for impl in ("eager", "sdpa")}
    return ours, hf, f"all-MiniLM-L6-v2 from {folder}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--budget", type=float, default=40.0, help="seconds per mask setting")
    ap.add_argument("--random-weights", action="store_true")
    args = ap.parse_args()
    import transformers

    ours, hf, source = build(args.random_weights)
    torch.manual_seed(1)
    ids = torch.randint(1000, 30000, (args.batch, args.seq))
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    mask[: args.batch // 4, args.seq // 2:] = 0

    with torch.no_grad():
        ref = hf["eager"](input_ids=ids, attention_mask=mask).last_hidden_state
        got, _ = ours(ids, mask)
    maxdiff = (ref - got)[mask.bool()].abs().max().item()

    rows = []
    for masked in (False, True):
        m = mask if masked else None
        fns = {
            "HF eager": lambda m=m: hf["eager"](input_ids=ids, attention_mask=m),
            "HF sdpa": lambda m=m: hf["sdpa"](input_ids=ids, attention_mask=m),
            "headwise": lambda m=m: ours(ids, m),
        }
        with torch.no_grad():
            times = interleave(fns, budget_s=args.budget)
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append((("padding mask" if masked else "no mask"), name, med * 1e3,
                         args.batch / med, ratio(times["HF eager"], ts),
                         ratio(times["HF sdpa"], ts), len(ts)))
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads; {source}")
    print(f"# batch {args.batch} x seq {args.seq}, no_grad; max|diff| headwise vs HF eager on "
          f"real tokens (padded batch): {maxdiff:.2e}")
    print("| mask | model | ms (median) | seq/s | HF eager / this | HF sdpa / this | rounds |")
    print("|---|---|---|---|---|---|---|")
    for mask_name, name, ms, sps, r_e, r_s, n in rows:
        print(f"| {mask_name} | {name} | {ms:.1f} | {sps:.1f} | {r_e:.3f} | {r_s:.3f} | {n} |")
    worst = min(row[5] for row in rows if row[1] == "headwise")  # HF sdpa / headwise
    verdict = "PASS" if worst >= 1.0 else "MISS"
    print(f"# goal: headwise at least as fast as HF sdpa in both settings: {verdict} "
          f"(worst HF sdpa / headwise = {worst:.3f})")


if __name__ == "__main__":
    main()
