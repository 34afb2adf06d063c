"""``headwise demo`` (``make demo``): train an encoder-decoder Transformer to reverse strings,
show that it learned (held-out exact match, greedy translations, the anti-diagonal its
cross-attention must discover), and write a report folder to look inside it.

``headwise-demo/``:
  ``checkpoint/``       the trained model (safetensors + JSON; ``headwise view --checkpoint``)
  ``metrics.json``      final held-out metrics and the evaluation history; ``log.jsonl``
  ``demo.json``         examples, per-head mirror scores, timings
  ``catalogue.html`` / ``catalogue.json``  every head over held-out strings, as ``headwise heads
                        catalogue --checkpoint`` writes it: its ``mirror`` score (mean weight on
                        the mirrored key) names the mirror head the demo prints
  ``head_view.html``    the interactive head view (offline), a few held-out examples
  ``cross_attention.png`` / ``decoder_self_attention.png`` / ``encoder_self_attention.png``
  ``importance.json`` / ``importance.png``  every head's importance: greedy zero ablation (also on the head view)
  ``trace.txt`` / ``trace.md``  the named-axis shape trace of one forward pass
  ``README.md``         what is where, with the numbers
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.commands import _flags as F
from headwise.commands._common import MIRROR, mirror_head
from headwise.commands._flags import flag

if TYPE_CHECKING:  # imported when the demo runs: `headwise demo --help` stays fast
    import torch

DEFAULT_STEPS = 1000
HELP = "the main job: train a Transformer to reverse strings and look inside it"
EXAMPLE = "headwise demo --out headwise-demo"


FLAGS = (
    flag("--out", default="headwise-demo", help="report folder (default headwise-demo)"),
    flag("--steps", type=int, default=DEFAULT_STEPS, help="training steps"),
    F.SEED,
    F.DEVICE.but(default="auto", help="auto, cpu, cuda, cuda:N"),
    flag("--precision", default="fp32", choices=("auto", "fp32", "bf16"),
         help="fp32 by default: at d_model 64 bf16 casts cost more than they save"),
    F.THREADS.but(default=1, help="CPU threads (default 1: a model this small gains nothing "
                                  "from more)"),
    F.QUIET,
)


def register(subparsers) -> None:
    F.parser(subparsers, "demo", "Train an encoder-decoder Transformer on `reverse` (about two "
             "minutes on 2 CPU cores), print what it learned, write a report folder.", FLAGS, run)


def demo_config(steps: int = DEFAULT_STEPS, seed: int = 0, **runtime):
    """The demo's training run: a 2+2-layer, 4-head, d_model-64 Transformer reversing strings
    of 4-16 letters over a 20-letter alphabet, batch 64, AdamW 3e-3 with warm-up + cosine."""
    from headwise.train import TrainConfig
    return TrainConfig(task="reverse", min_len=4, max_len=16, num_symbols=20,
                       model=dict(d_model=64, num_heads=4, num_layers=2, d_ff=256, dropout=0.0),
                       steps=steps, batch_size=64, lr=3e-3, warmup=min(100, steps // 10),
                       eval_every=max(1, steps // 5),
                       eval_size=1000, checkpoint_every=0, seed=seed, **runtime)


def mirror_scores(model, batch) -> torch.Tensor:
    """``(layers, heads)``: for each cross-attention head, the fraction of target positions
    whose largest weight is on the mirrored source position.

    Decoder position ``t`` (input ``<bos>``/``y[t-1]``) predicts ``y[t] = x[L-1-t]``, so a head
    that looks up the right source symbol attends from ``t`` to ``L-1-t``: the anti-diagonal.
    The ``<eos>`` position is left out."""
    import torch

    with torch.no_grad():
        _, att = model(batch.src, batch.tgt_in, src_valid_lens=batch.src_lens,
                       return_weights={"cross": True})
    cross = torch.stack(att["cross"])  # (layers, b, h, i, j)
    hits = torch.zeros(cross.shape[0], cross.shape[2])
    total = 0
    for k, n in enumerate(batch.src_lens.tolist()):
        best = cross[:, k, :, :n, :n].argmax(-1)  # (layers, h, i)
        mirror = torch.arange(n - 1, -1, -1, device=best.device)
        hits += (best == mirror).sum(-1).float().cpu()
        total += n
    return hits / total


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from headwise.train import train

    console = Console()
    out = _demo_folder(Path(args.out))
    _introduce(console, args.precision)
    t0 = time.perf_counter()
    cfg = demo_config(args.steps, args.seed, device=args.device, precision=args.precision,
                      threads=args.threads)
    result = train(cfg, out=out, progress=not args.quiet)
    train_s = time.perf_counter() - t0
    model, task = result.model, result.task
    m = result.metrics
    heldout = task.eval_set(cfg.eval_size)
    device = next(model.parameters()).device

    examples = _examples(model, task, heldout, device)
    hits = mirror_scores(model, heldout.to(device))
    cat = _catalogue(model, task, device, out)
    best = mirror_head(cat)
    layer, head = best["layer"], best["head"]
    scores = cat.table(MIRROR)["cross"]  # (layers, heads)
    artefacts, grid = _artefacts(model, task, heldout, device, out, mirror=(layer, head))
    artefacts["catalogue"] = str(out / "catalogue.html")
    heads = which_heads(model, task, heldout, grid, device)
    n_params = sum(p.numel() for p in model.parameters())
    console.print(_examples_table(examples))
    console.print(_learned_table(cfg, result, scores, n_params))
    console.print(f"The mirror head (mirror score: {cat.meta['scores'][MIRROR]}, over "
                  f"{cat.meta['inputs']} held-out strings; the measure `headwise heads "
                  f"catalogue` ranks by): head {head} of decoder layer {layer}, "
                  f"{scores[layer, head]:.3f}; its "
                  f"largest cross-attention weight is on the mirrored source position for "
                  f"{hits[layer, head]:.1%} of target positions.")
    console.print(_mirror_heatmap(model, task, heldout, device, layer, head))
    console.print(f"Which heads matter ({heads['method']}): the most important is "
                  f"{heads['top']}; zeroing the {len(heads['least'])} least important "
                  f"({', '.join(heads['least'])}) leaves exact match "
                  f"{heads['exact_match_without']:.4f} on {heads['measured_on']} other held-out "
                  f"strings (all heads: {heads['exact_match_all']:.4f}).")

    summary = {"exact_match": m["exact_match"], "token_accuracy": m["token_accuracy"],
               "loss": m["loss"], "train_seconds": result.seconds, "total_seconds":
               time.perf_counter() - t0, "training_wall_seconds": train_s,
               "precision": result.precision, "steps": cfg.steps, "parameters": n_params,
               "mirror_scores": scores.tolist(), "mirror_measure": cat.meta["scores"][MIRROR],
               "mirror_hits": hits.tolist(), "best_mirror_head": [layer, head],
               "examples": examples, "artefacts": artefacts, "which_heads": heads}
    (out / "demo.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _readme(out, cfg, summary)
    console.print(f"\nreport: {out.resolve()}/ (README.md; open head_view.html in a browser; "
                  f"`headwise view --checkpoint {out}/checkpoint --src abcdef` for any string)")
    console.print(f"[bold]held-out exact match: {m['exact_match']:.4f}[/] "
                  f"({cfg.eval_size} strings never seen in training)")
    return 0


def _demo_folder(out: Path) -> Path:
    """``out``, refused when it is a file or a folder that is not a demo's; a new run's evaluation
    log starts empty."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; pass --out NEW_FOLDER")
    if out.exists() and not (out / "checkpoint").exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not a headwise demo folder; pass --out elsewhere")
    (out / "log.jsonl").unlink(missing_ok=True)
    return out


