"""Every head of a long document (headwise.long.profile) against the same forward without it.

Sections (each timed interleaved in this one process: forward alone, forward + profile, in
rotating order; ratios are medians of per-round ratios; peaks are the process's VmHWM during the
call, reset before it, with glibc's mmap threshold fixed so every large buffer is counted):

  smollm2    SmolLM2-135M (the project's GGUF through headwise.hf.load, fp32 and bf16, 1 and
             2 threads) at 2k / 4k / 8192 tokens of Austen: all 30 x 9 = 270 heads' block maps
             and statistics vs the forward with none (``logits_to_keep=1`` on both: the
             logits are no attention cost). Goals: time <= 1.5x, peak <= 1.1x + the maps' bytes,
             as the process's peak and as the peak above the RSS before the call (the model
             loaded), the harder of the two.
  eager      the bytes HF eager ``output_attentions`` and TransformerLens' pattern cache
             (``hook_attn_scores`` + ``hook_pattern``) would need at those lengths (from shapes;
             measured for HF eager at 1024 where it fits), against the profile's own bytes.
  synthetic  a Llama-shaped model (random weights, a few layers, GQA) at 32k tokens: the same
             two ratios.
  check      SmolLM2: 3 heads' maps and masses against a chunked float64 reference over the
             same q, k (``--check-n``, 8192 by default in the full run).
  view       the long-document view of SmolLM2 at 8192: file size, first paint in headless
             Chromium (offline), console errors and requests, a hostile token.
  classes    SmolLM2's streaming scores over Austen and retrieval scores from a needle prompt
             (``--classes-n`` tokens), the classes, and two checks printed PASS / FAIL: zeroing
             the 10 top retrieval heads lowers the needle answer's log-probability more than
             each of 5 draws of 10 random heads; restricting the 10 top streaming heads to
             sinks + window changes the loss less than each draw.

    python benchmarks/long.py            # everything
    python benchmarks/long.py --quick    # fp32, 2 threads, 8192 only; synthetic 1 layer; 1 round;
                                         # check and classes at 2048
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # before torch: every big buffer is an mmap
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
import _common as C  # noqa: E402
import headwise as hw  # noqa: E402
import headwise.hf  # noqa: E402,F401
from headwise.long import profile  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def peak_mb(fn) -> tuple[float, float, float]:
    """``(seconds, peak MiB of the process during fn, that peak above the RSS before it)``."""
    gc.collect()
    C.reset_peak()
    base = C.rss_mb()
    t0 = C.CLOCK()
    fn()
    seconds = C.CLOCK() - t0
    peak = C.rss_mb("VmHWM")
    return seconds, peak, peak - base


def austen_ids(tokenizer, n: int) -> torch.Tensor:
    from headwise.data.corpora import austen_text

    ids = tokenizer(austen_text()[:n * 8], add_special_tokens=False)["input_ids"][:n]
    assert len(ids) == n, f"the corpus gave {len(ids)} tokens, wanted {n}"
    return torch.tensor([ids])


def compare(forward, profiled, rounds: int) -> dict:
    """Interleaved rounds of ``forward`` and ``profiled`` (which returns the profile; it is
    dropped at once, so no call's peak holds another's result)."""
    got = {name: [] for name in ("forward", "profile", "pf", "pp", "af", "ap")}
    kept = {}
    for r in range(rounds):
        order = ("forward", "profile") if r % 2 == 0 else ("profile", "forward")
        for name in order:
            if name == "forward":
                t, m, above = peak_mb(forward)
                got["forward"].append(t), got["pf"].append(m), got["af"].append(above)
            else:
                t, m, above = peak_mb(lambda: kept.__setitem__("bytes", profiled().map_bytes))
                got["profile"].append(t), got["pp"].append(m), got["ap"].append(above)
    maps = kept["bytes"] / 2**20
    return {"fwd s": min(got["forward"]), "prof s": min(got["profile"]),
            "time x": C.ratio(got["profile"], got["forward"]),
            "fwd peak MiB": max(got["pf"]), "prof peak MiB": max(got["pp"]),
            "fwd above MiB": max(got["af"]), "prof above MiB": max(got["ap"]), "maps MiB": maps,
            "mem x less maps": (max(got["pp"]) - maps) / max(got["pf"]),
            "above x less maps": (max(got["ap"]) - maps) / max(got["af"])}


def smollm2_row(model, tok, n: int, rounds: int) -> dict:
    ids = austen_ids(tok, n)

    def fwd():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1)

    with torch.no_grad():
        fwd()  # warm
    return compare(torch.no_grad()(fwd), lambda: profile(model, ids, progress=False,
                                                         forward=fwd), rounds)


def smollm2_rows(args) -> list[dict]:
    rows = []
    for dname in args.dtypes:
        model, tok = hw.hf.load("smollm2", dtype=DTYPES[dname])
        for threads in args.threads:
            torch.set_num_threads(threads)
            C.set_clock("cpu" if threads == 1 else "wall")
            for n in args.n:
                r = smollm2_row(model, tok, n, args.rounds)
                rows.append({"dtype": dname, "threads": threads, "n": n, **r})
                print(f"  smollm2 {dname} t={threads} n={n}: {r['time x']:.2f}x time, "
                      f"{r['mem x less maps']:.3f}x peak, {r['above x less maps']:.2f}x above",
                      file=sys.stderr, flush=True)
    return rows


def eager_bytes(n: int, layers=30, heads=9) -> dict:
    one = layers * heads * n * n * 4
    return {"n": n, "HF eager output_attentions GiB": one / 2**30,
            "TransformerLens scores+pattern cache GiB": 2 * one / 2**30}


def synthetic(args) -> dict:
    from headwise.layers import AttentionConfig
    from headwise.models import LMConfig, TransformerLM

    torch.set_num_threads(max(args.threads))
    C.set_clock("wall")
    n = args.synthetic_n
    torch.manual_seed(0)
    config = LMConfig(vocab_size=1000, d_model=512, num_heads=8, num_layers=args.synthetic_layers,
                      d_ff=1024, max_len=n, positional="rope", norm="rms", ffn="glu",
                      activation="silu", bias=False,
                      attention=AttentionConfig(num_kv_heads=2, rope_theta=500000.0))
    model = TransformerLM(config).eval()
    ids = torch.randint(0, 1000, (1, n))
    fwd = torch.no_grad()(lambda: model(ids))
    r = compare(fwd, lambda: profile(model, ids, progress=False), args.rounds)
    return {"model": f"d=512, 8 heads / 2 kv, {args.synthetic_layers} layers", "n": n, **r}


def check(args, model, tok) -> list[dict]:
    """3 heads of one layer against float64 statistics of their whole weights (one head's
    ``(n, n)`` float64 at a time)."""
    sys.path.insert(0, str(HERE.parent))
    from tests.long import dense

    n, layer, heads = args.check_n, 15, [0, 4, 8]
    ids = austen_ids(tok, n)
    seen = {}

    def keep(module, q, k, mask, causal, scale, self_attention, softcap, sinks):
        if len(seen) == layer:
            g = q.shape[1] // k.shape[1]
            seen["qk"] = (q[:, heads], k[:, [x // g for x in heads]], scale, causal, mask)
        seen[len(seen)] = True

    fwd = lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1)  # noqa: E731
    with hw.observe.observing(hw.observe.Observer(softmax=keep)), torch.no_grad():
        fwd()
    p = profile(model, ids, layers=[layer], heads=heads, progress=False, forward=fwd,
                dtype=torch.float64)
    q, k, scale, causal, mask = seen["qk"]
    assert mask is None and causal, "SmolLM2 on headwise: plain causal, no mask"
    rows = []
    for x, head in enumerate(heads):
        w, allowed, s = dense.probabilities(q[:, x:x + 1], k[:, x:x + 1], causal=True,
                                            scale=scale)
        want = dense.statistics(w, allowed, s, block=p.block, sinks=p.sinks, window=p.window,
                                far=1000, top_k=8)
        err = {name: (got[0, x].double() - want[name][0]).abs().max().item() for name, got in
               (("maps", p.maps), ("distance", p.distance), ("sink", p.sink),
                ("local", p.local), ("far", p.scores["far"]), ("topk_mass", p.topk_mass))}
        rel = ((p.received[0, x].double() - want["received"][0]).abs()
               / want["received"][0].clamp(min=1)).max().item()
        rows.append({"layer.head": f"{layer}.{head}", "n": n,
                     **{f"max abs {k}": v for k, v in err.items()}, "received rel": rel})
        del w, allowed, s
    return rows


def view(args, model, tok) -> dict:
    """The long view of SmolLM2 at 8192 (the last 64 rows' exact tiles): size, first paint."""
    from headwise.viz import long_view

    n = 8192
    ids = austen_ids(tok, n)
    tokens = [tok.decode([x]) for x in ids[0].tolist()]
    tokens[100] = '<img src=x onerror="window.__pwned=1">'  # a hostile token: must stay text
    rows = list(range(n - 64, n))
    fwd = lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1)  # noqa: E731
    with hw.hf.weights(model, {"rows": rows}) as got:
        p = profile(model, ids, tokens=tokens, progress=False, forward=fwd)
    path = Path(tempfile.mkdtemp(prefix="headwise-long-")) / "long.html"
    t0 = time.perf_counter()
    long_view(p, path, tiles={"last 64": (rows, [got[x][0].float().numpy() for x in
                                                 range(len(p.layers))])})
    out = {"n": n, "write s": time.perf_counter() - t0, "MB": path.stat().st_size / 1e6}
    return out | paint(path)


