"""The activation cache a run returns: TransformerLens' names and indexing.

Axis legend: ``b`` batch, ``h`` query heads, ``i`` query position, ``j`` key position, ``d``
head dim, ``m`` model dim.

``cache["blocks.5.attn.hook_pattern"]``, ``cache["pattern", 5]`` (negative layers count from
the end), ``cache["resid_post", -1]``; ``names()`` / ``keys()`` / ``values()`` / ``items()`` in
forward order; ``to(device)``; :meth:`ActivationCache.stack_head_results`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from headwise.lens import names as N

__all__ = ["ActivationCache"]


class ActivationCache:
    """Hook name -> tensor for one forward; ``n_layers`` is the model's layer count (for
    negative layers and the errors). A pattern under a selection has the selection's shape
    ``(b, hs, is, js)``; ``selection`` says which (None: every head, row and key)."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_layers: int, selection=None):
        self._tensors = dict(tensors)
        self.n_layers = n_layers
        self.selection = selection

    def _name(self, key) -> str:
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str):
            short, layer = key
            if short not in N.ORDER:
                raise KeyError(str(N.choose(short, self.n_layers, "ActivationCache")))
            if not isinstance(layer, int) or not -self.n_layers <= layer < self.n_layers:
                raise KeyError(f"ActivationCache: layer {layer!r} is out of range: the model has "
                               f"{self.n_layers} layers (0..{self.n_layers - 1})")
            return N.full(short, layer % self.n_layers)
        if isinstance(key, str):
            return key
        raise KeyError(f"ActivationCache: index with a hook name or (short name, layer), e.g. "
                       f"cache['pattern', 5]; got {key!r}")

    def __getitem__(self, key) -> torch.Tensor:
        name = self._name(key)
        if name not in self._tensors:
            N.choose(name, self.n_layers, "ActivationCache")  # an unknown name: did-you-mean
            raise KeyError(f"ActivationCache: {name!r} was not cached (cached: "
                           f"{_summary(self.names())}); add it to run_with_cache's names")
        return self._tensors[name]

    def __contains__(self, key) -> bool:
        try:
            return self._name(key) in self._tensors
        except KeyError:
            return False

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def names(self) -> list[str]:
        return list(self._tensors)

    keys = names

    def values(self) -> list[torch.Tensor]:
        return list(self._tensors.values())

    def items(self) -> list[tuple[str, torch.Tensor]]:
        return list(self._tensors.items())

    def to(self, *args, **kwargs) -> ActivationCache:
        """A copy with every tensor moved (``torch.Tensor.to``'s arguments)."""
        return ActivationCache({k: v.to(*args, **kwargs) for k, v in self._tensors.items()},
                               self.n_layers, self.selection)

    def stack_head_results(self, layer: int = -1, *, return_labels: bool = False):
        """``(layers * h, b, i, m)``: every head's ``hook_result`` of the layers before
        ``layer`` (``-1``: all of them), layer by layer, as TransformerLens stacks them (its
        ``apply_ln`` and ``pos_slice`` are not offered: slice the result instead). With
        ``return_labels``, also the labels ``"L{l}H{h}"``."""
        upto = self.n_layers if layer == -1 else layer
        if not isinstance(upto, int) or not 0 <= upto <= self.n_layers:
            raise ValueError(f"stack_head_results: layer must be -1 or 0..{self.n_layers}, "
                             f"got {layer!r}")
        missing = [n for n in (N.full("result", l) for l in range(upto)) if n not in self]
        if missing or upto == 0:
            raise ValueError(f"stack_head_results: {missing[0] if missing else 'no layer'} is "
                             "not cached; run with names including 'result' (hook_result)")
        parts = [self[N.full("result", l)].permute(2, 0, 1, 3) for l in range(upto)]
        stacked = torch.cat(parts)
        if not return_labels:
            return stacked
        return stacked, [f"L{l}H{h}" for l, p in enumerate(parts) for h in range(p.shape[0])]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in list(self._tensors.items())[:4])
        more = f", ... ({len(self) - 4} more)" if len(self) > 4 else ""
        return f"ActivationCache({len(self)} hooks of {self.n_layers} layers: {shapes}{more})"


def _summary(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "") \
        if names else "nothing"
