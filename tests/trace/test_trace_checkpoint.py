"""`headwise trace --checkpoint DIR`: a saved model is traced with its own sizes and tokenizer."""

from __future__ import annotations

import torch

from headwise import checkpoint
from headwise.cli import main
from headwise.data.tokenizers import CharTokenizer
from headwise.models import LMConfig, TransformerConfig, build


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
    assert "blocks.1.self_attn  self   eager" in out and "weights requested" in out


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
