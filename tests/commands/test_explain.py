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
    # the trace summary: one line per layer's attention call, naming the kernel and why
    assert re.search(r"attention: 6 calls", printed)
    assert printed.count("self_attn") == 6
    assert "weights recomputed from the flash LSE" in printed
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