def _introduce(console, precision: str) -> None:
    console.rule("[bold]headwise demo: teach a Transformer to reverse strings")
    console.print("An encoder-decoder Transformer (headwise.models.Transformer) learns "
                  "x1 x2 ... xn -> xn ... x2 x1 from scratch; held-out strings are never seen "
                  "in training.\n")
    if precision == "fp32":
        console.print("fp32 on purpose: at d_model 64 the bf16 casts cost more than the bf16 "
                      "matrix units save (about 3x slower per step here); "
                      "`headwise train` defaults to bf16 where the hardware has it.")


def _examples_table(examples: list[dict]):
    from rich.table import Table

    table = Table(title="greedy decoding of held-out strings", title_justify="left")
    for col in ("source", "model output", "correct"):
        table.add_column(col)
    for ex in examples:
        table.add_row(ex["source"], ex["output"], "yes" if ex["correct"] else "[red]no")
    return table


def _learned_table(cfg, result, scores, n_params: int):
    """Training cost, held-out metrics and each cross-attention head's mirror hits (l, h)."""
    from rich.table import Table

    m = result.metrics
    learned = Table(title="what it learned", title_justify="left")
    learned.add_column("measure")
    learned.add_column("value", justify="right")
    learned.add_row("training", f"{cfg.steps} steps x {cfg.batch_size} strings, "
                    f"{result.seconds:.0f} s ({result.precision})")
    learned.add_row("parameters", f"{n_params:,}")
    learned.add_row("held-out loss / perplexity", f"{m['loss']:.4f} / {m['perplexity']:.4f}")
    learned.add_row("held-out token accuracy", f"{m['token_accuracy']:.4f}")
    learned.add_row("held-out exact match", f"{m['exact_match']:.4f} "
                    f"({round(m['exact_match'] * cfg.eval_size)}/{cfg.eval_size} strings)")
    for l in range(scores.shape[0]):
        learned.add_row(f"cross-attn layer {l}: mirror score per head",
                        "  ".join(f"H{h} {scores[l, h]:.2f}" for h in range(scores.shape[1])))
    return learned


