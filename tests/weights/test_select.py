"""Weights recomputed from the log-sum-exp (headwise.weights): selections, gradients, errors."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
from tests.attend.test_init import configs, draw_inputs

selections = st.fixed_dictionaries({
    "heads": st.one_of(st.none(), st.integers(-1, 0), st.lists(st.integers(0, 8), min_size=1,
                                                               max_size=3)),
    "rows": st.one_of(st.none(), st.integers(0, 8), st.builds(slice, st.integers(-9, 3),
                                                              st.none(), st.sampled_from([1, 2]))),
    "keys": st.one_of(st.none(), st.lists(st.integers(0, 8), min_size=1, max_size=4),
                      st.builds(slice, st.integers(0, 2), st.integers(3, 9))),
})


def _valid(sel, h, nq, nk):
    heads = sel["heads"]
    if isinstance(heads, list):
        sel = {**sel, "heads": [x % h for x in heads]}
    if isinstance(sel["rows"], int):
        sel = {**sel, "rows": sel["rows"] % nq}
    if isinstance(sel["rows"], slice) and not range(nq)[sel["rows"]]:
        sel = {**sel, "rows": None}
    if isinstance(sel["keys"], list):
        sel = {**sel, "keys": [x % nk for x in sel["keys"]]}
    if isinstance(sel["keys"], slice) and not range(nk)[sel["keys"]]:
        sel = {**sel, "keys": None}
    return sel


def _slice(w, sel):
    """The same selection taken from the full weights with plain indexing."""
    for dim, name in ((1, "heads"), (2, "rows"), (3, "keys")):
        value = sel[name]
        if value is None:
            continue
        index = [value] if isinstance(value, int) else value
        index = torch.tensor(index) if isinstance(index, list) else \
            torch.arange(w.shape[dim])[index]
        w = w.index_select(dim, index % w.shape[dim])
    return w


@given(cfg=configs, sel=selections)
def test_a_selection_equals_the_same_slice_of_the_full_weights(cfg, sel):
    q, k, v, mask = draw_inputs(cfg)
    sel = _valid(sel, q.shape[1], q.shape[2], k.shape[2])
    for backend in ("sdpa", "eager"):
        out, full = hw.attention(q, k, v, mask=mask, causal=cfg["causal"], return_weights=True,
                                 backend=backend)
        out2, part = hw.attention(q, k, v, mask=mask, causal=cfg["causal"], backend=backend,
                                  return_weights=hw.Selection(**sel))
        # full rows are divided by their sum (weights.from_lse), a key range is not: the two
        # differ by the LSE's rounding; otherwise by 1 ulp (GEMM blocking)
        tol = (1e-5, 1e-6) if sel["keys"] is not None else (1e-6, 2e-7)
        torch.testing.assert_close(part, _slice(full, sel), rtol=tol[0], atol=tol[1])
        # all weights without autograd: sdpa's output is those weights @ v (another kernel
        # than the selection's fused one: equal to float32 rounding); eager: the same math
        exact = backend == "eager"
        torch.testing.assert_close(out2, out, rtol=0 if exact else 1e-5,
                                   atol=0 if exact else 1e-6)


@given(cfg=configs.filter(lambda c: c["mask"] != "float"))
def test_asking_for_weights_leaves_the_output_and_its_gradients_unchanged(cfg):
    q, k, v, mask = draw_inputs(cfg)
    grads = []
    for want in (False, True, {"heads": [0]}):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, w = hw.attention(*leaves, mask=mask, causal=cfg["causal"], return_weights=want)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(cfg["seed"]))
        grads.append((out.detach(), *torch.autograd.grad(out, leaves, grad_out)))
    # bit-identical, except grouped heads: there the LSE path runs the flash op on k, v
    # expanded to h heads, and the key/value gradients sum the group in another order (1 ulp)
    tol = 0 if cfg["r"] == 1 else 1e-6
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _recorded(q, k, v, **kwargs) -> dict:
    from headwise.observe import recording
    steps = {}
    with recording(lambda step, tensor, **info: steps.setdefault(step, info)):
        hw.attention(q, k, v, causal=True, **kwargs)
    assert "weighted sum" not in steps  # the eager path did not run
    return steps["fused attention"]


def test_the_record_says_which_kernel_made_the_output_and_how_the_weights_were_made():
    from headwise.observe import WEIGHTS_AT_V
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    # all weights, nothing for autograd: the output is those weights @ v, block by block
    run = _recorded(q, k, v, return_weights=True)
    assert run["kernel"] == WEIGHTS_AT_V and not run["fused"] and run["memory"] == "O(n^2)"
    assert run["weights_source"].describe() == \
        "recomputed exactly as the softmax of whole rows, 64-row chunks"
    # with autograd (or strict mode) the output stays on the fused kernel
    for leaves, strict in (([t.requires_grad_() for t in (q, k, v)], None), ((q, k, v), True)):
        run = _recorded(*leaves, return_weights=True, strict=strict)
        assert run["kernel"] == "FLASH_ATTENTION" and run["fused"] and run["memory"] == "O(n)"
        assert run["weights_source"].method == "rows"
    # a key range needs the row log-sum-exp: the flash op returns it with the output
    run = _recorded(q, k, v, return_weights=hw.Selection(heads=1, keys=slice(0, 8)))
    assert run["kernel"] == "FLASH_ATTENTION" and run["fused"]
    assert run["weights_source"].describe() == "recomputed from the flash LSE, 64-row chunks"


@pytest.mark.parametrize("sel, words", [
    (dict(heads=[4]), "heads index 4 out of range"),
    (dict(heads=-5), "heads index -5 out of range"),
    (dict(rows=[0, 9]), "rows index 9 out of range"),
    (dict(keys=[]), "empty selection of keys"),
    (dict(rows=slice(5, 2)), "empty selection of rows"),
])
def test_bad_selections_raise_a_clear_value_error(sel, words):
    q, k, v = (torch.randn(1, 4, 6, 8) for _ in range(3))
    with pytest.raises(ValueError, match=words):
        hw.attention(q, k, v, return_weights=hw.Selection(**sel))
    mha = hw.MultiHeadAttention(32, 4)
    with pytest.raises(ValueError, match=words):
        mha(torch.randn(1, 6, 32), return_weights=sel)


def test_a_selection_on_a_backend_that_cannot_honour_it_raises():
    hw.register_backend("plain-test", lambda q, k, v, **kw: (q, None))
    try:
        q = torch.randn(1, 2, 3, 4)
        with pytest.raises(ValueError, match="cannot return a selection"):
            hw.attention(q, q, q, backend="plain-test", return_weights=hw.Selection(heads=0))
    finally:
        del hw.BACKENDS["plain-test"]
    with pytest.raises(TypeError, match="return_weights"):
        hw.attention(q, q, q, return_weights="heads")
    with pytest.raises(ValueError, match="unknown selection keys"):
        hw.attention(q, q, q, return_weights={"head": 0})


not_indices = st.one_of(
    st.lists(st.booleans(), min_size=1, max_size=6).map(torch.tensor),  # a mask, not indices
    st.lists(st.floats(0, 3), min_size=1, max_size=3),  # [0.9, 2.7] was read as heads 0 and 2
    st.text(alphabet="0123", min_size=1, max_size=3),  # "12" was read as heads 1 and 2
    st.lists(st.floats(0, 3), min_size=1, max_size=3).map(torch.tensor),
    st.builds(slice, st.floats(0, 2), st.just(3)),
    st.booleans(),
)


@given(bad=not_indices, name=st.sampled_from(["heads", "rows", "keys"]))
def test_a_selection_refuses_what_is_not_an_index(bad, name):
    """Bool masks, floats and strings were coerced to other indices; now a TypeError naming
    the argument and the spelling that works, when the Selection is made."""
    with pytest.raises(TypeError, match=rf"Selection: {name}.*(pass|e\.g\.)"):
        hw.Selection(**{name: bad})
    mha = hw.MultiHeadAttention(8, 2)
    with pytest.raises(TypeError, match=rf"Selection: {name}"):
        mha(torch.randn(1, 3, 8), return_weights={name: bad})


@given(heads=st.lists(st.integers(-4, 3), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_every_integer_spelling_of_a_selection_picks_the_same_heads(heads, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, 5, 8, generator=g) for _ in range(3))
    _, full = hw.attention(q, k, v, return_weights=True)
    expected = full[:, [x % 4 for x in heads]]
    for spelling in (heads, tuple(heads), torch.tensor(heads), torch.tensor(heads).int()):
        _, w = hw.attention(q, k, v, return_weights=hw.Selection(heads=spelling))
        torch.testing.assert_close(w, expected, rtol=0, atol=0)  # same process, same kernel


@given(b=st.integers(1, 2), h=st.integers(1, 4), i=st.integers(1, 5), d=st.integers(1, 8),
       backend=st.sampled_from(["auto", "eager", "sdpa"]), causal=st.booleans())
def test_zero_keys_give_empty_weights_and_zero_output(b, h, i, d, backend, causal):
    """No keys is every row fully masked: zero output and weights of shape (b, h, i, 0) (this
    was a ZeroDivisionError in the block planner)."""
    q, k = torch.randn(b, h, i, d), torch.randn(b, h, 0, d)
    out, w = hw.attention(q, k, k, return_weights=True, backend=backend, causal=causal)
    assert w.shape == (b, h, i, 0) and bool((out == 0).all())
    mha = hw.MultiHeadAttention(8, 2)
    kv = torch.randn(b, 0, 8)
    out, w = mha(torch.randn(b, i, 8), kv, kv, return_weights=True)
    assert w.shape == (b, 2, i, 0)
    torch.testing.assert_close(out, mha.out_proj.bias.expand(b, i, 8), rtol=0, atol=0)
