"""``--hf DIR`` end to end: ``explain``, ``heads catalogue`` and ``heads score`` on tiny random
models written by ``save_pretrained`` with an offline word-level tokenizer; nothing downloads,
and what cannot run is one line (exit 2) before any weights are read."""

from __future__ import annotations

import json

import pytest
import torch

from headwise.cli import main

tiny = pytest.importorskip("tests.hf.tiny", reason="the hf wing needs transformers")
TEXT = " ".join(["the cat sat on the mat and it was a dog the dog ran to the house"] * 4)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-cli")
    for name in ("llama", "bert"):
        tiny.save(name, root / name)
    (root / "text.txt").write_text(TEXT + "\n" + "heads see one by one\n", encoding="utf-8")
    return root


@pytest.fixture
def weights_read(monkeypatch):
    """Every from_pretrained of a transformers model, recorded (and still run)."""
    import transformers

    calls = []
    real = transformers.PreTrainedModel.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        calls.append(cls.__name__)
        return real(cls, *args, **kwargs)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(spy))
    return calls


def test_explain_hf_writes_the_view_heatmaps_and_trace_offline(folders, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    out = tmp_path / "report"
    assert main(["explain", "--hf", str(folders / "llama"), "the cat sat", "a dog ran to Paris",
                 "-o", str(out), "--heads", "0-1"]) == 0
    printed = capsys.readouterr().out
    import os
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert (out / "head_view.html").is_file()
    assert (out / "heatmaps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ("llama (LlamaForCausalLM): 2 layers x 4 query heads sharing 2 key/value heads "
            "(2 each), causal self-attention") in printed
    assert "example 0 (4 tokens): [BOS] the cat sat" in printed
    assert "example 1 (6 tokens): [BOS] a dog ran to [UNK]" in printed
    assert "model.layers.0-1.self_attn (2 calls)" in printed  # the trace summary
    page = (out / "head_view.html").read_text()
    assert '"kvHeads":2' in page and "http://" not in page


def test_explain_hf_notes_a_text_longer_than_the_model_reads(folders, tmp_path, capsys):
    long = " ".join(["the cat"] * 40)  # 81 tokens with [BOS]; the tiny model reads 64
    assert main(["explain", "--hf", str(folders / "llama"), long, "-o", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "note: text 0 is longer than the model reads (64 tokens)" in captured.err
    assert "example 0 (64 tokens)" in captured.out


def test_explain_hf_on_an_encoder(folders, tmp_path, capsys):
    assert main(["explain", "--hf", str(folders / "bert"), "heads see one by one", "-o",
                 str(tmp_path / "v.html"), "--trace"]) == 0
    printed = capsys.readouterr().out
    assert "2 layers x 4 query heads, bidirectional self-attention" in printed
    assert (tmp_path / "v-heads.png").is_file()
    assert "BertSelfAttention" in printed  # the full trace names the modules


def test_heads_catalogue_hf_causal_and_encoder(folders, tmp_path, capsys):
    out = tmp_path / "cat"
    assert main(["heads", "catalogue", "--hf", str(folders / "llama"), "--sentences",
                 str(folders / "text.txt"), "--length", "16", "--examples", "3",
                 "--batch-size", "2", "-o", str(out)]) == 0
    data = json.loads((out / "catalogue.json").read_text())
    assert data["meta"]["dataset"] == "text.txt, 3 windows of 16 tokens"
    assert data["meta"]["kinds"] == {"decoder_self": [4, 4]} and data["meta"]["batches"] == 2
    assert {e["kind"] for e in data["heads"]} == {"decoder_self"} and len(data["heads"]) == 8
    out = tmp_path / "enc.html"
    assert main(["heads", "catalogue", "--hf", str(folders / "bert"), "--sentences",
                 str(folders / "text.txt"), "-o", str(out)]) == 0
    data = json.loads((tmp_path / "enc.json").read_text())
    assert data["meta"]["dataset"] == "text.txt, 2 sentences"
    assert data["meta"]["kinds"] == {"encoder_self": [4, 4]}
    # the top tokens are the model's own tokenizer's strings
    tokens = {t["token"] for e in data["heads"] for t in e["top_tokens"]}
    assert tokens <= set(tiny.WORDS) | {"[BOS]", "[UNK]"} and "the" in tokens
    capsys.readouterr()


def test_heads_score_hf_writes_the_scores_of_its_next_token_loss(folders, tmp_path, capsys):
    out = tmp_path / "score"
    assert main(["heads", "score", "--hf", str(folders / "llama"), "--sentences",
                 str(folders / "text.txt"), "--length", "8", "--examples", "4",
                 "--method", "ablation", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "importance.json").read_text())
    assert saved["method"] == "ablation" and saved["examples"] == 4
    assert "layers: ablation importance" in printed and (out / "importance.png").is_file()
    # the same scores as headwise.importance on the same windows, in Python
    import headwise as hw
    model, tok = tiny.transformers.AutoModelForCausalLM.from_pretrained(
        folders / "llama", attn_implementation="headwise").eval(), tiny.tokenizer()
    ids = torch.tensor(tok(TEXT, add_special_tokens=False)["input_ids"][:32]).view(4, 8)
    want = hw.importance(model, [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}],
                         method="ablation")["layers"]
    torch.testing.assert_close(torch.tensor(saved["scores"]["layers"], dtype=torch.float64),
                               want, atol=1e-6, rtol=0)


def test_heads_score_hf_on_an_encoder_takes_a_behaviour(folders, tmp_path, capsys,
                                                        weights_read):
    code = main(["heads", "score", "--hf", str(folders / "bert"), "--sentences",
                 str(folders / "text.txt"), "-o", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 2 and "is an encoder: it has no next-token loss for method 'greedy'" in err
    assert weights_read == []  # refused before the weights load
    assert main(["heads", "score", "--hf", str(folders / "bert"), "--sentences",
                 str(folders / "text.txt"), "--method", "sink", "-o", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "importance.json").read_text())["method"] == "sink"


def _bloom(folder):
    import transformers
    folder.mkdir()
    config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4,
                                      architectures=["BloomForCausalLM"])
    config.save_pretrained(folder)


@pytest.mark.parametrize("command", [["explain", "--hf", "{dir}", "the cat"],
                                     ["heads", "catalogue", "--hf", "{dir}"],
                                     ["heads", "score", "--hf", "{dir}"]])
@pytest.mark.parametrize("make, message", [
    (lambda d: None, "does not exist; pass a local Hugging Face model folder"),
    (lambda d: d.mkdir(), "has no config.json, so it is not a Hugging Face model folder"),
    (_bloom, "BloomForCausalLM does not call transformers' attention interface"),
])
def test_what_cannot_run_is_one_line_before_any_weights_load(tmp_path, capsys, weights_read,
                                                             command, make, message):
    folder = tmp_path / "model"
    make(folder)
    code = main([str(folder) if part == "{dir}" else part for part in command])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert weights_read == []


def test_a_missing_corpus_is_named_before_the_weights_load(folders, tmp_path, capsys,
                                                           monkeypatch, weights_read):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("HEADWISE_CORPORA", str(tmp_path / "empty"))
    code = main(["heads", "catalogue", "--hf", str(folders / "llama")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "make corpora" in err and len(err.splitlines()) == 1, err
    assert weights_read == []


@pytest.mark.parametrize("argv, message", [
    (["heads", "score", "--hf", "{llama}", "--compare"], "--compare measures a checkpoint's"),
    (["heads", "score", "--checkpoint", "x", "--sentences", "f"], "--sentences goes with --hf"),
    (["explain", "--hf", "{llama}", "the cat", "--generate", "3"], "--hf reads its texts"),
    (["heads", "catalogue", "--hf", "{llama}", "--length", "0"], "--length must be >= 1"),
    (["explain", "--hf", "{llama}", "the cat", "--layers", "2"],
     "--layers '2': [2] out of range; the model has 2"),
    (["explain", "--hf", "{llama}", "the cat", "--heads", "0-4"],
     "--heads '0-4': [4] out of range; the model has 4"),
    (["heads", "catalogue", "--hf", "{llama}", "--sentences", "{text}", "--length", "999"],
     "longer than the model's context (64 tokens)"),
])
def test_bad_flags_with_hf_are_one_line(folders, capsys, argv, message):
    argv = [str(folders / "llama") if a == "{llama}" else
            str(folders / "text.txt") if a == "{text}" else a for a in argv]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_heads_score_hf_names_every_problem_at_once_before_the_model_loads(
        folders, tmp_path, capsys, monkeypatch, weights_read):
    """An encoder, the default (loss) method and no corpus: one line names both fixes (the
    method and `make corpora`), and neither the weights nor the loader are reached."""
    from headwise.commands import _hf

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the checks")

    monkeypatch.setattr(_hf, "load", never)
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("HEADWISE_CORPORA", str(tmp_path / "empty"))
    code = main(["heads", "score", "--hf", str(folders / "bert")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("headwise heads score: error: ")
    assert "is an encoder: it has no next-token loss for method 'greedy'" in err
    assert "make corpora" in err
    assert weights_read == []
    # an unknown method is refused before anything is read
    assert main(["heads", "score", "--hf", str(folders / "bert"), "--method", "gradeint"]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'gradeint'" in err and "did you mean 'gradient'?" in err


def test_heads_prune_hf_saves_the_folder_python_would_prune(folders, tmp_path, capsys):
    """`heads prune --hf DIR`: the heads headwise.importance ranks least important, cut by whole
    key/value groups (plan_groups) with headwise.hf.prune_heads, saved; the saved folder loads
    back (headwise.hf.load) with the same logits as the model pruned in Python."""
    import headwise as hw
    from headwise.analysis.prune_sweep import plan_groups
    from headwise.hf.local import load

    out = tmp_path / "pruned"
    assert main(["heads", "prune", "--hf", str(folders / "llama"), "--sentences",
                 str(folders / "text.txt"), "--length", "8", "--examples", "4",
                 "--fraction", "0.5", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "pruned 4 of 8 heads (50%)" in printed and "before" in printed
    model = tiny.transformers.AutoModelForCausalLM.from_pretrained(
        folders / "llama", attn_implementation="headwise").eval()
    ids = torch.tensor(tiny.tokenizer()(TEXT, add_special_tokens=False)["input_ids"][:32])
    windows = [{"input_ids": ids.view(4, 8), "attention_mask": torch.ones(4, 8, dtype=torch.long)}]
    plan = plan_groups({"layers": [(4, 2), (4, 2)]},
                       hw.importance(model, windows, steps=4).scores, 0.5)
    hw.hf.prune_heads(model, plan)
    saved = json.loads((out / "config.json").read_text())
    assert saved["headwise_pruned_heads"] == [plan["layers"].get(n, []) for n in range(2)]
    reloaded, tokenizer = load(out)
    assert [m.num_heads for m in hw.hf.attention_layers(reloaded)] == [2, 2]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**windows[0]).logits, model(**windows[0]).logits)
    assert tokenizer("the cat")["input_ids"] == tiny.tokenizer()("the cat")["input_ids"]
    assert (out / "importance.json").is_file()


def test_heads_prune_hf_refuses_an_encoder_before_the_weights_load(folders, capsys,
                                                                   weights_read):
    code = main(["heads", "prune", "--hf", str(folders / "bert"), "--sentences",
                 str(folders / "text.txt")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "is an encoder" in err, err
    assert err.startswith("headwise heads prune: error: ") and weights_read == []
