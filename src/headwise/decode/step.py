"""One cached decoding step, built from the components' one-row forms, in one of four forms.

Axis legend: ``b`` rows (batch x beams), ``m`` model dim, ``h`` query heads, ``g`` key/value
heads, ``d`` head dim, ``f`` feed-forward width, ``v`` vocabulary, ``j`` cached positions,
``r`` rotated features.

Why it exists. After the prompt, a KV-cached decoder feeds one token per row per step: every
matrix product is a matrix-*vector* product (``(b, m) @ (m, f)`` with ``b`` small), so a step
costs one pass over all the weights plus a fixed cost per operation. The module tree
(:class:`~headwise.models.DecoderBlock` -> :class:`~headwise.MultiHeadAttention` -> ...) is
written for inspection: named steps, shape checks, trace hooks, ``(b, n, m)`` tensors. Run one
position at a time that bookkeeping costs more than the arithmetic.

One decoder, not two. Every component has one one-row form, found for its class in
:data:`headwise.decode.forms.FORMS`, and this module only strings them together: the
embeddings, each block's form (:class:`~headwise.decode.block.BlockRow`: the residual order over
the attention's, the norms' and the feed-forward's forms), the final norm and the vocabulary
head; RoPE's angles are computed once per generation for every position
(:meth:`~headwise.rope.RotaryEmbedding.angles`; each layer only rotates).

Its form is chosen in one place, :func:`choose` (a :class:`Choice`):

- ``growing``: the growing cache, Python-int positions, the forms called one by one; the
  products through :mod:`headwise.fast.rows` (the layouts and C kernels, which change no value);
- ``bound``: on the CPU, where every layer's form binds (``BlockRow.bind``), their kernel calls
  bound once per generation and run as one C call, or one per layer where torch computes the
  activation between (:mod:`headwise.fast.plan`: the same kernels and arguments, bit for bit);
  where some form does not bind the step stays ``growing``;
- ``fixed``: off the CPU (:func:`headwise.fast.fixed_shapes`), as gpt-fast's
  ``model(x, input_pos)``: the position is a ``(1,)`` tensor on the device, the cache is written
  at it (``index_copy_``) and attention reads all ``L`` preallocated positions under a mask
  built from it once per token. Every token launches the same kernels on the same buffers and
  reads nothing back to the host;
- ``graph``: the fixed-shape step captured once as a CUDA graph and replayed
  (``generate(..., compile=True)``): one launch per token.

The same choice says which weight copies a generation makes: for small models
(:data:`COPY_BUDGET`) joined ``cat(W_q, W_k, W_v)`` and ``cat(W_gate, W_up)`` so each is one
product, and for a single row over :data:`TRANSPOSE_STEPS` steps or more every weight transposed
to ``(in, out)``, the layout a vector-matrix product streams fastest on a CPU; larger models use
their own weights, stored as the step's row count reads them best
(:func:`headwise.fast.rows.lay_out`, from :data:`LAY_OUT_STEPS` steps on): no copy, so memory
stays at the weights plus the cache. The layout stays after the generation; values, shapes and
parameters are untouched. On the CPU in float32 oneDNN is disabled for the step
(``torch._C._set_mkldnn_enabled``; its exact-GELU primitive has a large fixed cost per call),
restored after each step. Measured effects: ``benchmarks/RESULTS.md`` (``generate``).

It is used by :func:`headwise.generate` for every step after the prompt when the cache is on,
unless an observer is active (:mod:`headwise.observe`: a trace, head statistics, an ablation), a
module of the decoder has hooks (both need the module path) or a module has no form
(:func:`usable`). ``tests/test_step.py`` checks it against the module path for every combination
of the config axes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import nn

from headwise.cache import KVCache
from headwise.decode.forms import form_of, missing, refuse
from headwise.decode.vouch import vouched
from headwise.fast import applies, fixed_shapes, graphs
from headwise.fast import int4 as _int4
from headwise.fast import native as _native
from headwise.fast import plan as _plan
from headwise.fast import rows as _rows
from headwise.observe import observed

__all__ = ["COPY_BUDGET", "Choice", "DecodeStep", "Form", "LAY_OUT_STEPS", "TRANSPOSE_STEPS",
           "choose", "usable"]

# Weight copies (fused products, transposed layouts) are made only for decoders whose weights
# take at most this many bytes: they double the memory of what they copy.
COPY_BUDGET = 64 * 2**20
#: From this many steps a single row's transposed copies of a small model's weights pay for
#: themselves (a copy costs about what ~100 steps gain).
TRANSPOSE_STEPS = 128
#: From this many steps (or for 2 rows and more) a larger model's weights are laid out for the
#: step's row count (the one-row layout costs a copy of the wide matrices, what ~30 steps gain).
LAY_OUT_STEPS = 32


class Form(enum.Enum):
    """The four forms of the step (module docstring)."""

    GROWING = "growing"
    BOUND = "bound"
    FIXED = "fixed"
    GRAPH = "graph"


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` decided for one generation.

    Attributes:
        form: the step's :class:`Form` (``BOUND``: bound where every form binds, else
            ``GROWING``).
        transpose: the forms copy their weights as ``W^T (in, out)`` (one row, small model).
        fuse: the products that read one input (q|k|v, gate|up) joined, over a copy where the
            weights are not stored joined.
        lay_out: store the decoder's own weights for the step's row count
            (:func:`headwise.fast.rows.lay_out`) before the forms are built.
        onednn_off: oneDNN disabled around each step (float32 on the CPU, where headwise's C
            kernels run).
    """

    form: Form
    transpose: bool
    fuse: bool
    lay_out: bool
    onednn_off: bool


