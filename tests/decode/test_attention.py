"""The one-row form of MultiHeadAttention (headwise.decode.attention) equals the module, position
by position."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import headwise as hw
from headwise.decode.forms import form_of
from headwise.decode.vouch import DECLINED
from headwise.fast import rows as _rows


class _Vouch:
    """A cache's NaN vouching that vouches for nothing."""

    def all_finite(self, end, vouched=0):
        return False  # vouches for nothing: the NaN policy reads k and v as usual

    def attend_new(self, cache, rows, rot, heads, r, window):
        return DECLINED  # (the one-call C form does not apply: the row form's own steps run)


class _Cache:
    """The part of a KV cache layer a row step uses: append, then read every position."""

    def __init__(self):
        self.k = self.v = None
        self.vouch = _Vouch()

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        return self.k, self.v


@settings(max_examples=20, deadline=None)
@given(g=st.integers(1, 2), r=st.integers(1, 3), n=st.integers(1, 6), transpose=st.booleans(),
       fuse=st.booleans(), window=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2**31 - 1))
def test_self_attention_rows_equal_the_causal_module(g, r, n, transpose, fuse, window, seed):
    torch.manual_seed(seed)
    mha = hw.MultiHeadAttention(8, g * r, head_dim=3, num_kv_heads=g,
                                window=window).double().eval()
    x = torch.randn(2, n, 8, dtype=torch.float64)
    want, _ = mha(x, causal=True)
    row, cache = form_of(mha, transpose=transpose, fuse=fuse, cross=False), _Cache()
    for p in range(n):
        got = _rows.linear(row.self_attend(x[:, p], cache, None), row.out)
        torch.testing.assert_close(got, want[:, p])


def test_cross_attention_rows_read_the_stored_keys():
    torch.manual_seed(0)
    mha = hw.MultiHeadAttention(8, 4, num_kv_heads=2).double().eval()
    x, memory = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    mask = hw.masks.from_valid_lens(torch.tensor([5, 2]), 5)
    want, _ = mha(x, memory, mask=mask)
    row, cache = form_of(mha, transpose=True, fuse=False, cross=True), _Cache()
    cache.k = mha._split(mha.k_proj(memory), "k", 2)
    cache.v = mha._split(mha.v_proj(memory), "v", 2)
    for p in range(3):
        got = _rows.linear(row.cross_attend(x[:, p], cache, mask), row.out)
        torch.testing.assert_close(got, want[:, p])


@settings(max_examples=10, deadline=None)
@given(softcap=st.sampled_from([None, 5.0]), sinks=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_only_the_fused_path_asks_the_cache_for_finiteness(softcap, sinks, seed):
    """Soft-capping or sinks run the eager reference, whose NaN policy reads its own inputs: the
    row form then never consults the cache's finiteness (work that would go unused); the
    fused path does, once per position. Either way the rows equal the module."""
    torch.manual_seed(seed)
    mha = hw.MultiHeadAttention(8, 4, num_kv_heads=2, softcap=softcap, sinks=sinks).eval()
    if sinks:
        with torch.no_grad():
            mha.sinks.normal_()
    x = torch.randn(2, 4, 8)
    want, _ = mha(x, causal=True)
    row, cache, asked = form_of(mha, transpose=False, fuse=False, cross=False), _Cache(), []
    cache.vouch.all_finite = lambda end, vouched=0: asked.append(end) or False
    for p in range(4):
        got = _rows.linear(row.self_attend(x[:, p], cache, None), row.out)
        torch.testing.assert_close(got, want[:, p], atol=1e-5, rtol=0)
    assert asked == ([] if softcap is not None or sinks else [1, 2, 3, 4])