def _examples(model, task, heldout, device, count: int = 6) -> list[dict]:
    from headwise.train.evaluate import greedy_decode, strip_special
    tok = task.tokenizer
    order = sorted(range(len(heldout)), key=lambda k: int(heldout.src_lens[k]))
    picks = [order[round(q * (len(order) - 1) / (count - 1))] for q in range(count)]
    src, lens = heldout.src[picks].to(device), heldout.src_lens[picks].to(device)
    out = greedy_decode(model, src, lens, bos_id=tok.bos_id, eos_id=tok.eos_id,
                        pad_id=tok.pad_id, max_new_tokens=heldout.tgt_out.shape[1])
    rows = []
    for k in range(len(picks)):
        source = tok.decode(src[k, :int(lens[k])].tolist())
        output = tok.decode(strip_special(out[k].tolist(), tok.eos_id, tok.pad_id))
        rows.append({"source": source, "output": output, "correct": output == source[::-1]})
    return rows


def _mirror_heatmap(model, task, heldout, device, layer: int, head: int):
    """The mirror head's cross-attention on one held-out string, drawn in the terminal."""
    import torch

    from headwise.viz.terminal import terminal_heatmap

    k = next(k for k in range(len(heldout)) if 6 <= int(heldout.src_lens[k]) <= 10)
    n, tok = int(heldout.src_lens[k]), task.tokenizer
    src, tgt = heldout.src[k:k + 1, :n].to(device), heldout.tgt_in[k:k + 1, :n + 1].to(device)
    with torch.no_grad():
        _, att = model(src, tgt, return_weights={"cross": [layer]})
    weights = att["cross"][layer][0, head]  # (i, j): target positions x source positions
    return terminal_heatmap(weights, tok.tokens(tgt[0].tolist()), tok.tokens(src[0].tolist()),
                            title=f"cross-attention of decoder layer {layer}, head {head} "
                                  f"(the anti-diagonal: target t looks at source n-1-t)")


