"""The head catalogue: dataset-level numbers equal a direct float64 computation from full eager
weights; it finds the reversal model's mirror head and MiniLM's previous/next-token heads;
bad input is a clear error."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise.analysis.catalogue import SCORES, catalogue
from headwise.data import make_task
from headwise.models import LMConfig, build
from headwise.train import TrainConfig, build_model_config

WINDOW, GRID = 3, 5


def _eager(model):
    for m in model.modules():
        if isinstance(m, hw.MultiHeadAttention):
            m.backend = "eager"
    return model


def _seq2seq(seed):
    torch.manual_seed(seed)
    task = make_task("reverse", seed=seed, min_len=3, max_len=7, num_symbols=8)
    cfg = TrainConfig(task="reverse", min_len=3, max_len=7, num_symbols=8,
                      model=dict(d_model=16, num_heads=2, num_layers=2, d_ff=16)).resolved()
    model = build(build_model_config(cfg, task)).eval()
    return model, task


def _overlap(p, n, g):
    """Length of [p/n, (p+1)/n) & [k/g, (k+1)/g) for every k, in float64."""
    return [max(0.0, min((p + 1) / n, (k + 1) / g) - max(p / n, k / g)) for k in range(g)]


class _Reference:
    """Every catalogue number of one head, accumulated row by row from full weights."""

    def __init__(self):
        self.rows = self.mirror_rows = 0
        self.sums = {name: 0.0 for name in SCORES}
        self.profile = [0.0] * (2 * WINDOW + 3)
        self.pattern = [[0.0] * GRID for _ in range(GRID)]
        self.pattern_rows = [0.0] * GRID
        self.mass = {}

    def add_row(self, w, i, nq, nk, ids, is_self, shift):
        """``w``: the row's weights over the input's ``nk`` real keys (float64 list); ``shift``
        = padded key length - padded query length (query ``i`` sits at key position
        ``i + shift``, bottom-right as in headwise.stats)."""
        self.rows += 1
        s = self.sums
        s["entropy"] += -sum(x * math.log(x) for x in w if x > 0)
        s["max_weight"] += max(w)
        s["sink"] += w[0]
        s["distance"] += sum(x * abs(i + shift - j) for j, x in enumerate(w))
        if is_self:
            s["prev_token"] += w[i - 1] if i >= 1 else 0.0
            s["next_token"] += w[i + 1] if i + 1 < nk else 0.0
            s["self"] += w[i]
            s["induction"] += sum(w[j] for j in range(1, nk) if ids[j - 1] == ids[i] and j - 1 < i)
            for j, x in enumerate(w):
                self.profile[max(-WINDOW - 1, min(WINDOW + 1, j - i)) + WINDOW + 1] += x
        if nk - 1 - i >= 0:
            s["mirror"] += w[nk - 1 - i]
            self.mirror_rows += 1
        qf = [x * GRID for x in _overlap(i, nq, GRID)]
        by_key = [sum(x * _overlap(j, nk, GRID)[k] * nk for j, x in enumerate(w))
                  for k in range(GRID)]
        for a in range(GRID):
            self.pattern_rows[a] += qf[a]
            for k in range(GRID):
                self.pattern[a][k] += qf[a] * by_key[k]
        for j, x in enumerate(w):
            self.mass[ids[j]] = self.mass.get(ids[j], 0.0) + x


def _reference(model, batches):
    """``{(kind, layer, head): _Reference}`` from the model's full weights (eager backend)."""
    from headwise.kinds import KINDS

    out = {}
    for batch in batches:
        pad = model.config.pad_id
        sides = {"src": (batch.src, batch.src_lens), "tgt": (batch.tgt_in,
                                                             (batch.tgt_in != pad).sum(1))}
        with torch.no_grad():
            _, att = _eager(model)(batch.src, batch.tgt_in, src_valid_lens=batch.src_lens,
                                   return_weights=True)
        for kind, layers in att.items():
            (_, q_lens), (k_ids, k_lens) = sides[KINDS[kind].query], sides[KINDS[kind].key]
            for layer, w in enumerate(layers):
                w = w.double()
                for b in range(w.shape[0]):
                    nq, nk, ids = int(q_lens[b]), int(k_lens[b]), k_ids[b].tolist()
                    for h in range(w.shape[1]):
                        ref = out.setdefault((kind, layer, h), _Reference())
                        for i in range(nq):
                            ref.add_row(w[b, h, i, :nk].tolist(), i, nq, nk, ids,
                                        kind != "cross", w.shape[3] - w.shape[2])
    return out


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**16), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=3))
def test_dataset_level_numbers_equal_a_direct_computation_from_full_weights(seed, sizes):
    """Several padded batches of an encoder-decoder (all three kinds, causal decoder): every
    score, profile, pattern and token share within 1e-5 of float64 sums over full weights."""
    model, task = _seq2seq(seed)
    batches = [task.batch(k, size) for k, size in enumerate(sizes)]
    got = catalogue(model, batches, window=WINDOW, grid=GRID, top_tokens=50)
    want = _reference(model, batches)
    assert len(got.heads) == len(want) == 12
    for e in got.heads:
        ref = want[e["kind"], e["layer"], e["head"]]
        assert e["rows"] == ref.rows > 0
        for name, value in e["scores"].items():
            if e["kind"] == "cross" and name in ("prev_token", "next_token", "self", "induction"):
                assert value is None
                continue
            expect = ref.sums[name] / (ref.mirror_rows if name == "mirror" else ref.rows)
            assert value == pytest.approx(expect, abs=1e-5), (e["kind"], e["layer"], name)
        if e["kind"] != "cross":
            assert e["profile"] == pytest.approx([x / ref.rows for x in ref.profile], abs=1e-5)
        pattern = [[x / max(r, 1e-30) for x in row] for row, r in zip(ref.pattern,
                                                                      ref.pattern_rows, strict=True)]
        torch.testing.assert_close(torch.tensor(e["pattern"], dtype=torch.float64),
                                   torch.tensor(pattern, dtype=torch.float64), rtol=0, atol=1e-5)
        total = sum(ref.mass.values())
        for t in e["top_tokens"]:
            assert t["share"] == pytest.approx(ref.mass[t["id"]] / total, abs=1e-5)


