"""Head view at 1024 tokens: file size and time to first paint in headless Chromium.

    .venv/bin/python benchmarks/head_view.py [--rounds 3] [--big]

For 1024 tokens x 6 layers x 8 heads (one example, plus rollout) it writes head views of three
kinds of attention -- peaky causal (logits N(0, 3^2), like a trained decoder), medium (N(0, 2^2))
and flat (N(0, 1): nearly uniform, the worst case for compression) -- and measures:

- file size, against two anchors computed in this process: the raw float32 weights, and the
  JSON BertViz embeds (``tensor.tolist()`` of every weight; measured on one head and scaled);
- in headless Chromium (file://, offline), in interleaved rounds, medians of:
  first contentful paint, ``headwise-grid`` (model view drawn, before the weight blocks are
  parsed), ``headwise-data`` (whole file parsed), ``headwise-ready`` (detail view drawn), and
  the time of one hover redraw (all 8 heads x 1024 keys) and of the 1024 x 1024 matrix view.

Bounds it checks (this 2-core box; stated so a regression is visible): file < 40 MB, first
contentful paint < 1.5 s, detail view ready < 5 s, one hover redraw < 100 ms.
``--big`` adds 12 layers x 12 heads at 1024 tokens (responsiveness only; no size bound).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from headwise.viz import head_view

CHROMIUM = os.environ.get("HEADWISE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
BOUNDS = {"size_mb": 40.0, "fcp_ms": 1500.0, "ready_ms": 5000.0, "hover_ms": 100.0}


def attention(layers, heads, n, scale, causal, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        x = torch.randn(1, heads, n, n, generator=g) * scale
        if causal:
            x = x.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        out.append(x.softmax(-1))
    return out


def bertviz_json_mb(layers) -> float:
    """Size of the JSON BertViz would embed: every weight via .tolist(); one head measured."""
    one = len(json.dumps(layers[0][0, 0].tolist()))
    return one * sum(w.shape[1] for w in layers) / 1e6


def measure(context, path: Path) -> dict:
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    t0 = time.perf_counter()
    page.goto(path.resolve().as_uri(), wait_until="load", timeout=120_000)
    page.evaluate("window.headwise.ready")  # (wait_for_function would need eval, which the CSP forbids)
    wall = (time.perf_counter() - t0) * 1e3
    marks = page.evaluate("""() => {
        const m = Object.fromEntries(performance.getEntriesByType('mark').map(e => [e.name, e.startTime]));
        const p = Object.fromEntries(performance.getEntriesByType('paint').map(e => [e.name, e.startTime]));
        return {fcp: p['first-contentful-paint'], grid: m['headwise-grid'],
                data: m['headwise-data'], ready: m['headwise-ready']}; }""")
    hover = page.evaluate("""async () => {
        const hw = window.headwise, t = [];
        for (let i = 0; i < 15; i++) { const s = performance.now();
          hw.setHover('q', 300 + 41 * i); t.push(performance.now() - s); }
        t.sort((a, b) => a - b); return t[7]; }""")
    matrix = page.evaluate("""async () => {
        const s = performance.now(); window.headwise.setTab('matrix');
        await new Promise(r => requestAnimationFrame(r));
        while (!window.headwise.lastDraw.matrix) await new Promise(r => setTimeout(r, 5));
        return performance.now() - s; }""")
    page.close()
    if errors:
        raise RuntimeError(f"{path.name}: page errors {errors}")
    return {**marks, "wall": wall, "hover": hover, "matrix": matrix}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="also 12 layers x 12 heads")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    n = 1024
    cases = [("peaky causal σ=3", 6, 8, 3.0, True), ("medium σ=2", 6, 8, 2.0, False),
             ("flat σ=1 (worst)", 6, 8, 1.0, False)]
    if args.big:
        cases.append(("12x12 peaky causal σ=3", 12, 12, 3.0, True))
    tmp = Path(tempfile.mkdtemp(prefix="headwise-bench-"))
    files = {}
    print(f"writing {len(cases)} head views of {n} tokens ...", flush=True)
    for name, layers, heads, scale, causal in cases:
        att = attention(layers, heads, n, scale, causal)
        t = time.perf_counter()
        path = head_view({"decoder_self" if causal else "encoder_self": att},
                         [f"tok{i}" for i in range(n)], tmp / f"{len(files)}.html").path
        write_s = time.perf_counter() - t
        text = path.read_text()
        levels = json.loads(text.split('id="hw-meta">', 1)[1].split("</script>", 1)[0])["levels"]
        files[name] = dict(path=path, layers=layers, heads=heads, write_s=write_s, levels=levels,
                           mb=path.stat().st_size / 1e6, raw_mb=layers * heads * n * n * 4 / 1e6,
                           json_mb=bertviz_json_mb(att), runs=[])
        del att, text

    profile = tempfile.mkdtemp(prefix="headwise-bench-profile-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS, offline=True,
            viewport={"width": 1400, "height": 900})
        for r in range(args.rounds):  # interleaved: every file once per round
            for f in files.values():
                f["runs"].append(measure(context, f["path"]))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        version = context.browser.version if context.browser else "chromium"
        context.close()

    med = lambda f, k: statistics.median(run[k] for run in f["runs"])  # noqa: E731
    print(f"\nhead view, {n} tokens, headless {version} (file://, offline), 2-core CPU, "
          f"median of {args.rounds} interleaved rounds")
    head = (f"{'case':<24}{'L x H':>7}{'file MB':>9}{'levels':>7}{'/ f32':>7}{'/ JSON':>8}"
            f"{'write s':>8}{'FCP ms':>8}{'grid ms':>8}{'parsed':>8}{'ready ms':>9}"
            f"{'hover ms':>9}{'matrix ms':>10}")
    print(head)
    print("-" * len(head))
    failures = []
    for name, f in files.items():
        row = {k: med(f, k) for k in ("fcp", "grid", "data", "ready", "hover", "matrix")}
        print(f"{name:<24}{f['layers']:>3} x {f['heads']:<2}{f['mb']:>8.1f}{f['levels']:>7}"
              f"{f['mb'] / f['raw_mb']:>7.2f}{f['mb'] / f['json_mb']:>8.3f}{f['write_s']:>8.1f}"
              f"{row['fcp']:>8.0f}{row['grid']:>8.0f}{row['data']:>8.0f}{row['ready']:>9.0f}"
              f"{row['hover']:>9.1f}{row['matrix']:>10.0f}")
        checks = [("ready_ms", row["ready"]), ("fcp_ms", row["fcp"]), ("hover_ms", row["hover"])]
        if f["layers"] * f["heads"] <= 48:
            checks.append(("size_mb", f["mb"]))
        failures += [f"{name}: {k} {v:.1f} > {BOUNDS[k]}" for k, v in checks if v > BOUNDS[k]]
    print(f"\nanchors: raw float32 weights {files[next(iter(files))]['raw_mb']:.0f} MB and BertViz-"
          f"style JSON {files[next(iter(files))]['json_mb']:.0f} MB for 6 x 8 heads; '/ f32' and "
          "'/ JSON' are our file size divided by them.")
    print("bounds: " + ", ".join(f"{k} < {v:g}" for k, v in BOUNDS.items())
          + " (size bound for <= 48 heads).")
    print("all bounds met" if not failures else "BOUNDS MISSED: " + "; ".join(failures))


if __name__ == "__main__":
    main()
