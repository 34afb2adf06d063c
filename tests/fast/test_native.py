"""headwise.fast.native: the C product for 1-4 rows equals float64 arithmetic on any shape, layout
and thread count it takes, declines what it cannot take, and says why when it cannot be built."""

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from headwise.fast import native as _native
from tests.fast.conftest import torch_threads


def _builds_here() -> bool:
    return (platform.machine().lower() in ("x86_64", "amd64")
            and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
            and shutil.which("cc") is not None)


def test_the_kernel_is_built_where_a_compiler_and_avx2_exist():
    assert (_native.status() == "ready") is _builds_here(), _native.status()


needs_kernel = pytest.mark.skipif(not _builds_here(), reason="no x86-64 AVX2 CPU or no cc")


@needs_kernel
@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 4), n_in=st.integers(1, 70), n_out=st.integers(1, 150),
       bias=st.booleans(), res=st.booleans(), threads=st.sampled_from([1, 2]),
       pad=st.integers(0, 9), seed=st.integers(0, 2**31 - 1), transposed=st.booleans())
@example(rows=1, n_in=37, n_out=70, bias=True, res=True, threads=2, pad=3, seed=5,
         transposed=True)
@example(rows=1, n_in=70, n_out=61, bias=False, res=True, threads=1, pad=0, seed=6,
         transposed=False)
def test_rows_matmul_equals_float64(rows, n_in, n_out, bias, res, threads, pad, seed,
                                    transposed):
    """Every row count, odd sizes (remainders of the 8-wide loops, of the row pairs and of
    one row's eight-row passes), padded row strides of x, W (or of W^T for one row: the
    transposed-storage kernel) and the residual, bias and residual each on or off, 1 or 2
    threads."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in + pad, generator=gen)[:, :n_in]
    wt = transposed and rows == 1  # W given as W^T (in, out), its rows padded
    w = (torch.randn(n_in, n_out + pad, generator=gen)[:, :n_out].t() if wt
         else torch.randn(n_out, n_in + pad, generator=gen)[:, :n_in])
    b = torch.randn(n_out, generator=gen) if bias else None
    r = torch.randn(rows, n_out + pad, generator=gen)[:, :n_out] if res else None
    want = x.double() @ w.double().t()
    want = want + (0 if b is None else b.double()) + (0 if r is None else r.double())
    with torch_threads(threads):
        got = _native.rows_matmul(x, w.t() if wt else w, b, r, wt=wt)
    assert got is not None and got.shape == (rows, n_out) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-5 * (n_in ** 0.5 + 1), rtol=1e-6)


@needs_kernel
def test_a_joined_matrix_block_is_read_through_its_view():
    """The step multiplies views of one storage (q/k/v joined): a block of rows is taken in
    place, and the rows outside it are never read into the result."""
    w = torch.randn(30, 16)
    x = torch.randn(3, 16)
    torch.testing.assert_close(_native.rows_matmul(x, w[10:20]), x @ w[10:20].t(),
                               atol=1e-5, rtol=0)


@needs_kernel
@pytest.mark.parametrize("case", ["float64", "five rows", "strided features", "grad",
                                  "bias shape", "residual shape", "two rows of a W^T"])
def test_what_the_kernel_cannot_take_is_declined(case):
    x, w = torch.randn(2, 8), torch.randn(6, 8)
    args = dict(x=x, w=w)
    if case == "float64":
        args.update(x=x.double(), w=w.double())
    elif case == "five rows":
        args.update(x=torch.randn(5, 8))
    elif case == "strided features":
        args.update(w=torch.randn(6, 16)[:, ::2])
    elif case == "grad":
        args.update(w=w.requires_grad_())
    elif case == "bias shape":
        args.update(bias=torch.randn(5))
    elif case == "two rows of a W^T":  # (the transposed-storage kernel takes one row)
        args.update(w=torch.randn(8, 6), wt=True)
    else:
        args.update(res=torch.randn(2, 5))
    assert _native.rows_matmul(**args) is None


def test_no_kernel_says_why_and_declines(monkeypatch, tmp_path):
    """Switched off by the environment, or a compiler that fails: the status names the reason
    and every call is declined (the caller's MKL path runs); nothing is left in the cache."""
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setenv("HEADWISE_NATIVE", "0")
    assert _native.status() == "HEADWISE_NATIVE=0"
    assert _native.rows_matmul(torch.randn(2, 8), torch.randn(6, 8)) is None
    if not _builds_here():
        return
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.delenv("HEADWISE_NATIVE")
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", shutil.which("false") or "false")
    assert "failed" in _native.status()
    assert _native.rows_matmul(torch.randn(2, 8), torch.randn(6, 8)) is None
    assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*"))


@needs_kernel
def test_a_fresh_cache_builds_once_and_loads(monkeypatch, tmp_path):
    """A new cache directory: the first status builds the library there (one file, named by
    the source's hash), and the product it loads is right."""
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path))
    assert _native.status(wait=_native.BUILD_TIMEOUT_S) == "ready"
    built = sorted(tmp_path.iterdir())  # the library and its stamp
    assert [p.name.startswith("step_kernels-") for p in built] == [True, True]
    assert built[0].suffix == ".so" and built[1].name == built[0].name + ".stamp"
    x, w = torch.randn(4, 40), torch.randn(24, 40)
    torch.testing.assert_close(_native.rows_matmul(x, w), x @ w.t(), atol=1e-5, rtol=0)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), heads=st.integers(1, 6), half=st.integers(1, 12),
       extra=st.integers(0, 5), tail=st.integers(0, 9), pos=st.integers(0, 500),
       bad=st.sampled_from([None, float("nan"), float("inf"), -float("inf")]),
       seed=st.integers(0, 2**31 - 1))