def paint(path: Path) -> dict:
    from playwright.sync_api import sync_playwright

    from head_view import ARGS, CHROMIUM

    errors, requests = [], []
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(tempfile.mkdtemp(), executable_path=CHROMIUM,
                                                    headless=True, args=ARGS, offline=True,
                                                    viewport={"width": 1400, "height": 900})
        page = ctx.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("request", lambda r: requests.append(r.url))
        page.goto(path.resolve().as_uri(), wait_until="load", timeout=120_000)
        page.evaluate("window.headwiseLong.ready")
        marks = page.evaluate("""() => {
            const p = Object.fromEntries(performance.getEntriesByType('paint').map(
                e => [e.name, e.startTime]));
            return {fcp: p['first-contentful-paint'], pwned: window.__pwned === 1}; }""")
        ctx.close()
    return {"first paint ms": marks["fcp"], "console errors": len(errors),
            "requests besides the file": len([u for u in requests if not u.startswith("file:")]),
            "hostile token ran": marks["pwned"]}


def head_classes(args, model, tok) -> None:
    """Streaming scores over Austen, retrieval scores from a needle prompt, the classes, and
    whether they mean what they say (ablation / restriction against random heads)."""
    import random

    from headwise.long import restrict, retrieval

    n = args.classes_n
    ids = austen_ids(tok, n)
    prof = profile(model, ids, progress=False,
                   forward=lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))
    rprof, needle = retrieval(model, tok, n=n, seed=1)
    stream, retr = prof.scores["streaming"], rprof.scores["retrieval"]
    found = prof.classes(retr)
    print(f"\n## Head classes of SmolLM2 ({n:,} tokens of Austen; needle {needle.passkey} at "
          f"token {needle.key[0]:,} of {needle.ids.shape[1]:,})\n")
    heads = [(la, hd) for la in range(stream.shape[0]) for hd in range(stream.shape[1])]
    top_s = sorted(heads, key=lambda x: -stream[x].item())[:10]
    top_r = sorted(heads, key=lambda x: -retr[x].item())[:10]
    rows = [{"rank": k + 1, "streaming head": f"{a[0]}.{a[1]}", "streaming": stream[a].item(),
             "its retrieval": retr[a].item(), "retrieval head": f"{b[0]}.{b[1]}",
             "retrieval": retr[b].item(), "its streaming": stream[b].item()}
            for k, (a, b) in enumerate(zip(top_s, top_r, strict=True))]
    print(C.table(rows, list(rows[0])))
    counts = {name: int((found["heads"] == c).sum()) for c, name in
              ((0, "full"), (1, "streaming"), (2, "retrieval"))}
    groups = {name: int((found["groups"] == c).sum()) for c, name in
              ((0, "full"), (1, "streaming"), (2, "retrieval"))}
    print(f"\nclasses (streaming >= 0.9, retrieval >= 0.1): heads {counts}, kv groups {groups}")
    draws = [random.Random(d).sample(heads, 10) for d in range(5)]
    as_spec = lambda hs: {la: [hd for x, hd in hs if x == la] for la in {x for x, _ in hs}}  # noqa: E731

    def needle_logp() -> float:
        with torch.no_grad():
            logits = model(input_ids=needle.ids, use_cache=False).logits[0, needle.rows]
        lp = torch.log_softmax(logits.float(), -1)
        return lp.gather(-1, torch.tensor(needle.answer)[:, None]).mean().item()

    def ablated(hs) -> float:
        with hw.ablate(model, {"layers": as_spec(hs)}):
            return needle_logp()

    def loss() -> float:
        with torch.no_grad():
            return model(input_ids=ids, labels=ids, use_cache=False).loss.item()

    def restricted(hs) -> float:
        with restrict(model, as_spec(hs), sinks=prof.sinks, window=prof.window):
            return loss()

    base, base_loss = needle_logp(), loss()
    drop_top = base - ablated(top_r)
    drops = [base - ablated(d) for d in draws]
    change_top = abs(restricted(top_s) - base_loss)
    changes = [abs(restricted(d) - base_loss) for d in draws]
    print(f"needle answer mean log-prob {base:.3f}: zeroing the 10 top retrieval heads drops it "
          f"by {drop_top:.3f}, 10 random heads by " + ", ".join(f"{x:.3f}" for x in drops))
    print(f"loss {base_loss:.4f}: restricting the 10 top streaming heads to sinks {prof.sinks} + "
          f"window {prof.window} changes it by {change_top:.4f}, 10 random heads by "
          + ", ".join(f"{x:.4f}" for x in changes))
    verdict = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    print(f"goal retrieval heads matter: drop {drop_top:.3f} > every random draw's "
          f"(max {max(drops):.3f}): {verdict(drop_top > max(drops))}")
    print(f"goal streaming heads need only sinks + window: change {change_top:.4f} < every "
          f"random draw's (min {min(changes):.4f}): {verdict(change_top < min(changes))}")


