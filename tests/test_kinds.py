"""The one attention-kinds table: it names what the models return and the sides their weights
read; no other module or page asset spells it; the pages get it through META; the score-table
check every view shares."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import headwise
from headwise.kinds import CROSS, DECODER_SELF, ENCODER_SELF, KINDS, as_tables

SRC = Path(headwise.__file__).resolve().parent


def test_the_kinds_are_what_an_encoder_decoder_returns_with_the_sides_they_read():
    """Source and target of different lengths: each kind's weights are (query side's length,
    key side's length), in the table's order; self-attention exactly where the sides agree."""
    from headwise.models import Transformer, TransformerConfig

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(src_vocab_size=11, tgt_vocab_size=13, d_model=8,
                                          num_heads=2, num_layers=1, d_ff=8, max_len=16,
                                          dropout=0.0)).eval()
    lengths = {"src": 5, "tgt": 3}
    _, att = model(torch.randint(1, 11, (2, 5)), torch.randint(1, 13, (2, 3)),
                   return_weights=True)
    assert list(att) == list(KINDS) == [ENCODER_SELF, DECODER_SELF, CROSS]
    for name, kind in KINDS.items():
        assert tuple(att[name][0].shape[2:]) == (lengths[kind.query], lengths[kind.key]), name
        assert kind.sides == (kind.query, kind.key)
    assert [name for name, kind in KINDS.items() if kind.is_self] == [ENCODER_SELF, DECODER_SELF]
    assert len({kind.label for kind in KINDS.values()}) == len({k.short for k in KINDS.values()}) \
        == 3


KIND_NAMES = frozenset(KINDS)


def table_copies(source: str) -> list[int]:
    """Lines of ``source`` that spell (part of) the kinds table again: a tuple, list or set of
    two or more kind names, or a dict keyed by two or more whose values are constants (a dict
    of data per kind, ``{"cross": weights}``, is no copy)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = {e.value for e in node.elts if isinstance(e, ast.Constant)} & KIND_NAMES
        elif isinstance(node, ast.Dict) and all(isinstance(v, (ast.Constant, ast.Tuple))
                                                for v in node.values):
            names = {k.value for k in node.keys if isinstance(k, ast.Constant)} & KIND_NAMES
        else:
            continue
        if len(names) >= 2:
            found.append(node.lineno)
    return found


def test_the_copy_finder_finds_the_copies_this_table_replaced():
    assert table_copies('KINDS = ("encoder_self", "decoder_self", "cross")\n') == [1]
    assert table_copies('KINDS = {"encoder_self": ("src", "src"),\n'
                        '         "cross": ("tgt", "src")}\n') == [1]
    assert table_copies("def f(m):\n    return [m[k] for k in ['decoder_self', 'cross']]\n") == [2]
    assert table_copies('out = {"encoder_self": enc, "cross": cross}\n'  # data per kind
                        'one = ("cross",)\nk = "decoder_self"\n') == []


def test_no_module_and_no_page_script_but_the_table_spells_the_kinds():
    copies = {path.relative_to(SRC).as_posix(): lines for path in sorted(SRC.rglob("*.py"))
              if (lines := table_copies(path.read_text()))}
    assert list(copies) == ["kinds.py"], copies  # its own ENCODER_SELF, ... = line
    for script in sorted((SRC / "viz" / "assets").glob("*.js")):
        spelled = re.findall(r"""["'`](encoder_self|decoder_self|cross)["'`]""",
                             script.read_text())
        assert spelled == [], f"{script.name} spells kinds {spelled}; read them from META"


def test_the_pages_get_the_kinds_order_and_labels_from_the_table(tmp_path):
    from headwise.viz import catalogue_page, head_view
    from tests.viz.test_head_view import read_page, seq2seq

    att = seq2seq()
    del att["encoder_self"]  # a kind absent from the model is still a (disabled) button
    meta = read_page(head_view(att, {"src": list("abcdef"), "tgt": list("vwxyz")}))[1]
    assert meta["kindOrder"] == list(KINDS)
    assert meta["kindShort"] == {name: kind.short for name, kind in KINDS.items()}
    assert {name: entry["label"] for name, entry in meta["kinds"].items()} == {
        DECODER_SELF: KINDS[DECODER_SELF].label, CROSS: KINDS[CROSS].label}

    class Catalogue:  # what catalogue_page reads of one (it is duck-typed)
        meta = {"model": "m", "kinds": {CROSS: [2], ENCODER_SELF: [2]}}
        heads: list = []

    text = catalogue_page(Catalogue()).html
    data = json.loads(re.search(r'id="hw-catalogue">(.*?)</script>', text, re.S).group(1))
    assert data["meta"]["kindOrder"] == [ENCODER_SELF, CROSS]  # the table's order, not the dict's
    assert data["meta"]["kindLabels"] == {k: KINDS[k].label for k in (CROSS, ENCODER_SELF)}


def test_the_table_loads_without_torch():
    """``headwise view --help`` builds its ``--kind`` choices from it."""
    code = "import sys, headwise.kinds; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_score_tables_are_checked_against_the_models_kinds_and_shapes():
    from headwise import HeadScores

    shapes = {CROSS: (2, 3)}
    table = torch.arange(6.0).reshape(2, 3)
    got = as_tables({CROSS: table.numpy()}, shapes, "view")
    assert got[CROSS].dtype == torch.float64 and torch.equal(got[CROSS], table.double())
    scores = HeadScores("gradient", {CROSS: table})
    assert torch.equal(as_tables(scores, shapes, "view")[CROSS], table.double())
    with pytest.raises(ValueError, match=r"view: importance has kind 'encoder_self'; this model "
                                         r"has \['cross'\]"):
        as_tables({ENCODER_SELF: table}, shapes, "view")
    with pytest.raises(ValueError, match=r"importance\['cross'\] must be \(layers, heads\) = "
                                         r"\(2, 3\), got shape \(3, 2\)"):
        as_tables({CROSS: table.T}, shapes, "view")
    with pytest.raises(TypeError, match="must be a HeadScores or a dict kind -> .*got list"):
        as_tables([table], shapes, "view")