def choose(decoder: nn.Module, cache: KVCache, *, steps: int | None = None,
           static: bool | None = None, graph: bool = False) -> Choice:
    """The step's form and weight layout for ``decoder`` over ``cache`` (arguments as
    :class:`DecodeStep` takes them); ValueError for ``graph=True`` off a CUDA device."""
    p = decoder.lm_head.weight
    static = fixed_shapes(p) if static is None else static
    if graph and getattr(cache, "ragged", False):
        raise ValueError("DecodeStep: graph=True replays a fixed-shape step, which a head-wise "
                         "KV cache (ring buffers at Python-int slots) does not take; pass "
                         "graph=False")
    if graph and not (static and graphs(p, cache.k)):
        raise ValueError(f"DecodeStep: graph=True replays a fixed-shape step as a CUDA graph; "
                         f"the model is on {p.device}; move it to a GPU or pass graph=False")
    # 4-bit codes attached by a loader are the step's weights already: no further copies
    coded = _int4.quantized(decoder)
    small = (sum(q.numel() * q.element_size() for q in decoder.parameters()) <= COPY_BUDGET
             and not coded)
    # One row: vector-matrix products stream W^T (in, out) faster than W (out, in) on a CPU,
    # worth a transposed copy for a long enough generation; from two rows on (out, in) is the
    # faster one, and a device multiplies (out, in) as fast: no copy there.
    transpose = (small and cache.batch == 1 and (steps is None or steps >= TRANSPOSE_STEPS)
                 and not fixed_shapes(p))
    lay_out = not small and (cache.batch > 1 or steps is None or steps >= LAY_OUT_STEPS)
    # A device's step joins q|k|v (and gate|up) at any size: one product instead of three and a
    # concatenation per layer and token, for a copy of those matrices per generation
    fuse = small or (static and not coded)
    if static:
        form = Form.GRAPH if graph else Form.FIXED
    else:
        form = Form.BOUND if applies(p, autograd=True, bf16=True) else Form.GROWING
    return Choice(form, transpose, fuse, lay_out, onednn_off=applies(p, autograd=True))


def usable(decoder: nn.Module) -> bool:
    """False while an observer is active (:func:`headwise.observe.observed`) or some module of
    ``decoder`` has forward hooks: both must see the module path, which the step bypasses; and
    where some module the step replaces has no one-row form
    (:func:`headwise.decode.forms.missing`), which the step would refuse."""
    if observed() or nn.modules.module._global_forward_hooks \
            or nn.modules.module._global_forward_pre_hooks:
        return False
    if any(m._forward_hooks or m._forward_pre_hooks for m in decoder.modules()):
        return False
    return not missing(decoder)


