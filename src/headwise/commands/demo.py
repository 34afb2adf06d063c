"""``headwise demo``: a tour of the core on the 4/3/2-sized example (replaced by the training
demo once it lands)."""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="the main job: a showcase of headwise")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import headwise as hw

    console = Console()
    torch.manual_seed(args.seed)
    mha = hw.MultiHeadAttention(4, 2, head_dim=3, kdim=3, vdim=2)
    q, k, v = torch.randn(1, 5, 4), torch.randn(1, 6, 3), torch.randn(1, 6, 2)
    console.print("[bold]MultiHeadAttention(4, 2, head_dim=3, kdim=3, vdim=2)[/]: queries of size"
                  " 4, keys of size 3, values of size 2, hidden size 6 in 2 heads")
    out, weights = mha(q, k, v, valid_lens=torch.tensor([4]), return_weights=True)
    shapes = Table("tensor", "shape", "axes")
    for name, t, axes in (("query", q, "b i m"), ("key", k, "b j kdim"), ("value", v, "b j vdim"),
                          ("weights", weights, "b h i j"), ("output", out, "b i m")):
        shapes.add_row(name, str(tuple(t.shape)), axes)
    console.print(shapes)
    for h in range(weights.shape[1]):
        console.print(f"head {h} weights (keys 4, 5 are padding, so 0):")
        console.print(weights[0, h].detach().numpy().round(3))
    per_head = hw.unfuse(mha)
    params = Table("form", "parameters", "output max |diff|")
    fused_n = sum(p.numel() for p in mha.parameters())
    loop_n = sum(p.numel() for p in per_head.parameters())
    diff = (per_head(q, k, v, mask=hw.masks.from_valid_lens(torch.tensor([4]), 6))[0] - out)
    params.add_row("fused MultiHeadAttention", str(fused_n), "-")
    params.add_row("per-head loop (unfuse)", str(loop_n), f"{diff.abs().max().item():.2e}")
    console.print(params)
    return 0