def test_rope_rows_is_rotate_bit_for_bit_and_reports_finiteness(rows, heads, half, extra, tail,
                                                                pos, bad, seed):
    """Partial rotary (``r < d``), value features after the q/k heads, any position: the turned
    heads equal RotaryEmbedding.rotate bit for bit, everything else is untouched, and the answer
    says whether every feature of every row is finite (a NaN or inf anywhere, v included)."""
    from headwise.rope import RotaryEmbedding
    gen = torch.Generator().manual_seed(seed)
    r, d = 2 * half, 2 * half + extra
    rope = RotaryEmbedding(d, theta=10000.0, rotary_dim=r)
    cos, sin = rope.angles(pos, 1, torch.empty(0))
    x = torch.randn(rows, heads * d + tail, generator=gen) * 3
    if bad is not None:
        x.view(-1)[int(torch.randint(0, x.numel(), (1,), generator=gen))] = bad
    want = rope.rotate(x[:, :heads * d].reshape(rows, heads, 1, d), cos, sin).reshape(rows, -1)
    got = x.clone()
    finite = _native.rope_rows(got, cos, sin, heads, d, r)
    assert finite is bool(torch.isfinite(got).all())
    assert finite is (bad is None)
    torch.testing.assert_close(got[:, :heads * d], want, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(got[:, heads * d:], x[:, heads * d:], atol=0, rtol=0,
                               equal_nan=True)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), m=st.integers(1, 700), eps=st.sampled_from([1e-6, 1e-5, 0.1]),
       seed=st.integers(0, 2**31 - 1))
def test_rms_rows_equals_float64_rms_norm(rows, m, eps, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, m, generator=gen) * 2, torch.randn(m, generator=gen)
    want = torch.rms_norm(x.double(), (m,), w.double(), eps)
    torch.testing.assert_close(_native.rms_rows(x, w, eps).double(), want, atol=2e-6, rtol=1e-6)


@needs_kernel
def test_rope_and_rms_rows_decline_what_they_cannot_take():
    from headwise.rope import RotaryEmbedding
    cos, sin = RotaryEmbedding(8).angles(0, 1, torch.empty(0))
    assert _native.rope_rows(torch.randn(2, 16).double(), cos, sin, 2, 8, 8) is None
    assert _native.rope_rows(torch.randn(2, 15), cos, sin, 2, 8, 8) is None  # too narrow
    assert _native.rope_rows(torch.randn(16, 2).t(), cos, sin, 2, 8, 8) is None  # strided
    assert _native.rms_rows(torch.randn(2, 8), torch.randn(7), 1e-5) is None
    assert _native.rms_rows(torch.randn(2, 8, requires_grad=True), torch.randn(8), 1e-5) is None


