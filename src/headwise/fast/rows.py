"""Weights in the form a one-row decoding step multiplies fastest (see :mod:`headwise.decode.step`).

Axis legend: ``b`` rows, ``in`` / ``out`` a linear map's input and output features.

A cached decoding step feeds ``(b, in)`` rows with ``b`` small: every product is a matrix-vector
product bound by reading the weights once. Each component's one-row form
(:mod:`headwise.decode.forms`) holds its matrices as :data:`Weight` tuples and multiplies through
:func:`linear` / :func:`residual`, so the layout choice is made here, once. What each choice
gains on the machines measured: ``benchmarks/RESULTS.md`` (``generate``, ``weights``).

- the C kernel: for 1 to :data:`COLUMN_ROWS` rows of float32 (or bfloat16) on an x86-64 CPU
  with AVX2, every product of either layout below is headwise's own
  (:mod:`headwise.fast.native`), which reads the weights at close to the speed memory delivers
  them, faster than MKL's small-``b`` kernels. It splits its products over the intra-op threads
  itself. The rest of this list is what runs where it does not apply;
- ``transpose=False``: the module's own ``(out, in)`` weight, no copy (the faster layout from
  two rows on, and the one that costs no memory). For 2 to :data:`COLUMN_ROWS` rows it is
  taken as ``(W @ x^T)^T``: MKL's small-``b`` kernel for ``x @ W^T`` (what ``F.linear`` calls)
  runs at a fraction of the memory's speed, so four rows cost about twice one row's time
  although the weights are read once; ``W @ x^T`` (the rows as ``b`` columns) is the kernel it
  is faster on (the ``(out, b)`` result is copied back to rows). From ~8 rows on ``F.linear`` is
  as fast; bfloat16 products run oneDNN's kernels, where the column form measured no faster;
- ``transpose=True``: a copy of ``W^T`` ``(in, out)``, which a single row streams faster on a
  CPU, at the price of a second copy of the weights while a generation runs (small models only:
  :data:`headwise.decode.step.COPY_BUDGET`);
- :func:`lay_out`: no copy kept: the module's own weight *stored* as ``W^T`` (its
  ``(out, in)`` shape and values unchanged, strides ``(1, out)``), for the matrices where the
  layout matters most. One row of ``x @ W^T`` over a wide matrix (``out > in``: a gated
  feed-forward's gate/up, the vocabulary head) streams ``(in, out)`` storage faster than
  ``(out, in)`` (float32, MKL; square and tall matrices measure the same either way or better
  untransposed); ``F.linear`` takes such a weight as it is. Larger models are laid out this way
  for a one-row generation and back for 2 to :data:`COLUMN_ROWS` rows, whose column form needs
  ``(out, in)``. Layers that read one input (q, k, v; gate, up) are stored as blocks of one
  buffer and laid out as their joined matrix: one product per group, with no copy
  (:func:`headwise.fast.storage.joined`), which for SmolLM2's q/k/v also turns three
  square-ish matrices into one wide one, which streams faster;
- one row, two or more threads, no C kernel: a float32 product of at least :data:`SPLIT_MIN`
  elements is one ``torch.bmm`` over one block of output features per intra-op thread (views
  of whichever storage the weight has, no copy). MKL's one-row kernel uses one thread whatever
  the setting, so split in blocks a matrix streams at nearly the two threads' memory speed.
  Smaller matrices sit in cache, where the split costs more than it gains, and with one thread
  it gains nothing;
- :class:`~headwise.fast.int4.Int4`: when a layer carries 4-bit codes (``layer.int4``; an
  :class:`~headwise.fast.int4.Int4Linear`, which :func:`headwise.pretrained.load_gguf` with
  ``q4=True`` puts in place of an ``nn.Linear`` to hold a GGUF's own Q4_1 blocks and no float32
  copy), the product reads those, about 1/6 of the float32 bytes, whatever ``transpose`` says;
- :class:`~headwise.fast.q8.Q8`: 8-bit codes attached beside a float32 weight (SmolLM2's tied
  vocabulary head, ``q4=True``): 1 to :data:`COLUMN_ROWS` rows read those (about a quarter of
  the float32 bytes), other row counts or a declined kernel the weight as above (:data:`Q8`
  layout).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from headwise.fast import applies
from headwise.fast import int4 as _int4
from headwise.fast import large as _large
from headwise.fast import native as _native
from headwise.fast import plan as _plan
from headwise.fast import q8 as _q8
from headwise.fast.storage import joined, joined_any, stored_transposed

__all__ = ["ARENA_BYTES", "COLUMN_ROWS", "INT4", "Q8", "SPLIT_MIN", "Weight", "bind", "joined",
           "lay_out", "linear", "of_group", "of_linear", "residual", "stored_transposed",
           "weight"]

Weight = tuple  # (matrix, bias | None, layout): layout False: W (out, in); True: W^T (in, out),
#                 a copy or a W^T storage's view; INT4: a headwise.fast.int4.Int4; Q8:
#                 (headwise.fast.q8.Q8, the float Weight a declined product multiplies by)
INT4, Q8 = "int4", "q8"
# Up to this many rows an untransposed weight multiplies through headwise.fast.native, or the rows
# as columns (module docstring).
COLUMN_ROWS = _native.ROWS
# From this many elements a one-row product is split across the intra-op threads (the module
# docstring says why; smaller matrices sit in cache, where one thread's kernel is faster).
SPLIT_MIN = 1 << 17
# lay_out stores the matrices it moves in buffers of about this many bytes, advised to huge pages
ARENA_BYTES = 64 << 20
# the weights lay_out placed there: id -> (a weak reference to the weight, its storage then)
_PLACED: dict[int, tuple[weakref.ref, int]] = {}


def weight(w: torch.Tensor, bias: torch.Tensor | None, transpose: bool) -> Weight:
    """A :data:`Weight` of ``w (out, in)`` and ``bias (out,)`` (detached: decoding has no
    gradients). A ``w`` already stored as ``W^T`` (:func:`lay_out`) is taken as that ``(in,
    out)`` view, copied or not: the product is then one ``mm`` call, the same BLAS call that
    ``F.linear`` makes after its transpose and dispatch."""
    w = w.detach()
    bias = None if bias is None else bias.detach()
    if transpose or stored_transposed(w):
        return w.t().contiguous(), bias, True  # (no copy when stored so)
    return w, bias, False


def of_linear(layer: nn.Linear, transpose: bool) -> Weight:
    """The :data:`Weight` of an ``nn.Linear`` (its :class:`~headwise.fast.int4.Int4` codes when it
    carries some; its :class:`~headwise.fast.q8.Q8` codes as :func:`headwise.fast.q8.of` says)."""
    codes = getattr(layer, "int4", None)
    if codes is not None:
        return codes, None if layer.bias is None else layer.bias.detach(), INT4
    if (q8 := _q8.of(layer)) is not None:
        return (q8, weight(layer.weight, layer.bias, transpose)), None, Q8
    return weight(layer.weight, layer.bias, transpose)


def of_group(layers, transpose: bool) -> Weight | None:
    """The one :data:`Weight` of layers that read one input (a component's ``joint_linears()``)
    with no copy: float32 weights stored as one matrix (:func:`joined`), or 4-bit codes that
    share one set (:func:`headwise.fast.int4.joined`; their biases, if any, concatenated);
    else None (the caller multiplies them one by one, or joins a copy)."""
    codes = [getattr(layer, "int4", None) for layer in layers]
    if any(c is None for c in codes):
        whole = joined(layers)
        return None if whole is None else weight(*whole, transpose)
    whole = _int4.joined(codes)
    biases = [layer.bias for layer in layers]
    if whole is None or len({b is None for b in biases}) > 1:
        return None
    return whole, None if biases[0] is None else torch.cat(biases).detach(), INT4


def lay_out(module: nn.Module, rows: int) -> int:
    """Store the float32 (and bfloat16) CPU ``nn.Linear`` weights of ``module`` the way a
    decoding step over ``rows`` rows reads them fastest (module docstring), in place; returns
    how many matrices moved.

    One row: each wide float32 matrix (``out > in``) stored as ``W^T``, the others ``(out,
    in)`` (bfloat16 always: the layout its kernel reads);
    2 to :data:`COLUMN_ROWS` rows: every matrix ``(out, in)``; more rows: left as they are
    (``F.linear`` measures the same on either). The layers a component lists as reading one
    input (``joint_linears()``: self-attention's q, k, v; a gated feed-forward's gate, up) are
    stored as blocks of one buffer, laid out as their joined matrix, so the step (and the
    module path's fused projection) multiplies them as one without a copy
    (:func:`~headwise.fast.storage.joined`).
    Only the storage changes: the same ``Parameter`` objects (tied weights stay tied, an
    optimizer keeps its references), their shapes and values. Every matrix it takes lives in
    buffers of about :data:`ARENA_BYTES` advised to transparent huge pages, one dtype each
    (fewer TLB misses for a step that streams them every token): one already in the layout
    wanted moves too, once, unless lay_out put it there (a measured gain even for the matrices
    whose layout does not change); the extra memory while they move is a buffer or two, or the
    largest group. The copies are ordinary tensors even inside ``torch.inference_mode``, so the
    model still trains afterwards."""
    if rows > COLUMN_ROWS:
        return 0
    todo, seen = [], set()
    groups = [g for m in module.modules() for g in getattr(m, "joint_linears", tuple)()]
    singles = [(m,) for m in module.modules() if isinstance(m, nn.Linear)]
    for layers in groups + singles:
        if not all(isinstance(m, nn.Linear) for m in layers) or any(map(_q8.of, layers)):
            continue  # (an Int4Linear's .weight would be dequantized; the step reads Q8 codes)
        ws = [layer.weight for layer in layers]
        if any(id(w) in seen for w in ws) or not applies(*ws, autograd=True, bf16=True):
            continue
        seen.update(id(w) for w in ws)
        want = rows == 1 and _wide(layers) and ws[0].dtype is torch.float32
        whole = joined_any(layers)
        if whole is None or not all(map(_placed, ws)) or not (
                stored_transposed(whole[0]) if want else whole[0].is_contiguous()):
            todo.append((layers, want))
    with torch.inference_mode(False), torch.no_grad():
        for chunk in _chunks(todo):
            arena = _large.huge(sum(_numel(layers) for layers, _ in chunk),
                                chunk[0][0][0].weight.dtype)
            at = 0
            for layers, want in chunk:
                _store(layers, want, arena[at:at + _numel(layers)])
                at += _numel(layers)
    return sum(len(layers) for layers, _ in todo)


def _place(w: torch.Tensor) -> None:
    key = id(w)
    _PLACED[key] = weakref.ref(w, lambda _: _PLACED.pop(key, None)), w.untyped_storage().data_ptr()


def _placed(w: torch.Tensor) -> bool:
    """Whether :func:`lay_out` put ``w`` where it is now (in one of its huge-page buffers)."""
    ref, at = _PLACED.get(id(w), (None, None))
    return ref is not None and ref() is w and w.untyped_storage().data_ptr() == at


def _numel(layers) -> int:
    return sum(layer.weight.numel() for layer in layers)


def _chunks(todo):
    """The groups to store as runs of about :data:`ARENA_BYTES` (a larger group is a run of
    its own), wide groups (``out > in``) apart from the others, one dtype a run: one huge-page
    buffer per run. Laying a model out for another row count moves exactly its wide groups (one row wants them
    ``W^T``, 2-4 rows ``(out, in)``), so every run it moves is vacated whole and freed, and the
    extra memory meanwhile is a run or two, not a second copy of the model."""
    for wide, dtype in ((w, d) for w in (False, True) for d in (torch.float32, torch.bfloat16)):
        run, size = [], 0
        for item in todo:
            if _wide(item[0]) is not wide or item[0][0].weight.dtype is not dtype:
                continue
            n = _numel(item[0]) * item[0][0].weight.element_size()
            if run and size + n > ARENA_BYTES:
                yield run
                run, size = [], 0
            run.append(item)
            size += n
        if run:
            yield run


def _wide(layers) -> bool:
    return sum(layer.weight.shape[0] for layer in layers) > layers[0].weight.shape[1]


def _store(layers, transposed: bool, buf: torch.Tensor) -> None:
    """The weights (and biases) of ``layers`` copied into ``buf`` (1-D, their total size) as
    consecutive blocks: ``(in, sum of out)`` columns when ``transposed``, else ``(sum of out,
    in)`` rows."""
    ws = [layer.weight for layer in layers]
    total, n_in = sum(w.shape[0] for w in ws), ws[0].shape[1]
    buf = buf.view((n_in, total) if transposed else (total, n_in))
    group = len(layers) > 1 and all(layer.bias is not None for layer in layers)
    biases = ws[0].new_empty(total) if group else None  # a single layer keeps its own
    at = 0
    for layer, w in zip(layers, ws, strict=True):
        n = w.shape[0]
        block = buf[:, at:at + n].t() if transposed else buf[at:at + n]
        w.data = block.copy_(w.detach())
        _place(w)
        if biases is not None:
            layer.bias.data = biases[at:at + n].copy_(layer.bias.detach())
        at += n


def _as_columns(x: torch.Tensor, m: torch.Tensor) -> bool:
    """Whether rows ``x (b, in)`` times an untransposed ``W (out, in)`` go as ``W @ x^T`` where
    :func:`headwise.fast.native.rows_matmul` does not apply: 2 to :data:`COLUMN_ROWS` rows of a
    float32 weight (the module docstring says why)."""
    return 1 < x.shape[0] <= COLUMN_ROWS and applies(x, m)


def _split_product(x: torch.Tensor, m: torch.Tensor, layout, res: torch.Tensor | None):
    """One row ``x (1, in)`` times a float32 matrix split into ``k`` blocks of output features,
    one per intra-op thread, as one batched product (plus ``res (1, out)`` when given) ->
    ``(1, out)``; None when the product is not split: one thread, another row count, a matrix
    under :data:`SPLIT_MIN` elements, ``k`` not dividing ``out``, a strided storage. The blocks
    are views: rows ``(k, out / k, in)`` of an ``(out, in)`` storage, columns
    ``(k, in, out / k)`` of an ``(in, out)`` one (a ``transpose`` copy or :func:`lay_out`)."""
    k = torch.get_num_threads()  # (first: one thread, the common case, returns at once)
    if k < 2 or x.shape[0] != 1 or m.numel() < SPLIT_MIN or not applies(x, m):
        return None
    wt = m if layout else m.t() if stored_transposed(m) else None  # (in, out), contiguous
    out = m.shape[0] if wt is None else wt.shape[1]
    if out % k or (wt is None and not m.is_contiguous()):
        return None
    if wt is not None:  # the row times each (in, out / k) block
        a, b = x.expand(k, 1, -1), wt.view(wt.shape[0], k, -1).permute(1, 0, 2)
        res = None if res is None else res.reshape(k, 1, -1)
    else:  # each (out / k, in) block times the row as a column
        a, b = m.view(k, -1, m.shape[1]), x.t().expand(k, -1, 1)
        res = None if res is None else res.reshape(k, -1, 1)
    return (torch.bmm(a, b) if res is None else torch.baddbmm(res, a, b)).view(1, -1)


def linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x (b, in) @ W^T + bias -> (b, out)``."""
    m, bias, layout = w
    if layout is INT4:
        return m.matmul(x, bias)
    if layout is Q8:
        y = m[0].matmul(x, m[1][1])
        return y if y is not None else linear(x, m[1])
    if (y := _native.rows_matmul(x, m, bias, wt=layout)) is not None:
        return y
    if (y := _split_product(x, m, layout, None)) is not None:
        return y if bias is None else y.add_(bias)
    if layout:
        return torch.mm(x, m) if bias is None else torch.addmm(bias, x, m)
    if _as_columns(x, m):  # (W @ x^T)^T
        y = torch.mm(m, x.t()) if bias is None else torch.addmm(bias[:, None], m, x.t())
        return y.t().contiguous()
    return F.linear(x, m, bias)


def residual(x: torch.Tensor, y: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x + (y @ W^T + bias)``: one product with the addition fused (as ``F.linear`` fuses
    its bias), plus one add when there is a bias."""
    m, bias, layout = w
    if layout is INT4:
        return m.matmul(y, bias, x)
    if layout is Q8:
        out = m[0].matmul(y, m[1][1], x)
        return out if out is not None else residual(x, y, m[1])
    if (out := _native.rows_matmul(y, m, bias, x, wt=layout)) is not None:
        return out
    if (split := _split_product(y, m, layout, x)) is not None:
        out = split
    elif not layout and _as_columns(y, m):
        out = torch.addmm(x.t(), m, y.t()).t().contiguous()  # (x^T + W @ y^T)^T
    else:
        out = torch.addmm(x, y, m if layout else m.t())
    return out if bias is None else out.add_(bias)


def bind(plan: _plan.Plan, x: torch.Tensor, w: Weight, y: torch.Tensor,
         res: torch.Tensor | None = None) -> bool:
    """Add to ``plan`` the C kernel's op that :func:`linear` (``res`` None) or :func:`residual`
    (``res + x @ W^T + bias``) runs for these tensors, writing ``y``; False where they would not
    run one (another layout, a declined kernel): the caller then runs unbound."""
    m, bias, layout = w
    if layout is INT4:  # (Int4.matmul: float32 rows through the codes' bound product)
        product = m.product()
        return (product is not None and x.dtype is torch.float32
                and plan.coded(product, x, y, bias, res))
    if layout is Q8:
        return False  # (a vocabulary head: outside the step's layers)
    return plan.matmul(x, m, y, bias, res, wt=layout)
