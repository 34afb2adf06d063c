"""``headwise trace``: the named-axis shape trace of a freshly built model or a checkpoint.

    headwise trace mha --embed-dim 4 --heads 2 --head-dim 3 --kdim 3 --vdim 2 --seq 5 --kv-seq 6
    headwise trace lm --vocab 33300 --embed-dim 512 --heads 8 --batch 1 --seq 8
    headwise trace transformer --layers 1 --pad 2 --weights cross
    headwise trace mha --png heads.png
    headwise trace --checkpoint runs/lm
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported inside the functions that run a model: `trace --help` stays fast
    import torch

KINDS = ("mha", "encoder", "decoder", "transformer", "lm")
WEIGHT_KINDS = {"encoder": ("encoder_self",), "decoder": ("decoder_self", "cross"),
                "transformer": ("encoder_self", "decoder_self", "cross"),
                "lm": ("decoder_self",)}


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
    size = p.add_argument_group("sizes")
    size.add_argument("--embed-dim", type=int, help="model dim m (default 512)")
    size.add_argument("--heads", type=int, help="query heads h (default 8)")
    size.add_argument("--head-dim", type=int, help="per-head size d (default m // h)")
    size.add_argument("--kdim", type=int, help="mha: key input size (cross-attention)")
    size.add_argument("--vdim", type=int, help="mha: value input size (cross-attention)")
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
    run = p.add_argument_group("run")
    run.add_argument("--backend", default=None, help="attention backend: auto, eager, sdpa, ...")
    run.add_argument("--weights", nargs="?", const="all", default=None, metavar="WHICH",
                     help="ask for attention weights: all (no value), a kind (encoder_self, "
                          "decoder_self, cross) or kind:layer,layer (e.g. cross:0)")
    run.add_argument("--print-weights", action="store_true",
                     help="also print each head's attention weights (example 0); implies "
                          "--weights unless --weights selects layers")
    run.add_argument("--pad", type=int, default=0,
                     help="the last N key/source positions of the last example are padding")
    run.add_argument("--causal", action="store_true", help="mha: causal masking")
    run.add_argument("--dropout", type=float, default=0.0,
                     help="attention/residual dropout; > 0 runs in training mode")
    run.add_argument("--text", help="with --checkpoint: trace this text instead of random ids")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--device", default="cpu")
    out = p.add_argument_group("output")
    out.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    out.add_argument("--full", action="store_true", help="do not collapse identical blocks")
    out.add_argument("--summary", action="store_true",
                     help="print only which attention calls ran fused and which fell back")
    out.add_argument("--svg", metavar="FILE", help="mha: also draw the split/merge diagram")
    out.add_argument("--png", metavar="FILE", help="mha: also draw the split/merge diagram")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    import torch

    from headwise.tracing import trace

    _check_args(args)
    if args.print_weights and args.weights is None:
        args.weights = "all"
    torch.manual_seed(args.seed)
    if args.checkpoint:
        model, inputs, kwargs = _from_checkpoint(args)
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
            from headwise.diagram import draw

            torch.manual_seed(args.seed)
            written = draw(model, *inputs, path=path, mask=kwargs.get("mask"),
                           valid_lens=kwargs.get("valid_lens"), causal=kwargs.get("causal", False))
            print(f"diagram written to {written}", file=sys.stderr)
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
def _check_args(args) -> None:
    import torch
    if args.checkpoint and args.kind:
        raise ValueError(f"give a model kind or --checkpoint, not both (got {args.kind!r} and "
                         f"--checkpoint {args.checkpoint})")
    if not args.checkpoint:
        if args.kind is None:
            raise ValueError(f"which model? give a kind ({', '.join(KINDS)}) or --checkpoint DIR")
        if args.kind not in KINDS:
            raise ValueError(f"unknown model kind {args.kind!r}; choose one of "
                             f"{', '.join(KINDS)}")
    for name in ("embed_dim", "heads", "head_dim", "kdim", "vdim", "kv_heads", "ff", "vocab",
                 "layers", "batch", "seq", "kv_seq"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    kind = args.kind or "checkpoint"
    if (args.kdim or args.vdim or args.causal) and kind != "mha":
        raise ValueError("--kdim, --vdim and --causal apply to `trace mha` only (the models "
                         "choose their own masks)")
    if (args.svg or args.png) and kind != "mha":
        raise ValueError("--svg/--png draw the split/merge diagram of `trace mha`; for a model's "
                         "weights use headwise.viz")
    if args.text is not None and not args.checkpoint:
        raise ValueError("--text needs --checkpoint (a fresh model has no tokenizer)")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device {args.device!r} is not a device; use cpu, cuda or cuda:N") \
            from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available on this machine; use "
                         "--device cpu")
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


def build(args) -> tuple[torch.nn.Module, tuple, dict]:
    """The model of ``args`` and its inputs: ``(model, positional args, keyword args)``."""
    import torch
    m = args.embed_dim or 512
    h = args.heads or 8
    backend = args.backend or "auto"
    b, n = args.batch, args.seq
    nk = args.kv_seq or n
    device = torch.device(args.device)
    if args.kind == "mha":
        import headwise as hw

        model = hw.MultiHeadAttention(m, h, head_dim=args.head_dim, kdim=args.kdim,
                                      vdim=args.vdim, num_kv_heads=args.kv_heads,
                                      dropout=args.dropout, backend=backend).to(device).eval()
        query = torch.randn(b, n, m, device=device)
        cross = args.kdim or args.vdim or nk != n
        kwargs = {"causal": True} if args.causal else {}
        if args.pad:
            kwargs["valid_lens"] = _lengths(b, nk, args.pad, device)
        if args.weights:
            kwargs["return_weights"] = True
        if not cross:
            return model, (query,), kwargs
        key = torch.randn(b, nk, model.kdim, device=device)
        value = torch.randn(b, nk, model.vdim, device=device)
        return model, (query, key, value), kwargs

    from headwise.models import LMConfig, TransformerConfig
    from headwise.models import build as build_model

    common = dict(d_model=m, num_heads=h, num_layers=args.layers or 6, d_ff=args.ff or 4 * m,
                  dropout=args.dropout, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                  backend=backend)
    vocab = args.vocab or 1000
    if args.kind == "lm":
        config = LMConfig(vocab_size=vocab, max_len=max(2048, n), **common)
        model = build_model(config)
    else:
        from headwise.models import Decoder, Encoder

        config = TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab,
                                   max_len=max(512, n, nk), **common)
        model = {"encoder": Encoder, "decoder": Decoder, "transformer": build_model}[
            args.kind](config)
    model = model.to(device).eval()
    return model, *_model_inputs(args.kind, model, config, args, vocab, device)


def _model_inputs(kind, model, config, args, vocab, device) -> tuple[tuple, dict]:
    import torch
    b, n = args.batch, args.seq
    nk = args.kv_seq or n
    ids = lambda length: torch.randint(1, vocab, (b, length), device=device)  # noqa: E731
    kwargs: dict = {}
    weights = _weights(args.weights, kind)
    if weights is not None:
        kwargs["return_weights"] = weights
    lens = _lengths(b, nk, args.pad, device) if args.pad else None
    if kind == "lm":
        return (ids(n),), kwargs
    if kind == "encoder":
        lens = _lengths(b, n, args.pad, device) if args.pad else None
        return (ids(n),), {**kwargs, **({"src_valid_lens": lens} if lens is not None else {})}
    if lens is not None:
        kwargs["src_valid_lens"] = lens
    if kind == "decoder":
        memory = torch.randn(b, nk, config.d_model, device=device)
        return (ids(n), memory), kwargs
    return (ids(nk), ids(n)), kwargs


def _lengths(b: int, n: int, pad: int, device) -> torch.Tensor:
    """Every example full except the last, whose final ``pad`` positions are padding."""
    import torch
    lens = torch.full((b,), n, dtype=torch.long, device=device)
    lens[-1] = n - pad
    return lens


def _weights(spec: str | None, kind: str):
    """``--weights`` to a model's ``return_weights``: True, a kind, or {kind: [layers]}."""
    if spec is None:
        return None
    if spec == "all":
        return True
    kinds = WEIGHT_KINDS[kind]
    name, _, layers = spec.partition(":")
    if name not in kinds:
        raise ValueError(f"--weights {spec!r}: unknown kind {name!r}; this model has "
                         f"{', '.join(kinds)} (or give --weights with no value for all)")
    if not layers:
        return {name}
    try:
        return {name: [int(x) for x in layers.split(",")]}
    except ValueError:
        raise ValueError(f"--weights {spec!r}: layers must be integers, e.g. {name}:0,2") from None


