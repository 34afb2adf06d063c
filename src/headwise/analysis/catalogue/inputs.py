"""What the head catalogue feeds a model: one batch, run, with the real length and token ids of
each side (``src``: encoder input; ``tgt``: decoder / language-model input), so that padding
rows and keys are left out of every dataset-level number.

Axis legend: ``b`` batch, ``n`` positions of one side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headwise.kinds import KINDS

__all__ = ["Prepared", "attention_modules", "prepare"]


def attention_modules(model: nn.Module) -> dict[str, list[nn.Module]]:
    """``{kind: [MultiHeadAttention per layer]}`` of a model the catalogue can run (the models'
    own rule: :func:`headwise.models.attention_layers`); a Hugging Face model running
    ``attn_implementation="headwise"`` gives ``{"decoder_self" or "encoder_self": [its
    attention layers]}`` (:func:`headwise.hf.model.kind`)."""
    from headwise.finders import transformers_model
    from headwise.models import Transformer, TransformerLM, attention_layers
    from headwise.models.bert import BertModel

    layers = attention_layers(model)  # TypeError for anything but a headwise or HF model
    if transformers_model(model):  # its layers, as the views name a decoder's or an encoder's
        from headwise.hf.model import kind, refuse_unmodelled
        refuse_unmodelled(model, layers["layers"], "catalogue", "use hw.hf.weights or "
                          "output_attentions for its weights")
        return {kind(model): layers["layers"]}
    if not isinstance(model, (Transformer, TransformerLM, BertModel)):
        raise TypeError(f"catalogue: runs a whole Transformer, TransformerLM or BertModel, got "
                        f"{type(model).__name__} (an Encoder or Decoder alone has no batches "
                        "of its own; catalogue the model it belongs to)")
    return layers


@dataclass
class Prepared:
    """One batch ready to run: ``call()`` runs the model; ``sides`` maps ``src``/``tgt`` to
    ``(ids (b, n), lens (b,))``."""

    call: Any
    sides: dict[str, tuple[torch.Tensor, torch.Tensor]]
    size: int

    def run(self) -> None:
        self.call()

    def lengths(self, kind: str, nq: int, nk: int):
        """``(query lens (b,), key lens (b,), key ids (b, j))`` of an attention call of
        ``kind`` with ``nq`` query and ``nk`` key positions."""
        q_side, k_side = KINDS[kind].sides
        q_ids, q_lens = self.sides[q_side]
        k_ids, k_lens = self.sides[k_side]
        if q_ids.shape[1] != nq or k_ids.shape[1] != nk:
            raise ValueError(f"catalogue: a {kind} call saw {nq} query and {nk} key positions "
                             f"but the batch has {q_ids.shape[1]} and {k_ids.shape[1]}; run the "
                             "model on whole sequences (no KV cache)")
        return q_lens, k_lens, k_ids


def prepare(model: nn.Module, batch) -> Prepared:
    """``batch`` checked against ``model``'s kind (see :func:`headwise.catalogue`)."""
    from headwise.data import LMBatch, Seq2SeqBatch
    from headwise.models import Transformer, TransformerLM
    from headwise.models.bert import BertModel

    device = next(model.parameters()).device
    if isinstance(model, Transformer):
        if not isinstance(batch, Seq2SeqBatch):
            raise TypeError(f"catalogue: an encoder-decoder Transformer takes Seq2SeqBatch "
                            f"batches (task.eval_set(n)), got {type(batch).__name__}")
        batch = batch.to(device)
        pad = model.config.pad_id if model.config.pad_id is not None else -1
        tgt_lens = (batch.tgt_in != pad).sum(1)
        return Prepared(lambda: model(batch.src, batch.tgt_in, src_valid_lens=batch.src_lens),
                        {"src": (batch.src, batch.src_lens), "tgt": (batch.tgt_in, tgt_lens)},
                        len(batch))
    if isinstance(model, TransformerLM):
        if isinstance(batch, LMBatch):
            ids, lens = batch.inputs.to(device), batch.valid_lens.to(device)
        else:
            ids = _ids(batch, "a language model takes LMBatch batches or (b, n) token ids")
            ids = ids.to(device)
            lens = torch.full((ids.shape[0],), ids.shape[1], device=device)
        return Prepared(lambda: model(ids), {"tgt": (ids, lens)}, ids.shape[0])
    if isinstance(model, BertModel):
        return _prepare_ids(model, batch, device, "src", "BERT")
    kinds = attention_modules(model)  # raises the TypeError naming what is expected
    side = KINDS[next(iter(kinds))].query  # a Hugging Face model: a decoder's or an encoder's ids
    return _prepare_ids(model, batch, device, side, type(model).__name__)


def _prepare_ids(model, batch, device, side: str, name: str) -> Prepared:
    """A batch of ``input_ids`` (a dict of the forward's arguments, or ids alone) whose
    ``attention_mask`` marks a prefix of each row."""
    where = f"{name} takes {{'input_ids', 'attention_mask'}} dicts or (b, n) token ids"
    if isinstance(batch, Mapping):
        unknown = set(batch) - {"input_ids", "attention_mask", "token_type_ids"}
        if unknown or "input_ids" not in batch:
            raise ValueError(f"catalogue: {where}; got keys {sorted(batch)}")
        kwargs = {key: value.to(device) for key, value in batch.items()}
    else:
        kwargs = {"input_ids": _ids(batch, where).to(device)}
    ids = _ids(kwargs["input_ids"], where)
    mask = kwargs.get("attention_mask")
    if mask is None:
        lens = torch.full((ids.shape[0],), ids.shape[1], device=device)
    else:
        mask = mask.bool()
        lens = mask.sum(1)
        prefix = torch.arange(ids.shape[1], device=device)[None] < lens[:, None]
        if not torch.equal(prefix, mask):
            raise ValueError("catalogue: attention_mask must mark a prefix of each row (padding "
                             "on the right, as tokenizer.batch(...) gives)")
    return Prepared(lambda: model(**kwargs), {side: (ids, lens)}, ids.shape[0])


def _ids(batch, where: str) -> torch.Tensor:
    if not isinstance(batch, torch.Tensor) or batch.dim() != 2 or batch.dtype not in (
            torch.int64, torch.int32):
        got = (f"a {tuple(batch.shape)} {batch.dtype} tensor" if isinstance(batch, torch.Tensor)
               else type(batch).__name__)
        raise TypeError(f"catalogue: {where}; got {got}")
    if batch.shape[0] == 0 or batch.shape[1] == 0:
        raise ValueError(f"catalogue: empty batch of shape {tuple(batch.shape)}; every batch "
                         "needs at least one input of at least one token")
    return batch.long()
