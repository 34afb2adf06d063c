"""``headwise view`` end to end on tiny saved checkpoints (LM and encoder-decoder)."""

import json
import re

import pytest
import torch

from headwise.cli import main


def page_meta(path):
    text = path.read_text(encoding="utf-8")
    return json.loads(re.search(r'id="hw-meta">(.*?)</script>', text, re.S).group(1))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from headwise import checkpoint
    from headwise.data.tokenizers import CharTokenizer
    from headwise.models import LMConfig, TransformerConfig, build

    torch.manual_seed(0)
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz ")
    root = tmp_path_factory.mktemp("ckpt")
    lm_cfg = LMConfig(vocab_size=tok.vocab_size, d_model=16, num_heads=2, num_layers=2, d_ff=32,
                      max_len=32, dropout=0.0)
    mt_cfg = TransformerConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size,
                               d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=32,
                               dropout=0.0)
    lm = checkpoint.save(root / "lm", build(lm_cfg), lm_cfg, tok)
    mt = checkpoint.save(root / "mt", build(mt_cfg), mt_cfg, tok)
    small = CharTokenizer("abcdefghij")
    rev_cfg = TransformerConfig(src_vocab_size=small.vocab_size, tgt_vocab_size=small.vocab_size,
                                d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=32,
                                dropout=0.0)
    rev = checkpoint.save(root / "rev", build(rev_cfg), rev_cfg, small,
                          metadata={"train_config": {"task": "reverse", "min_len": 4,
                                                     "max_len": 16, "num_symbols": 10}})
    return {"lm": lm, "mt": mt, "rev": rev}


def test_view_lm(checkpoints, tmp_path, capsys):
    out = tmp_path / "lm.html"
    assert main(["view", "--checkpoint", str(checkpoints["lm"]), "--text", "to be or not",
                 "-o", str(out), "--heatmaps", str(tmp_path / "lm.png")]) == 0
    meta = page_meta(out)
    assert list(meta["kinds"]) == ["decoder_self"]
    assert meta["tokens"]["tgt"] == [list("to be or not")]
    assert meta["kinds"]["decoder_self"]["heads"] == [2, 2]
    assert (tmp_path / "lm.png").stat().st_size > 1000
    assert "head view:" in capsys.readouterr().out


def test_view_lm_generate_matches_step_by_step_attention(checkpoints, tmp_path):
    """--generate N: the page holds prompt + continuation, and the weights of each generated
    token equal those the model used while generating it with the KV cache."""
    from headwise import checkpoint
    from headwise.decoding import generate

    out = tmp_path / "gen.html"
    assert main(["view", "--checkpoint", str(checkpoints["lm"]), "--text", "abc",
                 "--generate", "4", "-o", str(out)]) == 0
    toks = page_meta(out)["tokens"]["tgt"][0]
    assert toks[:3] == list("abc") and 4 <= len(toks) <= 7
    loaded = checkpoint.load(checkpoints["lm"])
    model, tok = loaded.model, loaded.tokenizer
    ids = torch.tensor([tok.encode("abc")])
    full = generate(model, ids, max_new_tokens=4, eos_id=tok.eos_id)[:, :len(toks)]
    assert tok.tokens(full[0].tolist()) == toks
    # step by step with the cache: the last token's row of weights at each step
    cache = model.new_cache(1)
    with torch.no_grad():
        _, att = model(full[:, :3], cache=cache, return_weights=True)
        steps = [att["decoder_self"][0][0, :, -1]]
        for t in range(3, full.shape[1]):
            _, att = model(full[:, t:t + 1], cache=cache, return_weights=True)
            steps.append(att["decoder_self"][0][0, :, -1])
        _, whole = model(full, return_weights=True)
    for k, row in enumerate(steps):
        t = 2 + k
        torch.testing.assert_close(row[:, :t + 1], whole["decoder_self"][0][0, :, t, :t + 1])


def test_view_seq2seq_with_and_without_target(checkpoints, tmp_path):
    out = tmp_path / "mt.html"
    assert main(["view", "--checkpoint", str(checkpoints["mt"]), "--src", "the cat",
                 "--tgt", "le chat", "-o", str(out)]) == 0
    meta = page_meta(out)
    assert set(meta["kinds"]) == {"encoder_self", "decoder_self", "cross"}
    assert meta["tokens"]["src"] == [list("the cat")]
    assert meta["tokens"]["tgt"] == [["<bos>", *"le chat"]]
    # no --tgt: the model's own greedy output is the target
    out2 = tmp_path / "mt2.html"
    assert main(["view", "--checkpoint", str(checkpoints["mt"]), "--src", "abc",
                 "--max-new-tokens", "5", "-o", str(out2)]) == 0
    tgt = page_meta(out2)["tokens"]["tgt"][0]
    assert tgt[0] == "<bos>" and 1 <= len(tgt) <= 6