def test_language_model_batches_and_rows_sum_to_one():
    """A causal LM on LMBatch (padded) and on plain id tensors; every pattern row sums to 1
    and a fresh model's scores are finite."""
    torch.manual_seed(1)
    task = make_task("induction", min_len=6, max_len=10, num_symbols=8)
    lm = build(LMConfig(vocab_size=task.tokenizer.vocab_size, d_model=16, num_heads=2,
                        num_layers=2, d_ff=16, max_len=64)).eval()
    batch = task.eval_set(6)
    a = catalogue(lm, [batch])
    assert set(a.meta["kinds"]) == {"decoder_self"} and len(a.heads) == 4
    for e in a.heads:
        assert all(sum(r) == pytest.approx(1.0, abs=1e-5) for r in e["pattern"])
        assert all(v is not None and math.isfinite(v) for v in e["scores"].values())
        assert e["profile"][-1] == 0.0  # causal: nothing beyond the window to the right
    ids = torch.randint(4, task.tokenizer.vocab_size, (3, 7))
    b = catalogue(lm, ids)  # one batch of plain ids: every position real
    assert b.meta["inputs"] == 3 and b.heads[0]["rows"] == 21


# ---------------------------------------------------------------- what it finds

REVERSAL = TrainConfig(task="reverse", min_len=3, max_len=6, num_symbols=8,
                       model=dict(d_model=32, num_heads=2, num_layers=1, d_ff=64, dropout=0.0),
                       steps=250, batch_size=64, lr=1e-2, warmup=25, eval_every=0, eval_size=64,
                       checkpoint_every=0, seed=0, precision="fp32")


@pytest.fixture(scope="module")
def reversal():
    """A small encoder-decoder trained on `reverse` (about 5 s of one CPU core; one thread:
    two threads on a shared 2-core machine spend more on barriers than they gain)."""
    from headwise.train import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        return train(REVERSAL, progress=False, verbose=False)
    finally:
        torch.set_num_threads(threads)


