"""``headwise long``: every head of a model over one long document, in one streaming pass.

    headwise long --hf smollm2 --file doc.txt                      # the per-head table
    headwise long --hf smollm2 --austen 2000 --by far --top 10     # who looks > 1,000 back
    headwise long --hf smollm2 --file doc.txt --sinks 1 --window 4 --by streaming --top 10
    headwise long --hf DIR --file doc.txt --layers 5 --heads 3 --rows last-sentence
    headwise long --hf smollm2 --file doc.txt --save p.safetensors --view long.html --rows last:64

Runs :func:`headwise.long.profile` (block maps, distance profiles, sink / local / received mass,
top keys; O(n) memory, exact) on the document's tokens and prints a row per head, optionally
sorted by one score (``--by``) and cut to ``--top`` rows. ``--rows`` (``last:N``, ``A:B``,
``last-sentence`` or a phrase of the document) prints, for each profiled head, the keys the
rows' queries put the most mass on, and with ``--view`` draws those rows' exact weights
(from the weights-from-LSE path, :func:`headwise.hf.weights`) in the long-document view.
Every input is checked before the model runs (a document longer than the model's context is
one line naming both lengths).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from headwise.commands import _flags as F
from headwise.commands._common import indices
from headwise.commands._flags import flag

HELP = "profile every head of a model over a long document (maps, distances, sinks, classes)"
EXAMPLE = "headwise long --hf smollm2 --austen 2000 --by far --top 10"
SCORES = ("streaming", "sink", "local", "far", "mean_distance")


def arguments() -> tuple:
    """The command's flags, in one table."""
    return (
        flag("--hf", metavar="DIR|NAME", required=True,
             help="a local Hugging Face model folder, .gguf file or installed name (smollm2) on "
                  "attn_implementation='headwise'; nothing downloads"),
        F.OneOf((flag("--file", metavar="TXT", help="the document (UTF-8 text)"),
                 flag("--austen", type=int, metavar="N", at_least=1,
                      help="the first N tokens of Austen's novels (make corpora)")),
                required=True),
        flag("--tokens", type=int, metavar="N", at_least=1,
             help="keep only the first N tokens of the document"),
        flag("--layers", help="layers to profile, e.g. 0,5 or 0-3 (default all)"),
        flag("--heads", help="query heads to profile, e.g. 0-3 (default all)"),
        flag("--block", type=int, metavar="B", at_least=1,
             help="tokens per block of the maps (default max(64, n/128))"),
        flag("--sinks", type=int, default=4, at_least=0, help="sink keys (default 4)"),
        flag("--window", type=int, default=64, at_least=1, help="local window (default 64)"),
        flag("--far", type=int, default=1000, at_least=0,
             help="the far score: mass further back than this many tokens, on keys that are "
                  "not sinks (default 1000)"),
        flag("--by", choices=SCORES, help="sort the table by this score, largest first"),
        flag("--top", type=int, metavar="N", at_least=1, help="print only the first N heads"),
        flag("--rows", metavar="SPEC",
             help="query rows to look at: last:N, A:B, last-sentence or a phrase of the text"),
        flag("--save", metavar="FILE.safetensors", help="write the profile"),
        flag("--view", metavar="FILE.html", help="write the long-document view"),
        F.THREADS,
        F.QUIET,
    )


def register(subparsers) -> None:
    F.parser(subparsers, "long", "Profile every head of a model over one long document in one "
             "streaming pass (O(n) memory, exact) and print a row per head.", arguments(), run)


def run(args: argparse.Namespace) -> int:
    import torch

    from headwise.commands._hf import load

    _check_paths(args)
    text = _document(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.hf, "cpu")
    ids, spans = _tokens(tokenizer, text, args.tokens)
    rows = _rows(args.rows, text, spans) if args.rows else None
    prof, tiles = _profile(model, tokenizer, ids, rows, args)
    print(f"{args.hf}: {prof.n:,} tokens, {len(prof.layers)} layers x {len(prof.heads)} heads "
          f"(of {prof.heads_per_layer}, {prof.groups_per_layer} key/value groups), blocks of "
          f"{prof.block}; sink = first {prof.sinks} keys, local = last {prof.window}, far = "
          f"more than {args.far} back")
    print("\n".join(prof.head_table(SCORES, top=args.top, by=args.by)))
    if rows is not None:
        _print_rows(prof, rows, tiles, args.rows)
    if args.save:
        print(f"profile: {prof.save(args.save)}")
    if args.view:
        from headwise.viz import long_view

        label = {args.rows: (rows, tiles)} if rows is not None else None
        print(f"view: {long_view(prof, args.view, tiles=label, title=f'{args.hf}: long').path}")
    return 0


