"""``headwise heads catalogue`` end to end on a tiny saved checkpoint, and its errors."""

import json

import pytest
import torch

from headwise.cli import main


@pytest.fixture(scope="module")
def rev_checkpoint(tmp_path_factory):
    """An untrained reversal checkpoint that records its task (as `headwise train` writes)."""
    from headwise import checkpoint
    from headwise.data import make_task
    from headwise.models import build
    from headwise.train import TrainConfig, build_model_config

    torch.manual_seed(0)
    cfg = TrainConfig(task="reverse", min_len=3, max_len=6, num_symbols=8,
                      model=dict(d_model=16, num_heads=2, num_layers=2, d_ff=16)).resolved()
    task = make_task("reverse", min_len=3, max_len=6, num_symbols=8)
    model_cfg = build_model_config(cfg, task)
    root = tmp_path_factory.mktemp("heads")
    return checkpoint.save(root / "rev", build(model_cfg), model_cfg, task.tokenizer,
                           metadata={"train_config": cfg.to_dict()})


def test_catalogue_of_a_checkpoint_writes_page_and_json(rev_checkpoint, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["heads", "catalogue", "--checkpoint", str(rev_checkpoint), "--examples", "40",
                 "--batch-size", "16", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "catalogue.json").read_text())
    assert data["meta"]["inputs"] == 40 and data["meta"]["batches"] == 3
    assert len(data["heads"]) == 3 * 2 * 2  # 3 kinds x 2 layers x 2 heads
    assert data["meta"]["dataset"] == "task reverse, held-out set"
    page = (out / "catalogue.html").read_text()
    assert 'id="hw-catalogue"' in page and "http://" not in page
    assert "most mirror" in printed and str(out / "catalogue.html") in printed


def test_catalogue_to_one_html_file_puts_json_beside_it(rev_checkpoint, tmp_path):
    out = tmp_path / "c.html"
    assert main(["heads", "catalogue", "--checkpoint", str(rev_checkpoint), "--examples", "8",
                 "-o", str(out), "--title", "mine"]) == 0
    assert out.is_file() and (tmp_path / "c.json").is_file()
    assert "<title>mine</title>" in out.read_text()


@pytest.mark.parametrize("argv, message", [
    (["--examples", "0"], "--examples must be >= 1, got 0"),
    (["--window", "-1"], "--window must be >= 1, got -1"),
    (["-o", "x.txt"], "expected a folder or a .html file"),
])
def test_bad_arguments_are_one_line_errors(rev_checkpoint, tmp_path, capsys, argv, message):
    code = main(["heads", "catalogue", "--checkpoint", str(rev_checkpoint), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert err.startswith("headwise heads catalogue: error:")


def test_checkpoint_without_a_task_and_missing_folder(tmp_path, capsys):
    from headwise import checkpoint
    from headwise.data.tokenizers import CharTokenizer
    from headwise.models import LMConfig, build

    tok = CharTokenizer("abc")
    cfg = LMConfig(vocab_size=tok.vocab_size, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                   max_len=8)
    bare = checkpoint.save(tmp_path / "bare", build(cfg), cfg, tok)
    assert main(["heads", "catalogue", "--checkpoint", str(bare)]) == 2
    assert "records no training task" in capsys.readouterr().err
    assert main(["heads", "catalogue", "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_nested_flags_are_checked_with_did_you_mean(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["heads", "catalogue", "--checkpoint", "x", "--exampels", "3"])
    assert exit_info.value.code == 2
    assert "did you mean '--examples'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["heads", "catalog"])
    assert "did you mean 'catalogue'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["heads", "catalogue"])  # one of --checkpoint / --model / --hf is required
    assert "one of the arguments --checkpoint --model --hf is required" in capsys.readouterr().err


_TEXT = ("Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy "
         "disposition, seemed to unite some of the best blessings of existence; and had lived "
         "nearly twenty-one years in the world with very little to distress or vex her. ") * 3


def test_catalogue_of_smollm2_over_windows_of_a_text(smollm2_path, tmp_path, capsys):
    """--model smollm2: every one of its 30 x 9 causal self-attention heads, over consecutive
    windows of the text; the tokens a head attends to most are tokens of that text."""
    from headwise.pretrained import load_smollm2
    text = tmp_path / "emma.txt"
    text.write_text(_TEXT)
    out = tmp_path / "smol"
    assert main(["heads", "catalogue", "--model", "smollm2", "--sentences", str(text),
                 "--examples", "2", "--length", "32", "-o", str(out)]) == 0
    data = json.loads((out / "catalogue.json").read_text())
    assert data["meta"]["inputs"] == 2 and "2 windows of 32 tokens" in data["meta"]["dataset"]
    heads = data["heads"]
    assert len(heads) == 30 * 9 and {h["kind"] for h in heads} == {"decoder_self"}
    assert {(h["layer"], h["head"]) for h in heads} == {(l, x) for l in range(30) for x in range(9)}
    tok = load_smollm2().tokenizer
    seen = set(tok.encode(_TEXT)[:64])
    top = {t["id"] for h in heads for t in h["top_tokens"]}
    assert top and top <= seen
    assert all(t["token"] == tok.tokens([t["id"]])[0] for h in heads for t in h["top_tokens"])
    assert "SmolLM2-135M-Instruct" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--length", "100000"], "longer than SmolLM2's context"),
    (["--length", "0"], "--length must be >= 1, got 0"),
    (["--length", "4000"], "fewer than one window of --length 4000"),
])
def test_smollm2_catalogue_bad_lengths_are_one_line(smollm2_path, tmp_path, capsys, argv,
                                                    message):
    text = tmp_path / "short.txt"
    text.write_text(_TEXT)
    code = main(["heads", "catalogue", "--model", "smollm2", "--sentences", str(text), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
