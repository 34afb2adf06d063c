"""`headwise trace`: the learner's LM command, fused vs fallback, bad input in one line, traces of
saved checkpoints, and the split/merge diagram written by --png/--svg."""

from __future__ import annotations

import pytest
import torch

from headwise import checkpoint
from headwise.cli import main
from headwise.data.tokenizers import CharTokenizer
from headwise.models import LMConfig, TransformerConfig, build


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_lm_command_shows_the_annotated_shapes_in_order(capsys):
    code, out, _ = run(capsys, "trace", "lm", "--vocab", "33300", "--embed-dim", "512",
                       "--heads", "8", "--batch", "1", "--seq", "8")
    assert code == 0
    lines = out.splitlines()

    def at(text, after=-1):
        for n, line in enumerate(lines):
            if n > after and text in line:
                return n
        raise AssertionError(f"{text!r} not found after line {after}:\n{out}")

    n = at("input tokens")
    assert "(b=1, n=8)" in lines[n]
    n = at("embed: Embeddings", n)
    assert "(b=1, n=8, m=512)" in lines[n]
    for name, pos in (("split heads q", "i"), ("split heads k", "j"), ("split heads v", "j")):
        n = at(name, n)
        assert f"(b=1, h=8, {pos}=8, d=64)" in lines[n]
    n = at("scores (not materialised)", n)
    assert "(b=1, h=8, i=8, j=8)" in lines[n]
    n = at("merge heads", n)
    assert "(b=1, i=8, (h d)=512)" in lines[n]
    n = at("output projection", n)
    assert "(b=1, i=8, m=512)" in lines[n]
    assert "5 more DecoderBlock" in out
    assert "6 calls, 6 fused" in out


def test_sdpa_fused_and_how_weights_were_made(capsys):
    base = ("trace", "transformer", "--embed-dim", "16", "--heads", "2", "--layers", "1",
            "--vocab", "30", "--seq", "4", "--kv-seq", "5", "--backend", "sdpa")
    code, out, _ = run(capsys, *base)
    assert code == 0 and "3 calls, 3 fused" in out and "fell back" not in out
    code, out, _ = run(capsys, *base, "--weights", "cross")
    # the trace runs without autograd: all cross weights are computed anyway, and the output is
    # those weights @ v; the other two calls stay fused, and nothing fell back
    assert code == 0 and "3 calls, 2 fused" in out and "fell back" not in out
    line = next(x for x in out.splitlines() if x.startswith("  decoder.blocks.0.cross_attn "))
    assert line.split()[:4] == ["decoder.blocks.0.cross_attn", "cross", "sdpa[weights", "@"]
    assert "O(n^2)" in line and "output = weights @ v" in line
    assert "weights recomputed exactly as the softmax of whole rows, 4-row chunks" in line
    code, out, _ = run(capsys, *base, "--dropout", "0.1")
    assert code == 0 and "dropout > 0" in out


@pytest.mark.parametrize("argv, message", [
    (("trace", "gpt"), "unknown model kind 'gpt'; choose one of mha, encoder, decoder"),
    (("trace", "mha", "--embed-dim", "510", "--heads", "8"), "embed_dim=510 is not divisible"),
    (("trace", "lm", "--heads", "4", "--kv-heads", "3"), "not a multiple of num_kv_heads"),
    (("trace", "mha", "--seq", "0"), "--seq must be >= 1"),
    (("trace", "mha", "--pad", "8"), "--pad 8 leaves no real key position"),
    (("trace", "lm", "--weights", "cross"), "unknown kind 'cross'"),
    (("trace",), "give a kind"),
    (("trace", "--checkpoint", "/nonexistent/ckpt"), "/nonexistent/ckpt"),
    (("trace", "mha", "--device", "banana"), "--device 'banana' is not a torch device"),
    (("trace", "lm", "--kv-seq", "5"), "`trace lm` has one sequence"),
])
def test_bad_input_is_one_readable_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code != 0
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_formats(capsys):
    code, out, _ = run(capsys, "trace", "mha", "--embed-dim", "8", "--heads", "2", "--format",
                       "markdown")
    assert code == 0 and out.startswith("### Trace of `MultiHeadAttention`")
    code, out, _ = run(capsys, "trace", "mha", "--embed-dim", "8", "--heads", "2", "--format",
                       "json")
    assert code == 0 and '"named_shape": "(b=1, h=2, i=8, d=4)"' in out


def test_lm_checkpoint_with_text_and_weight_selection(tmp_path, capsys):
    torch.manual_seed(0)
    tok = CharTokenizer.from_text("hello world")
    config = LMConfig(vocab_size=tok.vocab_size, d_model=16, num_heads=2, num_layers=2, d_ff=32,
                      max_len=64, backend="sdpa")
    checkpoint.save(tmp_path / "lm", build(config), config, tok)
    assert main(["trace", "--checkpoint", str(tmp_path / "lm"), "--text", "hello",
                 "--weights", "decoder_self:1"]) == 0
    out = capsys.readouterr().out
    assert "text 'hello' -> 5 tokens ['h', 'e', 'l', 'l', 'o']" in out
    assert "input tokens" in out and "(b=1, n=5)" in out
    assert f"(b=1, n=5, vocab={tok.vocab_size})" in out
    assert "blocks.0.self_attn  self   sdpa[FLASH_ATTENTION]" in out
    assert "blocks.1.self_attn  self   sdpa[weights @ v]" in out  # all its weights asked for
    assert "weights recomputed exactly as the softmax of whole rows" in out