COLUMNS = ["fwd s", "prof s", "time x", "fwd peak MiB", "prof peak MiB", "fwd above MiB",
           "prof above MiB", "maps MiB", "mem x less maps", "above x less maps"]


def goals(tag: str, r: dict) -> None:
    print(goal(f"time ratio {tag}", r["time x"], 1.5))
    print(goal(f"process peak ratio less the maps {tag}", r["mem x less maps"], 1.1))
    print(goal(f"peak above the model ratio less the maps {tag}", r["above x less maps"], 1.1))


def goal(name: str, value: float, bound: float) -> str:
    return f"goal {name}: {value:.3g} <= {bound:g}: {'PASS' if value <= bound else 'FAIL'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--synthetic-n", type=int, default=32768)
    ap.add_argument("--synthetic-layers", type=int, default=2)
    ap.add_argument("--check-n", type=int, default=8192)
    ap.add_argument("--classes-n", type=int, default=8192)
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["smollm2", "synthetic", "check", "view", "classes"])
    args = ap.parse_args()
    if args.quick:
        args.n, args.dtypes, args.threads, args.rounds = [8192], ["fp32"], [2], 1
        args.synthetic_layers, args.check_n, args.classes_n = 1, 2048, 2048
    print(f"headwise.long.profile vs the same forward without it, {args.rounds} interleaved "
          f"round(s); peaks are the process's VmHWM (MiB) during the call")
    if "smollm2" not in args.skip:
        rows = smollm2_rows(args)
        print("\n## SmolLM2-135M, all 270 heads (maps + statistics), logits_to_keep=1\n")
        print(C.table(rows, ["dtype", "threads", "n", *COLUMNS]))
        for r in rows:
            goals(f"{r['dtype']} t={r['threads']} n={r['n']}", r)
    print("\n## What the dense weights would need (from shapes; SmolLM2: 30 layers x 9 heads)\n")
    print(C.table([eager_bytes(n) for n in (1024, 2048, 4096, 8192)],
                  ["n", "HF eager output_attentions GiB",
                   "TransformerLens scores+pattern cache GiB"]))
    if "synthetic" not in args.skip:
        r = synthetic(args)
        print(f"\n## Synthetic Llama-shaped model at {r['n']:,} tokens ({r['model']})\n")
        print(C.table([r], ["n", *COLUMNS]))
        goals(f"synthetic n={r['n']}", r)
    if {"check", "view", "classes"} - set(args.skip):
        torch.set_num_threads(max(args.threads))
        model, tok = hw.hf.load("smollm2")
    if "check" not in args.skip:
        rows = check(args, model, tok)
        print("\n## SmolLM2, 3 heads of layer 15 vs float64 dense statistics\n")
        print(C.table(rows, list(rows[0])))
        worst = max(v for r in rows for k, v in r.items() if k.startswith("max abs"))
        print(goal(f"max abs error of masses at n={args.check_n}", worst, 1e-6))
    if "view" not in args.skip:
        r = view(args, model, tok)
        print("\n## The long-document view of SmolLM2 at 8192 tokens (last 64 rows exact)\n")
        print(C.table([r], list(r)))
        print(goal("view file size MB", r["MB"], 25))
        print(goal("view first paint ms", r["first paint ms"], 3000))
        print(goal("view console errors + requests + hostile token run",
                   r["console errors"] + r["requests besides the file"] + r["hostile token ran"],
                   0))
    if "classes" not in args.skip:
        head_classes(args, model, tok)


if __name__ == "__main__":
    main()
