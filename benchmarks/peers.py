"""headwise against the tools a user would pick instead, on the same model and text in one run:
SmolLM2-135M-Instruct loaded by transformers from its GGUF (dequantized to float32, written
once as a float32 copy that every child loads), real text (the start of Jane Austen's novels,
:func:`headwise.data.corpora.austen_text`) at 512 and 2048 tokens, CPU, 1 thread, CPU time.

Tools: headwise (``headwise.hf.weights`` selections, ``output_attentions`` from the fused
kernel's log-sum-exp, ``hw.stats.collect``, ``hw.record_heads``, ``headwise.hf.head_view``),
headwise's TransformerLens-style cache (``hw.run_with_cache``, where the build has it),
transformers' own eager ``output_attentions``, and the peers, each in an environment of its own
that ``make peers`` builds (never headwise's dependencies): TransformerLens 4.3.0
(TransformerBridge, ``run_with_cache`` with a ``names_filter``; also with ``stop_at_layer``),
nnsight 0.8.1 (``trace`` saving ``self_attn.output[1]``), attnread 0.1.2 (identity-value passes
on sdpa; in ``.peers-attnread/``, its pins differing from nnsight 0.8's), bertviz 1.4.1 (its
head-view page).

Cells (layer 15, head 3 where one is named): ``forward`` the tool's plain forward, no weights;
``head`` one head's pattern; ``head@stop`` the same, stopping after that layer; ``layers``
every layer's patterns; ``stats`` each head's entropy / max weight / sink mass; ``z`` the
per-head outputs of layer 15 (the input of ``o_proj``); ``hooks`` every TransformerLens hook of
every layer except the patterns and scores; ``view`` a head view of 512 tokens; ``decode``
one head's pattern for each of 32 tokens generated after a 64-token prompt.

Each (tool, cell, length) runs in a fresh process (``_peers_cells.py``), rounds interleaved
with the order rotating. In it: the floor (one forward of a plain transformers model on sdpa,
no weights; for ``decode`` its ``generate``), then the cell, each after resetting VmHWM, so
both peaks are above the loaded models; more floor/cell pairs, the order alternating, within
``--budget`` CPU seconds; then max |diff| against HF eager ``output_attentions`` on the same
model. ``x floor`` is the median over processes of each one's median cell / floor. A cell over
``--slow`` seconds (attnread's every head, bertviz's page) runs in one round and not at longer
lengths. A cell a tool cannot run offline says why in one line, under the table.

    make peers                                   # the peers' environments (minutes, once)
    python benchmarks/peers.py [--seqs 512 2048] [--rounds 3] [--tools ...] [--quick]

``--quick``: 512 tokens, 1 round (about 15 minutes on a busy 2-core box, most of it attnread's
and bertviz's cells); the full run, both lengths and 3 rounds, is for a quiet machine. Without ``.peers/`` the peers' rows say so and headwise's
and HF's still run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common as C  # noqa: E402
import _peers_cells as P  # noqa: E402

ROOT = HERE.parent
# tool -> the environment (relative to the checkout; None: this interpreter's)
ENVS = {"headwise": None, "headwise cache": None, "HF eager": None, "TransformerLens": ".peers", "nnsight": ".peers",
        "bertviz": ".peers", "attnread": ".peers-attnread"}
GOALS = {"head": 1.05, "head_peak": 1.2, "hooks": 1.15, "layers": 0.55, "decode": 1.2}
COLS = ["n", "cell", "tool", "s", "floor s", "x floor", "peak MiB", "floor peak MiB",
        "returned MiB", "max |diff|", "note"]


def python_for(tool: str) -> tuple[str | None, str]:
    """(interpreter, "") or (None, why not)."""
    env = ENVS[tool]
    if env is None:
        return sys.executable, ""
    exe = ROOT / env / "bin" / "python"
    return (str(exe), "") if exe.exists() else (None, f"not run: {env}/ absent (make peers)")


def prepare(directory: str, n_max: int) -> str:
    """The float32 copy of SmolLM2 (from its GGUF) and its tokenizer in ``directory``; the ids
    of the start of Austen's text (``n_max`` tokens) in a JSON file there; returns its path."""
    import transformers

    from headwise.data.corpora import austen_text
    from headwise.pretrained.gguf import find_smollm2
    from hf import float32_copy, load

    path = find_smollm2()
    float32_copy(load(), directory)
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok.save_pretrained(directory)
    ids = tok(austen_text()[: 20 * n_max])["input_ids"][:n_max]
    if len(ids) < n_max:
        raise SystemExit(f"peers.py: the corpus gave {len(ids)} tokens, need {n_max}")
    ids_file = os.path.join(directory, "ids.json")
    with open(ids_file, "w") as f:
        json.dump(ids, f)
    return ids_file


