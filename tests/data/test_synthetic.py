"""Synthetic tasks are deterministic and keep their held-out split; induction scores only the
predictable copy."""

import numpy as np
import pytest
import torch

from headwise.data import make_task
from headwise.data.synthetic import _is_heldout


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




def test_absurd_lengths_are_refused_before_any_work():
    import time

    import pytest

    from headwise.data import make_task
    start = time.perf_counter()
    with pytest.raises(ValueError, match="max_len=10,000,000 is over the maximum 4,096"):
        make_task("reverse", max_len=10**7)
    with pytest.raises(TypeError, match="max_len must be an int"):
        make_task("induction", max_len=8.5)
    with pytest.raises(ValueError, match="context must be in"):
        from headwise.data import TextLMTask
        TextLMTask("abc " * 100, context=10**7)
    assert time.perf_counter() - start < 5