@pytest.mark.parametrize("which, extra, message", [
    ("mt", ["--text", "abc"], "encoder-decoder model; pass --src"),
    ("lm", ["--src", "abc"], "decoder-only language model; pass --text"),
    ("lm", ["--text", "a" * 40], "max_len=32"),
    ("lm", ["--text", "abc", "--heatmaps", "x.png", "--kind", "cross"], "not an attention"),
    ("lm", [], "--text"),
    ("lm", ["--text", "abc", "--device", "foo"], "not a torch device"),
    ("lm", ["--text", "abc", "--generate", "-1"], ">= 0"),
])
def test_view_errors_are_one_line(checkpoints, tmp_path, capsys, which, extra, message):
    code = main(["view", "--checkpoint", str(checkpoints[which]), "-o", str(tmp_path / "v.html"),
                 *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "v.html").exists()


def test_view_missing_checkpoint(tmp_path, capsys):
    assert main(["view", "--checkpoint", str(tmp_path / "nope"), "--text", "a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headwise view: error:") and len(err.strip().splitlines()) == 1


def test_view_prints_the_output_and_writes_a_report_folder(checkpoints, tmp_path, capsys,
                                                          monkeypatch):
    """No -o: the page and heatmaps go to headwise-reports/view-<input>/, never loose files in
    the working directory; the decoded output is printed; the page opens on cross-attention at
    the head with the most focused weights."""
    monkeypatch.chdir(tmp_path)
    assert main(["view", "--checkpoint", str(checkpoints["rev"]), "--src", "abcdefg"]) == 0
    out = capsys.readouterr()
    folder = tmp_path / "headwise-reports" / "view-abcdefg"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["headwise-reports"]
    assert sorted(p.name for p in folder.iterdir()) == ["head_view.html", "heatmaps.png"]
    meta = page_meta(folder / "head_view.html")
    vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *"abcdefghij"])}
    tgt_ids = [vocab[t] for t in meta["tokens"]["tgt"][0]]  # <bos> + the greedy output
    from headwise.data.tokenizers import CharTokenizer

    shown = CharTokenizer("abcdefghij").decode(tgt_ids[1:])
    assert f"output: {shown}  (greedy decoding)" in out.out and "input:  abcdefg" in out.out
    assert out.err == ""  # 7 symbols: inside the trained 4-16, no warning
    init = meta["initial"]
    assert init["kind"] == "cross"
    from headwise import checkpoint

    model = checkpoint.load(checkpoints["rev"]).model
    src = torch.tensor([[4 + "abcdefg".index(c) for c in "abcdefg"]])
    tgt = torch.tensor([tgt_ids])
    with torch.no_grad():
        _, att = model(src, tgt, return_weights=True)
    focus = torch.stack([w[0].amax(-1).mean(-1) for w in att["cross"]])  # (layers, heads)
    assert divmod(int(focus.argmax()), focus.shape[1]) == (init["layer"], init["head"])


def test_view_warns_outside_the_training_lengths(checkpoints, tmp_path, capsys):
    assert main(["view", "--checkpoint", str(checkpoints["rev"]), "--src", "abc",
                 "-o", str(tmp_path / "v.html")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: --src has 3 symbols but this model was trained on 4-16")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("which, extra, message", [
    ("rev", ["--src", "Hello World"], "characters this model has no token for: ' ' 'H' 'W' 'l' 'o' 'r'; it knows only 'abcdefghij'"),
    ("rev", ["--src", "abc", "--tgt", "xyz"], "--tgt has characters"),
    ("rev", ["--src", "a" * 33], "--src is 33 tokens but the model takes at most max_len=32"),
    ("lm", ["--text", "abc!"], "--text has characters this model has no token for: '!'"),
    ("lm", ["--text", "a" * 32, "--bos"], "max_len=32 (1 for <bos>)"),
    ("rev", ["--src", "abcd", "--layer", "5"], "--layer 5: this model's recorded layers are [0, 1]"),
    ("rev", ["--src", "abcd", "--head", "2"], "--head 2: layer"),
    ("rev", ["--src", "abcd", "-o", "x.png"], "expected a folder or a .html file"),
])
def test_view_refuses_bad_input_in_one_line(checkpoints, tmp_path, capsys, which, extra, message,
                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["view", "--checkpoint", str(checkpoints[which]), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("headwise view: error:")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_importance_from_heads_score_is_shown_under_each_head(checkpoints, tmp_path, capsys):
    from headwise import HeadScores

    scores = tmp_path / "scores"
    assert main(["heads", "score", "--checkpoint", str(checkpoints["rev"]), "--examples", "16",
                 "--method", "ablation", "-o", str(scores)]) == 0
    out = tmp_path / "view.html"
    assert main(["view", "--checkpoint", str(checkpoints["rev"]), "--src", "abcdef", "-o",
                 str(out), "--importance", str(scores / "importance.json")]) == 0
    grid = HeadScores.from_json((scores / "importance.json").read_text())
    meta = page_meta(out)
    for kind in ("encoder_self", "decoder_self", "cross"):
        assert meta["kinds"][kind]["importance"] == grid[kind].tolist()
    (tmp_path / "bad.json").write_text("{}")
    capsys.readouterr()
    assert main(["view", "--checkpoint", str(checkpoints["rev"]), "--src", "abc", "-o",
                 str(out), "--importance", str(tmp_path / "bad.json")]) == 2
    assert "not an importance.json" in capsys.readouterr().err
