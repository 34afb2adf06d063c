"""Character- and byte-level tokenizers with the three special tokens every task needs.

Ids ``0, 1, 2`` are always ``<pad>``, ``<bos>``, ``<eos>``; ``<unk>`` is id 3 for the character
tokenizer (bytes need none: every string is bytes). Both round-trip through ``to_dict()`` /
``from_dict()`` (JSON-safe, stored in a checkpoint's ``config.json``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["SPECIALS", "ByteTokenizer", "CharTokenizer", "tokenizer_from_dict"]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS)


class _Tokenizer:
    pad_id, bos_id, eos_id = 0, 1, 2
    kind = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; specials are dropped and decoding stops at the first ``<eos>``."""
        raise NotImplementedError

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """One display string per id (specials shown as ``<pad>``/``<bos>``/``<eos>``)."""
        raise NotImplementedError

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        out = [int(i) for i in ids]
        bad = [i for i in out if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside this {self.kind} tokenizer's "
                             f"vocabulary of {self.vocab_size}; were the ids made by another "
                             f"tokenizer?")
        return out


class CharTokenizer(_Tokenizer):
    """One id per character of a fixed alphabet, after ``<pad> <bos> <eos> <unk>``.

    Characters outside the alphabet encode to ``<unk>`` (id 3).

    >>> tok = CharTokenizer("abc")
    >>> tok.encode("cab"), tok.decode([6, 4, 5])
    ([6, 4, 5], 'cab')
    """

    kind = "char"
    unk_id = 3

    def __init__(self, alphabet: Iterable[str]):
        chars = list(dict.fromkeys(alphabet))  # ordered, unique
        if not chars:
            raise ValueError("CharTokenizer needs a non-empty alphabet; got ''")
        if any(len(c) != 1 for c in chars):
            raise ValueError(f"CharTokenizer alphabet entries must be single characters; got "
                             f"{[c for c in chars if len(c) != 1][:3]}")
        self.alphabet = "".join(chars)
        self._itos = [PAD, BOS, EOS, UNK, *chars]
        self._stoi = {c: i + 4 for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Alphabet = the sorted set of characters in ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    def encode(self, text: str) -> list[int]:
        return [self._stoi.get(c, self.unk_id) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in self._check_ids(list(ids)):
            if i == self.eos_id:
                break
            if i > self.unk_id:
                out.append(self._itos[i])
            elif i == self.unk_id:
                out.append("\ufffd")
        return "".join(out)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._itos[i] for i in self._check_ids(list(ids))]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "alphabet": self.alphabet}

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class ByteTokenizer(_Tokenizer):
    """UTF-8 bytes: id ``b + 3`` for byte ``b``; vocabulary 259, nothing is ever unknown."""

    kind = "byte"
    offset = 3

    @property
    def vocab_size(self) -> int:
        return 256 + self.offset

    def encode(self, text: str) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate, e.g. from a bad decode upstream
            raise ValueError(f"ByteTokenizer.encode: the text holds {text[e.start]!r} at "
                             f"position {e.start}, a lone surrogate UTF-8 cannot encode; clean "
                             "it first: text.encode('utf-8', 'replace').decode()") from None
        return [b + self.offset for b in data]

    def decode(self, ids: Iterable[int]) -> str:
        out = bytearray()
        for i in self._check_ids(list(ids)):
            if i == self.eos_id:
                break
            if i >= self.offset:
                out.append(i - self.offset)
        return out.decode("utf-8", errors="replace")

    def tokens(self, ids: Iterable[int]) -> list[str]:
        names = []
        for i in self._check_ids(list(ids)):
            if i < self.offset:
                names.append(SPECIALS[i])
            else:
                b = i - self.offset
                names.append(chr(b) if 32 <= b < 127 else f"<0x{b:02X}>")
        return names

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=259)"


def tokenizer_from_dict(d: dict[str, Any]) -> CharTokenizer | ByteTokenizer:
    """Rebuild a tokenizer from its ``to_dict()``."""
    if not isinstance(d, dict) or "kind" not in d:
        raise ValueError(f"a tokenizer dict needs a 'kind' key ('char' or 'byte'); got {d!r:.80}")
    kind = d["kind"]
    if kind == "char":
        if set(d) != {"kind", "alphabet"}:
            raise ValueError(f"char tokenizer dict expects keys kind, alphabet; got {sorted(d)}")
        alphabet = d["alphabet"]
        if not isinstance(alphabet, str | list) or not all(isinstance(c, str) for c in alphabet):
            raise ValueError(f"char tokenizer dict: alphabet must be a string of its characters, "
                             f"got {type(d['alphabet']).__name__} {d['alphabet']!r:.40}; write "
                             "e.g. \"alphabet\": \"abc\"")
        return CharTokenizer(d["alphabet"])
    if kind == "byte":
        if set(d) != {"kind"}:
            raise ValueError(f"byte tokenizer dict expects only the key kind; got {sorted(d)}")
        return ByteTokenizer()
    raise ValueError(f"unknown tokenizer kind {kind!r}; expected 'char' or 'byte'")


CharTokenizer.from_dict = staticmethod(tokenizer_from_dict)  # type: ignore[attr-defined]
ByteTokenizer.from_dict = staticmethod(tokenizer_from_dict)  # type: ignore[attr-defined]
