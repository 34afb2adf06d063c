"""Autoregressive generation for headwise models: greedy, sampling, beam search, with a KV cache.

Axis legend: ``b`` batch, ``n`` prompt length, ``t`` new tokens, ``v`` vocabulary, ``k`` beams.

With ``use_cache=True`` the prompt is run once (prefill) and every later step feeds only the
newest token: each decoder layer appends one key/value position to a preallocated
:class:`~headwise.cache.KVCache` and attends over all cached positions (a single newest query
needs no causal mask: bottom-right alignment lets it see every key). Cross-attention keys and
values of an encoder-decoder are projected once per source. ``use_cache=False`` recomputes the
whole prefix at every step; both paths produce the same tokens.

The settings are one :class:`~headwise.decode.config.GenerationConfig`; keywords build it or
override its fields. After the prompt the steps run :class:`~headwise.decode.step.DecodeStep`
(its form: :func:`headwise.decode.step.choose`). On a GPU that step takes a fixed shape, and
``compile=True`` replays it as a CUDA graph. The stop test for ``eos_id`` reads a device value,
so off the CPU it runs every :data:`EOS_EVERY` tokens instead of every token (the result is the
same: positions after a row's eos are pad, and the output ends where the last row stopped).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import repeat

from headwise.decode.config import STRATEGIES, GenerationConfig, check_sampling, settle
from headwise.decode.ragged import headwise_cache
from headwise.decode.step import DecodeStep
from headwise.decode.step import usable as step_usable
from headwise.fast import fixed_shapes, graphs, host
from headwise.models import _checks
from headwise.models.lm import TransformerLM
from headwise.models.transformer import Transformer

__all__ = ["check_sampling", "EOS_EVERY", "GenerationConfig", "generate",
           "generate_with_logits", "STRATEGIES"]

#: Off the CPU, whether every row has stopped is read back every this many tokens (a read is a
#: device sync: one per token would stall the GPU between steps); the CPU reads it every token.
EOS_EVERY = 16
#: A fixed-shape step's cache holds a multiple of this many positions: the fused kernels take an
#: additive mask whose last dim is aligned to 16 without padding a copy of it per layer.
ALIGN = 16


def generate(model, tokens: torch.Tensor, config: GenerationConfig | None = None, *,
             src: torch.Tensor | None = None, src_valid_lens: torch.Tensor | None = None,
             on_token=None, **settings) -> torch.Tensor:
    """Continue ``tokens`` by up to ``config.max_new_tokens`` tokens.

    ``generate(model, tokens, config=GenerationConfig(max_new_tokens=20, strategy="sample"))``
    or, the same, ``generate(model, tokens, max_new_tokens=20, strategy="sample")``.

    Args:
        model: a :class:`~headwise.models.TransformerLM` or :class:`~headwise.models.Transformer`.
        tokens: ``(b, n)`` prompt ids (for the encoder-decoder: the decoder's start, e.g. bos).
        config: a :class:`~headwise.decode.config.GenerationConfig` (its fields say what each
            setting does).
        src, src_valid_lens: the encoder-decoder's source ``(b, j)`` and its lengths ``(b,)``.
        on_token: called with each new column ``(b,)`` of ids as soon as it is chosen (to
            stream text); greedy and sampling only.
        **settings: :class:`~headwise.decode.config.GenerationConfig` fields by name
            (``max_new_tokens``, ``strategy``, ``temperature``, ...); with ``config`` they
            override its fields (as Hugging Face's ``generate(**kwargs)`` does), without it
            they make the config.

    Returns:
        ``(b, n + t)`` ids with ``t <= max_new_tokens`` (fewer only if every row hit ``eos_id``).
    """
    config = settle(config, settings)
    tokens, _ = _run(model, tokens, config, src, src_valid_lens, keep_logits=False,
                     on_token=on_token)
    return tokens


def generate_with_logits(model, tokens: torch.Tensor, config: GenerationConfig | None = None,
                         *, src: torch.Tensor | None = None,
                         src_valid_lens: torch.Tensor | None = None, on_token=None,
                         **settings) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`generate` (greedy or sampling only) but also returns the logits each new
    token was chosen from: ``(tokens (b, n + t), logits (b, t, v))``."""
    config = settle(config, settings, "generate_with_logits")
    return _run(model, tokens, config, src, src_valid_lens, keep_logits=True, on_token=on_token)


# --------------------------------------------------------------------------- the decoding loops
def _run(model, tokens, c: GenerationConfig, src, src_valid_lens, *, keep_logits: bool,
         on_token=None):
    strategy = c.mode
    if on_token is not None and strategy == "beam":
        raise ValueError("generate: on_token streams greedy or sampled tokens; beam search "
                         "only knows its tokens at the end")
    if keep_logits and strategy == "beam":
        raise ValueError("generate_with_logits: beam search has no single logits path; use "
                         "strategy='greedy' or 'sample'")
    _check(model, tokens, c, src)
    _check_compile(model, c)
    pad_id = c.pad_id
    if pad_id is None:
        pad_id = model.config.pad_id if model.config.pad_id is not None else c.eos_id
    max_new_tokens, eos_id = c.max_new_tokens, c.eos_id
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            stepper = _Stepper(model, tokens, src, src_valid_lens,
                               c.beam_size if strategy == "beam" else 1, c.use_cache,
                               tokens.shape[1] + max_new_tokens, c.compile, c.kv_plan)
            if strategy == "beam":
                return _beam(stepper, tokens, max_new_tokens, c.beam_size, eos_id, pad_id,
                             c.length_penalty), None
            generator = None
            if strategy == "sample" and c.seed is not None:
                generator = torch.Generator(device=tokens.device).manual_seed(c.seed)
            choose = (_argmax if strategy == "greedy" else
                      lambda logits: _sample(logits, c.temperature, c.top_k, c.top_p, generator))
            return _greedy_or_sample(stepper, tokens, max_new_tokens, choose, eos_id, pad_id,
                                     keep_logits, on_token)
    finally:
        model.train(was_training)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``: the same index (the first of equal maxima; the first NaN), by
    ``max``, which torch runs several times faster on the CPU for bfloat16 logits."""
    return logits.max(-1).indices


def _greedy_or_sample(stepper, tokens, max_new, choose, eos_id, pad_id, keep_logits,
                      on_token=None):
    b, n = tokens.shape
    out = torch.empty(b, n + max_new, dtype=torch.long, device=tokens.device)
    out[:, :n] = tokens
    kept = []
    finished = torch.zeros(b, dtype=torch.bool, device=tokens.device)
    logits = stepper.first(tokens)  # (b, v)
    end = n + max_new
    every = 1 if host(out) else EOS_EVERY  # (a read is free on the CPU, a sync elsewhere)
    for pos in range(n, n + max_new):
        if keep_logits:
            kept.append(logits)
        nxt = choose(logits)  # (b,)
        if eos_id is not None:
            nxt = nxt.masked_fill(finished, pad_id)
            finished = finished | (nxt == eos_id)
        out[:, pos] = nxt
        if on_token is not None:
            on_token(nxt)
        if (eos_id is not None and ((pos + 1 - n) % every == 0 or pos + 1 == n + max_new)
                and bool(finished.all())):
            end = pos + 1 if every == 1 else _stopped(out, n, pos + 1, eos_id)
            break
        if pos + 1 < n + max_new:
            logits = stepper.next(out, pos + 1)
    if end < n + max_new and keep_logits:
        kept = kept[:end - n]
    logits_out = torch.stack(kept, 1) if keep_logits else None
    return out[:, :end], logits_out


def _stopped(out: torch.Tensor, n: int, upto: int, eos_id: int) -> int:
    """Where generation would have ended had every token been checked: one past the column at
    which the last row emitted its first ``eos_id`` (every row of ``out[:, n:upto]`` has one)."""
    first = (out[:, n:upto] == eos_id).int().argmax(dim=1)  # (b,): each row's first eos
    return n + int(first.max()) + 1


def _beam(stepper, tokens, max_new, k, eos_id, pad_id, length_penalty):
    """Beam search over ``k`` beams per row; finished beams keep their score and append pad."""
    b, n = tokens.shape
    dev = tokens.device
    out = torch.empty(b * k, n + max_new, dtype=torch.long, device=dev)
    out[:, :n] = repeat(tokens, "b n -> (b k) n", k=k)
    # Only the first beam of each row is live at the start: the others begin at -inf, so the
    # first step's k candidates are k different tokens after the same prompt.
    scores = torch.full((b, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0
    lengths = torch.zeros(b * k, dtype=torch.long, device=dev)  # new tokens up to eos
    finished = torch.zeros(b * k, dtype=torch.bool, device=dev)
    base = (torch.arange(b, device=dev) * k)[:, None]  # (b, 1): row offsets in (b k)
    logits = stepper.first(out[:, :n])  # (b k, v)
    end = n + max_new
    for pos in range(n, n + max_new):
        logp = torch.log_softmax(logits.float(), dim=-1)
        if eos_id is not None:  # a finished beam can only append pad, at no cost
            logp = torch.where(finished[:, None], float("-inf"), logp)
            logp[:, pad_id] = torch.where(finished, 0.0, logp[:, pad_id])
        v = logp.shape[-1]
        cand = (scores.reshape(b * k, 1) + logp).reshape(b, k * v)
        scores, flat = cand.topk(k, dim=-1)  # (b, k)
        parent = (base + flat // v).reshape(-1)  # (b k,) rows in (b k) layout
        token = (flat % v).reshape(-1)
        out[:, :pos] = out[parent, :pos]
        out[:, pos] = token
        finished, lengths = finished[parent], lengths[parent]
        lengths = lengths + (~finished).long()
        if eos_id is not None:
            finished = finished | (token == eos_id)
            if bool(finished.all()):
                end = pos + 1
                break
        if pos + 1 < n + max_new:
            stepper.reorder(parent)
            logits = stepper.next(out, pos + 1)
    norm = scores / lengths.reshape(b, k).clamp(min=1).float() ** length_penalty
    best = base[:, 0] + norm.argmax(-1)
    return out[best, :end]


class _Stepper:
    """Next-token logits for either model family, cached or recomputed.

    ``first(tokens (b, n)) -> (b, v)`` runs the prompt; ``next(out, pos) -> (b, v)`` feeds what
    follows (only ``out[:, pos - 1]`` with a cache, all of ``out[:, :pos]`` without).
    """

    def __init__(self, model, tokens, src, src_valid_lens, beams, use_cache, max_len,
                 compile=False, kv_plan=None):
        self.use_cache = use_cache
        b = tokens.shape[0] * beams
        if isinstance(model, Transformer):
            memory, mask = model.encode(src, src_valid_lens)  # once per source
            if beams > 1:
                memory = repeat(memory, "b j m -> (b k) j m", k=beams)
                mask = None if mask is None else repeat(mask, "b x y j -> (b k) x y j", k=beams)
            dec = model.decoder
            want = (dec._no_weights, dec._no_weights)
            self._call = lambda ids, cache: dec._forward(ids, memory, mask, None, cache, want,
                                                         last_only=True)[0]
        else:
            dec, mask = model, None
            self._call = lambda ids, cache: model._forward(ids, cache, model._no_weights,
                                                           last_only=True)[0]
        steps = max_len - tokens.shape[1]
        if fixed_shapes(dec.lm_head.weight):  # the device's step reads the whole cache
            max_len = -(-max_len // ALIGN) * ALIGN
        self.cache = (None if not use_cache else model.new_cache(b, max_len) if kv_plan is None
                      else headwise_cache(model, kv_plan, b, max_len))
        # After the prompt, one token per step runs through the flattened decoder (same cache,
        # same attention backend) unless an observer or a hook needs to see the modules.
        self._step = (DecodeStep(model, self.cache, mask, steps=steps, graph=compile)
                      if use_cache and step_usable(dec) else None)
        if compile and self._step is None:
            raise ValueError("generate: compile=True replays the decoding step, which an active "
                             "observer (trace, statistics, ablation) or a forward hook bypasses; "
                             "remove it or pass compile=False")

    def first(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._call(tokens, self.cache)[:, -1]

    def next(self, out: torch.Tensor, pos: int) -> torch.Tensor:
        if self._step is not None:
            return self._step(out[:, pos - 1])
        if self.cache is not None:
            return self._call(out[:, pos - 1:pos], self.cache)[:, -1]
        return self._call(out[:, :pos], None)[:, -1]

    def reorder(self, parent: torch.Tensor) -> None:
        if self.cache is not None:
            self.cache.reorder(parent)


def _sample(logits, temperature, top_k, top_p, generator):
    """One id per row from ``softmax(logits / temperature)`` restricted by top-k / top-p."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token once the tokens before it already reach top_p (the first always stays)
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


# --------------------------------------------------------------------------- checks
def _check_compile(model, c: GenerationConfig) -> None:
    """``compile=True`` against the model it runs on (the config checked its type)."""
    if not c.compile:
        return
    p = next(model.parameters())
    if not graphs(p):
        raise ValueError(f"generate: compile=True replays the decoding step as a CUDA graph; the "
                         f"model is on {p.device}. Move it to a GPU (model.cuda()) or drop "
                         "compile=True (the CPU step already runs headwise's C kernels)")
    if not c.use_cache:
        raise ValueError("generate: compile=True replays the cached decoding step; it needs "
                         "use_cache=True")
    if c.mode == "beam":
        raise ValueError("generate: compile=True decodes greedy or sampled tokens; beam search "
                         "reorders the cache between steps: pass compile=False for it")


def _check(model, tokens, c: GenerationConfig, src) -> None:
    """What the config's own checks cannot know: the settings against the model and inputs."""
    if not isinstance(model, (TransformerLM, Transformer)):
        raise TypeError(f"generate: model must be a headwise TransformerLM or Transformer, got "
                        f"{type(model).__name__}")
    mc = model.config
    vocab = mc.tgt_vocab_size if isinstance(model, Transformer) else mc.vocab_size
    for name, value in (("eos_id", c.eos_id), ("pad_id", c.pad_id)):
        if value is not None and not 0 <= value < vocab:
            raise ValueError(f"generate: {name} must be None or an id in [0, {vocab}), got "
                             f"{value!r}")
    if isinstance(model, Transformer):
        if src is None:
            raise ValueError("generate: an encoder-decoder Transformer needs src= (the source "
                             "ids, (b, j)); tokens are the decoder's start")
        _checks.tokens(tokens, vocab, "tokens", "generate")
        _checks.tokens(src, mc.src_vocab_size, "src", "generate")
        _checks.same_batch("generate", tokens=tokens.shape[0], src=src.shape[0])
    else:
        if src is not None:
            raise ValueError("generate: src= is only for encoder-decoder Transformers; a "
                             "TransformerLM continues tokens alone")
        model.check(tokens)
    total = tokens.shape[1] + c.max_new_tokens
    if total > mc.max_len:
        raise ValueError(f"generate: prompt {tokens.shape[1]} + max_new_tokens "
                         f"{c.max_new_tokens} = {total} exceeds max_len={mc.max_len}; ask for "
                         f"at most {mc.max_len - tokens.shape[1]} new tokens")
