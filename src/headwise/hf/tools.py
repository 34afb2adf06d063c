"""headwise's views of a Hugging Face model: its head view with the model's own tokenizer
(grouped-query heads under their key/value heads), one traced forward that gives the view's
weights and the trace's kernel report together, and the next-token loss that
:func:`headwise.importance` uses by default on a causal language model.

Axis legend: ``b`` batch, ``h`` query heads, ``i`` query position, ``j`` key position,
``v`` vocabulary.

    import headwise.hf
    run = headwise.hf.explain(model, tokenizer, ["The cat sat on the mat."])
    print(run.record.summary())                 # which kernel each layer ran, how weights came
    headwise.hf.head_view(model, tokenizer, ["The cat sat on the mat."], "view.html")
    scores = headwise.importance(model, batches)   # next_token_loss on a causal LM

Texts are padded on the right (the view trims each example's padding at its end). The model
must run ``attn_implementation="headwise"``: the weights then come from the fused kernel's
log-sum-exp, not from an eager pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from headwise.hf.model import context, kind, kv_head_count, running

__all__ = ["Explained", "encode", "explain", "head_view", "next_token_loss", "token_names"]


@dataclass
class Explained:
    """One traced forward of an HF model over some texts.

    Attributes:
        record: the :class:`headwise.Trace` of the forward (``record.output``: the model's own
            output, its ``attentions`` every layer's weights).
        tokens: each text's tokens as strings (:func:`token_names`; no padding).
        attentions: ``{kind: [(b, h, i, j) per layer]}``, kind ``"decoder_self"`` (causal) or
            ``"encoder_self"``: what :func:`headwise.viz.head_view` takes.
        kv_heads: the key/value heads ``g`` per layer under grouped-query attention (fewer
            than the query heads ``h``), else None: what ``head_view(kv_heads=)`` takes.
        inputs: the ``input_ids`` and ``attention_mask`` ``(b, n)`` the model ran on.
    """

    record: Any
    tokens: list[list[str]]
    attentions: dict[str, list[torch.Tensor]]
    kv_heads: int | None
    inputs: dict[str, torch.Tensor]


def encode(tokenizer, texts: Sequence[str], max_length: int | None,
            device) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """``texts`` as right-padded ``input_ids``/``attention_mask`` ``(b, n)`` and each text's
    ids (cut to ``max_length`` tokens)."""
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) and t.strip()
                                                      for t in texts):
        raise ValueError(f"headwise.hf: texts must be a non-empty list of non-empty strings, got "
                         f"{texts!r}")
    per_text = [tokenizer(t)["input_ids"][:max_length] for t in texts]
    if not all(per_text):
        raise ValueError("headwise.hf: a text is empty after tokenization; give some text")
    n = max(map(len, per_text))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([row + [pad] * (n - len(row)) for row in per_text], device=device)
    mask = torch.tensor([[1] * len(row) + [0] * (n - len(row)) for row in per_text],
                        device=device)
    return {"input_ids": ids, "attention_mask": mask}, per_text


def token_names(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each id as the text it stands for, decoded alone (a byte-level BPE's ``"Ġcapital"`` is
    ``" capital"``; WordPiece's ``"##ing"`` and special tokens stay as they are)."""
    return [tokenizer.decode([i]) for i in ids]


def explain(model, tokenizer, texts: Sequence[str]) -> Explained:
    """Run ``model`` once over ``texts`` under :func:`headwise.trace`, with every layer's
    weights (``output_attentions=True``, from the fused kernel's log-sum-exp)."""
    from headwise.tracing import trace

    layers = running(model, "headwise.hf.explain")
    view_kind = kind(model)
    device = next(model.parameters()).device
    inputs, per_text = encode(tokenizer, texts, context(model), device)
    with torch.no_grad():
        record = trace(model, **inputs, output_attentions=True)
    weights = list(record.output.attentions)
    if len(weights) != len(layers) or any(w is None for w in weights):
        raise ValueError(f"headwise.hf.explain: {type(model).__name__} returned "
                         f"{len(weights)} attention tensors for {len(layers)} attention layers")
    tokens = [token_names(tokenizer, row) for row in per_text]
    g, h = kv_head_count(layers[0]), weights[0].shape[1]
    return Explained(record, tokens, {view_kind: weights}, g if g < h else None, inputs)


def head_view(model, tokenizer, texts: Sequence[str], path=None, **options):
    """The interactive head view (:func:`headwise.viz.head_view`) of ``model`` on ``texts``:
    tokens from ``tokenizer``, query heads grouped under their key/value heads; written to
    ``path`` when given. ``options`` go to :func:`headwise.viz.head_view` (``title``,
    ``importance``, ``kind``/``layer``/``head`` to open on, ...)."""
    from headwise.viz import head_view as view

    run = explain(model, tokenizer, texts)
    options.setdefault("title", f"{type(model).__name__}: {texts[0][:60]}")
    return view(run.attentions, run.tokens, path, kv_heads=run.kv_heads, **options)


def next_token_loss(model, batch) -> torch.Tensor:
    """Mean next-token cross-entropy of an HF causal language model on ``batch``: a dict of its
    forward's arguments with ``input_ids (b, n)`` (``attention_mask``: pairs that touch a
    padded position are left out) or a ``(b, n)`` tensor of ids. The default loss of
    :func:`headwise.importance` on such a model."""
    if kind(model) != "decoder_self":
        raise TypeError(f"no default loss for {type(model).__name__} (an encoder: it does not "
                        "predict the next token); pass loss=lambda model, batch: ... returning "
                        "a scalar tensor (lower is better), or a behaviour method (entropy, "
                        "sink, prev_token)")
    if isinstance(batch, torch.Tensor):
        batch = {"input_ids": batch}
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise TypeError(f"next_token_loss: a batch is a dict with input_ids (b, n) or a (b, n) "
                        f"tensor of ids, got {type(batch).__name__}")
    ids, mask = batch["input_ids"], batch.get("attention_mask")
    logits = model(**batch).logits[:, :-1]  # (b, n-1, v)
    labels = ids[:, 1:]
    if mask is not None:
        keep = mask[:, 1:].bool() & mask[:, :-1].bool()
        labels = labels.masked_fill(~keep, -100)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