def test_transformer_checkpoint_and_errors(tmp_path, capsys):
    torch.manual_seed(0)
    config = TransformerConfig(src_vocab_size=20, tgt_vocab_size=30, d_model=16, num_heads=4,
                               num_layers=1, d_ff=32, max_len=32, num_kv_heads=2)
    checkpoint.save(tmp_path / "tr", build(config), config)
    assert main(["trace", "--checkpoint", str(tmp_path / "tr"), "--seq", "3", "--kv-seq", "4",
                 "--pad", "1"]) == 0
    out = capsys.readouterr().out
    assert "cross-attention, mask bool (b=1, h=1, i=1, j=4) = key padding" in out
    assert "(b=1, g=2, j=4, d=4)" in out  # grouped key/value heads
    for argv, message in ((["--heads", "4"], "cannot be combined with --checkpoint"),
                          (["--text", "hi"], "has no tokenizer"),
                          (["--backend", "flash9"], "unknown backend 'flash9'")):
        assert main(["trace", "--checkpoint", str(tmp_path / "tr"), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    (tmp_path / "tr" / "model.safetensors").write_bytes(b"broken")
    assert main(["trace", "--checkpoint", str(tmp_path / "tr")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_writes_png_and_svg(tmp_path, capsys):
    png, svg = tmp_path / "cross.png", tmp_path / "cross.svg"
    code = main(["trace", "mha", "--embed-dim", "4", "--heads", "2", "--head-dim", "3",
                 "--kdim", "3", "--vdim", "2", "--seq", "5", "--kv-seq", "6", "--pad", "2",
                 "--png", str(png), "--svg", str(svg)])
    out, err = capsys.readouterr()
    assert code == 0 and "diagram written to" in err
    assert png.stat().st_size > 20_000
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and "head 1" in text


def test_out_dim_tgt_pad_and_explain_options(capsys):
    assert main(["trace", "mha", "--embed-dim", "4", "--heads", "2", "--out-dim", "6",
                 "--seq", "3"]) == 0
    out = capsys.readouterr().out
    assert "output projection" in out and "(b=1, i=3, out=6)" in out
    for argv, message in ((["trace", "lm", "--out-dim", "6"], "apply to `trace mha` only"),
                          (["trace", "lm", "--tgt-pad", "1"], "--tgt-pad applies to"),
                          (["trace", "transformer", "--seq", "3", "--tgt-pad", "3"],
                           "leaves no real target position"),
                          (["trace", "mha", "--explain-seq", "0"], "--explain-seq must be >= 1")):
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv


# ------------------------------------------------------------------ a pretrained decoder (GGUF)
def test_llama_gguf_trace_shows_rope_after_the_split_and_shared_kv_heads(tmp_path, capsys):
    pytest.importorskip("gguf")
    from tests.pretrained import tiny_gguf
    path = tiny_gguf.write(tmp_path / "tiny.gguf", heads=4, kv_heads=2)
    assert main(["trace", "--model", "smollm2", "--gguf", str(path), "--text", "the cat"]) == 0
    out = capsys.readouterr().out
    assert "4 query heads sharing 2 key/value heads; text 'the cat' -> 6 tokens" in out
    lines = [line.strip() for line in out.splitlines()]
    order = [next(i for i, line in enumerate(lines) if line.startswith(step)) for step in (
        "split heads q", "split heads k", "rotary positions q", "rotary positions k",
        "fused attention", "merge heads")]
    assert order == sorted(order)  # RoPE turns q and k after the head split, before attention
    assert "(b=1, h=4, i=6, d=8)" in lines[order[2]] and "(b=1, g=2, j=6, d=8)" in lines[order[3]]
    assert "2 key/value heads, each shared by 2 query heads" in lines[order[1]]
    assert "RMSNorm" in out and "GatedFeedForward(activation='silu')" in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "smollm2", "--heads", "4"], "cannot be combined with --model"),
    (["lm", "--model", "smollm2"], "give one of a model kind, --checkpoint or --model"),
    (["--gguf", "x.gguf"], "--gguf needs --model smollm2"),
    (["--model", "smollm2", "--gguf", "/nonexistent/x.gguf"], "x.gguf does not exist"),
])
def test_model_option_bad_input_is_one_line(capsys, argv, message):
    assert main(["trace", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_smollm2_trace(smollm2_path, capsys):
    assert main(["trace", "--model", "smollm2", "--text", "Paris"]) == 0
    out = capsys.readouterr().out
    assert "30 layers, 9 query heads sharing 3 key/value heads" in out
    split_k = next(line for line in out.splitlines() if "split heads k" in line)
    assert "(b=1, g=3, j=1, d=64)" in split_k
    assert "3 key/value heads, each shared by 3 query heads" in split_k
    rotary_q = next(line for line in out.splitlines() if "rotary positions q" in line)
    assert "(b=1, h=9, i=1, d=64)" in rotary_q and "100000^(-2k/r), r = 64" in rotary_q
    assert "29 more DecoderBlock" in out
    assert "attention: 30 calls, 30 fused" in out
