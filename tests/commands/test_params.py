"""`headwise params`: counts taken from built modules equal the closed-form counts."""

from __future__ import annotations

import re

import pytest

from headwise.cli import main


def run(capsys, *argv):
    code = main(["params", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def rows(out):
    table = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] in ("W_q", "W_k", "W_v", "W_o", "total"):
            table[cells[0]] = cells
    return table


@pytest.mark.parametrize("m, h, d, kdim, vdim, g", [
    (512, 8, None, None, None, None), (4, 2, 3, 3, 2, None), (64, 8, None, None, None, 2),
    (30, 5, 7, 11, 13, 5)])
def test_mha_counts_match_closed_form(capsys, m, h, d, kdim, vdim, g):
    argv = ["mha", "--embed-dim", str(m), "--heads", str(h)]
    for flag, value in (("--head-dim", d), ("--kdim", kdim), ("--vdim", vdim),
                        ("--kv-heads", g)):
        if value is not None:
            argv += [flag, str(value)]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    d = d or m // h
    g = g or h
    kdim, vdim = kdim or m, vdim or kdim or m
    lin = lambda i, o: i * o + o  # noqa: E731
    want = {"W_q": (lin(m, h * d),) * 3,
            "W_k": (lin(kdim, g * d), lin(kdim, g * d), lin(kdim, h * d)),
            "W_v": (lin(vdim, g * d), lin(vdim, g * d), lin(vdim, h * d)),
            "W_o": (lin(h * d, m),) * 3}
    table = rows(out)
    for name, (fused, per_head, big) in want.items():
        numbers = [int(c.replace(",", "")) for c in table[name] if re.fullmatch(r"[\d,]+", c)]
        assert numbers == [fused, per_head, big], (name, table[name])
        assert table[name][-1] == ("yes" if fused == big else "per head only")
    total = [int(c.replace(",", "")) for c in table["total"] if re.fullmatch(r"[\d,]+", c)]
    assert total == [sum(v[0] for v in want.values()), sum(v[1] for v in want.values()),
                     sum(v[2] for v in want.values())]
    assert f"{h} heads × ({m}·{d} + {d}) = {m}·{h * d} + {h * d}" in out


def test_model_total_is_the_models_parameter_count(capsys):
    from headwise.models import LMConfig, build

    code, out, _ = run(capsys, "lm", "--vocab", "100", "--embed-dim", "32", "--heads", "4",
                       "--layers", "3", "--tie")
    assert code == 0
    model = build(LMConfig(100, d_model=32, num_heads=4, num_layers=3, d_ff=128, tie_embeddings=True))
    total = re.search(r"^\s*total\s+([\d,]+)\s*$", out, re.M).group(1)
    assert int(total.replace(",", "")) == sum(p.numel() for p in model.parameters())
    assert re.search(r"blocks\.\*\.self_attn\s+3\s+4,224\s+12,672", out)
    assert "lm_head (tied: counted once)" in out


@pytest.mark.parametrize("argv, message", [
    (("gpt",), "unknown model kind 'gpt'"),
    (("mha", "--embed-dim", "10", "--heads", "4"), "embed_dim=10 is not divisible"),
    (("lm", "--kdim", "3"), "--kdim, --vdim and --out-dim apply to `params mha` only"),
    (("mha", "--heads", "0"), "--heads must be >= 1"),
])
def test_bad_input(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
