"""The GPU's statistics kernel (headwise.fast.stats_triton) run by Triton's interpreter on CPU
tensors, against float64 references; the same kernel on CUDA is checked in
tests/gpu/test_stats.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

_INTERPRETED = r'''
import sys, torch
import headwise as hw
from headwise import masks, weights as W
from headwise.fast import stats_triton as T
from tests.attend.test_init import make_mask
from tests.reference import reference_attention
from tests.test_stats import stats_from_full_weights

bad = []
cases = [  # b, g, r, nq, nk, d, mask kind, causal, ids, lse, top_k, dtype, seed
    (2, 2, 2, 70, 90, 16, "none", True, True, False, 5, torch.float32, 0),
    (1, 1, 3, 130, 40, 32, "padding", True, True, True, 16, torch.float32, 1),
    (2, 2, 1, 33, 33, 8, "per_query", False, True, True, 3, torch.float32, 2),
    (1, 1, 2, 65, 65, 24, "full_bool", True, False, False, 1, torch.float32, 3),
    (2, 1, 2, 40, 70, 16, "float", False, True, False, 7, torch.float32, 4),
    (1, 2, 1, 50, 50, 16, "dead_rows", True, True, True, 9, torch.float32, 5),
    (1, 2, 2, 20, 6, 8, "none", True, True, False, 6, torch.float32, 6),   # top_k = every key
    (1, 2, 2, 80, 80, 64, "padding", True, True, False, 5, torch.float16, 7),
]
for b, g, r, nq, nk, d, kind, causal, with_ids, with_lse, top_k, dtype, seed in cases:
    gen = torch.Generator().manual_seed(seed)
    h = g * r
    q = torch.randn(b, h, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, g, nk, d, generator=gen).to(dtype)
    mask = make_mask(kind, b, h, nq, nk, gen)
    ids = torch.randint(0, 4, (b, nk), generator=gen) if with_ids else None
    lse = W.logsumexp(q.float(), k.float(), mask=mask, causal=causal) if with_lse else None
    qd, kd = q.double(), k.double()
    _, w = reference_attention(qd, kd, kd, mask, causal)
    want = stats_from_full_weights(w, nq, nk, ids, min(top_k, nk))
    got = T.head_stats(q, k, mask=masks.as_4d(mask), causal=causal, scale=None, lse=lse,
                       token_ids=ids, top_k=min(top_k, nk))
    tol = 2e-5 if dtype == torch.float32 else 1e-4
    for name, ref in want.items():
        err = (got[name].double() - ref).abs() - tol * (1 + ref.abs())
        if err.max() > 0:
            bad.append(f"case {seed} {name}: off by {(got[name].double() - ref).abs().max():.3g}")
    picked = w.gather(-1, got["top_keys"])
    if (picked - got["top_values"].double()).abs().max() > tol:
        bad.append(f"case {seed}: top_keys do not hold top_values")
    if got["top_keys"].min() < 0 or got["top_keys"].max() >= nk:
        bad.append(f"case {seed}: top_keys out of range")
    if not torch.equal(got["live"], w.sum(-1) > 0.5):
        bad.append(f"case {seed}: live")
    if (want["induction"] is None) != (got["induction"] is None) if "induction" in want else \
            got["induction"] is not None:
        bad.append(f"case {seed}: induction presence")
print("\n".join(bad) or "all equal")
sys.exit(1 if bad else 0)
'''


def test_the_triton_kernel_equals_float64_reference_in_the_interpreter():
    """The GPU's Triton kernel (fast.stats_triton), run by Triton's interpreter on CPU tensors
    (TRITON_INTERPRET=1, a fresh process: it must be set before triton is imported): every
    mask kind, causal with nq != nk (rows that see no key), grouped heads, with and without
    token ids and a given LSE, top_k from 1 to 16 and equal to the key count; float32 and
    float16 (the interpreter's bfloat16 dot is wrong, so bfloat16 is checked on a GPU only:
    tests/gpu/test_stats.py)."""
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _INTERPRETED], cwd=root,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all equal" in done.stdout


@pytest.mark.parametrize("dtype, variant", [
    ("bf16", dict(HAS_LSE=False, MASK=2, CAUSAL=True, IDS=True, TOP_K=16, KP=16)),
    ("fp32", dict(HAS_LSE=True, MASK=1, CAUSAL=False, IDS=False, TOP_K=1, KP=1)),
], ids=["bf16-lse-pass-additive-causal-ids", "fp32-given-lse-bool"])
def test_the_kernel_compiles_for_an_h100_without_one(dtype, variant):
    """Triton's compiler (source -> TTIR -> PTX -> cubin for sm_90) runs without a GPU: it
    rejects what its interpreter accepts (Python semantics) but a GPU would not, e.g. branches
    whose sides give a variable different types. Two variants take every constexpr branch
    (~5 s each here)."""
    pytest.importorskip("triton")
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from headwise.fast import stats_triton as T
    params = list(inspect.signature(T._stats_kernel.fn).parameters)
    pointers = {"q_ptr": "*" + dtype, "k_ptr": "*" + dtype, "mask_ptr": "*i8", "ids_ptr": "*i64",
                "live_ptr": "*i8", "topi_ptr": "*i64"}
    const = dict(variant, PREC="ieee" if dtype == "fp32" else "tf32", BLOCK_M=64, BLOCK_N=64,
                 BLOCK_D=64)
    signature = {p: "constexpr" if p in const else pointers.get(p, "*fp32")
                 if p.endswith("_ptr") else "fp32" if p == "qk_scale" else "i32"
                 for p in params}
    if variant["MASK"] == 2:
        signature["mask_ptr"] = "*fp32"
    source = ASTSource(T._stats_kernel, signature,
                       constexprs={(params.index(k),): v for k, v in const.items()})
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4})
    except RuntimeError as e:  # no CUDA toolchain in this triton build: nothing to check
        if "ptxas" in str(e) or "backend" in str(e).lower():
            pytest.skip(f"triton cannot build for CUDA here: {e}")
        raise
    assert "cubin" in compiled.asm