def _attention64(q, k, v):
    """float64 softmax(q k^T / sqrt(d)) v with each key/value head shared by h / g query heads."""
    per = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(per, 1) for t in (k, v))
    s = q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return (s.softmax(-1) @ v).reshape(q.shape[0], -1)


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 4), g=st.integers(1, 3), per=st.integers(1, 7), n=st.integers(1, 70),
       d=st.sampled_from([1, 5, 8, 12, 64, 72, 130]), start=st.integers(0, 6),
       spread=st.sampled_from([0.1, 1.0, 6.0]), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1))
def test_attend_rows_equals_float64_attention(rows, g, per, n, d, start, spread, threads, seed):
    """One query per row over n cached positions: every head grouping (g key/value heads, each
    shared by ``per`` query heads), head sizes below, at and past the 64-feature register
    block, cache views that start later (a sliding window) and end before the buffer does,
    the query a view of a fused q|k|v row, scores from flat to sharply peaked (the exp
    polynomial over its range), 1 or 2 threads."""
    gen = torch.Generator().manual_seed(seed)
    h, length = g * per, start + n + 3
    row = torch.randn(rows, (h + 2 * g) * d, generator=gen) * spread
    q = row[:, :h * d].view(rows, h, 1, d)
    kc, vc = (torch.randn(rows, g + 1, length, d, generator=gen) for _ in range(2))
    k, v = kc[:, :g, start:start + n], vc[:, :g, start:start + n]
    with torch_threads(threads):
        got = _native.attend_rows(q, k, v)
    assert got is not None and got.shape == (rows, h * d)
    # float32 scores carry ~2^-24 of their size into the exponent: the tolerance scales with the
    # largest score (over 3000 draws the kernel's error reached 2.1e-7 of 1 + max |score|,
    # F.scaled_dot_product_attention's own 2.8e-7)
    per_q = k.double().repeat_interleave(per, 1)
    top = float((q.double() @ per_q.transpose(-1, -2)).abs().max()) / d ** 0.5
    torch.testing.assert_close(got.double(), _attention64(q, k, v), atol=1e-6 * (1 + top),
                               rtol=0)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16]), rows=st.integers(1, 4),
       g=st.integers(1, 3), per=st.integers(2, 7), n=st.integers(1, 90),
       d=st.sampled_from([8, 12, 64, 72, 130]), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1))
