"""Autoregressive generation for headwise models: greedy, sampling, beam search, with a KV cache.

Axis legend: ``b`` batch, ``n`` prompt length, ``t`` new tokens, ``v`` vocabulary, ``k`` beams.

With ``use_cache=True`` the prompt is run once (prefill) and every later step feeds only the
newest token: each decoder layer appends one key/value position to a preallocated
:class:`~headwise.cache.KVCache` and attends over all cached positions (a single newest query
needs no causal mask: bottom-right alignment lets it see every key). Cross-attention keys and
values of an encoder-decoder are projected once per source. ``use_cache=False`` recomputes the
whole prefix at every step; both paths produce the same tokens.

On a GPU the steps after the prompt take a fixed shape (:mod:`headwise.step`: tensor positions,
the cache written at them, attention over its full preallocated length under a mask), and
``compile=True`` replays that step as a CUDA graph. The stop test for ``eos_id`` reads a device
value, so off the CPU it runs every :data:`EOS_EVERY` tokens instead of every token (the result is
the same: positions after a row's eos are pad, and the output ends where the last row stopped).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import repeat

from headwise.fast import fixed_shapes, graphs, host
from headwise.models import _checks
from headwise.models.lm import TransformerLM
from headwise.models.transformer import Transformer
from headwise.step import DecodeStep
from headwise.step import usable as step_usable

__all__ = ["check_sampling", "EOS_EVERY", "generate", "generate_with_logits", "STRATEGIES"]

STRATEGIES = ("greedy", "sample", "beam")
#: Off the CPU, whether every row has stopped is read back every this many tokens (a read is a
#: device sync: one per token would stall the GPU between steps); the CPU reads it every token.
EOS_EVERY = 16
#: A fixed-shape step's cache holds a multiple of this many positions: the fused kernels take an
#: additive mask whose last dim is aligned to 16 without padding a copy of it per layer.
ALIGN = 16


def generate(model, tokens: torch.Tensor, *, max_new_tokens: int, src: torch.Tensor | None = None,
             src_valid_lens: torch.Tensor | None = None, strategy: str = "greedy",
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             beam_size: int = 1, eos_id: int | None = None, pad_id: int | None = None,
             length_penalty: float = 1.0, use_cache: bool = True, seed: int | None = None,
             on_token=None, compile: bool = False) -> torch.Tensor:
    """Continue ``tokens`` by up to ``max_new_tokens`` tokens.

    Args:
        model: a :class:`~headwise.models.TransformerLM` or :class:`~headwise.models.Transformer`.
        tokens: ``(b, n)`` prompt ids (for the encoder-decoder: the decoder's start, e.g. bos).
        max_new_tokens: how many tokens to add at most.
        src, src_valid_lens: the encoder-decoder's source ``(b, j)`` and its lengths ``(b,)``.
        strategy: ``"greedy"``, ``"sample"`` (temperature / top-k / top-p) or ``"beam"``
            (``beam_size > 1`` with ``"greedy"`` also means beam search).
        temperature: divides the logits before sampling (> 0).
        top_k: sample among the ``k`` most likely tokens. top_p: among the smallest set whose
            probability reaches ``p`` (nucleus sampling, Holtzman et al. 2020).
        beam_size: beams per row; the best finished beam (by ``log p / length**length_penalty``)
            is returned.
        eos_id: a row stops when it emits this id; later positions are filled with ``pad_id``
            (default: the model config's ``pad_id``, else ``eos_id``). Generation ends early
            once every row has stopped.
        use_cache: decode with the KV cache (True) or recompute the prefix every step.
        seed: seeds a private generator for sampling (the global RNG is untouched).
        on_token: called with each new column ``(b,)`` of ids as soon as it is chosen (to
            stream text); greedy and sampling only.
        compile: replay the decoding step as a CUDA graph (the model on a CUDA device, the
            cache on, greedy or sampling): the first step after the prompt is captured, every
            later one is a single launch. The same tokens as without it.

    Returns:
        ``(b, n + t)`` ids with ``t <= max_new_tokens`` (fewer only if every row hit ``eos_id``).
    """
    tokens, _ = _run(model, tokens, max_new_tokens=max_new_tokens, src=src,
                     src_valid_lens=src_valid_lens, strategy=strategy, temperature=temperature,
                     top_k=top_k, top_p=top_p, beam_size=beam_size, eos_id=eos_id, pad_id=pad_id,
                     length_penalty=length_penalty, use_cache=use_cache, seed=seed,
                     keep_logits=False, on_token=on_token, compile=compile)
    return tokens


def generate_with_logits(model, tokens: torch.Tensor, *, max_new_tokens: int, **kwargs,
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`generate` (greedy or sampling only) but also returns the logits each new
    token was chosen from: ``(tokens (b, n + t), logits (b, t, v))``."""
    return _run(model, tokens, max_new_tokens=max_new_tokens, keep_logits=True, **kwargs)


# --------------------------------------------------------------------------- the decoding loops
def _run(model, tokens, *, max_new_tokens, src=None, src_valid_lens=None, strategy="greedy",
         temperature=1.0, top_k=None, top_p=None, beam_size=1, eos_id=None, pad_id=None,
         length_penalty=1.0, use_cache=True, seed=None, keep_logits=False, on_token=None,
         compile=False):
    if on_token is not None and (strategy == "beam" or beam_size > 1):
        raise ValueError("generate: on_token streams greedy or sampled tokens; beam search "
                         "only knows its tokens at the end")
    strategy = _check(model, tokens, max_new_tokens, src, strategy, temperature, top_k, top_p,
                      beam_size, eos_id, pad_id, length_penalty, keep_logits)
    _check_compile(model, compile, strategy, use_cache)
    if pad_id is None:
        pad_id = model.config.pad_id if model.config.pad_id is not None else eos_id
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            stepper = _Stepper(model, tokens, src, src_valid_lens,
                               beam_size if strategy == "beam" else 1, use_cache,
                               tokens.shape[1] + max_new_tokens, compile)
            if strategy == "beam":
                return _beam(stepper, tokens, max_new_tokens, beam_size, eos_id, pad_id,
                             length_penalty), None
            generator = None
            if strategy == "sample" and seed is not None:
                generator = torch.Generator(device=tokens.device).manual_seed(seed)
            choose = (_argmax if strategy == "greedy" else
                      lambda logits: _sample(logits, temperature, top_k, top_p, generator))
            return _greedy_or_sample(stepper, tokens, max_new_tokens, choose, eos_id, pad_id,
                                     keep_logits, on_token)
    finally:
        model.train(was_training)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``: the same index (the first of equal maxima; the first NaN), by
    ``max``, which torch runs 4x faster on the CPU for bfloat16 logits (SmolLM2's 49152: 44 us
    a row against 177, a bf16 step's 1.7%)."""
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
                 compile=False):
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
        self.cache = model.new_cache(b, max_len) if use_cache else None
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
def _check_compile(model, compile, strategy: str, use_cache: bool) -> None:
    if not isinstance(compile, bool):
        raise TypeError(f"generate: compile must be True or False, got {compile!r}")
    if not compile:
        return
    p = next(model.parameters())
    if not graphs(p):
        raise ValueError(f"generate: compile=True replays the decoding step as a CUDA graph; the "
                         f"model is on {p.device}. Move it to a GPU (model.cuda()) or drop "
                         "compile=True (the CPU step already runs headwise's C kernels)")
    if not use_cache:
        raise ValueError("generate: compile=True replays the cached decoding step; it needs "
                         "use_cache=True")
    if strategy == "beam":
        raise ValueError("generate: compile=True decodes greedy or sampled tokens; beam search "
                         "reorders the cache between steps: pass compile=False for it")


def _check(model, tokens, max_new, src, strategy, temperature, top_k, top_p, beam_size, eos_id,
           pad_id, length_penalty, keep_logits) -> str:
    if not isinstance(model, (TransformerLM, Transformer)):
        raise TypeError(f"generate: model must be a headwise TransformerLM or Transformer, got "
                        f"{type(model).__name__}")
    c = model.config
    for name, value, low in (("max_new_tokens", max_new, 0), ("beam_size", beam_size, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"generate: {name} must be an int >= {low}, got {value!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"generate: strategy must be one of {STRATEGIES}, got {strategy!r}")
    if beam_size > 1 and strategy == "greedy":
        strategy = "beam"
    if beam_size > 1 and strategy == "sample":
        raise ValueError(f"generate: beam_size={beam_size} cannot be combined with "
                         "strategy='sample'; use strategy='beam' or beam_size=1")
    if keep_logits and strategy == "beam":
        raise ValueError("generate_with_logits: beam search has no single logits path; use "
                         "strategy='greedy' or 'sample'")
    check_sampling(temperature, top_k, top_p)
    if not isinstance(length_penalty, (int, float)):
        raise TypeError(f"generate: length_penalty must be a number, got {length_penalty!r}")
    vocab = c.tgt_vocab_size if isinstance(model, Transformer) else c.vocab_size
    for name, value in (("eos_id", eos_id), ("pad_id", pad_id)):
        if value is not None and (not isinstance(value, int) or not 0 <= value < vocab):
            raise ValueError(f"generate: {name} must be None or an id in [0, {vocab}), got "
                             f"{value!r}")
    if isinstance(model, Transformer):
        if src is None:
            raise ValueError("generate: an encoder-decoder Transformer needs src= (the source "
                             "ids, (b, j)); tokens are the decoder's start")
        _checks.tokens(tokens, vocab, "tokens", "generate")
        _checks.tokens(src, c.src_vocab_size, "src", "generate")
        _checks.same_batch("generate", tokens=tokens.shape[0], src=src.shape[0])
    else:
        if src is not None:
            raise ValueError("generate: src= is only for encoder-decoder Transformers; a "
                             "TransformerLM continues tokens alone")
        model.check(tokens)
    total = tokens.shape[1] + max_new
    if total > c.max_len:
        raise ValueError(f"generate: prompt {tokens.shape[1]} + max_new_tokens {max_new} = "
                         f"{total} exceeds max_len={c.max_len}; ask for at most "
                         f"{c.max_len - tokens.shape[1]} new tokens")
    return strategy


def check_sampling(temperature, top_k, top_p, *, flags: bool = False) -> None:
    """The sampling settings' one rule: ``temperature`` > 0 and finite (None: greedy, for the
    command line), ``top_k`` None or an int >= 1, ``top_p`` None or in (0, 1]. ``flags``: name
    them as the command line does (``--top-p``), which checks them before a model loads."""
    def name(n: str) -> str:
        return "--" + n.replace("_", "-") if flags else f"generate: {n}"

    greedy = ("omit --temperature for greedy decoding" if flags
              else "for the most likely token use strategy='greedy'")
    if temperature is not None and (not isinstance(temperature, (int, float))
                                    or isinstance(temperature, bool)
                                    or not 0 < temperature < float("inf")):
        raise ValueError(f"{name('temperature')} must be > 0 and finite, got {temperature!r}; "
                         f"{greedy}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool)
                              or top_k < 1):
        raise ValueError(f"{name('top_k')} must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and not isinstance(top_p, bool)
                                  and 0 < top_p <= 1):
        raise ValueError(f"{name('top_p')} must be in (0, 1], got {top_p!r}; e.g. 0.9 keeps the "
                         "most likely tokens that make up 90% of the probability" if flags else
                         f"{name('top_p')} must be None or in (0, 1], got {top_p!r}")
