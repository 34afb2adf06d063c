"""What a filter installs: scores of only the selected heads / rows / keys (against float64),
weights computed only for what was filtered (counted at the attention calls), strict mode."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
import headwise.layers as hw_layers
from headwise.lens.hooks import scores
from headwise.models import LMConfig, TransformerLM
from tests.hf.tiny import batch, build  # (skips this file without transformers)

hf_interface = pytest.importorskip("headwise.hf.interface")


@given(seed=st.integers(0, 2**16), causal=st.booleans(), masked=st.booleans(),
       heads=st.sampled_from([None, [1], [3, 0]]), rows=st.sampled_from([None, slice(-2, None)]),
       keys=st.sampled_from([None, [0, 4]]))
def test_scores_of_a_selection_equal_float64_masked_scores(seed, causal, masked, heads, rows,
                                                           keys):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    mask = torch.rand(2, 1, 5, 6, generator=g) > 0.3 if masked else None
    sel = hw.Selection(heads, rows, keys)
    got = scores(q, k, mask, causal, None, sel)
    want = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) / 8 ** 0.5
    allowed = torch.ones(5, 6, dtype=torch.bool).tril(1) if causal else torch.ones(5, 6).bool()
    if mask is not None:
        allowed = allowed & mask
    want = want.masked_fill(~allowed, float("-inf"))
    h, r, c = sel.resolve(4, 5, 6, "cpu")
    for dim, index in ((1, h), (2, r), (3, c)):
        want = want[(slice(None),) * dim + (index,)]
    assert torch.equal(got.isinf(), want.isinf())
    assert (got.double() - want)[want.isfinite()].abs().max(0).values.max() < 1e-5


def _count(monkeypatch, module):
    """Wrap ``module.dispatch``: each call's (return_weights, weights elements)."""
    calls, real = [], module.dispatch

    def counting(*args, **kwargs):
        out, weights = real(*args, **kwargs)
        calls.append((kwargs.get("return_weights"), 0 if weights is None else weights.numel()))
        return out, weights
    monkeypatch.setattr(module, "dispatch", counting)
    return calls


def _lm() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(LMConfig(vocab_size=20, d_model=16, num_heads=4, num_layers=3, d_ff=24,
                                  max_len=16, dropout=0.0)).eval()


@pytest.mark.parametrize("kind", ["llama", "headwise"])
def test_a_pattern_is_computed_only_for_what_was_filtered(kind, monkeypatch):
    model = _lm() if kind == "headwise" else build(kind, "headwise")
    calls = _count(monkeypatch, hw_layers if kind == "headwise" else hf_interface)
    ids = batch("none")[0] if kind == "llama" else torch.randint(0, 20, (2, 9))
    _, cache = hw.run_with_cache(model, ids, names="pattern",
                                 select={"layers": [1], "heads": [2], "rows": slice(-3, None)})
    assert [n for n, _ in calls if n is not False] == [hw.Selection([2], slice(-3, None))]
    assert [e for _, e in calls] == [0, 2 * 1 * 3 * 9]  # layer 0 fused, layer 1's selection;
    assert cache["pattern", 1].shape == (2, 1, 3, 9)  # stopped after layer 1 (nothing later)
    calls.clear()
    hw.run_with_cache(model, ids, names=["z", "resid_post", "q"])
    assert all(n is False and e == 0 for n, e in calls) and len(calls) == len(
        hw.lens.run.sites.layers_of(model))  # no weights at all without a pattern


@pytest.mark.parametrize("kind", ["llama", "headwise"])
def test_a_filtered_run_passes_strict_mode(kind, monkeypatch):
    model = _lm() if kind == "headwise" else build(kind, "headwise")
    ids = torch.randint(1, 20, (2, 9))
    _, loose = hw.run_with_cache(model, ids, names=["pattern", "z"],
                                 select={"layers": [0, 1], "heads": [1]})
    monkeypatch.setenv("HEADWISE_STRICT", "1")
    _, strict = hw.run_with_cache(model, ids, names=["pattern", "z"],
                                  select={"layers": [0, 1], "heads": [1]})
    assert strict.names() == loose.names() and len(strict) == 4
    for name, x in strict.items():
        assert torch.equal(x, loose[name]), name
    with pytest.raises(ValueError):  # strict mode is on: all-heads eager weights are refused
        hw.attention(*(torch.randn(1, 1, 2, 4) for _ in range(3)), backend="eager")