def test_attend_rows_gives_each_head_what_it_gets_alone(dtype, rows, g, per, n, d, threads,
                                                        seed):
    """The kernel reads a key/value head once for up to three of the query heads that share it;
    each head's output is still, bit for bit, the one it gets as the only query head of its
    key/value head (so the grouping, and how rows and groups are split between threads, never
    changes a value)."""
    gen = torch.Generator().manual_seed(seed)
    h = g * per
    q = torch.randn(rows, h, 1, d, generator=gen).to(dtype)
    kc, vc = (torch.randn(rows, g, n + 4, d, generator=gen).to(dtype) for _ in range(2))
    k, v = kc[:, :, 2:2 + n], vc[:, :, 2:2 + n]
    with torch_threads(threads):
        together = _native.attend_rows(q, k, v)
        alone = [_native.attend_rows(q[:, t:t + 1], k[:, t // per:t // per + 1],
                                     v[:, t // per:t // per + 1]) for t in range(h)]
    assert together is not None and all(a is not None for a in alone)
    assert torch.equal(together, torch.cat(alone, 1))


@needs_kernel
@pytest.mark.parametrize("case", ["two queries", "heads not grouped", "float64", "grad",
                                  "strided query heads", "k and v strides differ"])
def test_attend_rows_declines_what_it_cannot_take(case):
    q, k, v = torch.randn(2, 6, 1, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    if case == "two queries":
        q = torch.randn(2, 6, 2, 8)
    elif case == "heads not grouped":
        k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    elif case == "float64":
        q, k, v = q.double(), k.double(), v.double()
    elif case == "grad":
        q.requires_grad_()
    elif case == "strided query heads":
        q = torch.randn(2, 6, 1, 16)[..., :8]
    else:
        v = torch.randn(2, 3, 8, 5).transpose(-1, -2)
    assert _native.attend_rows(q, k, v) is None


HANGING_CC = """#!/bin/sh
# a compiler that never finishes, with a child of its own (like cc1): both pids recorded
sleep 600 &
echo $$ $! >> "{pids}"
wait
"""


def _hanging_cc(tmp_path):
    pids = tmp_path / "pids"
    cc = tmp_path / "cc"
    cc.write_text(HANGING_CC.format(pids=pids))
    cc.chmod(0o755)
    return cc, pids


def _hanging_build(monkeypatch, tmp_path, wait_s: float, timeout_s: float):
    """A fresh native state whose next build runs a hanging ``$CC`` (into a cache of its own),
    first calls waiting ``wait_s`` and the build killed after ``timeout_s``: ``(cc, pids)``."""
    cc, pids = _hanging_cc(tmp_path)
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setattr(_native, "WAIT_S", wait_s)
    monkeypatch.setattr(_native, "BUILD_TIMEOUT_S", timeout_s)
    monkeypatch.setenv("HEADWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(cc))
    return cc, pids


def _gone(pids_file, seconds=10.0) -> bool:
    """Every recorded pid has exited (absent, or a zombie waiting for init)."""
    deadline = time.monotonic() + seconds
    pids = [int(p) for p in pids_file.read_text().split()]
    while time.monotonic() < deadline:
        states = []
        for pid in pids:
            try:
                states.append(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0])
            except OSError:
                states.append("gone")
        if all(s in ("gone", "Z") for s in states):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path("/proc").is_dir() or platform.machine().lower() not in (
    "x86_64", "amd64"), reason="needs Linux /proc and an x86-64 CPU")
def test_a_hanging_compiler_costs_the_first_call_wait_s_and_is_killed_with_its_children(
        monkeypatch, tmp_path):
    """A hung ``$CC`` blocked every process's first generation for the 300 s build timeout
    and left its children running. Now the first call waits WAIT_S, takes the torch path, and
    the compiler's whole process group is killed at BUILD_TIMEOUT_S."""
    cc, pids = _hanging_build(monkeypatch, tmp_path, 0.5, 3)
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("no AVX2: the kernel is never built here")
    start = time.monotonic()
    assert _native.rows_matmul(torch.randn(2, 8), torch.randn(6, 8)) is None
    assert time.monotonic() - start < 5  # WAIT_S (0.5 s) and the load, not the build
    assert "still building" in _native._state["why"]
    assert "did not finish within 3 s (killed with its children)" in _native.status(wait=10)
    assert _gone(pids)
    assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*"))


GENERATE = """
import time
import torch
from headwise.decoding import generate
from headwise.fast import native
from headwise.models import LMConfig, TransformerLM
lm = TransformerLM(LMConfig(vocab_size=11, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                            max_len=32)).eval()
start = time.monotonic()
with torch.no_grad():
    generate(lm, torch.tensor([[1, 2, 3]]), max_new_tokens=4)
print(round(time.monotonic() - start, 2), native._state.get("why"))
"""


@pytest.mark.skipif(not Path("/proc").is_dir() or platform.machine().lower() not in (
    "x86_64", "amd64") or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
    reason="needs Linux /proc and an x86-64 AVX2 CPU (else no build is tried)")
def test_generation_starts_within_10_s_with_a_hanging_cc_and_exit_kills_it(tmp_path):
    """The issue's case end to end, in a fresh process: its first generation finishes within
    10 s although ``$CC`` hangs, and when the process exits the compiler and its child go."""
    cc, pids = _hanging_cc(tmp_path)
    env = {**os.environ, "CC": str(cc), "HEADWISE_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", GENERATE], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seconds, why = run.stdout.split(" ", 1)
    assert float(seconds) < 10 and "still building" in why, run.stdout
    assert _gone(pids)
