"""``headwise params``: where the parameters of multi-head attention are, counted on real
modules.

    headwise params mha --embed-dim 512 --heads 8
    headwise params mha --embed-dim 4 --heads 2 --head-dim 3 --kdim 3 --vdim 2
    headwise params lm --vocab 33300 --embed-dim 512 --heads 8 --layers 6

For each projection the table shows the fused ``Linear(in, h*d)``, the ``h`` per-head
``Linear(in, d)`` of :func:`headwise.unfuse`, and one big single head of size ``h*d``: the three
always have exactly the same number of parameters (column block ``x`` of the fused weight *is*
head ``x``'s projection). Every count is ``sum(p.numel())`` over a module that was built.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `headwise params --help` must not load torch
    from rich.console import Console
    from torch import nn

KINDS = ("mha", "encoder", "decoder", "transformer", "lm")


HELP = "parameter table: per head vs fused vs one big head, per component"
EXAMPLE = "headwise params mha --embed-dim 512 --heads 8"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "params",
        description="Count the parameters of a configuration on real modules: each attention "
                    "projection fused, split into per-head projections, and as one big head; "
                    "for a model, every component and the total.")
    p.add_argument("kind", nargs="?", default="mha", help=f"one of {', '.join(KINDS)} "
                                                          "(default mha)")
    p.add_argument("--embed-dim", type=int, default=512, help="model dim m (default 512)")
    p.add_argument("--heads", type=int, default=8, help="query heads h (default 8)")
    p.add_argument("--head-dim", type=int, help="per-head size d (default m // h)")
    p.add_argument("--kdim", type=int, help="mha: key input size")
    p.add_argument("--vdim", type=int, help="mha: value input size")
    p.add_argument("--kv-heads", type=int, help="key/value heads g (grouped-query)")
    p.add_argument("--out-dim", type=int, help="mha: output size (default m)")
    p.add_argument("--no-bias", action="store_true", help="projections without biases")
    p.add_argument("--ff", type=int, help="models: feed-forward width (default 4 * m)")
    p.add_argument("--vocab", type=int, default=1000, help="models: vocabulary (default 1000)")
    p.add_argument("--layers", type=int, default=6, help="models: blocks per stack (default 6)")
    p.add_argument("--tie", action="store_true", help="models: tie output and input embeddings")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.kind not in KINDS:
        raise ValueError(f"unknown model kind {args.kind!r}; choose one of {', '.join(KINDS)}")
    for name in ("embed_dim", "heads", "head_dim", "kdim", "vdim", "kv_heads", "out_dim", "ff",
                 "vocab", "layers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.kind != "mha" and (args.kdim or args.vdim or args.out_dim):
        raise ValueError("--kdim, --vdim and --out-dim apply to `params mha` only")
    from rich.console import Console

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 100)
    if args.kind == "mha":
        import headwise as hw

        mha = hw.MultiHeadAttention(args.embed_dim, args.heads, head_dim=args.head_dim,
                                    kdim=args.kdim, vdim=args.vdim, num_kv_heads=args.kv_heads,
                                    out_dim=args.out_dim, bias=not args.no_bias)
        attention_table(console, mha)
        return 0
    model = _build_model(args)
    first = next(m for m in model.modules() if type(m).__name__ == "MultiHeadAttention")
    attention_table(console, first, title="each attention layer")
    component_table(console, model)
    return 0


def _count(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _linear(linear: nn.Linear) -> str:
    return f"{linear.in_features}→{linear.out_features}"


def attention_table(console: Console, mha, title: str | None = None) -> None:
    """Per projection: fused vs h per-head projections vs one big head, all counted."""
    from rich import box
    from rich.table import Table

    import headwise as hw

    per_head = hw.unfuse(mha)
    h, g, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    big = hw.MultiHeadAttention(mha.embed_dim, 1, head_dim=h * d, kdim=mha.kdim, vdim=mha.vdim,
                                out_dim=mha.out_dim, bias=mha.q_proj.bias is not None)
    heading = (f"MultiHeadAttention(m={mha.embed_dim}, h={h}, d={d}"
               + (f", g={g}" if g != h else "")
               + (f", kdim={mha.kdim}" if mha.kdim != mha.embed_dim else "")
               + (f", vdim={mha.vdim}" if mha.vdim != mha.kdim else "")
               + (f", out={mha.out_dim}" if mha.out_dim != mha.embed_dim else "") + ")")
    table = Table(title=f"{heading}{': ' + title if title else ''}", box=box.SIMPLE_HEAD,
                  title_justify="left", title_style="bold", pad_edge=False)
    for name in ("", "fused", "params", "per head", "params", "one head", "params", "same?"):
        table.add_column(name, justify="right" if name == "params" else "left", no_wrap=True)
    totals = [0, 0, 0]
    rows = (("W_q", mha.q_proj, per_head.q_heads, big.q_proj, h),
            ("W_k", mha.k_proj, per_head.k_heads, big.k_proj, g),
            ("W_v", mha.v_proj, per_head.v_heads, big.v_proj, g))
    for name, fused, heads, one, n in rows:
        counts = (_count(fused), _count(heads), _count(one))
        for x in range(3):
            totals[x] += counts[x]
        table.add_row(name, _linear(fused), f"{counts[0]:,}",
                      f"{n} × {_linear(heads[0])}",
                      f"{counts[1]:,}", _linear(one), f"{counts[2]:,}",
                      _same(*counts))
    counts = (_count(mha.out_proj), _count(per_head.out_proj), _count(big.out_proj))
    for x in range(3):
        totals[x] += counts[x]
    table.add_row("W_o", _linear(mha.out_proj), f"{counts[0]:,}",
                  _linear(per_head.out_proj), f"{counts[1]:,}",
                  _linear(big.out_proj), f"{counts[2]:,}", _same(*counts))
    table.add_section()
    table.add_row("total", "", f"{_count(mha):,}", "", f"{_count(per_head):,}", "",
                  f"{_count(big):,}", _same(_count(mha), _count(per_head), _count(big)))
    console.print(table)
    _explain_counts(console, mha, big)


def _explain_counts(console: Console, mha, big) -> None:
    """The notes under the table: what each column is and why the counts agree."""
    from torch import nn

    h, g, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    console.print(f"fused: this module; per head: headwise.unfuse (separate Linear(in, {d}) per "
                  f"head; W_o stays one Linear, it mixes all heads); one head: "
                  f"MultiHeadAttention(h=1, head_dim={h * d}). in→out is one nn.Linear with its "
                  "bias; every count is sum(p.numel()) of a built module.")
    bias = mha.q_proj.bias is not None
    per = f"{mha.embed_dim}·{d}" + (f" + {d}" if bias else "")
    whole = f"{mha.embed_dim}·{h * d}" + (f" + {h * d}" if bias else "")
    console.print(f"{h} heads × ({per}) = {whole} = {_count(mha.q_proj):,} for W_q: splitting "
                  "into heads is a reshape of the projection's output, it adds no parameters.")
    if g != h:
        console.print(f"grouped-query: W_k and W_v have g={g} heads (not h={h}) of d={d}, so "
                      f"{_count(big) - _count(mha):,} fewer parameters than one big head of "
                      f"{h * d}; the one-big-head column is the h = g comparison.")
    naive = h * sum(_count(nn.Linear(i, mha.embed_dim, bias=bias))
                    for i in (mha.embed_dim, mha.kdim, mha.vdim))
    if naive > _count(mha) - _count(mha.out_proj):
        console.print(f"(Were every head a full-width copy, h × Linear(·, {mha.embed_dim}) for "
                      f"q, k and v would need {naive:,} parameters instead of "
                      f"{_count(mha) - _count(mha.out_proj):,}.)")


def _same(fused: int, per_head: int, big: int) -> str:
    if fused == per_head == big:
        return "yes"
    return "per head only" if fused == per_head else "NO"


def component_table(console: Console, model: nn.Module) -> None:
    """Every component of a model, per layer and in total, tied weights counted once."""
    from rich import box
    from rich.table import Table

    groups: OrderedDict[str, dict] = OrderedDict()
    seen: set[int] = set()
    for path, param in model.named_parameters(remove_duplicate=False):
        owner = path.rsplit(".", 1)[0]
        name = re.sub(r"\.\d+\.", ".*.", owner + ".")[:-1]
        component = _component(name)
        entry = groups.setdefault(component, {"params": 0, "layers": set(), "tied": False})
        layer = re.search(r"\.(\d+)\.", owner + ".")
        if layer:
            entry["layers"].add(layer.group(1))
        if id(param) in seen:
            entry["tied"] = True
            continue
        seen.add(id(param))
        entry["params"] += param.numel()
    table = Table(title=f"{type(model).__name__}: parameters by component",
                  box=box.SIMPLE_HEAD, title_justify="left", title_style="bold")
    table.add_column("component")
    table.add_column("layers", justify="right")
    table.add_column("per layer", justify="right")
    table.add_column("total", justify="right")
    total = 0
    for component, entry in groups.items():
        layers = max(1, len(entry["layers"]))
        per = entry["params"] // layers
        total += entry["params"]
        note = " (tied: counted once)" if entry["tied"] and entry["params"] == 0 else ""
        table.add_row(component + note, str(layers) if entry["layers"] else "",
                      f"{per:,}" if entry["layers"] else "", f"{entry['params']:,}")
    table.add_section()
    real = sum(p.numel() for p in model.parameters())
    assert total == real, (total, real)
    table.add_row("total", "", "", f"{total:,}")
    console.print(table)


def _component(name: str) -> str:
    """``blocks.*.self_attn.q_proj`` -> ``blocks.*.self_attn``; ``embed.tokens`` stays."""
    parts = name.split(".")
    for n, part in enumerate(parts):
        if part.endswith("attn") or part in ("ff", "attention"):
            return ".".join(parts[:n + 1])
    return name


def _build_model(args):
    from headwise.layers import AttentionConfig
    from headwise.models import Decoder, Encoder, LMConfig, TransformerConfig, build

    m = args.embed_dim
    common = dict(d_model=m, num_heads=args.heads, num_layers=args.layers,
                  d_ff=args.ff or 4 * m, tie_embeddings=args.tie, bias=not args.no_bias,
                  attention=AttentionConfig(num_kv_heads=args.kv_heads, head_dim=args.head_dim))
    if args.kind == "lm":
        return build(LMConfig(vocab_size=args.vocab, **common))
    config = TransformerConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, **common)
    return {"encoder": Encoder, "decoder": Decoder, "transformer": build}[args.kind](config)

