"""headwise: multi-head attention that is fast and see-through.

Axis legend used everywhere: ``b`` batch, ``h`` heads, ``g`` key/value heads, ``i`` query
position, ``j`` key position, ``d`` head dim, ``m`` model dim. Masks: True = may attend.

The public names below are imported on first use (PEP 562), so ``import headwise.cli`` and
``headwise --help`` do not pay for importing torch; ``hw.MultiHeadAttention`` and
``from headwise import trace`` work as usual.
"""

from __future__ import annotations

from headwise import (
    _lazy,
    limits,  # torch-free
)

limits.wait_policy()  # before torch loads its OpenMP runtime: threads sleep, not spin, on a busy CPU

__version__ = "0.1.0"

# public name -> the module that defines it (None: the name is the submodule itself). No public
# function shares its name with a submodule: attention lives in attend.py, generate in
# decode/generation.py, trace in tracing/ (a test in tests/test_init.py keeps it so).
_EXPORTS = {
    "ABLATIONS": "headwise.analysis.ablation",
    "ablate": "headwise.analysis.ablation",
    "head_means": "headwise.analysis.ablation",
    "patch": "headwise.analysis.ablation",
    "record_heads": "headwise.analysis.ablation",
    "HeadScores": "headwise.analysis.head_scores",
    "importance": "headwise.analysis.scoring",
    "BACKENDS": "headwise.attend",
    "attention": "headwise.attend",
    "attention_weights": "headwise.attend",
    "register_backend": "headwise.attend",
    "KVCache": "headwise.cache",
    "KVPlan": "headwise.kvplan",
    "kv_plan": "headwise.analysis.kv",
    "ActivationCache": "headwise.lens",
    "capture": "headwise.lens",
    "head_view": "headwise.lens",
    "run_with_cache": "headwise.lens",
    "run_with_hooks": "headwise.lens",
    "Catalogue": "headwise.analysis.catalogue",
    "catalogue": "headwise.analysis.catalogue",
    "generate": "headwise.decode",
    "GenerationConfig": "headwise.decode",
    "merge_heads": "headwise.heads",
    "split_heads": "headwise.heads",
    "PerHeadAttention": "headwise.per_head",
    "fuse": "headwise.per_head",
    "unfuse": "headwise.per_head",
    "AttentionConfig": "headwise.layers",
    "MultiHeadAttention": "headwise.layers",
    "prune_heads": "headwise.analysis.prune",
    "Trace": "headwise.tracing",
    "trace": "headwise.tracing",
    "Selection": "headwise.weights",
    "release_memory": "headwise.weights",
    "long": None,
    "masks": None,
    "models": None,
    "stats": None,
    "strict": None,
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
