"""Data: tokenizers round-trip, synthetic tasks are deterministic and keep their held-out split,
text / pair files and the real corpora load (or fail with one clear line)."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.data import (
    ByteTokenizer,
    CharTokenizer,
    CorpusMissingError,
    austen_text,
    ding_pairs,
    make_task,
    tokenizer_from_dict,
)
from headwise.data.synthetic import _is_heldout


@given(st.text(min_size=0, max_size=50))
def test_byte_tokenizer_round_trips_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_id, *ids]) == text  # stops at <eos>
    assert len(tok.tokens(ids)) == len(ids)
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.encode(text) == ids


@given(st.text(alphabet="abcxyz ÄÖ.", min_size=1, max_size=40))
def test_char_tokenizer_round_trips_and_serialises(text):
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert min(ids) >= 4 and tok.decode(ids) == text
    assert tok.tokens([tok.bos_id, *ids[:1]]) == ["<bos>", text[0]]
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.encode(text) == ids and again.vocab_size == tok.vocab_size
    assert tok.encode("\u2603") == [tok.unk_id]


def test_tokenizer_errors_name_the_problem():
    with pytest.raises(ValueError, match="outside"):
        CharTokenizer("ab").decode([99])
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_dict({"kind": "bpe"})
    with pytest.raises(ValueError, match="non-empty"):
        CharTokenizer("")


@pytest.mark.parametrize("name", ["reverse", "copy", "sort"])
def test_seq2seq_tasks_are_deterministic_and_correct(name):
    task = make_task(name, seed=3)
    a, b = task.batch(7, 32), task.batch(7, 32)
    assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
    assert not torch.equal(task.batch(8, 32).src, a.src)
    tok = task.tokenizer
    for k in range(32):
        n = int(a.src_lens[k])
        assert task.min_len <= n <= task.max_len
        src = a.src[k, :n].tolist()
        assert (a.src[k, n:] == tok.pad_id).all()
        want = {"reverse": src[::-1], "copy": src, "sort": sorted(src)}[name]
        assert a.tgt_out[k, :n].tolist() == want and a.tgt_out[k, n] == tok.eos_id
        assert a.tgt_in[k, 0] == tok.bos_id and a.tgt_in[k, 1:n + 1].tolist() == want


def test_training_batches_never_contain_heldout_sequences():
    task = make_task("reverse", seed=0, min_len=3, max_len=6, num_symbols=8)
    heldout = {tuple(r[:n].tolist()) for r, n in zip(task.eval_set(300).src,
                                                     task.eval_set(300).src_lens, strict=True)}
    seen = set()
    for step in range(100):
        b = task.batch(step, 64)
        seen |= {tuple(r[:n].tolist()) for r, n in zip(b.src, b.src_lens, strict=True)}
    assert len(heldout) > 100 and len(seen) > 3000
    assert not heldout & seen
    # the split is a property of the sequence alone, about 1 in 10
    rows = np.random.default_rng(0).integers(0, 8, size=(20000, 6))
    frac = _is_heldout(rows, np.full(20000, 6)).mean()
    assert 0.08 < frac < 0.12


def test_induction_scores_only_the_predictable_copy():
    task = make_task("induction", seed=1)
    b = task.batch(0, 16)
    for k in range(16):
        total = int(b.valid_lens[k]) + 1
        n = total // 2
        seq = [*b.inputs[k, :total - 1].tolist(), int(b.labels[k, total - 2])]
        assert seq[:n] == seq[n:]
        scored = b.scored[k].nonzero().flatten().tolist()
        assert scored == list(range(n, 2 * n - 1))
        assert torch.equal(b.labels[k, :total - 1], torch.tensor(seq[1:]))


def test_batches_shard_like_distributed_sampler():
    b = make_task("reverse").batch(0, 8)
    parts = [b.shard(r, 2) for r in range(2)]
    assert torch.equal(parts[0].src, b.src[0::2]) and torch.equal(parts[1].src, b.src[1::2])
    with pytest.raises(ValueError, match="not divisible"):
        b.shard(0, 3)


def test_text_task_windows_and_heldout_tail(tmp_path):
    path = tmp_path / "t.txt"
    text = "".join(chr(97 + (i * 7) % 26) for i in range(5000))
    path.write_text(text, encoding="utf-8")
    task = make_task("text", text=str(path), context=32)
    b = task.batch(0, 4)
    assert b.inputs.shape == (4, 32) and torch.equal(b.inputs[:, 1:], b.labels[:, :-1])
    assert task.tokenizer.decode(b.inputs[0].tolist()) in text[:4500]
    e = task.eval_set(8)
    assert task.tokenizer.decode(e.inputs[0].tolist()) in text[4500:]


def test_pairs_file_split(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("".join(f"src {i}\tziel {i}\n" for i in range(200)), encoding="utf-8")
    task = make_task("pairs", pairs=str(path))
    assert len(task.train_pairs) + len(task.eval_pairs) == 200
    assert not set(task.train_pairs) & set(task.eval_pairs)
    b = task.batch(0, 4)
    assert task.tokenizer.decode(b.src[0].tolist()).startswith("src ")


@pytest.mark.parametrize("body, match", [("", "empty"), ("a\tb\nno tab here\n", ":2: expected")])
def test_bad_text_files(tmp_path, body, match):
    path = tmp_path / "f.txt"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        make_task("pairs", pairs=str(path))


def test_missing_corpus_says_how_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADWISE_CORPORA", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CorpusMissingError, match="make corpora"):
        ding_pairs()


def test_real_corpora_load():
    """Needs `make corpora` (the Makefile's test target runs it)."""
    text = austen_text(("persuasion",))
    assert text.startswith("Persuasion") and "Anne Elliot" in text and len(text) > 400_000
    pairs = ding_pairs()
    assert len(pairs) > 10_000
    assert all(de[-1] in ".!?" and en[-1] in ".!?" for de, en in pairs)
