"""The attention kinds: the one table of their names, which token side their queries and keys
read, and how the views label them.

A headwise model names its attentions by kind in ``return_weights``, ``head_mask``, head
selections ``{kind: {layer: [heads]}}`` and score tables ``{kind: (layers, heads)}``:
``encoder_self`` (encoder self-attention: ``src`` attends ``src``), ``decoder_self`` (decoder
or language-model self-attention: ``tgt`` attends ``tgt``) and ``cross`` (the decoder's queries
attend the encoder's output: ``tgt`` attends ``src``). The head view's page gets the order and
labels from here through its META (``assets/head_view.js`` writes none of its own).

A leaf: imports nothing of headwise and no torch (``headwise view --help`` reads it), so every
wing may import it (the wing table: ``tests/test_wings.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CROSS", "DECODER_SELF", "ENCODER_SELF", "KINDS", "Kind", "as_tables"]


@dataclass(frozen=True)
class Kind:
    """One attention kind.

    Attributes:
        query: the token side its queries read (``"src"`` or ``"tgt"``).
        key: the token side its keys and values read.
        label: its name on a page (``"Encoder self-attention"``).
        short: its name on a button (``"Encoder self"``).
    """

    query: str
    key: str
    label: str
    short: str

    @property
    def sides(self) -> tuple[str, str]:
        """``(query side, key side)``."""
        return self.query, self.key

    @property
    def is_self(self) -> bool:
        """Whether queries and keys read one sequence (so ``i == j`` and rollout applies)."""
        return self.query == self.key


ENCODER_SELF, DECODER_SELF, CROSS = "encoder_self", "decoder_self", "cross"

# kind -> Kind, in the order every view lists them
KINDS: dict[str, Kind] = {
    ENCODER_SELF: Kind("src", "src", "Encoder self-attention", "Encoder self"),
    DECODER_SELF: Kind("tgt", "tgt", "Decoder self-attention", "Decoder self"),
    CROSS: Kind("tgt", "src", "Cross-attention (decoder → encoder)", "Cross"),
}


def per_kind(table, kinds, name: str, what: str, where: str) -> list[tuple[str, object]]:
    """``table``'s ``(kind, value)`` items, checked once for every ``{kind: per-layer}`` table a
    caller passes (importance scores, pruned heads): a mapping (``what`` says of what), each of
    its kinds one of the model's ``kinds``."""
    if not isinstance(table, Mapping):
        raise TypeError(f"{where}: {name} must be {what}, got {type(table).__name__}")
    for kind in table:
        if kind not in kinds:
            raise ValueError(f"{where}: {name} has kind {kind!r}; this model has {sorted(kinds)}")
    return list(table.items())


def as_tables(importance, shapes: Mapping[str, tuple[int, int]], where: str) -> dict:
    """Scores a caller passes in as ``{kind: (layers, heads) float64 CPU tensor}``, checked
    against the model's ``shapes`` (``{kind: (layers, widest layer's heads)}``); NaN = no score.

    ``importance``: a dict kind -> ``(layers, heads)`` tensor or array, or a
    :class:`~headwise.HeadScores` (read through its ``scores`` dict, so that the views, which
    the head tools' results reach as arguments, import no tool)."""
    import torch  # here, not at the top: the table above stays torch-free

    table = getattr(importance, "scores", importance)
    out = {}
    for kind, scores in per_kind(table, shapes, "importance",
                                 "a HeadScores or a dict kind -> (layers, heads) array", where):
        t = torch.as_tensor(scores).detach().to("cpu", torch.float64)
        if tuple(t.shape) != tuple(shapes[kind]):
            raise ValueError(f"{where}: importance[{kind!r}] must be (layers, heads) = "
                             f"{tuple(shapes[kind])}, got shape {tuple(t.shape)}")
        out[kind] = t
    return out
