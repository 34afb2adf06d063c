"""Bad input to `headwise train`: one readable line on stderr and a non-zero exit."""

import hashlib
import json
import shutil

import pytest

from headwise.cli import main

TINY = ["--steps", "1", "--batch-size", "4", "--d-model", "16", "--heads", "2", "--layers", "1",
        "--d-ff", "16", "--eval-size", "4", "--precision", "fp32", "--quiet"]


def _fails(capsys, argv, match):
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("headwise train: error:") and match in err, err


def test_unknown_task(capsys):
    _fails(capsys, ["train", "reverso", *TINY], "unknown task 'reverso'")


def test_missing_text_file(capsys, tmp_path):
    _fails(capsys, ["train", "text", "--text", str(tmp_path / "nope.txt"), *TINY],
           "does not exist")


def test_empty_text_file(capsys, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n", encoding="utf-8")
    _fails(capsys, ["train", "text", "--text", str(path), *TINY], "is empty")


def test_tsv_line_without_tab(capsys, tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("Hallo.\tHello.\nDanke schön, thanks\n", encoding="utf-8")
    _fails(capsys, ["train", "pairs", "--pairs", str(path), *TINY], "pairs.tsv:2: expected")


def test_text_task_without_file(capsys):
    _fails(capsys, ["train", "text", *TINY], "--text FILE")


@pytest.mark.parametrize("bad", [["--steps", "0"], ["--lr", "-1"], ["--num-symbols", "99"]])
def test_bad_numbers(capsys, bad):
    _fails(capsys, ["train", "reverse", *TINY, *bad], "must be")


def test_resume_with_a_checkpoint_of_another_model(capsys, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "reverse", *TINY, "--out", str(a)]) == 0
    assert main(["train", "reverse", *TINY, "--d-model", "24", "--out", str(b)]) == 0
    capsys.readouterr()
    # another task's run
    _fails(capsys, ["train", "sort", "--resume", str(a), "--quiet"], "is a run of task 'reverse'")
    # changing the model while resuming
    _fails(capsys, ["train", "--resume", str(a), "--d-model", "24", "--quiet"], "cannot change")
    # weights of another model (consistent files, so not reported as corrupted)
    shutil.copy(b / "checkpoint" / "model.safetensors", a / "checkpoint" / "model.safetensors")
    meta = json.loads((a / "checkpoint" / "config.json").read_text())
    meta["files"]["model.safetensors"] = hashlib.sha256(
        (a / "checkpoint" / "model.safetensors").read_bytes()).hexdigest()
    (a / "checkpoint" / "config.json").write_text(json.dumps(meta))
    _fails(capsys, ["train", "--resume", str(a), "--steps", "2", "--quiet"], "do not fit")
    # a corrupted file
    (b / "checkpoint" / "train_state.safetensors").write_bytes(b"garbage")
    _fails(capsys, ["train", "--resume", str(b), "--steps", "2", "--quiet"], "corrupted")
    _fails(capsys, ["train", "--resume", str(tmp_path / "missing"), "--quiet"], "does not exist")


# --------------------------------------------------------------------------------------------
# presets, schedules, divergence, absurd sizes: each one line, before anything is allocated


def test_unknown_preset_size(capsys):
    _fails(capsys, ["train", "reverse", "--size", "huge", *TINY],
           "unknown size 'huge' for task 'reverse'; its sizes are small")


def test_warmup_not_shorter_than_the_run(capsys):
    _fails(capsys, ["train", "reverse", *TINY, "--warmup", "1"],
           "--warmup 1 must be smaller than --steps 1")


@pytest.mark.parametrize("bad", [["--lr", "inf"], ["--weight-decay", "nan"]])
@pytest.mark.parametrize("every, match", [
    ("0", "training diverged at step 2 of 4: the training loss is nan"),  # its loss, at once
    ("1", "training diverged at step 1 of 4: the weights are no longer finite"),  # before saving
])
def test_a_diverging_run_stops_naming_the_step(capsys, tmp_path, bad, every, match):
    argv = ["train", "reverse", *TINY, "--steps", "4", "--checkpoint-every", every,
            "--eval-every", "0", "--out", str(tmp_path / "run"), *bad]
    _fails(capsys, argv, match)
    assert not (tmp_path / "run" / "checkpoint").exists()  # no non-finite weights saved


@pytest.mark.parametrize("bad, match", [
    (["--threads", "100000"], "threads must be an int in [1, "),
    (["--max-len", "10000000"], "--max-len 10,000,000 is over the maximum 4,096"),
    (["--eval-size", "1000000000"], "--eval-size must be in [1, 100,000]"),
    (["--batch-size", "100000000"], "--batch-size must be in [1, 1,048,576]"),
    (["--batch-size", "1000000"], "--batch-size 1,000,000 (activations for backward) would need about"),
    (["--d-model", "100000", "--heads", "1"], "parameters (training) would need about"),
    (["--d-model", "1000000", "--heads", "1"], "--d-model 1000000 is over the maximum 131,072"),
    (["--layers", "1000000"], "--layers 1000000 is over the maximum 1,024"),
    (["--seed", str(2**70)], "seed must be in [0,"),
    (["--context", "1"], "context must be in [2,"),
])
def test_absurd_sizes_are_refused_at_once(capsys, bad, match):
    import time
    start = time.perf_counter()
    _fails(capsys, ["train", "reverse", *TINY, *bad], match)
    assert time.perf_counter() - start < 5


def test_an_unwritable_output_folder_is_one_line(capsys):
    _fails(capsys, ["train", "reverse", *TINY, "--out", "/proc/headwise-run"], "cannot write")


def test_help_lists_the_presets_with_their_estimated_time(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    import re
    assert "presets" in out and "on this machine" in out
    rows = [line for line in out.splitlines() if re.search(r"~\d+(\.\d+)? (s|min|h)$", line)]
    assert len(rows) == 7  # reverse, induction, text small/large/llama, pairs small/large
    assert any("large" in r and r.rstrip().endswith(" h") for r in rows)  # hours: named large
    small = [r for r in rows if " small " in r]
    assert len(small) == 4
    llama = [r for r in rows if " llama " in r]
    assert len(llama) == 1 and "4 heads, 2 kv" in llama[0]  # grouped-query heads shown


def test_help_table_imports_no_torch():
    import subprocess
    import sys
    code = ("import sys, headwise; base = 'torch' in sys.modules; "
            "from headwise.commands.train import presets_table; presets_table(); "
            "print(base, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    base, after = done.stdout.split()
    if base == "True":
        pytest.skip("`import headwise` itself imports torch here")
    assert after == "False"


def test_resume_hashes_each_checkpoint_file_once(tmp_path, monkeypatch):
    from headwise import checkpoint as ckpt
    run = tmp_path / "run"
    assert main(["train", "reverse", *TINY, "--out", str(run)]) == 0
    seen = []
    real = ckpt._sha256
    monkeypatch.setattr(ckpt, "_sha256", lambda p: seen.append(p) or real(p))
    assert main(["train", "--resume", str(run), "--steps", "2", "--quiet"]) == 0
    resumed = [p for p in seen if p.parent == run / "checkpoint"]
    assert sorted(p.name for p in resumed) == ["model.safetensors", "train_state.json",
                                               "train_state.safetensors"]


def test_the_llama_options_reach_the_model(tmp_path):
    """--positional rope, --rope-theta, --norm, --ffn, --bias, --tie-embeddings and --window
    are model-config rows of the option table: the trained checkpoint's model carries them."""
    from torch import nn

    from headwise import checkpoint
    from headwise.models.norms import RMSNorm
    text = tmp_path / "t.txt"
    text.write_text("a small text, read twice over for a tiny language model. " * 40)
    argv = ["train", "text", "--text", str(text), *TINY, "--kv-heads", "1", "--positional",
            "rope", "--rope-theta", "500", "--norm", "rms", "--ffn", "glu", "--activation", "silu",
            "--bias", "no", "--tie-embeddings", "yes", "--window", "8", "--out",
            str(tmp_path / "run")]
    assert main(argv) == 0
    model = checkpoint.load(tmp_path / "run" / "checkpoint").model
    c = model.config
    a = c.attention
    assert (c.positional, a.rope_theta, c.norm, c.ffn, c.activation, c.bias, c.tie_embeddings,
            a.window, a.num_kv_heads) == ("rope", 500.0, "rms", "glu", "silu", False, True, 8, 1)
    assert isinstance(model.blocks[0].attn_norm, RMSNorm) and hasattr(model.blocks[0].ff, "gate")
    assert model.lm_head.weight is model.embed.tokens.weight
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Linear))


def test_bad_model_options_are_one_line(capsys, tmp_path):
    _fails(capsys, ["train", "reverse", *TINY, "--norm", "batch"], "norm must be one of")
    _fails(capsys, ["train", "reverse", *TINY, "--ffn", "moe"], "ffn must be one of")
    with pytest.raises(SystemExit) as exit_:  # argparse: usage, then the one error line
        main(["train", "reverse", *TINY, "--bias", "maybe"])
    assert exit_.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --bias: expected yes or no, got 'maybe'" in err, err


def test_an_indivisible_head_count_suggests_a_flag_train_has_and_it_runs(capsys, tmp_path):
    """`--heads 3` at d_model 16: the config's suggestion (`head_dim=5`) reaches the user as
    this command's flags, every flag it names exists, and following it trains."""
    import re

    from headwise import checkpoint
    from headwise.cli import build_parser
    argv = ["train", "reverse", *TINY, "--heads", "3", "--out", str(tmp_path / "run")]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "head_dim" not in err and "num_heads" not in err, err
    flags = set(re.findall(r"--[a-z][a-z-]*", err))
    train = build_parser(["train"])._subparsers._group_actions[0].choices["train"]
    known = {s for a in train._actions for s in a.option_strings}
    assert "--head-dim" in flags and flags <= known, (flags - known, err)
    head_dim = int(re.search(r"pass --head-dim (\d+)", err).group(1))
    assert head_dim == 16 // 3
    assert main([*argv, "--head-dim", str(head_dim)]) == 0
    cfg = checkpoint.load(tmp_path / "run" / "checkpoint").model.config
    assert (cfg.num_heads, cfg.attention.head_dim) == (3, head_dim)
