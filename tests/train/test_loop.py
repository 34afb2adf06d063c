"""The training loop: learning, determinism, metrics per task, divergence."""

import json
import math

import pytest
import torch

from headwise.data import make_task
from headwise.train import TrainConfig, train
from headwise.train.recipe import build_model_config


def test_runs_are_deterministic():
    cfg = TrainConfig(task="induction", steps=15, batch_size=8, eval_size=32, eval_every=0,
                      min_len=6, max_len=10, model=dict(dropout=0.1), precision="fp32")
    a = train(cfg, progress=False)
    b = train(cfg, progress=False)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    assert a.metrics == b.metrics


def test_copy_model_learns():
    r = train(TrainConfig(task="copy", steps=150, batch_size=32, min_len=4, max_len=8,
                          warmup=20, eval_every=0, eval_size=200, precision="fp32"),
              progress=False)
    assert r.metrics["exact_match"] > 0.5 and r.metrics["token_accuracy"] > 0.8
    assert r.metrics["loss"] < 0.5 * math.log(20)


def test_text_task_reports_perplexity(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("the cat sat on the mat. " * 200, encoding="utf-8")
    r = train(TrainConfig(task="text", text=str(path), context=32, steps=30, batch_size=8,
                          model=dict(d_model=32, num_heads=2, num_layers=1, d_ff=64),
                          eval_size=8, precision="fp32", lr=3e-3, warmup=5), progress=False,
              out=tmp_path / "run")
    assert r.metrics["perplexity"] < 10  # 11 symbols: chance would be 11+
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()


@pytest.mark.parametrize("tokenizer", ["char", "byte"])
def test_pairs_task_reports_bleu(tmp_path, tokenizer):
    path = tmp_path / "p.tsv"
    words = ["eins", "zwei", "drei", "vier", "fünf"]
    lines = [f"{a} {b}\t{b} {a}" for a in words for b in words] * 4
    path.write_text("\n".join(lines), encoding="utf-8")
    # max_len counts tokens: "fünf fünf" is 9 characters but 11 bytes
    r = train(TrainConfig(task="pairs", pairs=str(path), steps=5, batch_size=8,
                          model=dict(d_model=32, num_heads=2, num_layers=1, d_ff=32),
                          eval_size=10, precision="fp32", tokenizer=tokenizer, max_len=10),
              progress=False)
    pairs = r.task.train_pairs + r.task.eval_pairs
    assert (("fünf fünf", "fünf fünf") in pairs) == (tokenizer == "char")
    assert 0.0 <= r.metrics["bleu"] <= 100.0 and "exact_match" in r.metrics


def test_text_runs_report_perplexity_not_exact_match(tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_text("the cat sat on the mat. " * 200, encoding="utf-8")
    r = train(TrainConfig(task="text", text=str(path), context=16, steps=3, batch_size=4,
                          model=dict(d_model=16, num_heads=2, num_layers=1, d_ff=16),
                          eval_size=4, precision="fp32", warmup=1), progress=False)
    assert "exact_match" not in r.metrics and r.metrics["perplexity"] > 1
    out = capsys.readouterr().out
    assert "ppl" in out and "EM" not in out
    # the estimate comes before the first step's line
    assert out.index("estimate") < out.index("step      3")


def test_a_non_finite_loss_stops_before_the_update():
    from headwise.errors import TrainingDiverged
    with pytest.raises(TrainingDiverged, match=r"at step 2 of 3: the training loss is nan"):
        train(TrainConfig(task="copy", steps=3, batch_size=4, eval_every=0, eval_size=4,
                          model=dict(d_model=16, num_heads=2, num_layers=1, d_ff=16),
                          lr=float("inf"), warmup=0, precision="fp32"), progress=False)


# --------------------------------------------------------------------------------------------
# the Llama-style text preset: RoPE + RMSNorm + SwiGLU + grouped-query heads, no biases, tied


_AUSTEN_LIKE = ("It is a truth universally acknowledged, that a single man in possession of a "
                "good fortune, must be in want of a wife. However little known the feelings or "
                "views of such a man may be on his first entering a neighbourhood, this truth is "
                "so well fixed in the minds of the surrounding families. ")


def _llama_run(tmp_path, **changes):
    """The preset's architecture (RoPE, RMSNorm, SwiGLU, GQA 2:1, no bias, tied) at a size a
    2-core CI box trains in seconds."""
    path = tmp_path / "austen.txt"
    path.write_text(_AUSTEN_LIKE * 40, encoding="utf-8")
    base = dict(task="text", size="llama", text=str(path), context=24, steps=30, batch_size=8,
                warmup=3, eval_every=10, eval_size=8, precision="fp32", threads=1, lr=1e-2,
                model=dict(d_model=32, d_ff=86, num_layers=2))
    return TrainConfig(**{**base, **changes})


def test_llama_preset_builds_a_llama_style_model(tmp_path):
    from headwise.models import build
    cfg = TrainConfig(task="text", size="llama", text=str(tmp_path / "a.txt")).resolved()
    assert (cfg.model["d_model"], cfg.model["num_layers"], cfg.model["d_ff"]) == (128, 3, 344)
    (tmp_path / "a.txt").write_text(_AUSTEN_LIKE * 10, encoding="utf-8")
    mc = build_model_config(cfg, make_task("text", text=cfg.text, context=cfg.context))
    assert (mc.positional, mc.norm, mc.ffn, mc.activation) == ("rope", "rms", "glu", "silu")
    assert (mc.num_heads, mc.kv_heads, mc.bias, mc.tie_embeddings) == (4, 2, False, True)
    model = build(mc)
    names = [n for n, _ in model.named_parameters()]
    assert not [n for n in names if n.endswith(".bias")]  # no bias anywhere
    assert model.lm_head.weight is model.embed.tokens.weight  # tied: one tensor
    assert not [n for n in names if "pos" in n]  # RoPE: no position table to learn
    k = model.blocks[0].self_attn.k_proj.weight
    assert k.shape == (2 * mc.head_size, mc.d_model)  # 2 key/value heads for 4 query heads


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_llama_preset_trains_and_its_loss_falls(tmp_path, precision):
    if precision == "bf16" and not torch.backends.mkldnn.is_available():
        pytest.skip("bf16 on CPU needs oneDNN")
    r = train(_llama_run(tmp_path, precision=precision), progress=False, verbose=False)
    assert r.precision == precision
    losses = [h["loss"] for h in r.history]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    # untrained, the loss is about log(vocab); it falls at every evaluation, well below that
    vocab = r.task.tokenizer.vocab_size
    assert losses[0] > losses[1] > losses[2] and losses[-1] < 0.8 * math.log(vocab), losses


def test_llama_preset_resumes_to_the_state_of_an_uninterrupted_run(tmp_path):
    import os
    import signal

    from safetensors.torch import load_file
    cfg = _llama_run(tmp_path, steps=8, warmup=2, eval_every=4, checkpoint_every=0)
    quiet = dict(progress=False, verbose=False)
    train(cfg, out=tmp_path / "full", **quiet)

    def ctrl_c_at_step_4(step, metrics):  # as a user's Ctrl-C: save after this step, stop
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, out=tmp_path / "split", on_eval=ctrl_c_at_step_4, **quiet)
    assert json.loads((tmp_path / "split" / "checkpoint" / "train_state.json").read_text()
                      )["state"]["step"] == 4
    train(resume=tmp_path / "split", out=tmp_path / "split", **quiet)
    for name in ("model.safetensors", "train_state.safetensors"):
        a = load_file(str(tmp_path / "full" / "checkpoint" / name))
        b = load_file(str(tmp_path / "split" / "checkpoint" / name))
        assert a.keys() == b.keys() and len(a) > 10
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
