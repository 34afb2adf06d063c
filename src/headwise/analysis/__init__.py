"""The head tools: which heads matter and what removing them does.

``ablation`` (:func:`headwise.ablate`, :func:`headwise.patch`, head means and recorded head
outputs), ``scoring`` (:func:`headwise.importance`; greedy ablation by default) and
``head_scores`` (:class:`headwise.HeadScores`), ``replay`` (ablation passes that replay the
blocks before the first one whose heads they change), ``removal`` (whether a ranking is right: the
metric after removing each ranking's least important heads against random heads), ``prune`` (:func:`headwise.prune_heads`: physical pruning of a
live model; the pruned structure itself is :mod:`headwise.models.pruned`), ``prune_sweep`` (the
metric and latency as heads go), ``catalogue`` (:func:`headwise.catalogue`: every head's
dataset-level scores, pattern and top tokens), ``run`` (running a model on the batches a tool is
handed).

May import: the core (:mod:`headwise.layers`, :mod:`headwise.attend`, :mod:`headwise.stats`,
...), :mod:`headwise.models`, :mod:`headwise.data`, :mod:`headwise.train.evaluate`; nothing in
the core or the models imports this wing.
"""
