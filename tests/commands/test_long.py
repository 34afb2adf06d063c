"""``headwise long`` end to end on a tiny Llama folder (offline word-level tokenizer): the
per-head table, --by/--top, --rows with exact tiles, --save/--view, and bad input as one line
(exit 2) before the forward."""

from __future__ import annotations

import pytest

from headwise.cli import main
from headwise.long import LongProfile

tiny = pytest.importorskip("tests.hf.tiny", reason="the hf wing needs transformers")
TEXT = "the cat sat on the mat . a dog ran to the house . it was the cat and the dog ."


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("long-cli")
    tiny.save("llama", root / "llama")
    (root / "doc.txt").write_text(TEXT, encoding="utf-8")
    (root / "long.txt").write_text(" ".join([TEXT] * 5), encoding="utf-8")  # 110 tokens > 64
    return root


def test_table_sorted_and_cut(folder, capsys):
    assert main(["long", "--hf", str(folder / "llama"), "--file", str(folder / "doc.txt"),
                 "--window", "2", "--sinks", "1", "--far", "4", "--by", "far", "--top", "3",
                 "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{folder / 'llama'}: 22 tokens, 2 layers x 4 heads (of 4, 2 ")
    rows = out[2:5]
    assert len(out) == 5 and all(r.split()[0].count(".") == 1 for r in rows)
    far = [float(r.split()[4]) for r in rows]
    assert far == sorted(far, reverse=True) and far[0] > 0


def test_rows_save_and_view(folder, tmp_path, capsys):
    save, view = tmp_path / "p.safetensors", tmp_path / "v.html"
    assert main(["long", "--hf", str(folder / "llama"), "--file", str(folder / "doc.txt"),
                 "--layers", "1", "--heads", "0,3", "--rows", "last-sentence", "--save",
                 str(save), "--view", str(view), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "rows 'last-sentence': tokens 14..21 " in out  # "it was the cat and the dog ."
    assert "  1.0: " in out and "  1.3: " in out
    prof = LongProfile.load(save)
    assert prof.layers == [1] and prof.heads == [0, 3] and prof.n == 22
    assert view.stat().st_size > 1000 and "<html" in view.read_text()[:500].lower()


@pytest.mark.parametrize("extra, words", [
    (["--file", "long.txt"], "the document has 110 tokens but LlamaForCausalLM's context is 64"),
    (["--file", "doc.txt", "--block", "50"], "block size 50 does not fit a 22-token document"),
    (["--file", "doc.txt", "--rows", "a zebra"], "--rows 'a zebra': not in the document"),
    (["--file", "doc.txt", "--layers", "7"], "--layers '7': [7] out of range"),
    (["--file", "doc.txt", "--save", "p.pt"], "must end in .safetensors"),
])
def test_bad_input_exits_2_with_one_line(folder, capsys, extra, words):
    extra = [str(folder / x) if x.endswith(".txt") else x for x in extra]
    assert main(["long", "--hf", str(folder / "llama"), *extra, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err
