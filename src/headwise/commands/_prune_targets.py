"""What ``headwise heads prune`` and ``benchmarks/prune.py`` prune: a model, its head order
(:func:`headwise.importance` on calibration inputs), a metric, and the inference workloads timed
(sizes stated in ``workloads``).

Every order is :func:`headwise.importance`'s default, greedy zero ablation (heads zeroed one by
one, each time the one whose removal raises the loss least), checked against full ablation and
random heads by ``benchmarks/importance.py`` on each of these models.

- ``reverse``: the demo's string-reversal Transformer (a ``headwise demo`` checkpoint, or a
  small one trained on the spot); order: greedy ablation of the loss on 256 held-out strings; metric: held-out exact match by greedy decoding; workload: greedy decoding
  of those 256 strings (4-16 letters).
- ``minilm``: all-MiniLM-L6-v2; order: greedy ablation, the loss being the mean squared
  change of the pairwise cosine similarities of 64 sentences (the model has no training loss); metric: Spearman correlation of the pairwise
  cosine similarities of sentence embeddings with those of the unpruned model, over English
  sentences of the Ding pairs; workloads: 64 of those sentences in one batch and 16 Austen
  passages of 256 tokens (the model's ``max_seq_length``).
- ``smollm2``: SmolLM2-135M-Instruct (9 query heads sharing 3 key/value heads per layer: cut by
  whole groups); order: greedy ablation of the next-token loss on 2 windows of *Emma*; metric: perplexity on
  held-out Austen text (the end of *Persuasion*); workload: a forward (prefill) over 4 windows
  of 256 tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from headwise.analysis.head_scores import HeadScores, spearman

__all__ = ["TARGETS", "Target", "spearman"]


@dataclass
class Target:
    """A model to prune and how to judge it (``higher``: whether a larger metric is better)."""

    name: str
    model: nn.Module
    calibrate: Callable[[nn.Module], object]
    importance: Callable[[nn.Module], HeadScores]
    metric: Callable[[nn.Module], float]
    metric_name: str
    higher: bool
    runs: dict[str, Callable[[nn.Module], object]]
    workloads: str


# ------------------------------------------------------------------------------------ reverse
def reverse(checkpoint: str | Path | None = None, *, quick: bool = False, steps: int | None = None,
            ) -> Target:
    """The demo's reversal model: ``checkpoint`` (default ``headwise-demo/checkpoint`` when it
    exists), else trained here (``steps``; the demo's recipe)."""
    from headwise import checkpoint as ckpt
    from headwise.commands.demo import demo_config
    from headwise.data import make_task
    from headwise.train.evaluate import evaluate, greedy_decode

    path = Path(checkpoint) if checkpoint else Path("headwise-demo/checkpoint")
    cfg = demo_config()
    task = make_task("reverse", seed=cfg.seed, min_len=cfg.min_len, max_len=cfg.max_len,
                     num_symbols=cfg.num_symbols)
    if checkpoint is not None or (path / "config.json").is_file():
        loaded = ckpt.load(path)
        model, trained_on = loaded.model, loaded.metadata.get("task")
        if loaded.config.kind != "transformer" or trained_on not in (None, "reverse"):
            raise ValueError(f"--checkpoint {path}: a model of kind {loaded.config.kind!r} "
                             f"trained on {trained_on or 'an unnamed task'}, but the sweep "
                             "measures exact "
                             "match on string reversal; pass a run of headwise train reverse "
                             "(or headwise demo's headwise-demo/checkpoint)")
    else:
        from headwise.train import train
        model = train(demo_config(steps=steps or (400 if quick else 1500)), progress=False,
                      verbose=False).model.eval()
    tok = task.tokenizer
    timed = task.eval_set(256)
    size = 200 if quick else 1000

    def calibrate(m):
        m(timed.src, timed.tgt_in, src_valid_lens=timed.src_lens)

    def decode(m):
        greedy_decode(m, timed.src, timed.src_lens, bos_id=tok.bos_id, eos_id=tok.eos_id,
                      pad_id=tok.pad_id, max_new_tokens=timed.tgt_out.shape[1])

    def scores(m):
        from headwise import importance
        return importance(m, timed)

    return Target("reverse", model, calibrate, scores,
                  lambda m: evaluate(m, task, size=size)["exact_match"], "exact match", True,
                  {"decode 256 strings": decode},
                  "greedy decoding of 256 held-out strings of 4-16 letters (one batch); "
                  f"exact match over {size} held-out strings")


# ------------------------------------------------------------------------------------- minilm
def minilm(*, quick: bool = False) -> Target:
    from headwise.data.corpora import austen_text, ding_pairs
    from headwise.pretrained import load_minilm

    encoder = load_minilm()
    pairs = ding_pairs()
    n = 64 if quick else 256
    step = max(1, len(pairs) // n)
    sentences = [en for _, en in pairs[::step][:n]]
    unpruned = encoder.embed(sentences, batch_size=64)
    upper = torch.triu_indices(n, n, offset=1)

    def similarities(m):
        vectors = dataclasses.replace(encoder, model=m).embed(sentences, batch_size=64)
        return (vectors @ vectors.T)[upper[0], upper[1]]

    reference = (unpruned @ unpruned.T)[upper[0], upper[1]]
    words = austen_text(("emma",)).split()
    passages = [" ".join(words[k * 300:(k + 1) * 300]) for k in range(4 if quick else 16)]
    batch = {k: v[:, :256] for k, v in encoder.tokenizer.batch(passages).items()}
    short = encoder.tokenizer.batch(sentences[:64])

    def passages_run(m):
        m(batch["input_ids"], batch["attention_mask"])

    def sentences_run(m):
        m(short["input_ids"], short["attention_mask"])

    with torch.no_grad():
        pooled = _pooled(encoder.model, short)

    def similarity_change(m, batch):
        vectors = _pooled(m, batch)
        return ((vectors @ vectors.T - pooled @ pooled.T) ** 2).mean()

    def scores(m):
        from headwise import importance
        return importance(m, short, loss=similarity_change)

    return Target("minilm", encoder.model, sentences_run, scores,
                  lambda m: spearman(similarities(m), reference),
                  "similarity Spearman vs unpruned", True,
                  {"64 sentences": sentences_run,
                   f"{batch['input_ids'].shape[0]}x{batch['input_ids'].shape[1]} passages":
                   passages_run},
                  f"{n} English sentences of the Ding pairs ({n * (n - 1) // 2} pairs); "
                  f"latency: 64 of them in one padded batch "
                  f"({tuple(short['input_ids'].shape)}), and "
                  f"{tuple(batch['input_ids'].shape)} Austen passages (Emma)")


# ------------------------------------------------------------------------------------ smollm2
def smollm2(*, quick: bool = False) -> Target:
    from headwise.data.corpora import austen_text
    from headwise.pretrained import load_smollm2

    chat = load_smollm2()
    n, windows = (128, 2) if quick else (256, 8)
    held_out = chat.tokenizer.encode(austen_text(("persuasion",))[-60000:])
    ids = torch.tensor(held_out[:n * windows]).view(windows, n)
    calib = torch.tensor(chat.tokenizer.encode(austen_text(("emma",))[:20000])[:2 * n]).view(2, n)
    timed = ids[:1 if quick else 4]

    @torch.no_grad()
    def perplexity(m):
        logits, _ = m(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        return math.exp(float(loss))

    def scores(m):
        from headwise import importance
        return importance(m, calib)

    return Target("smollm2", chat.model, lambda m: m(calib), scores, perplexity, "perplexity",
                  False,
                  {f"prefill {tuple(timed.shape)}": lambda m: m(timed)},
                  f"perplexity on {windows} windows of {n} tokens from the end of Persuasion; "
                  f"latency: one forward over {tuple(timed.shape)} tokens")


def _pooled(model, batch) -> torch.Tensor:
    """Unit-length mean-pooled sentence vectors ``(b, m)`` of a BERT model on ``batch``."""
    from headwise.pretrained.sentence import mean_pool
    hidden, _ = model(batch["input_ids"], batch["attention_mask"])
    return F.normalize(mean_pool(hidden, batch["attention_mask"]), dim=-1)


TARGETS: dict[str, Callable[..., Target]] = {"reverse": reverse, "minilm": minilm,
                                               "smollm2": smollm2}