def _check_paths(args) -> None:
    if args.save and Path(args.save).suffix != ".safetensors":
        raise ValueError(f"--save {args.save!r} must end in .safetensors")
    if args.view and Path(args.view).suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"--view {args.view!r} must end in .html")


def _document(args) -> str:
    if args.file:
        from headwise.data import read_text

        text = read_text(args.file)
    else:
        from headwise.data.corpora import austen_text

        text = austen_text()[:args.austen * 8]  # ~4 characters a token: enough, then cut
        args.tokens = min(args.tokens or args.austen, args.austen)
    if not text.strip():
        raise ValueError(f"--file {args.file}: the document is empty; pass a text file")
    return text


def _tokens(tokenizer, text: str, keep: int | None):
    """``(ids (1, n), spans)``: the document's ids and each token's character span."""
    import torch

    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids, spans = enc["input_ids"], enc["offset_mapping"]
    if keep is not None:
        ids, spans = ids[:keep], spans[:keep]
    return torch.tensor([ids]), [tuple(s) for s in spans]


def _rows(spec: str, text: str, spans) -> list[int]:
    """The query rows ``--rows`` names (checked against the document before the model runs)."""
    n = len(spans)
    if m := re.fullmatch(r"last:(\d+)", spec):
        return list(range(max(0, n - int(m[1])), n))
    if m := re.fullmatch(r"(\d+):(\d+)", spec):
        a, b = int(m[1]), min(int(m[2]), n)
        if not a < b:
            raise ValueError(f"--rows {spec!r}: no rows in {a}:{b} of {n:,} tokens")
        return list(range(a, b))
    end = spans[-1][1] if spans else 0
    if spec == "last-sentence":
        cut = max(text.rfind(x, 0, max(0, end - 2)) for x in ".!?")
        start = cut + 1 if cut >= 0 else 0
    else:
        start = text.rfind(spec, 0, end)
        if start < 0:
            raise ValueError(f"--rows {spec!r}: not in the document's first {n:,} tokens; give "
                             "a phrase it contains, last:N or A:B")
        end = start + len(spec)
    picked = [t for t, (a, b) in enumerate(spans) if b > start and a < end]
    return picked or [n - 1]


def _profile(model, tokenizer, ids, rows, args):
    """The profile, and the exact weights of ``rows`` (one ``(h, r, j)`` per layer)."""
    from contextlib import nullcontext

    import headwise.hf
    from headwise.hf.model import attention_layers, head_count
    from headwise.long import profile

    layers = attention_layers(model)
    chosen_layers = indices(args.layers, len(layers), "--layers")
    chosen_heads = indices(args.heads, head_count(layers[0]), "--heads")
    tokens = [tokenizer.decode([x]) for x in ids[0].tolist()]
    picked = chosen_layers if chosen_layers is not None else list(range(len(layers)))
    spec = {"layers": picked, "rows": rows, "heads": chosen_heads} if rows is not None else None
    with (headwise.hf.weights(model, spec) if spec else nullcontext({})) as got:
        prof = profile(model, ids, block=args.block, sinks=args.sinks, window=args.window,
                       far=args.far, layers=chosen_layers, heads=chosen_heads, tokens=tokens,
                       progress=not args.quiet)
    tiles = [got[x][0].float().numpy() for x in picked] if spec else None
    return prof, tiles


def _print_rows(prof, rows, tiles, spec) -> None:
    """Per profiled head: the keys the rows' queries put the most mean mass on."""
    print(f"rows {spec!r}: tokens {rows[0]}..{rows[-1]} "
          f"{''.join(prof.tokens[rows[0]:rows[-1] + 1])!r}")
    for li, layer in enumerate(prof.layers):
        for hi, head in enumerate(prof.heads):
            mean = tiles[li][hi].mean(0)
            top = mean.argsort()[::-1][:5]
            where = ", ".join(f"{int(j)} {prof.tokens[int(j)]!r} {mean[j]:.2f}" for j in top)
            print(f"  {layer}.{head}: {where}")
