"""The head tools: which heads matter and what removing them does.

``ablation`` (:func:`headwise.ablate`, :func:`headwise.patch`, head means and recorded head
outputs), ``scoring`` (:func:`headwise.importance`; greedy ablation by default) and
``head_scores`` (:class:`headwise.HeadScores`), ``replay`` (ablation passes that replay the
blocks before the first one whose heads they change), ``removal`` (whether a ranking is right: the
metric after removing each ranking's least important heads against random heads), ``prune`` (:func:`headwise.prune_heads`: physical pruning of a
live model; the pruned structure itself is :mod:`headwise.models.pruned`), ``prune_sweep`` (the
metric and latency as heads go), ``catalogue`` (:func:`headwise.catalogue`: every head's
dataset-level scores, pattern and top tokens), ``kv`` (:func:`headwise.kv_plan`: which key/value
groups stream in a head-wise KV cache, by a budget, with the loss measured), ``run`` (running a model on the batches a tool is
handed).

May import (the rule and its check: the table in ``tests/test_wings.py``): the core (``masks``, ``heads``, ``attend``, ``weights``, ``observe``,
``stats``, ``layers``, ``fast``), ``models``, ``data``, ``train.evaluate``, ``hf`` (for a
transformers model), ``kvplan`` and ``decode.ragged`` (the plans' loss), and ``analysis.catalogue`` also ``viz.catalogue`` (its page); nothing in
the core, the models or the views imports this wing (the tools' results reach the views as
arguments).
"""
