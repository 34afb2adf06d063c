"""RoPE against an independent float64 reference (complex rotation of feature pairs (k, k+r/2)),
the relative-position property, partial rotary, and bad arguments."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headwise.rope import RotaryEmbedding, rotate_half


def reference_rope(x, offset, theta, r):
    """x (b, h, n, d) float64: pair (k, k + r/2) as the complex number x_k + i x_{k+r/2} and
    multiply by e^{i p theta^(-2k/r)}; features from r on are left alone."""
    out = x.clone()
    n = x.shape[2]
    for p in range(n):
        for k in range(r // 2):
            angle = (offset + p) * theta ** (-2 * k / r)
            z = complex(1.0, 0.0) * math.cos(angle) + 1j * math.sin(angle)
            a, b = x[:, :, p, k], x[:, :, p, k + r // 2]
            out[:, :, p, k] = a * z.real - b * z.imag
            out[:, :, p, k + r // 2] = a * z.imag + b * z.real
    return out


@given(n=st.integers(1, 6), half=st.integers(1, 4), extra=st.integers(0, 3),
       offset=st.integers(0, 300), theta=st.sampled_from([10000.0, 100000.0, 37.5]),
       seed=st.integers(0, 2**16))
def test_matches_float64_reference(n, half, extra, offset, theta, seed):
    torch.manual_seed(seed)
    r = 2 * half
    d = r + 2 * extra
    x = torch.randn(2, 3, n, d, dtype=torch.float64)
    rope = RotaryEmbedding(d, theta=theta, rotary_dim=r)
    got = rope(x, offset)
    torch.testing.assert_close(got, reference_rope(x, offset, theta, r), atol=1e-10, rtol=1e-10)
    # float32 inputs: the float64 angles cast once, so float32 rounding only
    torch.testing.assert_close(rope(x.float(), offset), got.float(), atol=2e-6, rtol=2e-6)


@given(p=st.integers(0, 200), q=st.integers(0, 200), shift=st.integers(0, 500),
       seed=st.integers(0, 2**16))
def test_scores_depend_on_relative_position_only(p, q, shift, seed):
    torch.manual_seed(seed)
    rope = RotaryEmbedding(8, theta=10000.0)
    a, b = torch.randn(2, 1, 1, 1, 8, dtype=torch.float64)
    s1 = (rope(a, p) * rope(b, q)).sum()
    s2 = (rope(a, p + shift) * rope(b, q + shift)).sum()
    torch.testing.assert_close(s1, s2, atol=1e-9, rtol=1e-9)


def test_rotate_half_and_norm_preserved():
    x = torch.arange(1.0, 9.0)
    assert rotate_half(x).tolist() == [-5.0, -6.0, -7.0, -8.0, 1.0, 2.0, 3.0, 4.0]
    y = torch.randn(2, 2, 5, 8, dtype=torch.float64)
    # a rotation keeps every head's length
    torch.testing.assert_close(RotaryEmbedding(8)(y, 9).norm(dim=-1), y.norm(dim=-1))


@pytest.mark.parametrize("kwargs, match", [
    (dict(head_dim=8, rotary_dim=5), "rotary_dim must be even"),
    (dict(head_dim=8, rotary_dim=10), r"rotary_dim must be even and in \(0, 8\]"),
    (dict(head_dim=8, theta=0.0), "theta must be > 0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kwargs)


@given(n=st.integers(1, 5), half=st.integers(1, 40), extra=st.integers(0, 3),
       offset=st.integers(0, 5000), seed=st.integers(0, 2**16))
def test_rotate_is_the_textbook_form_bit_for_bit(n, half, extra, offset, seed):
    """float32 rotate equals ``x * cos + rotate_half(x) * sin`` exactly (the order of Hugging
    Face's ``apply_rotary_pos_emb``), whole or partial rotary: the swapped halves times the
    signed sine are the same products."""
    torch.manual_seed(seed)
    r, d = 2 * half, 2 * half + extra
    rope = RotaryEmbedding(d, theta=10000.0, rotary_dim=r)
    x = torch.randn(2, 3, n, d) * 10
    pos = torch.arange(offset, offset + n, dtype=torch.float64)
    ang = torch.outer(pos, 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r))
    cos, sin = (torch.cat((t, t), -1).float() for t in (ang.cos(), ang.sin()))
    want = torch.cat((x[..., :r] * cos + rotate_half(x[..., :r]) * sin, x[..., r:]), -1)
    assert torch.equal(rope(x, offset), want)


@given(n=st.integers(1, 40), offset=st.integers(0, 100), seed=st.integers(0, 2**31 - 1))
def test_the_last_angles_are_kept_only_for_the_same_positions_and_mode(n, offset, seed):
    """The layers of one forward share one RotaryEmbedding, so its last answer is kept: asked
    again for the same positions it is the same tables; other positions, dtype or autograd mode
    get their own (equal to a fresh instance's); tables made under inference_mode never reach
    a forward that autograd records (it could not save them for the backward)."""
    rope, fresh = RotaryEmbedding(8, theta=500.0), RotaryEmbedding(8, theta=500.0)
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
    first = rope.angles(offset, n, x)
    assert all(a is b for a, b in zip(rope.angles(offset, n, x), first, strict=True))
    for args in ((offset + 1, n, x), (offset, n + 1, x), (offset, n, x.double())):
        for got, want in zip(rope.angles(*args), fresh.angles(*args), strict=True):
            assert torch.equal(got, want)
    rope.angles(offset, n, x)
    rope.theta = fresh.theta = 800.0  # (a changed base is a new table, not the kept one)
    assert torch.equal(rope.angles(offset, n, x)[1], fresh.angles(offset, n, x)[1])
    with torch.inference_mode():
        rope.angles(offset, n, x)
    q = x.clone().requires_grad_()
    rope.rotate(q.view(1, 1, n, 8), *rope.angles(offset, n, x)).square().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