def test_finds_the_mirror_head_of_a_trained_reversal_model(reversal):
    """The head ranked first by the mirror score is a cross-attention head, far above chance
    (uniform attention over the 3-6 source symbols) and above every self-attention head, and
    its averaged pattern is the anti-diagonal; the same architecture untrained has no such
    head, so the score finds what training made."""
    assert reversal.metrics["exact_match"] > 0.5  # it did learn to reverse
    held_out = reversal.task.eval_set(128)
    chance = float((1.0 / held_out.src_lens.double()).mean())
    cat = catalogue(reversal.model, held_out, tokens=reversal.tokenizer.tokens)
    top = cat.ranked("mirror")[0]
    assert top["kind"] == "cross"
    assert top["scores"]["mirror"] > 1.8 * chance
    best_self = max(e["scores"]["mirror"] for e in cat.heads if e["kind"] != "cross")
    assert top["scores"]["mirror"] > best_self + 0.15
    p = torch.tensor(top["pattern"])
    assert p.flip(1).diagonal().sum() > 2 * p.diagonal().sum()
    torch.manual_seed(0)
    untrained = build(build_model_config(REVERSAL.resolved(), reversal.task)).eval()
    before = catalogue(untrained, held_out).ranked("mirror", kind="cross")[0]
    assert before["scores"]["mirror"] < 1.3 * chance


def test_minilm_has_a_previous_or_next_token_head(minilm):
    """Clark et al. 2019 ("What Does BERT Look At?") found BERT heads that put most of their
    weight on the previous or the next token; all-MiniLM-L6-v2 has them too, over English
    sentences."""
    from headwise.data.corpora import ding_pairs

    try:
        english = [en for _, en in ding_pairs()]
    except Exception as exc:  # corpora not unpacked: `make corpora`
        pytest.skip(f"the Ding pairs are not available: {exc}")
    texts = english[::max(1, len(english) // 64)][:64]
    batches = [minilm.tokenizer.batch(texts[s:s + 32]) for s in (0, 32)]
    batches = [{k: v for k, v in b.items() if k in ("input_ids", "attention_mask")}
               for b in batches]
    cat = catalogue(minilm.model, batches, tokens=minilm.tokenizer.tokens)
    best = max(cat.ranked("prev_token")[0]["scores"]["prev_token"],
               cat.ranked("next_token")[0]["scores"]["next_token"])
    assert best > 0.5
    assert cat.meta["inputs"] == 64 and len(cat.heads) == 6 * 12


# ---------------------------------------------------------------- bad input

def test_bad_input_is_a_clear_error():
    model, task = _seq2seq(0)
    with pytest.raises(ValueError, match="no data: batches is empty"):
        catalogue(model, [])
    with pytest.raises(TypeError, match="expected a headwise model"):
        catalogue(torch.nn.Linear(2, 2), [task.eval_set(2)])
    with pytest.raises(TypeError, match="takes Seq2SeqBatch"):
        catalogue(model, [torch.zeros(2, 3, dtype=torch.long)])
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        catalogue(model, task.eval_set(2), window=0)
    with pytest.raises(ValueError, match="grid must be an int >= 2"):
        catalogue(model, task.eval_set(2), grid=1)
    with pytest.raises(ValueError, match=r"importance\['cross'\] must be \(layers, heads\) = "
                                         r"\(2, 2\), got shape \(3,\)"):
        catalogue(model, task.eval_set(2), importance={"cross": torch.ones(3)})
    with pytest.raises(ValueError, match="importance has kind 'nope'"):
        catalogue(model, task.eval_set(2), importance={"nope": torch.ones(2, 2)})
    cat = catalogue(model, task.eval_set(2))
    with pytest.raises(ValueError, match="unknown score 'prev'"):
        cat.ranked("prev")
    with pytest.raises(KeyError, match="no head cross layer 5 head 0"):
        cat.head("cross", 5, 0)
    lm = build(LMConfig(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_len=8))
    with pytest.raises(ValueError, match=r"empty batch of shape \(0, 4\)"):
        catalogue(lm, torch.zeros(0, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="float32 tensor"):
        catalogue(lm, torch.zeros(2, 4))