def run_child(tool: str, cell: str, n: int, model_dir: str, ids_file: str,
              timeout: float, budget: float = 20.0) -> dict:
    exe, why = python_for(tool)
    if exe is None:
        return {"why": why}
    spec = {"tool": tool, "cell": cell, "n": n, "model_dir": model_dir, "ids_file": ids_file,
            "budget": budget}
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if ENVS[tool] is not None:
        env.pop("PYTHONPATH", None)  # the peers' environments never see headwise
    try:
        out = subprocess.run([exe, str(HERE / "_peers_cells.py"), json.dumps(spec)],
                             capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"why": f"not run: over the {timeout:.0f} s limit"}
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"why": f"failed: {last[:150]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def jobs(tools, cells, seqs) -> list[tuple[str, str, int]]:
    return [(t, c, n) for n in seqs for c in cells for t in tools
            if P.TOOLS[t].lengths.get(c, n) == n
            and not (c == "view" and n != 512) and not (c == "decode" and n != seqs[0])]


def measure(tools, cells, seqs, rounds: int, timeout: float, budget: float,
            slow: float) -> dict:
    """(tool, cell, n) -> the list of each round's child result (or one ``{"why": ...}``). A
    cell that took over ``slow`` seconds runs in one round only, and not at longer lengths."""
    todo = jobs(tools, cells, seqs)
    got: dict = {}
    with tempfile.TemporaryDirectory() as model_dir:
        ids_file = prepare(model_dir, max(seqs))
        for r in range(rounds):
            for key in todo[r % len(todo):] + todo[:r % len(todo)]:
                if key in got and ("why" in got[key][0] or got[key][0]["s"] > slow):
                    continue
                why = P.supported(key[0], key[1]) or _too_slow(got, key, slow)
                res = {"why": why} if why else run_child(*key, model_dir, ids_file, timeout,
                                                          budget)
                print(f"# {key}: {res}", file=sys.stderr, flush=True)
                got.setdefault(key, []).append(res)
    return got


def _too_slow(got: dict, key: tuple, slow: float) -> str:
    tool, cell, n = key
    for (t, c, m), runs in got.items():
        if (t, c) == (tool, cell) and m < n and "s" in runs[0] and runs[0]["s"] > slow:
            return (f"not run: {runs[0]['s']:.0f} s at n={m} ({runs[0]['ratio']:.0f}x floor), "
                    f"over --slow {slow:.0f} s")
    return ""


def rows_of(got: dict) -> list[dict]:
    rows = []
    for (tool, cell, n), runs in got.items():
        row = {"n": n, "cell": cell, "tool": tool}
        if "why" in runs[0]:
            rows.append({**row, "note": runs[0]["why"]})
            continue
        med = lambda k, runs=runs: statistics.median(r[k] for r in runs)  # noqa: E731
        row.update({"s": med("s"), "floor s": med("floor_s"),
                    "x floor": statistics.median(r["ratio"] for r in runs),
                    "peak MiB": med("peak"), "floor peak MiB": med("floor_peak"),
                    "returned MiB": med("returned"),
                    "max |diff|": "—" if runs[0]["diff"] is None else f"{runs[0]['diff']:.1e}"})
        if runs[0]["n"] != n:
            row["note"] = f"{runs[0]['n']}-token prompt"
        rows.append(row)
    return sorted(rows, key=lambda r: (r["n"], P.CELLS.index(r["cell"]), list(ENVS).index(
        r["tool"]) if r["tool"] in ENVS else 99))


