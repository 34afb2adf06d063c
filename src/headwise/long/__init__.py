"""Every head of a long document in one streaming pass: per-head block maps, distance profiles,
sink / local / received mass, top keys and user-defined reductions, in O(n) memory, exact.

Axis legend: ``l`` layers, ``h`` query heads, ``g`` key/value groups, ``b`` batch, ``i`` query
position, ``j`` key position, ``I`` query blocks, ``J`` key blocks, ``D`` distance bins.

:mod:`~headwise.long.profile` holds the result (:class:`LongProfile`, saved and loaded as
safetensors).

May import (the rule and its check: the table in ``tests/test_wings.py``): the core
(``masks``, ``heads``, ``attend``, ``weights``, ``observe``, ``stats``, ``layers``, ``fast``),
``data`` (the synthetic needle prompt) and ``hf`` (a transformers model's layers).
"""

from headwise.long.profile import LongProfile, group_scores

__all__ = ["LongProfile", "group_scores"]
