"""``headwise heads catalogue``: run a model over a dataset and write the head catalogue (one
offline HTML page and its JSON).

    headwise heads catalogue --checkpoint headwise-demo/checkpoint
    headwise heads catalogue --model minilm --examples 512 -o reports/minilm-heads
    headwise heads catalogue --model minilm --sentences my_sentences.txt -o minilm.html
    headwise heads catalogue --model smollm2 --examples 16 --length 128
    headwise heads catalogue --hf path/to/saved_model --examples 16

Data: a checkpoint's own task (its held-out set: ``eval_set``); for ``--model minilm`` the
English side of the Ding German-English sentence pairs (``make corpora``) or ``--sentences
FILE`` (one sentence per line); for ``--model smollm2`` (SmolLM2-135M-Instruct's causal
self-attention) consecutive windows of ``--length`` tokens of Austen's *Emma* (``make corpora``)
or of ``--sentences FILE`` read as one text; ``--hf DIR`` (any local Hugging Face model, its own
tokenizer) as SmolLM2 for a causal LM and as MiniLM for an encoder. Output: ``headwise-reports/heads-catalogue-<model>/``
(``catalogue.html`` + ``catalogue.json``), ``-o DIR``, or ``-o FILE.html`` (JSON beside it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from headwise.commands import _flags as F
from headwise.commands._common import MIRROR, mirror_head, parse_device, report_paths
from headwise.commands._flags import flag

HELP = "every head's dataset-level scores, typical pattern and top tokens (HTML + JSON)"
EXAMPLE = "headwise heads catalogue --checkpoint headwise-demo/checkpoint"
MODELS = ("minilm", "smollm2")


FLAGS = (
    F.OneOf((
        F.CHECKPOINT.but(help="a headwise checkpoint folder (its own task's held-out set is the "
                              "dataset)"),
        flag("--model", choices=MODELS,
             help="minilm = all-MiniLM-L6-v2 (the 'pretrained' extra) on English sentences; "
                  "smollm2 = SmolLM2-135M-Instruct on windows of text"),
        F.hf("a causal LM on windows of text (as smollm2), an encoder on sentences (as minilm)"),
    ), required=True),
    *F.DATA,
    flag("--window", type=int, default=8, at_least=1,
         help="relative-offset profile covers keys -W..W (default 8)"),
    flag("--top-tokens", type=int, default=10, at_least=1, help="tokens listed per head"),
    F.output("heads-catalogue-MODEL", "the page's .html, JSON beside it"),
    F.TITLE,
    F.DEVICE,
)


def register(subparsers) -> None:
    F.parser(subparsers, "catalogue", "Run a model over a dataset and describe every head (per "
             "attention kind and layer): previous/next-token, mirror, induction, sink, entropy, "
             "focus and distance scores, its averaged attention pattern and the tokens it attends "
             "to most, in one offline, sortable HTML page and a JSON file.", FLAGS, run,
             full_command="heads catalogue")  # errors: "headwise heads catalogue:"


def run(args: argparse.Namespace) -> int:
    from headwise.analysis.catalogue import catalogue

    device = parse_device(args.device)
    load = (_checkpoint if args.checkpoint else _hf if args.hf else
            _smollm2 if args.model == "smollm2" else _minilm)
    model, batches, names, label, dataset = load(args, device)
    cat = catalogue(model, batches, tokens=names, window=args.window,
                    top_tokens=args.top_tokens, name=label, dataset=dataset)
    html, json_path = report_paths(args.output, "heads-catalogue", label,
                                   files=("catalogue.html", "catalogue.json"))
    json_path = json_path or html.with_suffix(".json")
    cat.page(html, title=args.title)
    cat.to_json(json_path)
    _summary(cat)
    print(f"catalogue: {html} (offline, any browser)\njson:      {json_path}")
    return 0


def _summary(cat) -> None:
    """The heads that stand out most on a few scores, one line each, naming what the score
    measures; the mirror head is :func:`headwise.commands._common.mirror_head`'s, the one
    ``headwise demo`` names."""
    print(f"{cat.meta['model']}: {len(cat.heads)} heads over {cat.meta['inputs']} inputs "
          f"({cat.meta['dataset']})")
    for score in ("prev_token", "next_token", MIRROR, "induction", "sink"):
        best = cat.ranked(score)
        e = mirror_head(cat) if score == MIRROR else best[0] if best else None
        if e is not None:
            print(f"  most {score:<10} {e['kind']} layer {e['layer']} head {e['head']}: "
                  f"{e['scores'][score]:.3f} ({cat.meta['scores'][score]})")


def chunks(batch, size: int) -> list:
    """``batch`` (a dataclass of tensors) as batches of ``size`` rows."""
    from dataclasses import fields

    n = len(batch)
    return [type(batch)(**{f.name: getattr(batch, f.name)[s:s + size] for f in fields(batch)})
            for s in range(0, n, size)]


def _checkpoint(args, device):
    from headwise import checkpoint
    from headwise.train.config import TrainConfig
    from headwise.train.recipe import task_for

    loaded = checkpoint.load(args.checkpoint, device=device)
    cfg = loaded.metadata.get("train_config")
    if not cfg:
        raise ValueError(f"checkpoint {args.checkpoint} records no training task, so there is "
                         "no dataset to run; use a checkpoint written by `headwise train` or "
                         "`headwise demo`")
    cfg = TrainConfig.from_dict(cfg).resolved()
    task = task_for(cfg)
    batches = chunks(task.eval_set(args.examples), args.batch_size)
    tok = loaded.tokenizer
    names = tok.tokens if tok is not None else None
    label = Path(args.checkpoint).resolve().name
    if label == "checkpoint":
        label = Path(args.checkpoint).resolve().parent.name
    return loaded.model, batches, names, label, f"task {cfg.task}, held-out set"


def _minilm(args, device):
    from headwise import pretrained

    if args.sentences:  # the text first: a missing corpus is one line, before a model loads
        from headwise.data import read_text
        texts = [line.strip() for line in read_text(args.sentences).splitlines() if line.strip()]
        dataset = f"{Path(args.sentences).name}"
        if not texts:
            raise ValueError(f"--sentences {args.sentences}: no non-empty lines")
    else:
        from headwise.data.corpora import ding_pairs
        texts, dataset = [en for _, en in ding_pairs()], "English side of the Ding de-en pairs"
    encoder = pretrained.load_sentence_encoder(pretrained.find_minilm(), device=device)
    step = max(1, len(texts) // args.examples)  # spread over the whole file, deterministic
    texts = texts[::step][:args.examples]
    tok = encoder.tokenizer
    batches = [{k: v for k, v in tok.batch(texts[s:s + args.batch_size], device=device).items()
                if k in ("input_ids", "attention_mask", "token_type_ids")}
               for s in range(0, len(texts), args.batch_size)]
    return (encoder.model, batches, tok.tokens, "all-MiniLM-L6-v2",
            f"{dataset}, {len(texts)} sentences")


def _smollm2(args, device):
    import torch

    from headwise.pretrained import load_smollm2

    if args.sentences:  # the text first: a missing corpus is one line, before a model loads
        from headwise.data import read_text
        text, dataset = read_text(args.sentences), Path(args.sentences).name
    else:
        from headwise.data.corpora import austen_text
        text, dataset = austen_text(("emma",)), "Austen's Emma"
    chat = load_smollm2(device=device)
    n, want = args.length, args.examples
    limit = chat.model.config.max_len
    if n > limit:
        raise ValueError(f"--length {n} is longer than SmolLM2's context ({limit} tokens); "
                         f"pass --length {limit} or less")
    ids = chat.tokenizer.encode(text[:(n * want + 1) * 16])  # (a few characters per token)
    windows = min(want, len(ids) // n)
    if windows < 1:
        raise ValueError(f"{dataset}: {len(ids)} tokens, fewer than one window of --length {n}; "
                         "give a longer text or a smaller --length")
    ids = torch.tensor(ids[:windows * n], device=device).view(windows, n)
    batches = list(ids.split(args.batch_size))
    return (chat.model, batches, chat.tokenizer.tokens, "SmolLM2-135M-Instruct",
            f"{dataset}, {windows} windows of {n} tokens")


def _hf(args, device):
    from headwise.commands import _hf as hf

    data = hf.read_data(args)  # the text first: a missing corpus is one line, before weights
    model, tokenizer = hf.load(args.hf, device)
    batches, dataset = hf.batches(model, tokenizer, data, args, device)
    from functools import partial

    from headwise.hf.tools import token_names
    return model, batches, partial(token_names, tokenizer), Path(args.hf).name, dataset