def goals(rows: list[dict]) -> list[str]:
    """The issue's goal lines, at each length measured."""
    at = {(r["tool"], r["cell"], r["n"]): r for r in rows if "x floor" in r}
    lines = []
    cache = "headwise cache" if any(k[0] == "headwise cache" for k in at) else "headwise"
    via = "the cache" if cache == "headwise cache" else "headwise.hf.weights (no cache yet)"
    for n in sorted({r["n"] for r in rows}):
        one = at.get((cache, "head", n))
        if one:
            ok_t = one["x floor"] <= GOALS["head"]
            room = one["floor peak MiB"] + GOALS["head_peak"] * one["returned MiB"]
            ok_m = one["peak MiB"] <= room
            lines.append(f"goal one head via {via}, n={n}: {one['x floor']:.2f}x floor "
                         f"(<= {GOALS['head']}), peak {one['peak MiB']:.0f} MiB (<= "
                         f"{room:.0f}): {'PASS' if ok_t and ok_m else 'FAIL'}")
        hooks = at.get((cache, "hooks", n))
        lines.append(f"goal every TL hook but patterns, n={n}: " + (
            f"{hooks['x floor']:.2f}x floor (<= {GOALS['hooks']}): "
            f"{'PASS' if hooks['x floor'] <= GOALS['hooks'] else 'FAIL'}" if hooks else
            "not measured (no hw.run_with_cache in this build): FAIL"))
        mine, eager = at.get(("headwise", "layers", n)), at.get(("HF eager", "layers", n))
        if mine and eager:
            x = mine["x floor"] / eager["x floor"]
            lines.append(f"goal every layer's patterns, n={n}: {x:.2f}x HF eager's time "
                         f"(<= {GOALS['layers']}): {'PASS' if x <= GOALS['layers'] else 'FAIL'}")
    dec = next((r for k, r in at.items() if k[:2] == (cache, "decode")), None)
    if dec:
        lines.append(f"goal one head's pattern per generated token: {dec['x floor']:.2f}x plain "
                     f"decoding (<= {GOALS['decode']}): "
                     f"{'PASS' if dec['x floor'] <= GOALS['decode'] else 'FAIL'}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tools", nargs="+", choices=list(P.TOOLS), default=list(P.TOOLS))
    p.add_argument("--cells", nargs="+", choices=P.CELLS, default=list(P.CELLS))
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    p.add_argument("--budget", type=float, default=20.0,
                   help="CPU seconds of interleaved floor/cell rounds in each child (<= 5)")
    p.add_argument("--slow", type=float, default=120.0,
                   help="a cell over this many seconds runs once, and not at longer lengths")
    p.add_argument("--quick", action="store_true", help="512 tokens, 1 round")
    args = p.parse_args()
    if args.quick:
        args.seqs, args.rounds = [512], 1
    got = measure(args.tools, args.cells, sorted(args.seqs), args.rounds, args.timeout,
                  args.budget, args.slow)
    rows = rows_of(got)
    measured = [r for r in rows if "x floor" in r or r.get("note", "").startswith(
        ("not run", "failed"))]
    print(f"SmolLM2-135M-Instruct (float32 from its GGUF), Austen text, CPU, 1 thread, CPU time; "
          f"{args.rounds} round(s), one fresh process per cell; floor: plain transformers sdpa "
          "forward (decode: generate), no weights; peaks above the loaded models; max |diff| "
          "against HF eager output_attentions\n")
    print(C.table(measured, COLS))
    print("\nWhat a tool cannot do here (cells: why)")
    for tool in args.tools:
        cannot: dict[str, list[str]] = {}  # why -> the cells it stops
        for r in rows:
            if r["tool"] == tool and r not in measured:
                cannot.setdefault(r["note"], []).append(r["cell"])
        if cannot:
            print(f"- {tool}: " + "; ".join(f"{', '.join(dict.fromkeys(c))}: {why}"
                                           for why, c in cannot.items()))
    print()
    print("\n".join(goals(rows)))


if __name__ == "__main__":
    main()
