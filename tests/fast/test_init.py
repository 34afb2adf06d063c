"""The one place that decides where the speed layer applies (headwise.fast): the device rule,
the float32 kernel rule and the one NaN check, each against what it must refuse."""

import subprocess

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise import fast


def test_applies_takes_float32_cpu_tensors_with_nothing_to_differentiate():
    x, w = torch.randn(2, 3), torch.randn(3, 3)
    assert fast.applies(x, w) and fast.applies()
    assert not fast.applies(x, w.double()) and not fast.applies(x.bfloat16(), w)
    p = torch.randn(3, 3, requires_grad=True)
    assert not fast.applies(x, p)  # autograd would record a product the C kernels cannot
    assert fast.applies(x, p, autograd=True)  # a layout keeps the same parameter
    with torch.no_grad():
        assert fast.applies(x, p)
    assert not fast.applies(torch.randn(2, 3, device="meta"))


def test_host_and_applies_step_aside_under_torch_compile():
    seen = {}

    def f(x):
        seen.update(host=fast.host(x), applies=fast.applies(x), compiling=fast.compiling())
        return x + 1

    torch.compile(f, fullgraph=True, backend="eager")(torch.randn(3))
    assert seen == dict(host=False, applies=False, compiling=True)
    assert fast.host(torch.randn(3)) and not fast.compiling()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2), st.integers(0, 63), st.sampled_from([float("nan"), float("inf"),
                                                               -float("inf")]),
       st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), st.integers(0, 2**31))
def test_finite_finds_one_bad_value_anywhere_in_any_tensor(which, at, bad, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(4, 16, generator=g).to(dtype) for _ in range(3)]
    assert fast.finite(*ts) is True
    ts[which].view(-1)[at] = bad
    assert fast.finite(*ts) is False


def test_finite_does_not_overflow_on_large_finite_half_values():
    """The total is float32: fp16 values near their maximum sum to a finite float32."""
    t = torch.full((1024,), 60000.0, dtype=torch.float16)
    assert fast.finite(t, t) is True


def test_gpu_is_the_cuda_side_of_the_device_rule():
    from tests.fake_cuda import run
    assert not fast.gpu(torch.randn(3)) and not fast.gpu(torch.randn(3, device="meta"))
    assert not fast.gpu()
    counts = run('''
        from headwise import fast
        with counted("rule"):
            assert fast.gpu(cuda(3), cuda(2, dtype=torch.bfloat16))
            assert not fast.gpu(cuda(3), torch.empty(3, device="cpu"))
    ''')
    assert counts["rule"].error is None, counts["rule"].traceback


def test_finite_says_none_off_the_host():
    assert fast.finite(torch.randn(3, device="meta")) is None


def test_no_other_module_tests_a_device_or_compile_for_speed():
    """The rule lives here only: outside headwise/fast/__init__.py, no source line reads
    ``.is_cpu`` or ``is_compiling``, and none compares a tensor's device to "cpu" but the
    ones that name a device for a user (strict's reason, training's precision choice,
    load_gguf refusing q4=True off the CPU: its int4 kernel is torch's CPU one)."""
    src = fast.__file__.rsplit("/fast/", 1)[0]
    out = subprocess.run(["grep", "-rnE", r'\.is_cpu\b|is_compiling|device\.type ?[!=]= ?"cpu"',
                          src, "--include=*.py"], capture_output=True, text=True).stdout
    places = sorted({line.split(":")[0].split("/headwise/", 1)[1] for line in out.splitlines()})
    assert places == ["fast/__init__.py", "pretrained/gguf.py", "strict.py", "train/loop.py"], \
        places


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_reads_the_inputs_without_changing_them(dtype):
    t = torch.randn(5, 7).to(dtype)
    keep = t.clone()
    fast.finite(t)
    assert torch.equal(t, keep)
