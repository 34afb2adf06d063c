"""The Triton weights kernel against float64, on the CPU under Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before ``triton.jit`` decorates the kernel, so every case
runs in one child process (a module-scoped fixture) that prints its results as JSON. The
interpreter computes ``tl.dot`` of bfloat16 tiles wrongly (1e10 off on a 16x16 product, a
numpy limitation), so bfloat16 is checked on a GPU only (tests/gpu/test_weights.py); float32
and float16 run here.
"""

from __future__ import annotations

import pytest

from tests.triton_child import run_interpreted

triton = pytest.importorskip("triton")

_CHILD = r'''
import json, math, os, sys
import torch
from headwise.fast.triton_weights import select_and_launch

torch.manual_seed(int(sys.argv[1]))
out = {}


def reference(q, k, mask, causal, scale):
    """float64 weights and LSE: masked -> 0, fully masked rows -> 0, then the NaN policy."""
    b, h, nq, d = q.shape
    g, nk = k.shape[1], k.shape[2]
    kk = k.double().repeat_interleave(h // g, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    if causal:
        i, j = torch.arange(nq)[:, None], torch.arange(nk)[None]
        s = s.masked_fill(j > i + (nk - nq), -math.inf)
    lse = torch.logsumexp(s, -1)
    w = torch.exp(s - lse[..., None]).nan_to_num(nan=0.0)
    bad = ~torch.isfinite(q.double().sum(-1, keepdim=True)) \
        | ~torch.isfinite(kk.sum((-2, -1)))[..., None, None]
    return w.masked_fill(bad, math.nan), lse


def pick(w, heads, rows, keys):
    for dim, ix in ((1, heads), (2, rows), (3, keys)):
        w = w.narrow(dim, ix.start, ix.stop - ix.start) if isinstance(ix, slice) \
            else w.index_select(dim, ix)
    return w


def err(a, ref):
    a = a.double()
    same_nan = bool((a.isnan() == ref.isnan()).all())
    diff = (a - ref).nan_to_num(0.0).abs().max().item() if a.numel() else 0.0
    return {"err": diff, "nan_match": same_nan, "shape": list(a.shape)}


for dt in ("float32", "float16"):
    dtype = getattr(torch, dt)
    for b, h, g, nq, nk, d in ((2, 4, 2, 37, 70, 24), (1, 3, 1, 5, 130, 64), (1, 2, 2, 65, 65, 16)):
        q = torch.randn(b, h, nq, d).to(dtype)
        k = torch.randn(b, g, nk, d).to(dtype)
        bool_mask = torch.rand(b, 1, nq, nk) > 0.3
        bool_mask[0, 0, 1] = False                                 # a fully masked row
        add_mask = torch.randn(h, nq, nk).to(dtype)
        add_mask[:, 2, :3] = -math.inf
        scale = d ** -0.5
        for mname, m4 in (("none", None), ("bool", bool_mask), ("additive", add_mask[None])):
            for causal in (False, True):
                ref, lse = reference(q, k, m4, causal, scale)
                sels = {
                    "all": (slice(0, h), slice(0, nq), slice(0, nk)),
                    "one head": (slice(h - 1, h), slice(0, nq), slice(0, nk)),
                    "last rows": (slice(0, h), slice(nq - 3, nq), slice(0, nk)),
                    "key range": (slice(0, h), slice(0, nq), slice(1, nk - 2)),
                    "scattered": (torch.tensor([h - 1, 0]), torch.tensor([nq - 1, 0, 2]),
                                  torch.tensor([4, 0, nk - 1])),
                }
                for sname, (hs, rs, ks) in sels.items():
                    w = select_and_launch(q, k, lse.float(), mask=m4, causal=causal,
                                          scale=scale, heads=hs, rows=rs, keys=ks)
                    key = f"{dt} {b},{h},{g},{nq},{nk},{d} {mname} causal={causal} {sname}"
                    out[key] = {**err(w, pick(ref, hs, rs, ks)), "dtype": str(w.dtype)}

# fully masked rows: whatever LSE the kernel reported (flash +inf, others -inf), zeros
q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
m = torch.ones(1, 1, 8, 8, dtype=torch.bool)
m[..., 3, :] = False
full = (slice(0, 2), slice(0, 8), slice(0, 8))
for lse_value in (math.inf, -math.inf, math.nan):
    _, lse = reference(q, k, m, False, 0.25)
    lse[..., 3] = lse_value
    w = select_and_launch(q, k, lse.float(), mask=m, causal=False, scale=0.25,
                          heads=full[0], rows=full[1], keys=full[2])
    out[f"dead row lse={lse_value}"] = {"row": w[..., 3, :].abs().max().item(),
                                        "rest_finite": bool(w.isfinite().all())}

# NaN policy: a NaN query row -> that row NaN (masked entries too); a NaN key at a masked
# position -> every weight of its head NaN, the other heads untouched
q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
m = torch.ones(1, 1, 8, 8, dtype=torch.bool)
m[..., 5] = False
q[0, 0, 2, 3] = math.nan
k[0, 1, 5, 0] = math.nan
ref, lse = reference(q, k, m, True, 0.25)
w = select_and_launch(q, k, lse.float(), mask=m, causal=True, scale=0.25,
                      heads=full[0], rows=full[1], keys=full[2])
out["nan policy"] = {**err(w, ref), "row": bool(w[0, 0, 2].isnan().all()),
                     "others in head 0": bool(w[0, 0, [0, 1, 3, 4, 5, 6, 7]].isfinite().all()),
                     "head 1": bool(w[0, 1].isnan().all())}
print("@@" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def results():
    return run_interpreted(_CHILD)


# The kernel reads the inputs as given (float32 products of float16 values are exact) and
# accumulates in float32 over d <= 64 terms: ~1e-6 relative on the scores, then exp and one
# rounding to the output dtype (float32: 6e-8 relative; float16: 2^-11 = 4.9e-4 relative, on
# weights <= 1).
TOLERANCE = {"float32": 2e-6, "float16": 1e-3}


def test_every_selection_mask_and_dtype_matches_float64(results):
    res, seed = results
    cases = {k: v for k, v in res.items() if k.startswith(("float32", "float16"))}
    assert len(cases) == 2 * 3 * 3 * 2 * 5
    for name, r in cases.items():
        dt = name.split()[0]
        assert r["nan_match"], (seed, name)
        assert r["err"] <= TOLERANCE[dt], (seed, name, r)
        assert r["dtype"] == f"torch.{dt}", (seed, name)


def test_selections_have_the_shape_asked_for(results):
    res, _ = results
    assert res["float32 2,4,2,37,70,24 none causal=False all"]["shape"] == [2, 4, 37, 70]
    assert res["float32 2,4,2,37,70,24 none causal=False one head"]["shape"] == [2, 1, 37, 70]
    assert res["float32 2,4,2,37,70,24 none causal=False last rows"]["shape"] == [2, 4, 3, 70]
    assert res["float32 2,4,2,37,70,24 none causal=False key range"]["shape"] == [2, 4, 37, 67]
    assert res["float32 2,4,2,37,70,24 none causal=False scattered"]["shape"] == [2, 2, 3, 3]


@pytest.mark.parametrize("lse", ["inf", "-inf", "nan"])
def test_a_fully_masked_row_gets_zeros_whatever_lse_the_kernel_reported(results, lse):
    r = results[0][f"dead row lse={float(lse)}"]
    assert r["row"] == 0.0 and r["rest_finite"]


def test_the_nan_policy_poisons_the_query_row_and_the_head_of_a_nan_key(results):
    r = results[0]["nan policy"]
    assert r["row"] and r["others in head 0"] and r["head 1"] and r["nan_match"]
    assert r["err"] <= 2e-6


def _compile_for_h100(dtype: str, mask: int, causal: bool, idx: bool, aligned: bool = True):
    """The kernel compiled ahead of time for sm_90 (an H100) on this CPU machine: triton's
    wheel carries ptxas, and compiling needs no device. ``aligned``: the pointers and the key
    count divisible by 16, as the JIT specialises them for torch's allocations and a key
    count divisible by 16."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from headwise.fast.triton_weights import _weights_kernel as kernel
    names = kernel.arg_names
    ptr = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}[dtype]
    const = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_D": 64, "MASK": mask, "CAUSAL": causal,
             "ROW_IDX": idx, "KEY_IDX": idx, "IEEE": dtype == "float32",
             "sq3": 1, "sk3": 1, "sm3": 1}
    types = {"Q": ptr, "K": ptr, "W": ptr, "LSE": "*fp32", "KSUM": "*fp32", "M": "*u8",
             "RP": "*i64", "KP": "*i64", "scale": "fp32"}
    signature = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]]
             for n in ("Q", "K", "W", "LSE", "NJ")} if aligned else {}
    src = ASTSource(fn=kernel, signature=signature,
                    constexprs={(names.index(n),): v for n, v in const.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


@pytest.mark.parametrize("dtype, mask, causal, idx", [
    ("bfloat16", 0, False, False), ("float32", 2, True, True)])
def test_the_kernel_compiles_for_an_h100_with_tensor_cores_and_wide_stores(dtype, mask, causal,
                                                                           idx):
    """What the interpreter cannot show: the GPU compile of each variant, ``q k^T`` on the
    tensor cores (wgmma on sm_90; float32 as IEEE products), and the weights stored 16 bytes
    at a time (the kernel is bound by that store)."""
    pytest.importorskip("triton.backends.nvidia")
    try:
        compiled = _compile_for_h100(dtype, mask, causal, idx)
    except (TypeError, AttributeError) as e:  # triton's AOT API moves between releases
        pytest.skip(f"triton {triton.__version__}: ASTSource/compile API differs ({e})")
    ptx = compiled.asm["ptx"]
    if dtype != "float32":
        assert "wgmma.mma_async" in ptx, "q k^T left the tensor cores"
    assert "st.global.v4" in ptx or "st.global.v2" in ptx, "scalar stores of the weights"
