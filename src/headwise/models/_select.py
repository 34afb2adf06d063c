"""Which layers' attention weights a model call should return (``return_weights=...``), and
which heads, query rows and keys of them.

Layers not asked for stay on the fused path (no weights are built for them); the layers asked
for recompute only the selected weights from the fused kernel's log-sum-exp.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from headwise.weights import Selection as Heads

Selection = dict[str, list]  # kind -> per layer: False, True or a headwise.Selection


def select(return_weights, layers: Mapping[str, int]) -> Selection | None:
    """Normalise ``return_weights`` to ``kind -> [per layer: False, True or a Selection]``
    (None: nothing wanted).

    ``layers`` maps each kind the model has to its number of layers. Accepted forms:
    ``False``/``None``; ``True`` (everything); a :class:`headwise.Selection` (those heads/rows/
    keys of every layer); a kind name; an iterable of kind names; or a mapping from kind to
    ``True``, layer indices (negative count from the end), a Selection, or a dict
    ``{"layers": indices, "heads": ..., "rows": ..., "keys": ...}``.
    """
    if return_weights is None or return_weights is False:
        return None
    if return_weights is True or isinstance(return_weights, Heads):
        return {kind: [return_weights] * n for kind, n in layers.items()}
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
        which, wanted = _split(kind, which)
        if which is True:
            out[kind] = [wanted] * n
            continue
        if isinstance(which, int) and not isinstance(which, bool):
            which = [which]
        if not isinstance(which, Iterable) or isinstance(which, (str, bytes)):
            raise TypeError(f"return_weights[{kind!r}] must be True, layer indices, a "
                            f"headwise.Selection or a dict with layers/heads/rows/keys, got "
                            f"{which!r}")
        for index in which:
            if not isinstance(index, int) or isinstance(index, bool) or not -n <= index < n:
                raise ValueError(f"return_weights[{kind!r}]: layer index {index!r} out of range "
                                 f"for {n} layers (use 0..{n - 1} or negative from the end)")
            out[kind][index] = wanted
    return out


def _split(kind: str, which):
    """``(layer indices or True, what each chosen layer returns: True or a Selection)``."""
    if isinstance(which, Heads):
        return True, which
    if isinstance(which, Mapping):
        unknown = set(which) - {"layers", "heads", "rows", "keys"}
        if unknown:
            raise ValueError(f"return_weights[{kind!r}]: unknown keys {sorted(unknown)}; use "
                             "layers, heads, rows, keys")
        rest = {key: value for key, value in which.items() if key != "layers"}
        return which.get("layers", True), (Heads(**rest) if rest else True)
    return which, True