def _artefacts(model, task, heldout, device, out: Path, mirror: tuple[int, int]) -> tuple:
    """Head view (opening on the mirror head's cross-attention), heatmaps and shape trace of a
    few held-out examples: ``(files written by name, the head scores the view shows)``."""
    import torch

    from headwise.kinds import CROSS, DECODER_SELF, ENCODER_SELF, KINDS
    from headwise.tracing import trace
    from headwise.viz import head_view, heatmaps

    tok = task.tokenizer
    picks = [k for k in range(len(heldout)) if 8 <= int(heldout.src_lens[k]) <= 12][:4]
    batch = type(heldout)(src=heldout.src[picks], src_lens=heldout.src_lens[picks],
                          tgt_in=heldout.tgt_in[picks], tgt_out=heldout.tgt_out[picks]).to(device)
    with torch.no_grad():
        _, att = model(batch.src, batch.tgt_in, src_valid_lens=batch.src_lens,
                       return_weights=True)
    src_tokens = [tok.tokens(batch.src[k, :int(n)].tolist())
                  for k, n in enumerate(batch.src_lens.tolist())]
    tgt_tokens = [tok.tokens(batch.tgt_in[k, :int(n) + 1].tolist())
                  for k, n in enumerate(batch.src_lens.tolist())]
    grid = _importance(model, heldout, device, out)
    files = {"head_view": str(head_view(
        att, {"src": src_tokens, "tgt": tgt_tokens}, out / "head_view.html",
        title="headwise demo: reverse", kind="cross", layer=mirror[0], head=mirror[1],
        importance=grid).path),
             "importance": str(out / "importance.json"),
             "importance_plot": str(out / "importance.png")}
    n = int(batch.src_lens[0])
    sides = {"src": (src_tokens[0], n), "tgt": (tgt_tokens[0], n + 1)}  # (tokens, length)
    for kind in (CROSS, DECODER_SELF, ENCODER_SELF):
        (q, i), (k, j) = (sides[side] for side in KINDS[kind].sides)
        weights = [w[0, :, :i, :j].float().cpu() for w in att[kind]]
        name = "cross_attention" if kind == "cross" else f"{kind}_attention"
        files[name] = str(heatmaps(weights, query_tokens=q, key_tokens=k,
                                   path=out / f"{name}.png",
                                   title=f"{kind} attention: {''.join(src_tokens[0])} -> "
                                         f"{''.join(src_tokens[0])[::-1]}").path)
    with torch.no_grad():
        tr = trace(model, batch.src[:1], batch.tgt_in[:1], src_valid_lens=batch.src_lens[:1])
    (out / "trace.txt").write_text(tr.render() + "\n", encoding="utf-8")
    (out / "trace.md").write_text(tr.to_markdown(), encoding="utf-8")
    files["trace"] = str(out / "trace.txt")
    return files, grid


def _catalogue(model, task, device, out: Path):
    """The catalogue ``headwise heads catalogue --checkpoint OUT/checkpoint`` writes, on the
    same held-out strings (its default ``--examples`` and ``--batch-size``), as
    ``catalogue.html`` and ``catalogue.json``: the mirror head is its, by one measure."""
    from headwise.analysis.catalogue import catalogue
    from headwise.commands._heads_catalogue import chunks

    default = {row.dest: row.options.get("default") for row in F.DATA}
    batches = chunks(task.eval_set(default["examples"]).to(device), default["batch_size"])
    cat = catalogue(model, batches, tokens=task.tokenizer.tokens, name=out.name,
                    dataset=f"task {task.name}, held-out set")
    cat.page(out / "catalogue.html", title=f"{out.name}: every head over held-out strings")
    cat.to_json(out / "catalogue.json")
    return cat


SCORED = 256  # held-out strings the heads are scored on; the rest measure what removing does
LEAST = 4  # the least important heads the demo removes


def _importance(model, heldout, device, out: Path):
    """Every head's importance by :func:`headwise.importance`'s default (greedy zero ablation)
    on the first :data:`SCORED` held-out strings, written as ``importance.json`` and
    ``importance.png`` (about a hundred forward passes of those strings: seconds)."""
    from headwise.analysis.scoring import importance

    grid = importance(model, _part(heldout, slice(0, SCORED)).to(device))
    grid.to_json(out / "importance.json")
    grid.plot(out / "importance.png", title=f"demo: head importance, {grid.method} (lower: "
                                            "zeroed earlier, matters less)")
    return grid


