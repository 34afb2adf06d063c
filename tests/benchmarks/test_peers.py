"""benchmarks/peers.py's cells do not rot: headwise's cells and HF eager's run on a tiny random
Llama (16 layers, so layer 15 head 3 exists) saved with a word-level tokenizer, and each result
equals HF eager's output_attentions (the reference the table reports against); the parent's
child protocol, table and goal lines work on a real child; a cell a tool lacks says why without
a process; the peers' cells run only where ``make peers`` built ``.peers/``."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
P = importlib.import_module("_peers_cells")
peers = importlib.import_module("peers")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

N = 40  # tokens
WORDS = [f"w{i}" for i in range(60)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model_dir, ids_file): a random Llama and its tokenizer, saved; ids of N words."""
    d = tmp_path_factory.mktemp("tiny")
    cfg = transformers.LlamaConfig(
        vocab_size=len(WORDS) + 1, hidden_size=32, intermediate_size=48, num_hidden_layers=16,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    vocab = {w: i for i, w in enumerate(WORDS)} | {"<unk>": len(WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece()  # joins the words with spaces
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(d)
    ids = torch.randint(0, len(WORDS), (N + P.PROMPT,), generator=torch.Generator().manual_seed(1))
    ids_file = d / "ids.json"
    ids_file.write_text(json.dumps(ids.tolist()))
    return str(d), str(ids_file)


def _measure(tiny, tool, cell, n=N):
    threads = torch.get_num_threads()
    try:
        return P.measure({"tool": tool, "cell": cell, "n": n, "model_dir": tiny[0],
                          "ids_file": tiny[1]})
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("cell", ["head", "layers", "stats", "z", "decode"])
@pytest.mark.parametrize("tool", ["headwise", "HF eager"])
def test_each_cell_equals_hf_eager_and_reports_what_it_returned(tiny, tool, cell):
    got = _measure(tiny, tool, cell, n=P.PROMPT if cell == "decode" else N)
    assert got["diff"] is not None and got["diff"] < 1e-5, got  # float32 softmax, 16 layers
    assert got["s"] > 0 and got["floor_s"] > 0
    returned = {"head": N * N * 4, "layers": 16 * 4 * N * N * 4, "stats": 16 * 4 * 3 * 8,
                "z": N * 4 * 8 * 4}
    if cell in returned:
        assert got["returned"] * 2**20 == pytest.approx(returned[cell], rel=0.5 if cell == "stats"
                                                        else 1e-9)
        assert got["n"] == N
    else:  # decode: the tokens (int64) and one (j,) row a forward, the prompt's last and each
        assert got["n"] == P.PROMPT  # step's
        want = 8 * (P.PROMPT + P.NEW) + sum(4 * (P.PROMPT + k) for k in range(P.NEW))
        assert got["returned"] * 2**20 == want


def test_the_head_view_cell_writes_a_page(tiny):
    got = _measure(tiny, "headwise", "view")
    assert got["returned"] > 1000 / 2**20 and got["diff"] is None  # a page: bytes, no diff


def test_a_cell_a_tool_lacks_says_why_in_one_line():
    for tool, cell in [("headwise", "head@stop"), ("bertviz", "head"), ("attnread", "z"),
                       ("HF eager", "view")]:
        why = P.supported(tool, cell)
        assert why and "\n" not in why and len(why) < 100
    assert P.supported("TransformerLens", "head@stop") == ""
    assert all(P.supported("headwise", c) == "" for c in ("head", "layers", "stats", "z"))


def test_a_child_process_feeds_the_table_and_the_goal_lines(tiny):
    got = peers.run_child("headwise", "head", N, tiny[0], tiny[1], timeout=300)
    assert "why" not in got, got
    rows = peers.rows_of({("headwise", "head", N): [got],
                          ("nnsight", "head@stop", N): [{"why": P.supported("nnsight",
                                                                            "head@stop")}]})
    table = peers.C.table(rows, peers.COLS)
    assert "| headwise |" in table and "nnsight runs the whole forward" in table
    lines = peers.goals(rows)
    assert lines[0].startswith(f"goal one head via headwise.hf.weights (no cache yet), n={N}")
    assert all(ln.endswith(("PASS", "FAIL")) and len(ln) <= 140 for ln in lines), lines


def test_the_goal_lines_turn_at_their_thresholds():
    def rows(x_head, x_layers_hw, x_layers_eager):
        base = {"n": 512, "s": 1.0, "floor s": 1.0, "peak MiB": 10.0, "floor peak MiB": 10.0,
                "returned MiB": 1.0}
        return [{**base, "tool": "headwise", "cell": "head", "x floor": x_head},
                {**base, "tool": "headwise", "cell": "layers", "x floor": x_layers_hw},
                {**base, "tool": "HF eager", "cell": "layers", "x floor": x_layers_eager}]
    good = peers.goals(rows(1.04, 1.0, 2.0))
    bad = peers.goals(rows(1.06, 1.2, 2.0))
    assert [ln.rsplit(" ", 1)[1] for ln in good] == ["PASS", "FAIL", "PASS"]  # no cache: FAIL
    assert [ln.rsplit(" ", 1)[1] for ln in bad] == ["FAIL", "FAIL", "FAIL"]


@pytest.mark.skipif(not (peers.ROOT / ".peers" / "bin" / "python").exists(),
                    reason=".peers/ absent: `make peers` builds the peers' environment")
@pytest.mark.parametrize("tool,cell", [("TransformerLens", "head"),
                                       ("TransformerLens", "head@stop"),
                                       ("TransformerLens", "z"), ("nnsight", "layers"),
                                       ("nnsight", "z")])
def test_the_peers_cells_run_in_their_environment(tiny, tool, cell):
    got = peers.run_child(tool, cell, N, tiny[0], tiny[1], timeout=300)
    assert "why" not in got, got
    assert got["diff"] < 1e-5, got


@pytest.mark.skipif(bool(P.HeadwiseCache.available()), reason="no hw.run_with_cache in this build")
@pytest.mark.parametrize("cell", ["head", "head@stop", "layers", "z", "hooks", "decode"])
def test_the_cache_cells_equal_hf_eager(tiny, cell):
    got = _measure(tiny, "headwise cache", cell, n=P.PROMPT if cell == "decode" else N)
    assert cell == "hooks" or got["diff"] < 1e-5, got
    assert got["returned"] > 0
