"""Count what a piece of headwise would launch on a GPU, on a CPU-only machine.

CI has no GPU, yet the GPU path's budget (kernels per call, host synchronisations) must not
regress. Fake tensors on device ``"cuda:0"`` (``FakeTensorMode``) run every aten op's shape
logic with no data and no driver; a counting dispatch mode under it records each op, so:

- ``ops``: the aten ops a call issues, views excluded (each other op is at least one CUDA kernel
  in eager mode);
- ``syncs``: host reads of a device value (``aten._local_scalar_dense``: ``.item()``, ``bool()``,
  ``int()``, ``.tolist()``) and data-dependent shapes (``nonzero``, boolean-mask indexing,
  ``unique``), which on a GPU wait for the device. Fake tensors cannot answer either, so the
  call raises there: the run records the sync, the error, and stops that block;
- ``h2d``: copies from the CPU to the device inside the block;
- ``d2h``: copies from the device to the CPU (``.cpu()``; the host waits for the device).

Python indexing (``t[0, :, 2:]``, ``t[...] = v``) of a fake CUDA tensor fails too ("not linked
with support for cuda devices"); the runner replays it on cuda tensors with the aten ops it
dispatches anyway (select, slice, unsqueeze, index, copy_, index_put_), so counts are unchanged;
so are ``~t`` and ``t.copy_(u)`` (bitwise_not, copy_).

Some ops abort the *process* on the CPU wheel when they meet a fake CUDA tensor (``torch.cat``
asks for a CUDA device guard, which this build lacks: "PyTorch is not linked with support for
cuda devices", then ``terminate``). So every script runs in a child process; an abort is a
failed run with its stderr, never a dead test session.

Usage (a test)::

    from tests.fake_cuda import run
    counts = run('''
        m = headwise.MultiHeadAttention(64, 4)
        m = fake_module(m)                      # parameters -> fake cuda:0, same shapes/dtypes
        x = cuda(2, 16, 64)                     # a fake cuda:0 tensor (float32 by default)
        with counted("forward"):
            m(x, causal=True)
    ''')
    assert counts["forward"].syncs == 0 and counts["forward"].kernels <= 12

The script sees ``torch``, ``headwise``, ``nn``, ``F``, ``cuda``, ``fake_module`` and
``counted``; it runs under the fake mode, so every tensor it makes is fake (make CPU tensors
with ``device="cpu"``: they are fake CPU tensors, and copying one to ``cuda:0`` counts as h2d).
``run(..., sdpa_as_one=True)`` counts each call of the public
``F.scaled_dot_product_attention`` as the one op ``aten.scaled_dot_product_attention`` (on
fake CUDA it decomposes into the math kernel's ops, which a GPU would not run).

Where fake CUDA tensors fail (indexing one, a reduction with ``dtype=``, autograd: "PyTorch is
not linked with support for cuda devices"), :func:`on_device_path` counts in this process on
real CPU tensors that take the GPU's code path (:func:`headwise.fast.as_device`), forward and
backward, with the values there to check against a reference; it cannot see h2d copies (every
tensor is on the CPU), so a fake-CUDA run still guards those where it works.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Counts", "on_device_path", "run", "VIEWS"]

# ops that make views or read metadata: no kernel on a GPU
VIEWS = frozenset({
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.permute",
    "aten.transpose", "aten.t", "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select",
    "aten.split", "aten.split_with_sizes", "aten.chunk", "aten.unbind", "aten.as_strided",
    "aten.alias", "aten.detach", "aten.narrow", "aten.unflatten", "aten.flatten",
    "aten.diagonal", "aten.lift_fresh", "aten.view_as", "aten.expand_as", "aten.movedim",
    "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset",
    "aten.is_same_size", "aten._reshape_alias", "aten.empty_like", "aten.empty",
    "aten.empty_strided", "prim.device", "prim.layout", "aten._has_compatible_shallow_copy_type",
    "aten.is_contiguous", "aten.stride", "aten.size", "aten.dim", "aten.numel",
    "aten._fused_sdp_choice",  # SDPA's kernel choice: a host-side function of shapes
})
SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.unique", "aten._unique",
            "aten._unique2", "aten.masked_select", "aten.item", "aten.equal",
            "aten.is_nonzero")

_RUNNER = r'''
import json, sys, contextlib, traceback
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
import headwise

VIEWS = set(json.loads(sys.argv[1]))
SYNC_OPS = tuple(json.loads(sys.argv[2]))
RESULTS = {}


def _name(func):
    return str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)


class _Count(TorchDispatchMode):
    def __init__(self, row):
        super().__init__()
        self.row = row

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name.startswith(SYNC_OPS):
            self.row["syncs"].append(name)
        elif name in ("aten._to_copy", "aten.copy_", "aten.to"):
            src = args[1] if name == "aten.copy_" else args[0]
            dst = (args[0].device if name == "aten.copy_"
                   else kwargs.get("device", getattr(src, "device", None)))
            if getattr(src, "device", None) is not None and src.device.type == "cpu" \
                    and dst is not None and torch.device(dst).type == "cuda":
                self.row["h2d"].append(name)
            if getattr(src, "device", None) is not None and src.device.type == "cuda" \
                    and dst is not None and torch.device(dst).type == "cpu":
                self.row["d2h"].append(name)  # .cpu(): the host waits for the device
        if name not in VIEWS:
            self.row["ops"].append(name)
        return func(*args, **kwargs)


@contextlib.contextmanager
def counted(label):
    row = RESULTS.setdefault(label, {"ops": [], "syncs": [], "h2d": [], "d2h": [],
                                     "error": None})
    try:
        with _Count(row):
            yield row
    except Exception as e:  # a sync (data-dependent output) or any other failure: recorded
        row["error"] = f"{type(e).__name__}: {e}"[:2000]
        if not any(s in type(e).__name__ for s in ("DataDependent", "DynamicOutputShape")):
            row["traceback"] = traceback.format_exc()[-4000:]


def cuda(*shape, dtype=torch.float32, requires_grad=False):
    return torch.empty(*shape, dtype=dtype, device="cuda:0", requires_grad=requires_grad)


def fake_module(module, dtype=None):
    """The module with every parameter and buffer replaced by a fake cuda:0 tensor of the same
    shape (and dtype, or ``dtype`` for floating ones), keeping requires_grad."""
    for mod in module.modules():
        for n, p in list(mod._parameters.items()):
            if p is not None:
                dt = dtype if (dtype is not None and p.is_floating_point()) else p.dtype
                mod._parameters[n] = nn.Parameter(
                    torch.empty(p.shape, dtype=dt, device="cuda:0"), requires_grad=p.requires_grad)
        for n, b in list(mod._buffers.items()):
            if b is not None:
                dt = dtype if (dtype is not None and b.is_floating_point()) else b.dtype
                mod._buffers[n] = torch.empty(b.shape, dtype=dt, device="cuda:0")
    return module


if len(sys.argv) > 4 and sys.argv[4] == "sdpa_as_one":
    _sdpa = F.scaled_dot_product_attention

    def _sdpa_once(*args, **kwargs):
        mode = torch.utils._python_dispatch._get_current_dispatch_mode()
        if not isinstance(mode, _Count):
            return _sdpa(*args, **kwargs)
        mode.row["ops"].append("aten.scaled_dot_product_attention")
        with torch.utils._python_dispatch._pop_mode_temporarily():
            return _sdpa(*args, **kwargs)

    F.scaled_dot_product_attention = _sdpa_once


# Python indexing (t[...] and t[...] = v) of a fake CUDA tensor aborts the same way (its binding
# takes a CUDA device guard), so on cuda tensors it is replayed with the aten ops it dispatches
# anyway (select / slice / unsqueeze / index / copy_ / index_put_): same ops, same counts.
_GETITEM, _SETITEM = torch.Tensor.__getitem__, torch.Tensor.__setitem__


def _index(t, idx):
    """``t[idx]``: basic indices by view ops, then tensor indices (if any) by aten.index."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    out, dim, tensors = t, 0, []
    for i in idx:
        if i is Ellipsis:
            skip = t.dim() - real
            tensors += [None] * skip
            dim += skip
        elif i is None:
            out = torch.ops.aten.unsqueeze.default(out, dim)
            tensors.append(None)
            dim += 1
        elif isinstance(i, int) and not isinstance(i, bool):
            out = torch.ops.aten.select.int(out, dim, i)
        elif isinstance(i, slice):
            out = torch.ops.aten.slice.Tensor(out, dim, i.start, i.stop, i.step or 1)
            tensors.append(None)
            dim += 1
        else:  # tensors, lists (copied to the device, as on a GPU)
            i = torch.as_tensor(i, device=t.device)
            if i.dtype == torch.bool:  # as torch does: positions from nonzero (a host sync)
                i = torch.ops.aten.nonzero.default(i)
                tensors += list(i.unbind(1))
                dim += i.shape[1]
                continue
            tensors.append(i)
            dim += 1
    if any(x is not None for x in tensors):
        return out, tensors
    return out, None


