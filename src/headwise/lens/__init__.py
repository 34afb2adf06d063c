"""TransformerLens' conventions on the fused path: an activation cache with its hook names,
run-with-hooks for per-head edits, and the cache during generation, for headwise's language
model and any transformers decoder on ``attn_implementation="headwise"``.

    logits, cache = hw.run_with_cache(model, tokens, names="pattern",
                                      select={"layers": [5], "heads": [3]})
    cache["pattern", 5]          # (b, 1, i, j): head 3 only, from the log-sum-exp
    logits = hw.run_with_hooks(model, tokens, fwd_hooks=[("blocks.5.attn.hook_z", zero_head_3)])
    with hw.capture(model, names="pattern", select={"layers": [5]}) as steps:
        model.generate(...)      # steps[t]["pattern", 5]: step t's new row, (b, h, 1, j)

Modules: ``names`` (the hook names and the filter), ``sites`` (where each hook lives in a
model), ``hooks`` (what a filter installs), ``activations`` (:class:`ActivationCache`), ``run``
(the three entry points), ``view`` (:func:`head_view`, the same for either kind of model).
May import (the rule and its check: the table in
``tests/test_wings.py``): the core (``masks``, ``observe``, ``weights``, ``layers``),
``models``, ``analysis`` (running a batch), ``hf`` (a transformers model's weights
selection) and ``viz`` (the head view's page); nothing imports this wing but the public names.
"""

from headwise.lens.activations import ActivationCache
from headwise.lens.hooks import HookPoint
from headwise.lens.run import capture, run_with_cache, run_with_hooks
from headwise.lens.view import head_view

__all__ = ["ActivationCache", "HookPoint", "capture", "head_view", "run_with_cache",
           "run_with_hooks"]
