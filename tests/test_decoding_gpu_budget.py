"""The device's decoding step, counted on fake cuda:0 tensors (tests/fake_cuda.py): no host
synchronisation, no copy from the host, and at most a fixed number of kernels per layer, so a
CUDA graph can replay it and eager decoding launches no more than a plain loop does.

The budgets, op by op (eager, one new token per row; each op is one CUDA kernel):

- per GPT-style layer (LayerNorm, learned positions, GELU MLP, biases): 2 ``layer_norm``, the
  q|k|v product (``linear``), 2 ``index_copy_`` (k, v into the cache at the position tensor),
  1 ``scaled_dot_product_attention``, the output projection with the residual as one ``addmm``
  plus its bias (``add_``), the MLP's ``linear`` + ``gelu``, its down ``addmm`` + bias ``add_``:
  **12** (a plain PyTorch loop launches the same 12: two norms, four products, two cache
  writes, SDPA, GELU, two residual adds);
- per Llama-style layer (RMSNorm, RoPE, 2 key/value heads, SwiGLU, no biases): 2 RMSNorms of 5
  (``linalg_vecdot``, ``addcmul``, ``rsqrt``, 2 ``mul``), the q|k|v product, RoPE on q and k
  together in 4 (``mul``, ``flip``, ``mul_``, ``add_``), 2 ``index_copy_``, SDPA, the output
  ``addmm``, the gate|up product, ``silu``, ``mul_``, the down ``addmm``: **23**;
- once per token: the embedding (+ ``index_select`` of the position's row or RoPE angles, and
  the add of a learned position), the mask from the position tensor (``le``, ``where``), the
  final norm, the vocabulary product, the position's ``add_``: at most **12**.

Mutation check (done when these tests were written): ``int(pos)`` (a host read of the position)
in ``SelfAttentionCache.write`` makes ``syncs`` non-empty; the additive mask rebuilt in every
layer (``torch.where`` in ``AttentionRow.static_attend``) or an ``isfinite`` check of q put back
there adds ops per layer over the budget; each fails here.
"""

import pytest

from tests.fake_cuda import run

# What the script needs beyond tests/fake_cuda.py: torch.cat / torch.stack / a scalar
# torch.tensor abort or fail on fake CUDA tensors with this CPU wheel, and only *building* the
# step uses them (RoPE's angle table, the joined q|k|v weights, RMSNorm's constants); the public
# SDPA call counts as the one fused kernel a GPU runs (on fake CUDA it decomposes into math).
PRELUDE = '''
from headwise.models import LMConfig, TransformerLM
from headwise.step import DecodeStep

def _cat_free(ts, dim=0):
    ts = list(ts)
    dim = dim % ts[0].dim()
    shape = list(ts[0].shape)
    shape[dim] = sum(t.shape[dim] for t in ts)
    out = torch.empty(shape, dtype=ts[0].dtype, device="cuda:0")
    at = 0
    for t in ts:
        out.index_copy_(dim, torch.arange(at, at + t.shape[dim], device="cuda:0"), t)
        at += t.shape[dim]
    return out

_tensor = torch.tensor

def _scalar(data, dtype=None, device=None, **kw):
    if isinstance(data, (int, float)) and device is not None \\
            and torch.device(device).type == "cuda":
        return torch.full((), data, dtype=dtype, device=device)
    return _tensor(data, dtype=dtype, device=device, **kw)

torch.cat = _cat_free
torch.stack = lambda ts, dim=0: _cat_free([t.unsqueeze(dim) for t in ts], dim)
torch.tensor = _scalar
_sdpa = F.scaled_dot_product_attention

def _sdpa_once(*args, **kwargs):
    mode = torch.utils._python_dispatch._get_current_dispatch_mode()
    if mode is None or not hasattr(mode, "row"):
        return _sdpa(*args, **kwargs)
    mode.row["ops"].append("aten.scaled_dot_product_attention")
    with torch.utils._python_dispatch._pop_mode_temporarily():
        return _sdpa(*args, **kwargs)

F.scaled_dot_product_attention = _sdpa_once

def count(label, layers, rows, d_model=32, **kw):
    c = LMConfig(97, d_model=d_model, num_heads=4, num_layers=layers, d_ff=2 * d_model,
                 max_len=64, dropout=0.0, **kw)
    model = fake_module(TransformerLM(c).eval())
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.inference_mode():
        cache = model.new_cache(rows, 32)
        cache.advance(7)  # a prompt of 7 (its values do not matter to the counts)
        step = DecodeStep(model, cache)
        ids = torch.zeros(rows, dtype=torch.long, device="cuda:0")
        with counted(label + "-first"):  # the first step also makes the position tensor
            step(ids)
        with counted(label):
            step(ids)
'''

GPT = dict(positional="learned", activation="gelu")
LLAMA = dict(positional="rope", num_kv_heads=2, norm="rms", ffn="glu", activation="silu",
             bias=False)
# the same at 2048 wide (2 layers: 200 MB of fake float32, over headwise.step.COPY_BUDGET, where
# the CPU step stops joining q|k|v and gate|up; a device's step joins them at any size)
BIG = dict(d_model=2048)
MODELS = {"gpt": GPT, "llama": LLAMA, "gpt_big": dict(GPT, **BIG),
          "llama_big": dict(LLAMA, **BIG)}
BUDGET = {"gpt": 12, "llama": 23, "gpt_big": 12, "llama_big": 23}
ONCE = 12


@pytest.fixture(scope="module")
def counts():
    lines = [f"count('{name}{layers}', {layers}, {rows}, **{kw!r})"
             for name, kw in MODELS.items() for layers, rows in ((2, 1), (4, 3))]
    return run(PRELUDE + "\n".join(lines) + "\n")


@pytest.mark.parametrize("name", list(MODELS))
def test_a_device_step_reads_nothing_back_and_copies_nothing_in(counts, name):
    for layers in (2, 4):
        for label in (f"{name}{layers}-first", f"{name}{layers}"):
            c = counts[label]
            assert c.syncs == [] and c.h2d == [], f"{label}: {c}"
            assert c.error is None, c.traceback or c.error


@pytest.mark.parametrize("name", list(MODELS))
def test_a_device_step_launches_at_most_the_budget_per_layer(counts, name):
    two, four = counts[f"{name}2"], counts[f"{name}4"]
    per_layer = (four.kernels - two.kernels) / 2
    assert per_layer <= BUDGET[name], f"{per_layer} per layer: {four.histogram()}"
    assert two.kernels - 2 * per_layer <= ONCE, str(two)
    # and the device step's own ops: no NaN scan, no mask built per layer, no copy of a cache
    ops = set(four.ops)
    assert not ops & {"aten.isfinite", "aten.isnan", "aten.sum", "aten.cat", "aten.clone",
                      "aten.copy_", "aten.masked_fill"}, sorted(ops)