def _getitem(self, idx):
    if self.device.type != "cuda":
        return _GETITEM(self, idx)
    out, tensors = _index(self, idx)
    return out if tensors is None else torch.ops.aten.index.Tensor(out, tensors)


def _setitem(self, idx, value):
    if self.device.type != "cuda":
        return _SETITEM(self, idx, value)
    out, tensors = _index(self, idx)
    if tensors is None:
        return out.copy_(value) if isinstance(value, torch.Tensor) else out.fill_(value)
    if not isinstance(value, torch.Tensor):  # a Python number: a 0-dim CPU value, no copy
        value = torch.tensor(value, dtype=self.dtype, device="cpu")
    torch.ops.aten.index_put_.default(out, tensors, value)


def _replayed(method, op):
    """A hand-written Tensor method (its binding takes the device guard) as its aten op."""
    def call(self, *args, **kwargs):
        return (op if self.device.type == "cuda" else method)(self, *args, **kwargs)
    return call


torch.Tensor.__getitem__, torch.Tensor.__setitem__ = _getitem, _setitem
torch.Tensor.__invert__ = _replayed(torch.Tensor.__invert__, torch.ops.aten.bitwise_not.default)
torch.Tensor.copy_ = _replayed(torch.Tensor.copy_, torch.ops.aten.copy_.default)

