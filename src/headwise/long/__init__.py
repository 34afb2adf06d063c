"""Every head of a long document in one streaming pass: per-head block maps, distance profiles,
sink / local / received mass, top keys and user-defined reductions, in O(n) memory, exact.

Axis legend: ``l`` layers, ``h`` query heads, ``g`` key/value groups, ``b`` batch, ``i`` query
position, ``j`` key position, ``I`` query blocks, ``J`` key blocks, ``D`` distance bins.

::

    prof = hw.long.profile(model, ids)              # a LongProfile: every layer and head
    prof.scores["far"]                              # (l, h) mass > 1,000 tokens back, not sinks
    hw.long.profile(model, ids, reductions=[hw.long.MaxLogit()]).scores["max_logit"]

The modules: :mod:`~headwise.long.profile` (the result, :class:`LongProfile`, saved and loaded
as safetensors), :mod:`~headwise.long.tiles` (the pass over one attention call: query chunks
x keys up to the diagonal), :mod:`~headwise.long.reductions` (the reduction protocol and the
built-ins written with it), :mod:`~headwise.long.checks` (the boundary), :mod:`~headwise.long.
run` (:func:`profile`: the forward with one observer), :mod:`~headwise.long.classes` (the
retrieval score from a needle prompt, head classes, the sinks + window restriction).

May import (the rule and its check: the table in ``tests/test_wings.py``): the core
(``masks``, ``heads``, ``attend``, ``weights``, ``observe``, ``stats``, ``layers``, ``fast``),
``data`` (the synthetic needle prompt), ``hf`` (a transformers model's layers) and ``kvplan``
(the sinks + window rule that the restriction applies).
"""

from headwise.long.checks import default_block
from headwise.long.classes import Needle, SpanMass, classes, needle_prompt, restrict, retrieval
from headwise.long.profile import LongProfile, group_scores
from headwise.long.reductions import (
    BlockMap,
    Distance,
    MaxLogit,
    Received,
    RowMasses,
    TopKeys,
    distance_edges,
)
from headwise.long.run import profile
from headwise.long.tiles import Call, Tile

__all__ = ["BlockMap", "Call", "Distance", "LongProfile", "MaxLogit", "Needle", "Received",
           "RowMasses", "SpanMass", "Tile", "TopKeys", "classes", "default_block",
           "distance_edges", "group_scores", "needle_prompt", "profile", "restrict", "retrieval"]
