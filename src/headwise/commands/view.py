"""``headwise view``: run a checkpoint on one input, print what it produced and write the
interactive head view.

    headwise view --checkpoint headwise-demo/checkpoint --src abcdefgh
    headwise view --checkpoint runs/lm --text "to be or not" --generate 20 -o lm-view/
    headwise view --checkpoint runs/mt --src "the cat" --tgt "le chat" -o view.html

For an encoder-decoder checkpoint without ``--tgt`` the target is the model's own greedy
output, printed and shown, so the view shows the attention that produced it; the page opens on
cross-attention at its most focused head. Output goes to a report folder
(``headwise-reports/view-<input>/``: ``head_view.html`` + ``heatmaps.png``), to ``-o DIR``, or
to ``-o FILE.html``. Characters the model has no token for are refused; inputs outside the
lengths it was trained on get a warning.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from headwise.commands import _flags as F
from headwise.commands._common import parse_device, report_paths
from headwise.commands._flags import flag
from headwise.kinds import KINDS  # torch-free

# torch is imported inside the functions that run the model: `headwise view --help` stays fast
KIND_CHOICES = tuple(KINDS)
HELP = "write the interactive head view (one offline HTML file) for a checkpoint"
EXAMPLE = "headwise view --checkpoint headwise-demo/checkpoint --src abcdefgh"


FLAGS = (
    F.CHECKPOINT.but(required=True, help="checkpoint folder"),
    flag("--text", help="input text (decoder-only language models)"),
    flag("--src", help="source text (encoder-decoder models)"),
    flag("--tgt", help="target text (encoder-decoder; default: greedy output)"),
    F.output("view-INPUT", "one .html file"),
    F.HEATMAPS.but(help="heatmaps file (default: in the report folder; none with -o FILE.html)"),
    flag("--kind", choices=KIND_CHOICES,
         help="attention kind the page opens on and the heatmaps show (default: cross for "
              "encoder-decoder models)"),
    flag("--layer", type=int, help="layer the page opens on (default: the most focused head's)"),
    flag("--head", type=int, help="head the page opens on (default: the most focused)"),
    flag("--bos", action="store_true", help="language models: put <bos> before the text"),
    F.MAX_NEW_TOKENS.but(default=None, help="encoder-decoder without --tgt: longest output "
                                            "(default 2*len+8)"),
    F.GENERATE,
    F.TITLE.but(help="page title (default: the checkpoint folder and input)"),
    flag("--importance", metavar="FILE.json",
         help="head scores to show under each head (the importance.json of `headwise heads "
              "score` or `headwise demo`)"),
    F.DEVICE,
)


def register(subparsers) -> None:
    F.parser(subparsers, "view", "Run a checkpoint on one input, print the model's output, and "
             "write every layer's and head's attention as one self-contained HTML file (no "
             "network needed to open it) plus a PNG grid of heatmaps.", FLAGS, run)


def run(args: argparse.Namespace) -> int:
    from headwise import checkpoint
    from headwise.viz import head_view, heatmaps

    loaded = checkpoint.load(args.checkpoint, device=parse_device(args.device))
    config, tok = loaded.config, loaded.tokenizer
    if tok is None:
        raise ValueError(f"checkpoint {args.checkpoint} has no tokenizer, so text cannot be "
                         "encoded; save it with checkpoint.save(..., tokenizer=tok)")
    attentions, tokens, summary = (_run_lm if config.kind == "lm" else _run_seq2seq)(
        args, loaded)
    kind = args.kind or ("cross" if "cross" in attentions else next(iter(attentions)))
    if kind not in attentions:
        raise ValueError(f"--kind {kind} is not an attention of this {config.kind} model; "
                         f"choose from {sorted(attentions)}")
    layer, head = _opening_head(attentions[kind], args.layer, args.head)
    html, png = report_paths(args.output, "view", args.src or args.text or "input")
    png = Path(args.heatmaps) if args.heatmaps else png
    title = args.title or f"{Path(args.checkpoint).name}: {summary}"
    view = head_view(attentions, tokens, html, title=title, kind=kind, layer=layer, head=head,
                     importance=_importance(args.importance))
    why = ("as asked" if args.layer is not None and args.head is not None else
           f"{FOCUS}; --layer/--head choose another")
    print(f"head view: {view.path} ({view.path.stat().st_size / 1e6:.2f} MB; opens on {kind} "
          f"layer {layer} head {head}, {why}; any browser, offline)")
    if png is not None:
        q_side, k_side = KINDS[kind].sides
        weights = [None if w is None else w[0] for w in attentions[kind]]
        heatmaps(weights, query_tokens=tokens[q_side][0], key_tokens=tokens[k_side][0],
                 path=png, title=f"{kind} · {summary}")
        print(f"heatmaps ({kind}): {png}")
    return 0


def _importance(path: str | None):
    """The :class:`~headwise.HeadScores` saved at ``path`` (None: no scores on the page)."""
    if path is None:
        return None
    from headwise.analysis.head_scores import HeadScores
    try:
        return HeadScores.from_json(Path(path).read_text(encoding="utf-8"))
    except (KeyError, TypeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"--importance {path}: not an importance.json of headwise heads score "
                         f"({exc})") from None


FOCUS = ("the most focused head on this input (largest mean of its rows' maximum weight, not "
         "the mirror score)")


def _opening_head(layers, layer: int | None, head: int | None) -> tuple[int, int]:
    """The head the page opens on: the one given, else the most focused one (:data:`FOCUS`:
    the head that looks at one position rather than everywhere)."""
    recorded = [l for l, w in enumerate(layers) if w is not None]
    focus = {l: layers[l][0].amax(-1).mean(-1) for l in recorded}  # (h,) per layer
    if layer is None:
        layer = max(recorded, key=lambda l: float(focus[l].max()))
    if layer not in recorded:
        raise ValueError(f"--layer {layer}: this model's recorded layers are {recorded}")
    head = int(focus[layer].argmax()) if head is None else head
    if not 0 <= head < len(focus[layer]):
        raise ValueError(f"--head {head}: layer {layer} has heads 0..{len(focus[layer]) - 1}")
    return layer, head


def _run_lm(args, loaded):
    import torch

    model, config, tok = loaded.model, loaded.config, loaded.tokenizer
    device = next(model.parameters()).device
    ids = _lm_input(args, tok, config, loaded.metadata)
    prompt = len(ids)
    if args.generate:
        ids = _continue(model, ids, args.generate, tok, config, device)
    # one causal forward over the whole sequence gives exactly the weights each generated
    # token used when it was produced step by step with the KV cache
    with torch.no_grad():
        _, attentions = model(torch.tensor([ids], device=device), return_weights=True)
    continuation = tok.decode(ids[prompt:]) if len(ids) > prompt else ""
    print(f"input:        {args.text}")
    if args.generate:
        print(f"continuation: {continuation}")
    summary = f"“{args.text}”" + (f" + “{continuation}”" if continuation else "")
    return attentions, {"tgt": [tok.tokens(ids)]}, summary


def _run_seq2seq(args, loaded):
    import torch

    model, config, tok = loaded.model, loaded.config, loaded.tokenizer
    device = next(model.parameters()).device
    src_ids, tgt_ids = _seq2seq_input(args, tok, config, model, device, loaded.metadata)
    with torch.no_grad():
        _, attentions = model(torch.tensor([src_ids], device=device),
                              torch.tensor([tgt_ids], device=device), return_weights=True)
    output = tok.decode(tgt_ids[1:])
    print(f"input:  {args.src}")
    print(f"{'target' if args.tgt is not None else 'output'}: {output}"
          + ("  (given with --tgt)" if args.tgt is not None else "  (greedy decoding)"))
    tokens = {"src": [tok.tokens(src_ids)], "tgt": [tok.tokens(tgt_ids)]}
    return attentions, tokens, f"“{args.src}” → “{output}”"


def _continue(model, ids, n, tok, config, device) -> list[int]:
    import torch

    if n < 0:
        raise ValueError(f"--generate {n}: pass a number of new tokens >= 0")
    n = min(n, config.max_len - len(ids))
    if n <= 0:
        raise ValueError(f"--generate: the text already fills max_len={config.max_len}; "
                         "shorten --text")
    from headwise.decode.generation import generate

    with torch.no_grad():
        out = generate(model, torch.tensor([ids], device=device), max_new_tokens=n,
                       eos_id=tok.eos_id)
    new = []
    for i in out[0, len(ids):].tolist():
        new.append(i)
        if i in (tok.eos_id, tok.pad_id):
            break
    return ids + new


def encode_checked(tok, text: str, flag: str, max_len: int, reserved: int = 0) -> list[int]:
    """``text`` -> ids, refusing characters the tokenizer maps to ``<unk>`` and inputs longer
    than the model takes (``reserved`` positions are taken by <bos>/<eos>)."""
    ids = tok.encode(text)
    unk = getattr(tok, "unk_id", None)
    if unk is not None and unk in ids:
        bad = sorted({c for c in text if tok.encode(c) == [unk]})
        known = getattr(tok, "alphabet", None)
        raise ValueError(f"{flag} has characters this model has no token for: "
                         f"{' '.join(map(repr, bad))}"
                         + (f"; it knows only {known!r}" if known is not None else "")
                         + "; use only those characters")
    if len(ids) + reserved > max_len:
        raise ValueError(f"{flag} is {len(ids)} tokens but the model takes at most "
                         f"max_len={max_len}" + (f" ({reserved} for <bos>)" if reserved else "")
                         + "; shorten it")
    return ids


def warn_if_untrained_length(n: int, flag: str, metadata: dict) -> None:
    """Print a warning when a synthetic-task model gets an input length it never trained on."""
    cfg = metadata.get("train_config") or {}
    lo, hi = cfg.get("min_len"), cfg.get("max_len")
    from headwise.data.synthetic import SEQ2SEQ_TASKS

    if cfg.get("task") in (*SEQ2SEQ_TASKS, "induction") and lo and hi and not lo <= n <= hi:
        print(f"warning: {flag} has {n} symbols but this model was trained on {lo}-{hi} "
              f"(task {cfg['task']}); expect wrong output outside that range", file=sys.stderr)


def _lm_input(args, tok, config, metadata) -> list[int]:
    if args.src is not None or args.tgt is not None:
        raise ValueError("this checkpoint is a decoder-only language model; pass --text, "
                         "not --src/--tgt")
    if not args.text:
        raise ValueError("pass the input with --text \"...\" (a non-empty string)")
    ids = encode_checked(tok, args.text, "--text", config.max_len, reserved=int(args.bos))
    return ([tok.bos_id] if args.bos else []) + ids


def _seq2seq_input(args, tok, config, model, device, metadata) -> tuple[list[int], list[int]]:
    import torch

    if args.text is not None:
        raise ValueError("this checkpoint is an encoder-decoder model; pass --src \"...\" "
                         "(and optionally --tgt \"...\") instead of --text")
    if not args.src:
        raise ValueError("pass the source with --src \"...\" (a non-empty string)")
    src_ids = encode_checked(tok, args.src, "--src", config.max_len)
    tgt_ids = (None if args.tgt is None
               else [tok.bos_id] + encode_checked(tok, args.tgt, "--tgt", config.max_len, 1))
    warn_if_untrained_length(len(src_ids), "--src", metadata)  # once every input is valid
    if tgt_ids is not None:
        return src_ids, tgt_ids
    from headwise.decode.generation import generate

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
    return src_ids, tgt_ids
