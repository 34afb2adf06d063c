"""A transformers ``Cache`` that stores each layer's key/value groups as a
:class:`~headwise.kvplan.KVPlan` says: the head-wise cache of :mod:`headwise.decode.ragged`
behind ``model.generate(..., past_key_values=HeadwiseKVCache(model, plan, max_len))``.

Axis legend: ``b`` batch, ``h`` query heads, ``g`` key/value groups, ``i`` query positions,
``j`` key positions, ``d`` head dim.

Why a claim. transformers' attention modules call ``cache.update(k, v, layer)`` and hand what
it returns to the attention function; a ragged cache has no one tensor to return. So
:meth:`HeadwiseKVCache.update` returns the new keys/values themselves and *claims* them:
headwise's attention function (:func:`headwise.hf.interface.attention_forward`) asks
:func:`claimed` whether its ``key`` is such a claim and then lets the cache's layer attend each
group over its own part. Another attention implementation would attend over the new positions
alone: the cache is refused for it when made, and a claim left unread fails the next update.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from headwise.decode.ragged import RaggedLayer
from headwise.kvplan import KVPlan

__all__ = ["HeadwiseKVCache", "claimed", "model_shape"]

_CLAIMS: dict[int, tuple[torch.Tensor, RaggedLayer]] = {}  # id(key) -> (key, its layer)


def model_shape(config) -> tuple[int, int, int]:
    """``(layers, key/value groups, head dim)`` of a transformers config (a plan's
    fingerprint)."""
    c = getattr(config, "text_config", None) or config
    heads = c.num_attention_heads
    groups = getattr(c, "num_key_value_heads", None) or heads
    d = getattr(c, "head_dim", None) or c.hidden_size // heads
    return c.num_hidden_layers, groups, d


def claimed(key: torch.Tensor) -> RaggedLayer | None:
    """The head-wise layer whose update returned ``key`` (then forgotten), or None."""
    got = _CLAIMS.get(id(key))
    if got is None or got[0] is not key:
        return None
    del _CLAIMS[id(key)]
    return got[1]


class _Layer(CacheLayerMixin):
    """One layer: a :class:`~headwise.decode.ragged.RaggedLayer`, made on the first update
    (when the batch, dtype and device are known)."""

    is_sliding = False

    def __init__(self, plan: KVPlan, index: int, max_len: int):
        super().__init__()
        self.plan, self.index, self.max_len, self.ragged = plan, index, max_len, None

    def lazy_initialization(self, key_states, value_states) -> None:
        self.ragged = RaggedLayer(self.plan, self.index, key_states.shape[0], self.max_len,
                                  dtype=key_states.dtype, device=key_states.device)
        self.keys, self.values = self.ragged.kf, self.ragged.vf
        self.device, self.is_initialized = key_states.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        if _CLAIMS:
            _CLAIMS.clear()
            raise ValueError("HeadwiseKVCache: an attention layer read the new keys without "
                             "headwise's attention function; load the model with "
                             "attn_implementation='headwise'")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        _CLAIMS[id(key_states)] = (key_states, self.ragged)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return 0 if self.ragged is None else self.ragged.n

    def get_max_length(self) -> int:
        return self.max_len

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.ragged is not None:
            self.ragged.reorder(beam_idx.to(self.device))

    def reset(self) -> None:
        self.ragged, self.is_initialized = None, False


class HeadwiseKVCache(Cache):
    """The head-wise KV cache of a transformers model loaded with
    ``attn_implementation="headwise"``: per layer, the groups ``plan`` streams in a ring of
    sinks + window, the others whole, up to ``max_len`` positions (prompt + new tokens).

    ValueError (one line) for another attention implementation or a plan of another shape."""

    def __init__(self, model, plan: KVPlan, max_len: int):
        impl = getattr(model.config, "_attn_implementation", None)
        if impl != "headwise":
            raise ValueError(f"HeadwiseKVCache: the model attends with {impl!r}, which would "
                             f"read only the new keys; load it with "
                             f"attn_implementation='headwise'")
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
            raise ValueError(f"HeadwiseKVCache: max_len must be a positive int (prompt + new "
                             f"tokens), got {max_len!r}")
        plan.check(model_shape(model.config))
        self.plan = plan
        super().__init__(layers=[_Layer(plan, i, max_len) for i in range(plan.layers)])

    def nbytes(self) -> int:
        """Bytes of every layer's key/value buffers (exact; 0 before the first forward)."""
        return sum(layer.ragged.nbytes() for layer in self.layers if layer.ragged is not None)


def attend(layer: RaggedLayer, query, key, value, attention_mask, scaling, softcap, s_aux,
           causal: bool) -> torch.Tensor:
    """``(b, h, i, d)``: the claimed layer's attention (what the attention function returns
    before its transpose)."""
    return layer.attend(query, key, value, mask=attention_mask, causal=causal, scale=scaling,
                        softcap=softcap, sinks=s_aux)