def _part(batch, rows: slice):
    return type(batch)(**{f: getattr(batch, f)[rows] for f in
                          ("src", "src_lens", "tgt_in", "tgt_out")})


def which_heads(model, task, heldout, grid, device) -> dict:
    """The most important head, and held-out exact match on the strings the scores never saw
    with all heads and with the :data:`LEAST` least important zeroed."""
    from headwise.analysis.ablation import ablate
    from headwise.analysis.removal import seq2seq_metrics

    measured = _part(heldout, slice(SCORED, None)).to(device)
    least = grid.least(LEAST)
    kind, layer, head, _ = grid.ranked()[0]
    exact = seq2seq_metrics(model, measured, task.tokenizer)["exact_match"]
    with ablate(model, least):
        without = seq2seq_metrics(model, measured, task.tokenizer)["exact_match"]
    return {"method": grid.describe(), "top": f"{kind} layer {layer} head {head}",
            "least": [f"{k} layer {l} head {h}" for k, per in least.items()
                      for l, hs in per.items() for h in hs],
            "exact_match_all": exact, "exact_match_without": without,
            "measured_on": len(measured.src)}


def _readme(out: Path, cfg, s: dict) -> None:
    layer, head = s["best_mirror_head"]
    lines = [
        "# headwise demo: a Transformer that reverses strings", "",
        f"Trained {cfg.steps} steps (batch {cfg.batch_size}) in {s['train_seconds']:.0f} s, "
        f"{s['precision']}, {s['parameters']:,} parameters.", "",
        "| held-out measure | value |", "|---|---|",
        f"| exact match ({cfg.eval_size} strings) | {s['exact_match']:.4f} |",
        f"| token accuracy | {s['token_accuracy']:.4f} |",
        f"| loss | {s['loss']:.4f} |",
        f"| mirror head (layer {layer}, head {head}): {s['mirror_measure']} | "
        f"{s['mirror_scores'][layer][head]:.3f} |", "",
        "| file | what |", "|---|---|",
        "| `checkpoint/` | the model: `headwise view --checkpoint checkpoint --src abcdef` |",
        "| `metrics.json`, `log.jsonl` | final metrics, evaluation history |",
        "| `demo.json` | examples, per-head mirror scores, timings |",
        "| `catalogue.html`, `catalogue.json` | every head's scores over 256 held-out strings "
        "(`headwise heads catalogue --checkpoint checkpoint`): the mirror score names the "
        "mirror head |",
        "| `head_view.html` | interactive head view of 4 held-out examples (offline); opens on "
        f"cross-attention, layer {layer} head {head} |",
        "| `cross_attention.png` | cross-attention heads: the anti-diagonal |",
        "| `importance.json`, `importance.png` | every head's importance by greedy zero ablation "
        "(`headwise heads score --checkpoint checkpoint --compare` checks every method against "
        "random heads), also on the head view's grid |",
        "| `decoder_self_attention.png`, `encoder_self_attention.png` | self-attention heads |",
        "| `trace.txt`, `trace.md` | the named-axis shape trace of one forward pass |", "",
        "## Which heads matter", "",
        f"{s['which_heads']['method']}. Most important: {s['which_heads']['top']}. Zeroing the "
        f"{len(s['which_heads']['least'])} least important ({', '.join(s['which_heads']['least'])}) "
        f"leaves exact match {s['which_heads']['exact_match_without']:.4f} on "
        f"{s['which_heads']['measured_on']} other held-out strings (all heads: "
        f"{s['which_heads']['exact_match_all']:.4f}).", "",
        "## Greedy decoding of held-out strings", "",
        "| source | output | correct |", "|---|---|---|",
        *[f"| `{e['source']}` | `{e['output']}` | {'yes' if e['correct'] else 'no'} |"
          for e in s["examples"]], ""]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")