_SCRIPT = open(sys.argv[3]).read()
with FakeTensorMode(allow_non_fake_inputs=True):
    exec(compile(_SCRIPT, "<fake-cuda script>", "exec"),
         {"torch": torch, "nn": nn, "F": F, "headwise": headwise, "cuda": cuda,
          "fake_module": fake_module, "counted": counted})
print("@@COUNTS@@" + json.dumps(RESULTS))
'''


@dataclass
class Counts:
    """What one ``counted(label)`` block issued."""
    ops: list[str] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)
    h2d: list[str] = field(default_factory=list)
    d2h: list[str] = field(default_factory=list)
    error: str | None = None
    traceback: str | None = None

    @property
    def kernels(self) -> int:
        """Non-view aten ops: a lower bound on the CUDA kernels launched in eager mode."""
        return len(self.ops)

    def histogram(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name in self.ops:
            out[name] = out.get(name, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def __str__(self) -> str:
        return (f"{self.kernels} ops, syncs {self.syncs}, h2d {self.h2d}, d2h {self.d2h}, "
                f"error {self.error}; {self.histogram()}")


def run(script: str, *, timeout: float = 240.0, env: dict | None = None,
        sdpa_as_one: bool = False) -> dict[str, Counts]:
    """Run ``script`` (see the module docstring) in a child process under fake CUDA; return its
    ``counted`` blocks by label. A crash of the child (an abort, a timeout, an exception outside
    every ``counted`` block) is an AssertionError with its output. ``sdpa_as_one``: each public
    ``F.scaled_dot_product_attention`` call counts as one op (the fused kernel a GPU runs)."""
    import tempfile
    src = Path(__file__).resolve().parents[1] / "src"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(script))
        path = f.name
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep), **(env or {})}
    try:
        done = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(sorted(VIEWS)),
                               json.dumps(SYNC_OPS), path]
                              + (["sdpa_as_one"] if sdpa_as_one else []),
                              capture_output=True, text=True,
                              timeout=timeout, env=child_env)
    finally:
        os.unlink(path)
    marker = "@@COUNTS@@"
    if done.returncode != 0 or marker not in done.stdout:
        raise AssertionError(f"the fake-CUDA run failed (exit {done.returncode}):\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    raw = json.loads(done.stdout.split(marker, 1)[1])
    return {label: Counts(**row) for label, row in raw.items()}


# The fused kernels' ops, forward and backward, on any device: each is one kernel (or a few
# inside one library call) on a GPU.
FUSED_SDPA_OPS = ("aten._scaled_dot_product_flash_attention",
                  "aten._scaled_dot_product_efficient_attention",
                  "aten._scaled_dot_product_cudnn_attention",
                  "aten._scaled_dot_product_fused_attention_overrideable")


@contextlib.contextmanager
def on_device_path(gpu_rules: bool = True):
    """Count, in this process, the aten ops (views excluded), host reads and data-dependent
    shapes issued inside the block by real CPU tensors taking the GPU's code path
    (:func:`headwise.fast.as_device`; ``gpu_rules=False``: the CPU's own path, to guard it
    too). Yields a :class:`Counts`, filled when the block ends.

    The public ``F.scaled_dot_product_attention`` counts as the one op
    ``aten.scaled_dot_product_attention`` (on the CPU it may decompose into the math kernel's
    ops, where a GPU runs one fused kernel); its backward is then whatever the CPU ran for it,
    the CPU flash kernel's backward being one op (``..._flash_attention_for_cpu_backward``).
    Host reads are recorded, not raised: real tensors can answer them."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode_temporarily

    from headwise.fast import as_device

    row = Counts()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
            if name.startswith(SYNC_OPS):
                row.syncs.append(name)
            if name not in VIEWS:
                row.ops.append(name)
            return func(*args, **(kwargs or {}))

    mode = _Count()
    sdpa = F.scaled_dot_product_attention

    def sdpa_once(*args, **kwargs):
        row.ops.append("aten.scaled_dot_product_attention")
        with _pop_mode_temporarily():
            return sdpa(*args, **kwargs)

    F.scaled_dot_product_attention = sdpa_once
    try:
        with as_device() if gpu_rules else contextlib.nullcontext(), mode:
            yield row
    finally:
        F.scaled_dot_product_attention = sdpa