class DecodeStep:
    """``step(ids (b,)) -> logits (b, v)``: feed the newest token of every row to a decoder
    whose :class:`KVCache` already holds the earlier positions; the cache advances by one.

    Args:
        model: a :class:`~headwise.models.TransformerLM` or
            :class:`~headwise.models.Transformer` in eval mode (no dropout is applied); every
            module the step replaces must have a one-row form
            (:data:`headwise.decode.forms.FORMS`), else TypeError naming its class.
        cache: the cache the prompt step filled (for the encoder-decoder: with its cross-
            attention keys/values).
        memory_mask: the source padding mask ``(b, 1, 1, j)`` (True = may attend) or None.
        steps: how many steps the caller will run, if known: some weight copies pay for
            themselves only over a long enough generation (:func:`choose`).
        static: the fixed-shape form (module docstring); default: the device rule
            :func:`headwise.fast.fixed_shapes` (off the CPU). ``True`` on the CPU runs the
            device's form on CPU tensors (tests check its values there).
        graph: replay the fixed-shape step as a CUDA graph (CUDA only): the first step runs
            eagerly and is captured; later ones copy the ids in and replay it.

    ``form`` is the :class:`Form` it runs in.
    """

    def __init__(self, model: nn.Module, cache: KVCache, memory_mask: torch.Tensor | None = None,
                 *, steps: int | None = None, static: bool | None = None, graph: bool = False):
        dec = getattr(model, "decoder", model)
        refuse(dec)
        choice = choose(dec, cache, steps=steps, static=static, graph=graph)
        self.cache, self.memory_mask = cache, memory_mask
        p = dec.lm_head.weight
        self.static = choice.form in (Form.FIXED, Form.GRAPH)
        self.graph = choice.form is Form.GRAPH
        if choice.lay_out:
            _rows.lay_out(dec, cache.batch)
        t, fuse = choice.transpose, choice.fuse
        self.embed = form_of(dec.embed)
        self.layers = [form_of(block, cache=layer_cache, transpose=t, fuse=fuse)
                       for block, layer_cache in zip(dec.blocks, cache.layers, strict=True)]
        self.rope = dec.blocks[0].self_attn.rope
        # every position's angles at once (the same values, elementwise): a step takes a view
        # instead of a dozen small kernels
        self.angles = (None if self.rope is None
                       else self.rope.angles(0, cache.max_len, p))
        self.final_norm = (None if isinstance(dec.final_norm, nn.Identity)
                           else form_of(dec.final_norm))
        self.head = form_of(dec.lm_head, transpose=t)
        self.like = p
        self.native = choice.onednn_off  # (the step only reads its weights)
        self.plan = self._bind() if choice.form is Form.BOUND else None
        self.form = (Form.GROWING if choice.form is Form.BOUND and self.plan is None
                     else choice.form)
        if self.static:
            self.window = dec.blocks[0].self_attn.window
            self.keys = torch.arange(cache.max_len, device=p.device)  # (L,) key positions
            self.zero = torch.zeros((), dtype=p.dtype, device=p.device)
            self.neg = torch.full((cache.max_len,), float("-inf"), dtype=p.dtype,
                                  device=p.device)
            self.pos = None  # (1,) long on the device: set by the first step (the prompt's end)
            self._graph = self._ids = self._logits = None

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.static:
            return self._fixed(ids)
        step = self._step if self.plan is None else self._planned
        if not self.native:
            return step(ids)
        onednn = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        try:
            return step(ids)
        finally:
            torch._C._set_mkldnn_enabled(onednn)

    def _step(self, ids: torch.Tensor) -> torch.Tensor:
        pos = self.cache.length
        return self._finish(self.embed(ids, pos), 0, pos)

    def _finish(self, x: torch.Tensor, first: int, pos: int) -> torch.Tensor:
        """The step from layer ``first`` on, unbound, for its input ``x (b, m)``."""
        rot = None if self.rope is None else self._angles(pos)
        for layer in self.layers[first:]:
            x = layer(x, rot, self.memory_mask)
        self.cache.advance(1)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return _rows.linear(x, self.head)

    # ----------------------------------------------------------------- the bound form
    def _bind(self):
        """The layers' row forms and the final norm bound to buffers kept for the generation,
        as a :class:`~headwise.fast.plan.Plan` (module docstring), or None where some form does
        not bind (the step then runs unbound)."""
        cache, n = self.cache, len(self.layers)
        if _native.library() is None or cache.length >= cache.max_len or self.final_norm is None:
            return None
        m, dtype = self.like.shape[1], self.like.dtype
        plan = _plan.Plan(cache.batch)
        xs = [plan.buffer(f"x{k}", m, dtype) for k in (0, 1)]  # a layer's input, its output
        self.rests = []  # the calls between stretches (activations the plan leaves to torch)
        for k, layer in enumerate(self.layers):
            plan.layer = k
            rest = layer.bind(plan, xs[k % 2], xs[1 - k % 2], self.angles, cache.length)
            if rest is None:
                return None
            if rest is not True:
                self.rests.append(rest)
        plan.layer, self.xs = n, xs
        self.normed = plan.buffer("final", m, dtype)
        if not getattr(self.final_norm, "bind", lambda *a: False)(plan, xs[n % 2], self.normed):
            return None
        plan.cut()
        plan.seal()
        self.selfs = [vouched(layer.self_attn) for layer in cache.layers]
        return plan

    def _planned(self, ids: torch.Tensor) -> torch.Tensor:
        """:meth:`_step` as the plan: its stretches, and the activations torch computes
        between them (:attr:`rests`: none where the plan computes them)."""
        plan, pos, lib = self.plan, self.cache.length, _native.library()
        # the one-call attention attends only over keys/values known finite (as
        # Vouch.attend_new asks: read once, the prompt's after the prompt, then known)
        if (lib is None or pos >= self.cache.max_len
                or not all(c.upto >= pos or c.all_finite(pos) for c in self.selfs)):
            return self._step(ids)
        self.xs[0].copy_(self.embed(ids, pos))
        threads, n = torch.get_num_threads(), len(self.rests)
        for k in range(n + 1):
            if (stop := plan.run(k, pos, threads, lib)) >= 0:  # redo that layer on, unbound
                first = plan.owner[stop]
                for c in self.selfs[:first]:
                    c.vouch(pos + 1)
                return self._finish(self.xs[first % 2], first, pos)
            if k < n:
                self.rests[k]()
        for c in self.selfs:
            c.vouch(pos + 1)  # (as attend_new: this position found finite with its query)
        self.cache.advance(1)
        return _rows.linear(self.normed, self.head)

    def _angles(self, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's ``(cos, signed sin)`` of position ``pos``, ``(1, 2, r/2)`` each."""
        if pos >= self.cache.max_len:  # (the cache's update then says what went wrong)
            return self.rope.angles(pos, 1, self.like)
        cos, sin = self.angles
        return cos[pos:pos + 1], sin[pos:pos + 1]

    # ----------------------------------------------------------------- the fixed-shape form
    def _fixed(self, ids: torch.Tensor) -> torch.Tensor:
        n = self.cache.length
        if n >= self.cache.max_len:  # (Python ints: the device would only assert)
            raise ValueError(f"DecodeStep: position {n} does not fit a cache of max_len="
                             f"{self.cache.max_len}; create the cache with a larger max_len")
        if self.pos is None:
            self.pos = torch.full((1,), n, dtype=torch.long, device=self.like.device)
        logits = self._replay(ids) if self.graph else self._fixed_step(ids)
        self.cache.advance(1)
        return logits

    def _fixed_step(self, ids: torch.Tensor) -> torch.Tensor:
        """One step at ``self.pos``, which it advances on the device: fixed shapes, no host
        read, the same kernels every token."""
        pos, keys = self.pos, self.keys
        x = self.embed(ids, pos)
        rot = None if self.rope is None else tuple(t.index_select(0, pos) for t in self.angles)
        allowed = keys <= pos  # (L,): the filled positions and this one
        if self.window is not None:
            allowed = allowed & (keys > pos - self.window)
        bias = torch.where(allowed, self.zero, self.neg)  # the same mask, additive
        at = (pos, allowed.view(1, 1, 1, -1), bias.view(1, 1, 1, -1))
        for layer in self.layers:
            x = layer(x, rot, self.memory_mask, at)
        pos.add_(1)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return _rows.linear(x, self.head)

    def _replay(self, ids: torch.Tensor) -> torch.Tensor:
        """The step as a CUDA graph. The first call runs it eagerly on a side stream (a real
        step, which also warms up cuBLAS and the allocator, as ``torch.cuda.graphs`` asks),
        then captures it: capture records the kernels without running them, so no step is
        taken twice. Later calls copy ``ids`` into the captured input and replay; the logits
        are copied out, since the next replay overwrites the captured output."""
        if self._graph is not None:
            self._ids.copy_(ids)
            self._graph.replay()
            return self._logits.clone()
        self._ids = ids.clone()
        side, main = torch.cuda.Stream(ids.device), torch.cuda.current_stream(ids.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            logits = self._fixed_step(self._ids)
        main.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._logits = self._fixed_step(self._ids)
        self._graph = graph
        return logits