def _from_checkpoint(args) -> tuple[torch.nn.Module, tuple, dict]:
    import torch

    from headwise import checkpoint

    for name in ("embed_dim", "heads", "head_dim", "kv_heads", "ff", "vocab", "layers"):
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} cannot be combined with --checkpoint: "
                             "the checkpoint fixes the sizes")
    folder = Path(args.checkpoint)
    loaded = checkpoint.load(folder, device=args.device)
    model, config = loaded.model.eval(), loaded.config
    kind = config.kind
    if args.backend:
        from headwise.attention import BACKENDS

        if args.backend != "auto" and args.backend not in BACKENDS:
            raise ValueError(f"unknown backend {args.backend!r}; choose 'auto' or one of "
                             f"{sorted(BACKENDS)}")
        for sub in model.modules():
            if hasattr(sub, "backend") and hasattr(sub, "num_heads"):
                sub.backend = args.backend
    device = torch.device(args.device)
    vocab = getattr(config, "vocab_size", None) or config.tgt_vocab_size
    if args.text is not None:
        if loaded.tokenizer is None:
            raise ValueError(f"--text: checkpoint {folder} has no tokenizer; trace random ids "
                             "(omit --text)")
        ids = torch.tensor([loaded.tokenizer.encode(args.text)], device=device)
        if ids.shape[1] == 0:
            raise ValueError("--text is empty after tokenization")
        shown = (loaded.tokenizer.tokens(ids[0].tolist()) if hasattr(loaded.tokenizer, "tokens")
                 else ids[0].tolist())
        print(f"{folder}: {kind} checkpoint; text {args.text!r} -> {ids.shape[1]} tokens "
              f"{shown}")
        args.seq = ids.shape[1]
        args.batch = 1
        if kind == "lm":
            return model, (ids,), _model_inputs("lm", model, config, args, vocab, device)[1]
        args.kv_seq = ids.shape[1]
        _, kwargs = _model_inputs(kind, model, config, args, vocab, device)
        return model, (ids, ids), kwargs
    if kind == "transformer":
        vocab = min(config.src_vocab_size, config.tgt_vocab_size)
    return model, *_model_inputs(kind, model, config, args, vocab, device)
