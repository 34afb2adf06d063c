"""The attention core against an independent float64 reference, on every backend and mask."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw

BACKENDS = ["eager", "sdpa"]
MASK_KINDS = ["none", "padding", "per_query", "full_bool", "float", "dead_rows"]


def make_mask(kind, b, h, nq, nk, gen):
    if kind == "none":
        return None
    if kind == "padding":  # (b, 1, 1, j); at least one valid key per row
        lens = torch.randint(1, nk + 1, (b,), generator=gen)
        return hw.masks.from_valid_lens(lens, nk)
    if kind == "per_query":  # (b, 1, i, j)
        lens = torch.randint(0, nk + 1, (b, nq), generator=gen)
        return hw.masks.from_valid_lens(lens, nk, nq)
    if kind == "full_bool":  # (b, h, i, j) random
        return torch.rand(b, h, nq, nk, generator=gen) > 0.3
    if kind == "float":  # additive, with some -inf
        m = torch.randn(b, 1, nq, nk, generator=gen)
        return m.masked_fill(torch.rand(b, 1, nq, nk, generator=gen) > 0.7, float("-inf"))
    if kind == "dead_rows":  # whole query rows with no key at all
        m = torch.rand(b, h, nq, nk, generator=gen) > 0.3
        m[:, :, torch.randint(0, nq, (1,), generator=gen)] = False
        return m
    raise AssertionError(kind)


configs = st.fixed_dictionaries({
    "b": st.integers(1, 3), "g": st.integers(1, 3), "r": st.integers(1, 3),
    "nq": st.integers(1, 9), "nk": st.integers(1, 9), "d": st.sampled_from([4, 8, 16]),
    "e": st.sampled_from([4, 8, 16]), "mask": st.sampled_from(MASK_KINDS),
    "causal": st.booleans(), "seed": st.integers(0, 2**31 - 1),
})


def draw_inputs(cfg):
    """q (b, h, i, d), k (b, g, j, d), v (b, g, j, e) and a mask of the drawn kind."""
    gen = torch.Generator().manual_seed(cfg["seed"])
    b, g, h, nq, nk = cfg["b"], cfg["g"], cfg["g"] * cfg["r"], cfg["nq"], cfg["nk"]
    q = torch.randn(b, h, nq, cfg["d"], generator=gen)
    k = torch.randn(b, g, nk, cfg["d"], generator=gen)
    v = torch.randn(b, g, nk, cfg["e"], generator=gen)
    return q, k, v, make_mask(cfg["mask"], b, h, nq, nk, gen)


@given(cfg=configs)
def test_weights_rows_sum_to_one_and_masked_keys_get_exactly_zero(cfg):
    q, k, v, mask = draw_inputs(cfg)
    b, h, nq, nk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    out, w = hw.attention(q, k, v, mask=mask, causal=cfg["causal"], return_weights=True)
    blocked = torch.zeros(b, h, nq, nk, dtype=torch.bool)
    if mask is not None:
        blocked |= (~mask if mask.dtype == torch.bool else torch.isneginf(mask)).expand_as(blocked)
    if cfg["causal"]:
        blocked |= ~hw.masks.causal(nq, nk)
    assert (w[blocked] == 0).all()
    dead = blocked.all(-1)
    sums = w.sum(-1)
    torch.testing.assert_close(sums[~dead], torch.ones_like(sums[~dead]))
    assert (sums[dead] == 0).all()
    assert (out.transpose(1, 2)[dead.transpose(1, 2)] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask_kind", ["none", "padding", "float", "dead_rows"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_float64(backend, mask_kind, causal):
    gen = torch.Generator().manual_seed(0)
    b, h, g, nq, nk, d = 2, 4, 2, 3, 4, 3
    q = torch.randn(b, h, nq, d, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(b, g, nk, d, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(b, g, nk, d, dtype=torch.float64, generator=gen, requires_grad=True)
    mask = make_mask(mask_kind, b, h, nq, nk, gen)
    if mask is not None and mask.is_floating_point():
        mask = mask.double()

    def f(q, k, v):
        return hw.attention(q, k, v, mask=mask, causal=causal, backend=backend)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_have_finite_zero_gradients(backend):
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[0, :, 2] = False
    out, _ = hw.attention(q, k, v, mask=mask, backend=backend)
    assert (out[0, :, 2] == 0).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[0, :, 2] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nq,nk", [(6, 6), (3, 7)])
def test_causality_proven_by_gradients(backend, nq, nk):
    """Output i must not depend on any key/value later than i (bottom-right aligned)."""
    q = torch.randn(1, 2, nq, 4, requires_grad=True)
    k = torch.randn(1, 2, nk, 4, requires_grad=True)
    v = torch.randn(1, 2, nk, 4, requires_grad=True)
    pad = hw.masks.from_valid_lens(torch.tensor([nk]), nk)
    for i in range(nq):
        out, _ = hw.attention(q, k, v, mask=pad, causal=True, backend=backend)
        (gk, gv) = torch.autograd.grad(out[:, :, i].sum(), (k, v))
        last_visible = i + nk - nq
        assert (gk[:, :, last_visible + 1:] == 0).all()
        assert (gv[:, :, last_visible + 1:] == 0).all()
        assert gv[:, :, : last_visible + 1].abs().sum() > 0


def test_dropout_is_applied_only_when_asked():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    base, _ = hw.attention(q, k, v)
    torch.manual_seed(0)
    dropped, _ = hw.attention(q, k, v, dropout_p=0.5)
    assert not torch.allclose(base, dropped)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(q=torch.randn(2, 4, 3)), ValueError, "4-D"),
    (dict(k=torch.randn(3, 2, 5, 8)), ValueError, "batch sizes differ"),
    (dict(k=torch.randn(2, 3, 5, 8), v=torch.randn(2, 3, 5, 8)), ValueError, "multiple of g"),
    (dict(k=torch.randn(2, 2, 5, 7)), ValueError, "head dim"),
    (dict(mask=torch.ones(2, 1, 1, 5, dtype=torch.int64)), TypeError, "bool"),
    (dict(mask=torch.ones(2, 1, 1, 6, dtype=torch.bool)), ValueError, "broadcast"),
    (dict(backend="flash9"), ValueError, "unknown backend"),
    (dict(q=torch.randint(0, 3, (2, 4, 3, 8))), TypeError, "floating"),
])
def test_bad_input_errors(kwargs, error, match):
    args = dict(q=torch.randn(2, 4, 3, 8), k=torch.randn(2, 2, 5, 8), v=torch.randn(2, 2, 5, 8))
    args.update(kwargs)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(error, match=match):
        hw.attention(q, k, v, **args)


