"""``headwise view``: run a checkpoint on one input and write the interactive head view.

    headwise view --checkpoint runs/lm --text "to be or not" -o view.html [--generate 20]
    headwise view --checkpoint runs/mt --src "the cat" [--tgt "le chat"] -o view.html

For an encoder-decoder checkpoint without ``--tgt`` the target is the model's own greedy
translation, so the view shows the attention that produced it. ``--heatmaps FILE.png`` also
writes the static grid of one attention kind.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.commands._common import parse_device

if TYPE_CHECKING:  # imported when the command runs: `headwise view --help` stays fast
    pass

KIND_CHOICES = ("encoder_self", "decoder_self", "cross")
HELP = "write the interactive head view (one offline HTML file) for a checkpoint"
EXAMPLE = "headwise view --checkpoint headwise-demo/checkpoint --src abcdefgh"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "view",
        description="Run a checkpoint on one input and write every layer's and head's attention "
                    "as one self-contained HTML file (no network needed to open it).")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="checkpoint folder")
    p.add_argument("--text", help="input text (decoder-only language models)")
    p.add_argument("--src", help="source text (encoder-decoder models)")
    p.add_argument("--tgt", help="target text (encoder-decoder; default: greedy translation)")
    p.add_argument("-o", "--output", default="view.html", metavar="FILE.html")
    p.add_argument("--heatmaps", metavar="FILE.png|svg", help="also write static heatmaps")
    p.add_argument("--kind", choices=KIND_CHOICES,
                   help="attention kind for --heatmaps (default: the model's first)")
    p.add_argument("--bos", action="store_true",
                   help="language models: put <bos> before the text")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="encoder-decoder without --tgt: longest translation (default 2*len+8)")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="language models: greedily continue --text by N tokens and show the "
                        "attention over prompt + continuation (what each new token looked at)")
    p.add_argument("--title", help="page title (default: the checkpoint folder and input)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from headwise import checkpoint
    from headwise.viz import head_view, heatmaps

    for flag, value, low in (("--max-new-tokens", args.max_new_tokens, 1),
                             ("--generate", args.generate, 0)):
        if value is not None and value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    loaded = checkpoint.load(args.checkpoint, device=parse_device(args.device))
    model, config, tok = loaded.model, loaded.config, loaded.tokenizer
    if tok is None:
        raise ValueError(f"checkpoint {args.checkpoint} has no tokenizer, so text cannot be "
                         "encoded; save it with checkpoint.save(..., tokenizer=tok)")
    device = next(model.parameters()).device
    if config.kind == "lm":
        ids = _lm_input(args, tok, config)
        prompt = len(ids)
        if args.generate:
            ids = _continue(model, ids, args.generate, tok, config, device)
        # one causal forward over the whole sequence gives exactly the weights each generated
        # token used when it was produced step by step with the KV cache
        with torch.no_grad():
            _, attentions = model(torch.tensor([ids], device=device), return_weights=True)
        tokens_arg = {"tgt": [tok.tokens(ids)]}
        summary = f"“{args.text}”" + (f" + “{tok.decode(ids[prompt:])}”" if len(ids) > prompt
                                      else "")
    else:
        src_ids, tgt_ids = _seq2seq_input(args, tok, config, model, device)
        with torch.no_grad():
            _, attentions = model(torch.tensor([src_ids], device=device),
                                  torch.tensor([tgt_ids], device=device), return_weights=True)
        tokens_arg = {"src": [tok.tokens(src_ids)], "tgt": [tok.tokens(tgt_ids)]}
        summary = f"“{args.src}” → “{tok.decode(tgt_ids[1:])}”"
    kind = args.kind or next(k for k in KIND_CHOICES if k in attentions)
    if kind not in attentions:
        raise ValueError(f"--kind {kind} is not an attention of this {config.kind} model; "
                         f"choose from {sorted(attentions)}")
    title = args.title or f"{Path(args.checkpoint).name}: {summary}"
    out = head_view(attentions, tokens_arg, args.output, title=title)
    print(f"head view: {out} ({out.stat().st_size / 1e6:.2f} MB; open it in any browser, offline)")
    if args.heatmaps:
        q_side, k_side = {"encoder_self": ("src", "src"), "decoder_self": ("tgt", "tgt"),
                          "cross": ("tgt", "src")}[kind]
        weights = [None if w is None else w[0] for w in attentions[kind]]
        path = heatmaps(weights, query_tokens=tokens_arg[q_side][0],
                        key_tokens=tokens_arg[k_side][0], path=args.heatmaps,
                        title=f"{kind} · {summary}")
        print(f"heatmaps ({kind}): {path}")
    return 0


def _continue(model, ids, n, tok, config, device) -> list[int]:
    import torch
    if n < 0:
        raise ValueError(f"--generate {n}: pass a number of new tokens >= 0")
    n = min(n, config.max_len - len(ids))
    if n <= 0:
        raise ValueError(f"--generate: the text already fills max_len={config.max_len}; "
                         "shorten --text")
    from headwise.decoding import generate

    with torch.no_grad():
        out = generate(model, torch.tensor([ids], device=device), max_new_tokens=n,
                       eos_id=tok.eos_id)
    new = []
    for i in out[0, len(ids):].tolist():
        new.append(i)
        if i in (tok.eos_id, tok.pad_id):
            break
    return ids + new


def _lm_input(args, tok, config) -> list[int]:
    if args.src is not None or args.tgt is not None:
        raise ValueError("this checkpoint is a decoder-only language model; pass --text, "
                         "not --src/--tgt")
    if not args.text:
        raise ValueError("pass the input with --text \"...\" (a non-empty string)")
    ids = ([tok.bos_id] if args.bos else []) + tok.encode(args.text)
    if len(ids) > config.max_len:
        raise ValueError(f"--text is {len(ids)} tokens but the model takes at most "
                         f"max_len={config.max_len}; shorten it")
    return ids


def _seq2seq_input(args, tok, config, model, device) -> tuple[list[int], list[int]]:
    import torch
    if args.text is not None:
        raise ValueError("this checkpoint is an encoder-decoder model; pass --src \"...\" "
                         "(and optionally --tgt \"...\") instead of --text")
    if not args.src:
        raise ValueError("pass the source with --src \"...\" (a non-empty string)")
    src_ids = tok.encode(args.src)
    if len(src_ids) > config.max_len:
        raise ValueError(f"--src is {len(src_ids)} tokens but the model takes at most "
                         f"max_len={config.max_len}; shorten it")
    if args.tgt is not None:
        tgt_ids = [tok.bos_id] + tok.encode(args.tgt)
    else:
        from headwise.decoding import generate

        limit = args.max_new_tokens or 2 * len(src_ids) + 8
        limit = max(1, min(limit, config.max_len - 1))
        with torch.no_grad():
            out = generate(model, torch.tensor([[tok.bos_id]], device=device),
                           max_new_tokens=limit, src=torch.tensor([src_ids], device=device),
                           eos_id=tok.eos_id)
        tgt_ids = [tok.bos_id]
        for i in out[0, 1:].tolist():
            if i in (tok.eos_id, tok.pad_id):
                break
            tgt_ids.append(i)
    if len(tgt_ids) > config.max_len:
        raise ValueError(f"--tgt is {len(tgt_ids)} tokens with <bos> but the model takes at "
                         f"most max_len={config.max_len}; shorten it")
    return src_ids, tgt_ids
