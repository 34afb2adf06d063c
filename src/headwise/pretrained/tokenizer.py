"""A checkpoint's own ``tokenizer.json`` (through the ``tokenizers`` package)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from headwise.errors import CheckpointError
from headwise.models.bert import BertConfig

__all__ = ["CheckpointTokenizer", "load_tokenizer"]


class CheckpointTokenizer:
    """A checkpoint's own ``tokenizer.json`` (word-piece for BERT) through ``tokenizers``.

    ``encode(str) -> list[int]``, ``decode(ids) -> str``, ``tokens(ids) -> list[str]`` as every
    headwise tokenizer, plus ``batch(texts) -> {"input_ids", "attention_mask",
    "token_type_ids"}`` ``(b, n)`` tensors padded to the longest text.
    """

    def __init__(self, tokenizer, *, max_length: int, pad_id: int = 0):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_id = pad_id
        tokenizer.no_padding()  # files often fix a length (all-MiniLM's pads every text to 128)
        tokenizer.enable_truncation(max_length)

    @classmethod
    def from_file(cls, path: str | Path, *, max_length: int = 512,
                  pad_id: int = 0) -> CheckpointTokenizer:
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path} does not exist; the checkpoint needs a tokenizer.json")
        try:
            return cls(Tokenizer.from_file(str(path)), max_length=max_length, pad_id=pad_id)
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise CheckpointError(f"{path}: not a tokenizers file ({exc})") from None

    def encode(self, text: str, pair: str | None = None) -> list[int]:
        """Ids with the special tokens (``[CLS] text [SEP]``, ``[CLS] a [SEP] b [SEP]``)."""
        return self.tokenizer.encode(text, pair).ids

    def truncated(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[bool]:
        """Whether each text (with its pair) is longer than the model reads: :meth:`batch`
        keeps only its first :attr:`max_length` tokens."""
        inputs = list(zip(texts, pairs, strict=True)) if pairs is not None else list(texts)
        return [bool(e.overflowing) for e in self.tokenizer.encode_batch(inputs)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """The display string of each id (``[CLS]``, ``hello``, ``##s``...)."""
        return [self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]

    def batch(self, texts: Sequence[str] | str, pairs: Sequence[str] | None = None, *,
              device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Tokenise and right-pad: ``(b, n)`` ``input_ids``, ``attention_mask`` (1 = real),
        ``token_type_ids`` (1 for the second text of a pair)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError("batch: texts must be a non-empty list of str")
        if pairs is not None:
            if len(pairs) != len(texts):
                raise ValueError(f"batch: {len(texts)} texts but {len(pairs)} pairs")
            encodings = self.tokenizer.encode_batch(list(zip(texts, pairs, strict=True)))
        else:
            encodings = self.tokenizer.encode_batch(texts)
        n = max(len(e.ids) for e in encodings)
        ids = torch.full((len(texts), n), self.pad_id, dtype=torch.long)
        types = torch.zeros((len(texts), n), dtype=torch.long)
        valid = torch.zeros((len(texts), n), dtype=torch.long)
        for row, e in enumerate(encodings):
            ids[row, :len(e.ids)] = torch.tensor(e.ids)
            types[row, :len(e.ids)] = torch.tensor(e.type_ids)
            valid[row, :len(e.ids)] = 1
        return {"input_ids": ids.to(device), "attention_mask": valid.to(device),
                "token_type_ids": types.to(device)}


def load_tokenizer(folder: str | Path, config: BertConfig | None = None) -> CheckpointTokenizer:
    """The folder's ``tokenizer.json``, truncating at sentence-transformers' ``max_seq_length``
    when the folder has a ``sentence_bert_config.json``, else at the model's ``max_len``."""
    folder = Path(folder)
    max_length = config.max_len if config is not None else 512
    st = folder / "sentence_bert_config.json"
    if st.is_file():
        max_length = min(max_length, int(json.loads(st.read_text()).get("max_seq_length",
                                                                           max_length)))
    pad_id = config.pad_id if config is not None else 0
    return CheckpointTokenizer.from_file(folder / "tokenizer.json", max_length=max_length,
                                         pad_id=pad_id)
