"""``--hf DIR`` for ``explain``, ``heads catalogue``, ``heads score`` and ``heads prune``: a local Hugging Face
model (a folder as ``save_pretrained`` writes it, or one ``.gguf`` file) running
``attn_implementation="headwise"``, and the data the head tools run it on.

Nothing downloads: ``HF_HUB_OFFLINE=1`` is set before transformers is imported and every file
is read with ``local_files_only=True``; a missing folder, a folder without ``config.json`` or a
model class headwise cannot serve is one line (exit 2) before any weights are read.

Data: a causal language model reads consecutive windows of ``--length`` of its own tokens of
Austen's *Emma* (``make corpora``) or of ``--sentences FILE`` read as one text; an encoder reads
sentences, one per line of ``--sentences FILE`` (default: the English side of the Ding pairs).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from headwise.commands._common import default_png, indices, parse_device, report_paths

__all__ = ["batches", "explain", "load", "model_kind", "prune", "read_data"]


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: nothing downloads


def load(source: str, device):
    """``(model, tokenizer)`` of ``--hf source``: checked, offline, ``attn_implementation=
    "headwise"``, eval, float32."""
    _offline()
    from transformers.utils import logging

    from headwise.hf.local import load as load_hf

    logging.disable_progress_bar()  # a command prints its own lines
    return load_hf(source, device=device, where=f"--hf {source}")


def model_kind(args) -> str:
    """The attention kind of ``--hf DIR`` (``"decoder_self"`` or ``"encoder_self"``), from its
    configuration built on the meta device: no weights are read."""
    _offline()
    from headwise.hf.local import skeleton
    from headwise.hf.model import kind

    return kind(skeleton(args.hf, f"--hf {args.hf}"))


def read_data(args, found: str | None = None) -> tuple[str, str, str]:
    """``(kind, text, label)`` of ``--hf DIR``, read before any weights load (a missing file or
    corpus is one line): ``--sentences FILE`` or the default corpus of the model's kind
    ``found`` (default: :func:`model_kind`; ``decoder_self``: Austen's *Emma*;
    ``encoder_self``: the English Ding sentences, one per line)."""
    found = found or model_kind(args)
    if args.sentences:
        from headwise.data import read_text
        return found, read_text(args.sentences), Path(args.sentences).name
    if found == "decoder_self":
        from headwise.data.corpora import austen_text
        return found, austen_text(("emma",)), "Austen's Emma"
    from headwise.data.corpora import ding_pairs
    return found, "\n".join(en for _, en in ding_pairs()), "English side of the Ding de-en pairs"


def batches(model, tokenizer, data: tuple[str, str, str], args, device) -> tuple[list, str]:
    """``(batches, dataset description)`` of :func:`read_data`'s ``data``: ``--examples``
    windows of ``--length`` tokens (a causal LM) or sentences (an encoder), ``--batch-size`` at
    a time (dicts of ``input_ids`` and ``attention_mask``; sentences padded on the right)."""
    found, text, label = data
    if found == "decoder_self":
        return _windows(model, tokenizer, text, label, args, device)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{label}: no non-empty lines")
    step = max(1, len(lines) // args.examples)  # spread over the whole file, deterministic
    lines = lines[::step][:args.examples]
    from headwise.hf.model import context
    from headwise.hf.tools import encode

    out = [encode(tokenizer, lines[s:s + args.batch_size], context(model), device)[0]
           for s in range(0, len(lines), args.batch_size)]
    return out, f"{label}, {len(lines)} sentences"


def _windows(model, tokenizer, text, label, args, device):
    import torch

    from headwise.hf.model import context

    n, want = args.length, args.examples
    limit = context(model)
    if limit is not None and n > limit:
        raise ValueError(f"--length {n} is longer than the model's context ({limit} tokens); "
                         f"pass --length {limit} or less")
    ids = tokenizer(text[:(n * want + 1) * 16], add_special_tokens=False)["input_ids"]
    windows = min(want, len(ids) // n)
    if windows < 1:
        raise ValueError(f"{label}: {len(ids)} tokens, fewer than one window of --length {n}; "
                         "give a longer text or a smaller --length")
    ids = torch.tensor(ids[:windows * n], device=device).view(windows, n)
    out = [{"input_ids": part, "attention_mask": torch.ones_like(part)}
           for part in ids.split(args.batch_size)]
    return out, f"{label}, {windows} windows of {n} tokens"


def explain(args: argparse.Namespace) -> int:
    """``headwise explain --hf DIR TEXT...``: the head view (query heads grouped under their
    key/value heads), the heatmaps and the trace summary, as ``explain --model`` writes them."""
    from headwise import viz
    from headwise.hf.model import context
    from headwise.hf.tools import explain as run_model

    if args.pair or args.generate or args.chat:
        raise ValueError("--hf reads its texts as they are: --pair, --generate and --chat "
                         "apply to --model / --gguf")
    if not 0 <= args.example < len(args.text):
        raise ValueError(f"--example {args.example} is out of range for {len(args.text)} texts")
    model, tokenizer = load(args.hf, parse_device(args.device))
    run = run_model(model, tokenizer, args.text)
    limit = context(model)
    for i, text in enumerate(args.text):  # as explain notes a text MiniLM cuts
        if limit is not None and len(tokenizer(text)["input_ids"]) > limit:
            print(f"headwise explain: note: text {i} is longer than the model reads ({limit} "
                  f"tokens); the view shows its first {limit}", file=sys.stderr)
    (kind, weights), = run.attentions.items()
    h, g = weights[0].shape[1], run.kv_heads
    causal = kind == "decoder_self"
    layers = indices(args.layers, len(weights), "--layers") or (
        [len(weights) - 1] if causal else None)
    heads = indices(args.heads, h, "--heads")
    name = Path(args.hf).name
    text = args.text[0]
    html, png = report_paths(args.output, "explain", f"{name}-{text}")
    view = viz.head_view(run.attentions, run.tokens, html, kv_heads=g,
                         title=f"{name}: {text[:60]}" + "..." * (len(text) > 60))
    png = Path(args.heatmaps) if args.heatmaps else png or default_png(view.path)
    b, toks = args.example, run.tokens[args.example]
    chosen = [w[b, :, :len(toks), :len(toks)].float().cpu() for w in weights]
    viz.heatmaps(chosen, query_tokens=toks, key_tokens=toks, path=png, layers=layers,
                 heads=heads, title=f"{name}: example {b}, {len(toks)} tokens")
    shared = f" sharing {g} key/value heads ({h // g} each)" if g else ""
    print(f"{name} ({type(model).__name__}): {len(weights)} layers x {h} query heads{shared}, "
          f"{'causal' if causal else 'bidirectional'} self-attention, attn_implementation="
          f"'headwise', on {parse_device(args.device)}")
    for i, t in enumerate(run.tokens):
        print(f"example {i} ({len(t)} tokens): " + " ".join(map(str, t)))
    print(f"head view: {view.path}\nheatmaps:  {png}")
    print(run.record.render() if args.trace else run.record.summary())
    return 0


def prune(args: argparse.Namespace) -> int:
    """``headwise heads prune --hf DIR``: a causal LM's heads ordered by
    :func:`headwise.importance`'s default (greedy zero ablation of its next-token loss on the
    ``--hf`` data), the least important key/value groups covering ``--fraction`` of its heads
    cut (:func:`headwise.hf.prune_heads`: the matrices shrink; the rule of
    :func:`headwise.analysis.prune_sweep.plan_groups`), its loss on the same data before and
    after, and the pruned folder saved (``save_pretrained``, with the tokenizer and
    ``importance.json``) where ``headwise.hf.load`` and every ``--hf`` read it back.

    Every check that needs no weights comes first: the order, the fraction, the output folder,
    the model's kind (an encoder has no loss to order its heads by) and its text."""
    import torch

    from headwise.analysis.prune_sweep import plan_groups
    from headwise.analysis.scoring import importance
    from headwise.hf.model import attention_layers, head_count, kv_head_count
    from headwise.hf.prune import prune_heads
    from headwise.hf.tools import next_token_loss

    folder, data = _prune_checks(args)
    model, tokenizer = load(args.hf, "cpu")
    inputs, dataset = batches(model, tokenizer, data, args, "cpu")
    layers = attention_layers(model)
    counts = {"layers": [(head_count(m), kv_head_count(m)) for m in layers]}
    total = sum(h for h, _ in counts["layers"])
    steps = max(1, min(total - 1, round(args.fraction * total)))  # greedy need go no further
    scores = importance(model, inputs, steps=steps)
    plan = plan_groups(counts, scores.scores, args.fraction)
    if not plan:
        raise ValueError(f"--fraction {args.fraction} of {total} heads rounds to no whole "
                         "key/value group; pass a larger --fraction")

    def loss() -> float:
        with torch.no_grad():
            return sum(float(next_token_loss(model, b)) for b in inputs) / len(inputs)

    before = loss()
    prune_heads(model, plan)
    after = loss()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    scores.to_json(folder / "importance.json")
    cut = sum(len(heads) for heads in plan["layers"].values())
    print(f"head order: {scores.describe()} ({dataset})")
    print(f"pruned {cut} of {total} heads ({cut / total:.0%}): " + ", ".join(
        f"layer {layer} heads {heads}" for layer, heads in sorted(plan["layers"].items())))
    print(f"next-token loss on those {dataset.split(', ', 1)[-1]}: {before:.4f} before, "
          f"{after:.4f} after (no retraining)")
    print(f"pruned model: {folder} (headwise.hf.load({str(folder)!r}), or any --hf {folder})")
    return 0


def _prune_checks(args: argparse.Namespace) -> tuple[Path, tuple[str, str, str]]:
    """``heads prune --hf``'s checks, none of which reads weights: ``(the folder the pruned
    model goes to, the data :func:`read_data` read)``."""
    if args.order != "importance":
        raise ValueError("--order norm reads headwise's own attention modules; with --hf the "
                         "heads are ordered by importance (drop --order)")
    if not 0 < args.fraction < 1:
        raise ValueError(f"--fraction must be in (0, 1), got {args.fraction}")
    page, beside = report_paths(args.output, "heads-prune", Path(args.hf).name)
    if beside is None:
        raise ValueError(f"-o {args.output}: expected a folder (the pruned model is saved in it)")
    found = model_kind(args)
    if found != "decoder_self":
        raise ValueError(f"--hf {args.hf} is an encoder: it has no next-token loss to order its "
                         "heads by; heads prune --hf takes a causal LM (prune an encoder in "
                         "Python: headwise.hf.prune_heads(model, {'layers': {layer: [heads]}}))")
    return page.parent, read_data(args, found)
