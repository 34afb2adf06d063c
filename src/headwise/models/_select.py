"""Which layers' attention weights a model call should return (``return_weights=...``).

Layers not asked for stay on the fused path (no ``(b, h, i, j)`` tensor is built for them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Selection = dict[str, list[bool]]

KINDS = ("encoder_self", "decoder_self", "cross")


def select(return_weights, layers: Mapping[str, int]) -> Selection | None:
    """Normalise ``return_weights`` to ``kind -> [wanted per layer]`` (None: nothing wanted).

    ``layers`` maps each kind the model has to its number of layers. Accepted forms:
    ``False``/``None``; ``True`` (everything); a kind name; an iterable of kind names; or a
    mapping ``kind -> layer indices`` (negative indices count from the end) or ``kind -> True``.
    """
    if return_weights is None or return_weights is False:
        return None
    if return_weights is True:
        return {kind: [True] * n for kind, n in layers.items()}
    if isinstance(return_weights, str):
        return_weights = [return_weights]
    if isinstance(return_weights, Mapping):
        chosen = dict(return_weights)
    elif isinstance(return_weights, Iterable):
        chosen = {kind: True for kind in return_weights}
    else:
        raise TypeError(f"return_weights must be a bool, a kind, a set of kinds or a dict kind -> "
                        f"layer indices, got {type(return_weights).__name__}")
    out = {kind: [False] * n for kind, n in layers.items()}
    for kind, which in chosen.items():
        if kind not in layers:
            raise ValueError(f"return_weights: unknown kind {kind!r}; this model has "
                             f"{sorted(layers)}")
        n = layers[kind]
        if which is True:
            out[kind] = [True] * n
            continue
        if isinstance(which, int) and not isinstance(which, bool):
            which = [which]
        if not isinstance(which, Iterable) or isinstance(which, (str, bytes)):
            raise TypeError(f"return_weights[{kind!r}] must be True or layer indices, got "
                            f"{which!r}")
        for index in which:
            if not isinstance(index, int) or isinstance(index, bool) or not -n <= index < n:
                raise ValueError(f"return_weights[{kind!r}]: layer index {index!r} out of range "
                                 f"for {n} layers (use 0..{n - 1} or negative from the end)")
            out[kind][index] = True
    return out

