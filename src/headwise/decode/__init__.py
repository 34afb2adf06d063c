"""The decode wing: everything that runs a decoder one new token at a time.

- :mod:`~headwise.decode.generation`: :func:`generate` and :func:`generate_with_logits` (greedy,
  sampling, beam search), set by one :class:`GenerationConfig` (:mod:`~headwise.decode.config`);
- :mod:`~headwise.decode.step`: :class:`DecodeStep`, the cached step after the prompt, and
  :func:`~headwise.decode.step.choose`, the one place that picks its form (growing cache, bound
  C plan, fixed shapes, CUDA graph);
- :mod:`~headwise.decode.forms`: :data:`FORMS`, the one table from each module class to its
  one-row form, and the forms themselves beside it (``attention``, ``block``, ``norms``,
  ``feedforward``, ``embedding``);
- :mod:`~headwise.decode.vouch`: the KV cache's NaN vouching (which cached positions are known
  finite) and the one-call self-attention that relies on it;
- :mod:`~headwise.decode.ragged`: the head-wise KV cache (streaming groups in a ring of sinks +
  window, the others whole, as a :class:`~headwise.kvplan.KVPlan` says).

May import (the rule and its check: the table in ``tests/test_wings.py``): ``models``,
``layers``, ``attend``, ``fast``, ``cache``, ``rope``, ``observe`` and ``kvplan``. Nothing
below it imports it (``models/``, ``layers/``, ``cache`` and ``fast/`` never do; the cache is
told about vouching through a slot, not an import), so importing this wing cannot cycle. Only
the shims ``headwise.step`` and ``headwise.decoding`` import it, to keep those names for users.
The names here are imported on first use (PEP 562), so ``import headwise.decode.vouch`` does not
load the models.
"""

from __future__ import annotations

from headwise import _lazy

# public name -> the submodule that defines it
_EXPORTS = {
    "generate": "headwise.decode.generation",
    "generate_with_logits": "headwise.decode.generation",
    "GenerationConfig": "headwise.decode.config",
    "DecodeStep": "headwise.decode.step",
    "FORMS": "headwise.decode.forms",
    "form_of": "headwise.decode.forms",
    "HeadwiseCache": "headwise.decode.ragged",
    "headwise_cache": "headwise.decode.ragged",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
