"""The probes behind ``docs/robustness.md``: each public function and CLI command against wrong
ranks, sizes, dtypes, NaN/inf, empty inputs, bad masks, out-of-range tokens, absurd sizes, bad
checkpoint and text files and bad devices. ``probes(tmp)`` builds the fixtures it needs (tiny
models, a checkpoint, a BERT folder, text files) under ``tmp`` and returns the list."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

import headwise as hw
from headwise import masks
from tests.robustness.runner import Probe, cli

NAN, INF = float("nan"), float("inf")


def _t(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x.to(dtype) if dtype.is_floating_point or dtype.is_complex else (x * 3).to(dtype)


def _qkv(dtype=torch.float32, b=1, h=2, i=3, j=3, d=4):
    return _t(b, h, i, d, dtype=dtype), _t(b, h, j, d, dtype=dtype, seed=1), \
        _t(b, h, j, d, dtype=dtype, seed=2)


def _with(x, index, value):
    x = x.clone()
    x[index] = value
    return x


def _agree(mask, **kw):
    """Run eager and sdpa; return 'eager == sdpa' with the output description."""
    q, k, v = kw.pop("qkv", None) or _qkv()
    a, _ = hw.attention(q, k, v, mask=mask, backend="eager", **kw)
    b, _ = hw.attention(q, k, v, mask=mask, backend="sdpa", **kw)
    same_nan = bool((a.isnan() == b.isnan()).all())
    tol = 1e-5 if a.dtype in (torch.float32, torch.float64) else 2e-2
    close = torch.allclose(a.nan_to_num().float(), b.nan_to_num().float(), atol=tol, rtol=tol)
    if not (same_nan and close):
        raise AssertionError("eager and sdpa disagree")
    rows = a.isnan().any(-1)
    nan = f", NaN rows {rows.nonzero()[:, 2].unique().tolist()}" if rows.any() else ""
    zero = (a == 0).all(-1)
    zeros = f", zero rows {zero.nonzero()[:, 2].unique().tolist()}" if zero.any() else ""
    return f"eager == sdpa, shape {tuple(a.shape)}{nan}{zeros}"


def _as_if_zero(mask, causal=False, **kw):
    """:func:`_agree`, and the rows that are not NaN equal those of the same call with every
    NaN or inf of q, k and v put to 0 (a masked position's bad value changes nothing)."""
    q, k, v = kw.pop("qkv")
    said = _agree(mask, qkv=(q, k, v), causal=causal, **kw)
    zero = [torch.where(torch.isfinite(t), t, 0.0) for t in (q, k, v)]
    for backend in ("eager", "sdpa"):
        got, want = (hw.attention(*x, mask=mask, causal=causal, backend=backend, **kw)
                     for x in ((q, k, v), zero))
        for a, b in zip(got, want, strict=True):
            if a is not None and not torch.allclose(a[~a.isnan()], b[~a.isnan()], atol=1e-6):
                raise AssertionError(f"{backend}: a masked bad value changed the answer")
    return said.replace("eager == sdpa", "eager == sdpa == with 0 there")


# ------------------------------------------------------------------------------ core API
def attention_probes() -> list[Probe]:
    A = "attention"
    q, k, v = _qkv()
    P = []

    def add(call, fn, expect="error", area=A):
        P.append(Probe(area, call, fn, expect))

    add("attention(q[0], k, v)  # 3-D q", lambda: hw.attention(q[0], k, v))
    add("attention(q, k[None], v)  # 5-D k", lambda: hw.attention(q, k[None], v))
    add("attention(q.tolist(), k, v)", lambda: hw.attention(q.tolist(), k, v))
    for name, dt in (("int", torch.long), ("bool", torch.bool), ("complex", torch.complex64)):
        add(f"attention(q, k, v) all {name}", lambda dt=dt: hw.attention(*_qkv(dt)))
    add("attention(q, k, v) all half", lambda: _agree(None, qkv=_qkv(torch.half)), "ok")
    add("attention(q, k, v) all double", lambda: _agree(None, qkv=_qkv(torch.double)), "ok")
    add("attention(q, k, v) all bfloat16", lambda: _agree(None, qkv=_qkv(torch.bfloat16)), "ok")
    add("attention(q, k.double(), v)", lambda: hw.attention(q, k.double(), v))
    add("attention(q, k, v) batch 1 vs 2", lambda: hw.attention(q, *_qkv(b=2)[1:]))
    add("attention: q head dim 4, k head dim 5", lambda: hw.attention(q, _t(1, 2, 3, 5), v))
    add("attention: 3 query heads, 2 kv heads", lambda: hw.attention(_t(1, 3, 3, 4), k, v))
    add("attention: k 3 positions, v 4", lambda: hw.attention(q, k, _t(1, 2, 4, 4)))
    add("attention: 4 query heads, 2 kv heads (GQA)",
        lambda: hw.attention(_t(1, 4, 3, 4), k, v)[0], "ok")
    add("attention(mask=int tensor)", lambda: hw.attention(q, k, v, mask=torch.ones(3, 3).long()))
    add("attention(mask=complex tensor)",
        lambda: hw.attention(q, k, v, mask=torch.zeros(3, 3, dtype=torch.complex64)))
    add("attention(mask=[[True]*3]*3)  # a list", lambda: hw.attention(q, k, v, mask=[[True] * 3] * 3))
    add("attention(mask=(j,) bool, 1-D)", lambda: _agree(torch.tensor([True, False, True])), "ok")
    add("attention(mask=(j,) float, 1-D)",
        lambda: _agree(torch.tensor([0.0, -INF, 0.0])), "ok")
    add("attention(mask=(i, j) bool)", lambda: _agree(torch.ones(3, 3, dtype=torch.bool).tril()),
        "ok")
    add("attention(mask=(h, i, j) bool)",
        lambda: _agree(torch.ones(2, 3, 3, dtype=torch.bool).tril()), "ok")
    add("attention(mask=(1, 1, 1, 1, j)) 5-D",
        lambda: hw.attention(q, k, v, mask=torch.ones(1, 1, 1, 1, 3, dtype=torch.bool)))
    add("attention(mask=(j+1,))", lambda: hw.attention(q, k, v, mask=torch.ones(4, dtype=torch.bool)))
    add("attention(mask=(b=2, 1, 1, j)) for b=1",
        lambda: hw.attention(q, k, v, mask=torch.ones(2, 1, 1, 3, dtype=torch.bool)))
    add("attention(mask=float64 additive) on float32",
        lambda: _agree(torch.tensor([0.0, -INF, 0.0], dtype=torch.float64)), "ok")
    add("attention(mask=float16 additive) on float32",
        lambda: _agree(torch.tensor([0.0, -INF, 0.0], dtype=torch.float16)), "ok")
    add("attention: row 1 fully masked", lambda: _agree(
        torch.tensor([[True, True, True], [False, False, False], [True, False, True]])), "ok")
    add("attention: NaN in query row 1", lambda: _agree(None, qkv=(_with(q, (0, 0, 1, 2), NAN), k, v)),
        "ok")
    add("attention: inf in query row 2", lambda: _agree(None, qkv=(_with(q, (0, 1, 2, 0), INF), k, v)),
        "ok")
    add("attention: NaN in key 0 (attended by all)",
        lambda: _agree(None, qkv=(q, _with(k, (0, 0, 0, 1), NAN), v)), "ok")
    add("attention: NaN in value 1 (attended by all)",
        lambda: _agree(None, qkv=(q, k, _with(v, (0, 1, 1, 3), NAN))), "ok")
    pad = torch.tensor([True, True, False])
    add("attention: NaN in key 2, masked by padding",
        lambda: _as_if_zero(pad, qkv=(q, _with(k, (0, 0, 2, 1), NAN), v)), "ok")
    add("attention: inf in value 2, masked by a float -inf mask",
        lambda: _as_if_zero(torch.tensor([0.0, 0.0, -INF]), qkv=(q, k, _with(v, (0, 1, 2), INF))),
        "ok")
    add("attention: NaN in key 2, the causal future of rows 0 and 1",
        lambda: _as_if_zero(None, causal=True, qkv=(q, _with(k, (0, 1, 2, 0), NAN), v)), "ok")
    add("attention: -inf in key 0, outside a sliding window of 2",
        lambda: _as_if_zero(masks.sliding_window(3, 3, 2), qkv=(q, _with(k, (0, 0, 0), -INF), v)),
        "ok")
    add("attention: NaN in key 2, padding masks it, all weights",
        lambda: _as_if_zero(pad, return_weights=True, qkv=(q, _with(k, (0, 0, 2, 1), NAN), v)),
        "ok")
    add("attention: -inf additive mask everywhere (all rows masked)",
        lambda: _agree(torch.full((3,), -INF)), "ok")
    add("attention(scale=nan)", lambda: hw.attention(q, k, v, scale=NAN))
    add("attention(scale=inf)", lambda: hw.attention(q, k, v, scale=INF))
    add("attention(scale='0.5')", lambda: hw.attention(q, k, v, scale="0.5"))
    add("attention(scale=0.0)", lambda: _agree(None, scale=0.0), "ok")
    add("attention(dropout_p=1.0)", lambda: hw.attention(q, k, v, dropout_p=1.0))
    add("attention(dropout_p=-0.1)", lambda: hw.attention(q, k, v, dropout_p=-0.1))
    add("attention(dropout_p=nan)", lambda: hw.attention(q, k, v, dropout_p=NAN))
    add("attention(backend='bogus')", lambda: hw.attention(q, k, v, backend="bogus"))
    add("attention: empty query sequence (i=0)", lambda: _agree(None, qkv=_qkv(i=0)), "ok")
    add("attention: empty key sequence (j=0)", lambda: _agree(None, qkv=_qkv(j=0)), "ok")
    add("attention: empty batch (b=0)", lambda: _agree(None, qkv=_qkv(b=0)), "ok")
    add("attention(causal=True), i=2 > j=... bottom-right i=3, j=5",
        lambda: _agree(None, causal=True, qkv=_qkv(i=3, j=5)), "ok")
    add("attention(causal=True), i=5 > j=3 (first rows see nothing)",
        lambda: _agree(None, causal=True, qkv=_qkv(i=5, j=3)), "ok")
    add("attention_weights(q, k, scale=nan)", lambda: hw.attention_weights(q, k, scale=NAN))
    add("attention_weights(q, k): rows sum to 1",
        lambda: f"rows sum to 1: {torch.allclose(hw.attention_weights(q, k).sum(-1), torch.ones(1))}",
        "ok")
    return P


def mha_probes() -> list[Probe]:
    A, F = "MultiHeadAttention()", "MultiHeadAttention.forward"
    mha = hw.MultiHeadAttention(4, 2).eval()
    x = _t(2, 3, 4)
    P = []

    def add(area, call, fn, expect="error"):
        P.append(Probe(area, call, fn, expect))

    for value in ("0", "-1", "1.5", "'8'", "True", "10**9 + 1", "99999999999999999999999",
                  "2**17"):
        add(A, f"MultiHeadAttention({value}, 2)",
            lambda value=value: hw.MultiHeadAttention(eval(value), 2))  # noqa: S307
    add(A, "MultiHeadAttention(131071, 2)  # prime: hint is cheap",
        lambda: hw.MultiHeadAttention(131071, 2))
    add(A, "MultiHeadAttention(2**17, 1)  # 275 GB", lambda: hw.MultiHeadAttention(2**17, 1))
    add(A, "MultiHeadAttention(8, 0)", lambda: hw.MultiHeadAttention(8, 0))
    add(A, "MultiHeadAttention(8, 10**6)", lambda: hw.MultiHeadAttention(8, 10**6))
    add(A, "MultiHeadAttention(10, 4)", lambda: hw.MultiHeadAttention(10, 4))
    add(A, "MultiHeadAttention(8, 4, num_kv_heads=3)",
        lambda: hw.MultiHeadAttention(8, 4, num_kv_heads=3))
    add(A, "MultiHeadAttention(8, 2, head_dim=0)", lambda: hw.MultiHeadAttention(8, 2, head_dim=0))
    add(A, "MultiHeadAttention(8, 2, kdim=10**7)", lambda: hw.MultiHeadAttention(8, 2, kdim=10**7))
    add(A, "MultiHeadAttention(8, 2, dropout=1.0)", lambda: hw.MultiHeadAttention(8, 2, dropout=1.0))
    add(A, "MultiHeadAttention(8, 2, dropout=nan)", lambda: hw.MultiHeadAttention(8, 2, dropout=NAN))
    add(A, "MultiHeadAttention(8, 2, dropout='0.1')",
        lambda: hw.MultiHeadAttention(8, 2, dropout="0.1"))
    add(A, "MultiHeadAttention(8, 2, backend='flash3')",
        lambda: hw.MultiHeadAttention(8, 2, backend="flash3"))
    add(A, "MultiHeadAttention(10, 4, head_dim=3)",
        lambda: hw.MultiHeadAttention(10, 4, head_dim=3).hidden_dim, "ok")
    add(F, "mha(x[0])  # 2-D", lambda: mha(x[0]))
    add(F, "mha(x[None])  # 4-D", lambda: mha(x[None]))
    add(F, "mha(x with 5 features)", lambda: mha(_t(2, 3, 5)))
    for name, dt in (("long", torch.long), ("bool", torch.bool), ("half", torch.half),
                     ("double", torch.double), ("complex", torch.complex64)):
        add(F, f"mha(x.{name}()) on a float32 module", lambda dt=dt: mha(x.to(dt)))
    add(F, "mha.double()(x.double())", lambda: hw.MultiHeadAttention(4, 2).double()(x.double())[0],
        "ok")
    add(F, "mha(x, key batch 3)", lambda: mha(x, _t(3, 3, 4)))
    add(F, "mha(x, key 3 positions, value 4)", lambda: mha(x, _t(2, 3, 4), _t(2, 4, 4)))
    add(F, "mha(x, mask=(2, 2, 3, 4))", lambda: mha(x, mask=torch.ones(2, 2, 3, 4, dtype=torch.bool)))
    add(F, "mha(x, mask=(j,) bool)", lambda: mha(x, mask=torch.tensor([True, True, False]))[0], "ok")
    add(F, "mha(x, mask=float64 (b, 1, 1, j))",
        lambda: mha(x, mask=torch.zeros(2, 1, 1, 3, dtype=torch.float64))[0], "ok")
    add(F, "mha(x, valid_lens=[1, 2, 3])", lambda: mha(x, valid_lens=torch.tensor([1, 2, 3])))
    add(F, "mha(x, valid_lens=float)", lambda: mha(x, valid_lens=torch.tensor([1.0, 2.0])))
    add(F, "mha(x, valid_lens=[0, 3])  # row 0 fully masked",
        lambda: mha(x, valid_lens=torch.tensor([0, 3]))[0][0].abs().max().item() < 1, "ok")
    add(F, "mha(x, head_mask=(3,))", lambda: mha(x, head_mask=torch.ones(3)))
    add(F, "mha(x, head_mask=[1, 0])", lambda: mha(x, head_mask=[1, 0]))
    add(F, "mha(empty batch (0, 3, 4))", lambda: mha(_t(0, 3, 4))[0], "ok")
    add(F, "mha(empty sequence (2, 0, 4))", lambda: mha(_t(2, 0, 4))[0], "ok")
    add(F, "mha(x with NaN in row (0, 1))",
        lambda: mha(_with(x, (0, 1, 2), NAN))[0].isnan().any(-1).tolist(), "ok")
    add(F, "mha(x.tolist())", lambda: mha(x.tolist()))
    add(F, "mha(x, cache=object())", lambda: mha(x, cache=object()))
    return P


def mask_and_head_probes() -> list[Probe]:
    M, H = "masks", "heads"
    P = []

    def add(area, call, fn, expect="error"):
        P.append(Probe(area, call, fn, expect))

    add(M, "masks.causal(-1)", lambda: masks.causal(-1))
    add(M, "masks.causal(1.5)", lambda: masks.causal(1.5))
    add(M, "masks.causal(10**9)", lambda: masks.causal(10**9))
    add(M, "masks.causal(3, 5, align='middle')", lambda: masks.causal(3, 5, align="middle"))
    add(M, "masks.causal(0)", lambda: masks.causal(0), "ok")
    add(M, "masks.from_valid_lens([1.5], 3)", lambda: masks.from_valid_lens([1.5], 3))
    add(M, "masks.from_valid_lens(l, -1)", lambda: masks.from_valid_lens(torch.tensor([1]), -1))
    add(M, "masks.from_valid_lens(l, 10**9)",
        lambda: masks.from_valid_lens(torch.tensor([1]), 10**9))
    add(M, "masks.from_valid_lens(3-D lens, 3)",
        lambda: masks.from_valid_lens(torch.ones(1, 1, 1).long(), 3))
    add(M, "masks.from_valid_lens((b, i) lens, 3, nq=5)",
        lambda: masks.from_valid_lens(torch.ones(1, 2).long(), 3, nq=5))
    add(M, "masks.from_valid_lens([2, 0], 3)",
        lambda: masks.from_valid_lens([2, 0], 3), "ok")
    add(M, "masks.padding([[1]], 0)  # a list", lambda: masks.padding([[1]], 0))
    add(M, "masks.padding(float ids, 0)", lambda: masks.padding(torch.ones(1, 2), 0))
    add(M, "masks.padding(1-D ids, 0)", lambda: masks.padding(torch.tensor([1, 0]), 0))
    add(M, "masks.padding(ids, '0')", lambda: masks.padding(torch.tensor([[1, 0]]), "0"))
    add(M, "masks.padding(empty (1, 0) ids, 0)", lambda: masks.padding(torch.ones(1, 0).long(), 0),
        "ok")
    add(M, "masks.combine(bool, int)",
        lambda: masks.combine(torch.ones(3, dtype=torch.bool), torch.ones(3).long()))
    add(M, "masks.combine(None, None)", lambda: masks.combine(None, None), "ok")
    add(M, "masks.as_bias(int mask [1, 0])", lambda: masks.as_bias(torch.tensor([1, 0]),
                                                                   torch.float32))
    add(M, "masks.as_bias(bool, dtype=torch.long)",
        lambda: masks.as_bias(torch.tensor([True]), torch.long))
    add(M, "masks.check('mask', 'here')", lambda: masks.check("mask", "here"))
    x = _t(1, 2, 4)
    add(H, "split_heads(x, 0)", lambda: hw.split_heads(x, 0))
    add(H, "split_heads(x, -2)", lambda: hw.split_heads(x, -2))
    add(H, "split_heads(x, 3)  # 4 % 3", lambda: hw.split_heads(x, 3))
    add(H, "split_heads(x, 2.0)", lambda: hw.split_heads(x, 2.0))
    add(H, "split_heads(x[0], 2)  # 2-D", lambda: hw.split_heads(x[0], 2))
    add(H, "split_heads(list, 2)", lambda: hw.split_heads(x.tolist(), 2))
    add(H, "merge_heads(x)  # 3-D", lambda: hw.merge_heads(x))
    add(H, "merge_heads(split_heads(x, 2))", lambda: hw.merge_heads(hw.split_heads(x, 2)), "ok")
    add(H, "unfuse(torch.nn.Linear(4, 4))", lambda: hw.unfuse(torch.nn.Linear(4, 4)))
    add(H, "fuse(MultiHeadAttention(4, 2))", lambda: hw.fuse(hw.MultiHeadAttention(4, 2)))
    add(H, "fuse(unfuse(mha(dropout=0.2, backend='eager')))", lambda: (lambda m: (
        m.dropout_p, m.backend))(hw.fuse(hw.unfuse(hw.MultiHeadAttention(4, 2, dropout=0.2,
                                                                        backend="eager")))), "ok")
    return P


def model_probes() -> list[Probe]:
    from headwise.models import LMConfig, TransformerConfig, build, config_from_dict

    C, F, G = "models config", "model forward", "generate"
    small = dict(vocab_size=10, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_len=8)
    lm = build(LMConfig(**small)).eval()
    s2s = build(TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=8, num_heads=2,
                                  num_layers=1, d_ff=8, max_len=8)).eval()
    ids = torch.tensor([[1, 2, 3]])
    P = []

    def add(area, call, fn, expect="error"):
        P.append(Probe(area, call, fn, expect))

    for field, value in (("vocab_size", "0"), ("vocab_size", "10**9"), ("d_model", "10**6"),
                         ("d_model", "'8'"), ("num_layers", "10**6"), ("max_len", "10**8"),
                         ("d_ff", "-1"), ("dropout", "1.0"), ("dropout", "nan"),
                         ("activation", "'swish'"), ("positional", "'alibi'"), ("pad_id", "10"),
                         ("layer_norm_eps", "0.0"), ("layer_norm_eps", "nan"),
                         ("layer_norm_eps", "'1e-5'"), ("backend", "'bogus'"),
                         ("num_heads", "3"), ("num_kv_heads", "3"), ("tie_embeddings", "1")):
        add(C, f"LMConfig(..., {field}={value})", lambda f=field, v=value: LMConfig(
            **{**small, f: eval(v, {"nan": NAN})}))  # noqa: S307
    add(C, "TransformerConfig(..., num_decoder_layers=10**6)",
        lambda: TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, num_decoder_layers=10**6))
    add(C, "LMConfig.from_dict({'vocab_size': 10, 'bogus': 1})",
        lambda: LMConfig.from_dict({"vocab_size": 10, "bogus": 1}))
    add(C, "LMConfig.from_dict([])", lambda: LMConfig.from_dict([]))
    add(C, "LMConfig.from_dict({})  # missing vocab_size", lambda: LMConfig.from_dict({}))
    add(C, "config_from_dict('gpt', {})", lambda: config_from_dict("gpt", {}))
    add(C, "build(LMConfig(d_model=65536, num_layers=1000))  # ~70 TB",
        lambda: build(LMConfig(vocab_size=10, d_model=65536, num_heads=2, num_layers=1000)))
    add(C, "build({'vocab_size': 10})", lambda: build({"vocab_size": 10}))
    add(F, "lm(ids.float())", lambda: lm(ids.float()))
    add(F, "lm(ids[0])  # 1-D", lambda: lm(ids[0]))
    add(F, "lm(empty (1, 0) ids)", lambda: lm(ids[:, :0]))
    add(F, "lm(empty batch (0, 3))", lambda: lm(ids[:0]))
    add(F, "lm(ids with 10 >= vocab 10)", lambda: lm(torch.tensor([[1, 10]])))
    add(F, "lm(ids with -1)", lambda: lm(torch.tensor([[1, -1]])))
    add(F, "lm(9 ids > max_len 8)", lambda: lm(torch.ones(1, 9).long()))
    for name, dt in (("uint8", torch.uint8), ("int8", torch.int8), ("int16", torch.int16),
                     ("bool", torch.bool)):
        add(F, f"lm(ids.to({name}))", lambda dt=dt: lm(ids.to(dt)))
    add(F, "lm(ids.int())  # int32", lambda: lm(ids.int())[0], "ok")
    add(F, "lm(ids.tolist())", lambda: lm(ids.tolist()))
    add(F, "lm(ids, cache=other_model.new_cache(1))",
        lambda: lm(ids, cache=build(LMConfig(**{**small, "num_layers": 2})).new_cache(1)))
    add(F, "lm(ids, cache=lm.new_cache(2))  # batch 2 vs 1", lambda: lm(ids, cache=lm.new_cache(2)))
    add(F, "transformer(src batch 1, tgt batch 2)", lambda: s2s(ids, torch.ones(2, 2).long()))
    add(F, "transformer(src, tgt, src_valid_lens=[1.5])",
        lambda: s2s(ids, ids, src_valid_lens=torch.tensor([1.5])))
    add(F, "transformer(src, tgt, src_valid_lens=[-1])",
        lambda: s2s(ids, ids, src_valid_lens=torch.tensor([-1])))
    add(F, "transformer(src, tgt, cache=lm.new_cache(1))",
        lambda: s2s(ids, ids, cache=lm.new_cache(1)))
    gen = hw.generate
    add(G, "generate(lm, ids, max_new_tokens=-5)", lambda: gen(lm, ids, max_new_tokens=-5))
    add(G, "generate(lm, ids, max_new_tokens=1.5)", lambda: gen(lm, ids, max_new_tokens=1.5))
    add(G, "generate(lm, ids, max_new_tokens=6)  # 3 + 6 > max_len 8",
        lambda: gen(lm, ids, max_new_tokens=6))
    for kw in ("temperature=nan", "temperature=inf", "temperature=0", "top_k=0", "top_p=1.5",
               "top_p=nan"):
        add(G, f"generate(..., strategy='sample', {kw})", lambda kw=kw: gen(
            lm, ids, max_new_tokens=2, strategy="sample",
            **{kw.split("=")[0]: eval(kw.split("=")[1], {"nan": NAN, "inf": INF})}))  # noqa: S307
    add(G, "generate(..., strategy='nucleus')",
        lambda: gen(lm, ids, max_new_tokens=2, strategy="nucleus"))
    add(G, "generate(..., strategy='sample', beam_size=3)",
        lambda: gen(lm, ids, max_new_tokens=2, strategy="sample", beam_size=3))
    add(G, "generate(..., eos_id=99)", lambda: gen(lm, ids, max_new_tokens=2, eos_id=99))
    add(G, "generate(torch.nn.Linear(2, 2), ids)",
        lambda: gen(torch.nn.Linear(2, 2), ids, max_new_tokens=2))
    add(G, "generate(lm, ids, src=ids)", lambda: gen(lm, ids, max_new_tokens=2, src=ids))
    add(G, "generate(transformer, ids)  # no src", lambda: gen(s2s, ids, max_new_tokens=2))
    add(G, "generate(lm, ids, max_new_tokens=0)", lambda: gen(lm, ids, max_new_tokens=0), "ok")
    add(G, "generate(lm, ids.int(), max_new_tokens=2)",
        lambda: gen(lm, ids.int(), max_new_tokens=2), "ok")
    add(G, "KVCache(0, 1, 2, 4, 8)", lambda: hw.KVCache(0, 1, 2, 4, 8))
    add(G, "KVCache(1, 1, 2, 4, 8.0)", lambda: hw.KVCache(1, 1, 2, 4, 8.0))
    return P


# ------------------------------------------------------------------------------ files
def _checkpoint(tmp: Path) -> Path:
    from headwise import checkpoint
    from headwise.data.tokenizers import CharTokenizer
    from headwise.models import LMConfig, build

    tok = CharTokenizer("abc")
    config = LMConfig(vocab_size=tok.vocab_size, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                      max_len=16)
    torch.manual_seed(0)
    return checkpoint.save(tmp / "ckpt", build(config), config, tok)


def _edited(tmp: Path, good: Path, name: str, edit) -> Path:
    """A copy of ``good`` with one file edited (config.json edits re-listed under "files")."""
    folder = tmp / name
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(good, folder)
    edit(folder)
    return folder


def _set_config(**changes):
    def edit(folder: Path):
        meta = json.loads((folder / "config.json").read_text())
        meta["config"].update(changes)
        (folder / "config.json").write_text(json.dumps(meta))
    return edit


def _write(name: str, data: bytes | str):
    def edit(folder: Path):
        path = folder / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return edit


def checkpoint_probes(tmp: Path) -> list[Probe]:
    from headwise import checkpoint

    K = "checkpoint.load"
    good = _checkpoint(tmp)
    weights = (good / "model.safetensors").read_bytes()
    cases = {
        "missing folder": tmp / "nowhere",
        "a folder without config.json": _edited(tmp, good, "noconf", lambda f: (
            f / "config.json").unlink()),
        "config.json not JSON": _edited(tmp, good, "badjson", _write("config.json", "{oops")),
        "config.json a JSON list": _edited(tmp, good, "jsonlist", _write("config.json", "[1]")),
        "config.json not UTF-8": _edited(tmp, good, "notutf8", _write("config.json", b"\xff\xfe")),
        "model.safetensors truncated": _edited(tmp, good, "trunc", _write(
            "model.safetensors", weights[: len(weights) // 2])),
        "model.safetensors missing": _edited(tmp, good, "noweights", lambda f: (
            f / "model.safetensors").unlink()),
        "model.safetensors one byte edited": _edited(tmp, good, "flipped", _write(
            "model.safetensors", weights[:-1] + bytes([weights[-1] ^ 1]))),
        "config edited: num_layers 1000000": _edited(tmp, good, "layers",
                                                     _set_config(num_layers=1_000_000)),
        "config edited: d_model 1000000": _edited(tmp, good, "dmodel",
                                                  _set_config(d_model=1_000_000)),
        "config edited: d_model 100000 (memory)": _edited(
            tmp, good, "dmem", _set_config(d_model=100_000, d_ff=100_000, num_heads=4,
                                           num_layers=200)),
        "config edited: d_model 16 (weights do not fit)": _edited(
            tmp, good, "dfit", _set_config(d_model=16)),
        "config edited: unknown key": _edited(tmp, good, "unknown", _set_config(rope=True)),
        "foreign: a Hugging Face BERT folder": _bert_folder(tmp, "bert_for_ckpt"),
    }
    probes = [Probe(K, f"checkpoint.load({what})", lambda p=path: checkpoint.load(p), "error")
              for what, path in cases.items()]
    probes.append(Probe(K, "checkpoint.load(a good checkpoint)",
                        lambda: type(checkpoint.load(good).model).__name__, "ok"))
    return probes


def _bert_folder(tmp: Path, name: str, **hf_changes) -> Path:
    from safetensors.torch import save_file

    from headwise.models.bert import BertConfig, BertModel
    from headwise.pretrained import to_hf_state_dict

    folder = tmp / name
    folder.mkdir(exist_ok=True)
    config = BertConfig(vocab_size=20, d_model=8, num_heads=2, num_layers=1, d_ff=8, max_len=8)
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in to_hf_state_dict(BertModel(config)).items()}
    save_file(state, str(folder / "model.safetensors"))
    hf = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 20,
          "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
          "intermediate_size": 8, "max_position_embeddings": 8, "layer_norm_eps": 1e-12,
          "hidden_act": "gelu", **hf_changes}
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def bert_probes(tmp: Path) -> list[Probe]:
    from safetensors.torch import load_file, save_file

    from headwise.pretrained import load_bert

    B = "pretrained.load_bert"
    good = _bert_folder(tmp, "bert")
    load_bert(good)  # the first call imports what it needs: keep that out of the timed rows
    P = [Probe(B, "load_bert(a tiny BERT folder)", lambda: type(load_bert(good)).__name__, "ok")]

    def add(call, fn, expect="error"):
        P.append(Probe(B, call, fn, expect))

    for change in ("num_hidden_layers=100000", "hidden_size=10**6", "layer_norm_eps='x'",
                   "layer_norm_eps=[1]", "layer_norm_eps=-1", "layer_norm_eps=None",
                   "model_type='gpt2'", "hidden_act='mish'", "num_attention_heads=3",
                   "vocab_size=0", "hidden_dropout_prob='a lot'"):
        key, value = change.split("=", 1)
        folder = _bert_folder(tmp, f"bert_{key}_{abs(hash(value))}",
                              **{key: eval(value)})  # noqa: S307
        add(f"load_bert(config.json with {change})", lambda f=folder: load_bert(f))
    add("load_bert(missing folder)", lambda: load_bert(tmp / "nope"))
    add("load_bert(folder of pickles only)", lambda: load_bert(_pickles(tmp)))
    add("load_bert(a .txt path)", lambda: load_bert(tmp / "text.txt"))
    add("load_bert(42)", lambda: load_bert(42))
    add("load_bert(state_dict) without config", lambda: load_bert({}))
    state = load_file(str(good / "model.safetensors"))
    hf = json.loads((good / "config.json").read_text())
    missing = {k: v for k, v in state.items()
               if k != "encoder.layer.0.attention.self.query.weight"}
    add("load_bert(state dict missing encoder.layer.0.attention.self.query.weight, hf)",
        lambda: load_bert(missing, hf))
    add("load_bert(state dict with a (7, 8) query weight, hf)", lambda: load_bert(
        {**state, "encoder.layer.0.attention.self.query.weight": torch.zeros(7, 8)}, hf))
    sharded = tmp / "bert_sharded"
    sharded.mkdir(exist_ok=True)
    (sharded / "config.json").write_text(json.dumps(hf))
    for name, text in (("not JSON", "{"), ("no weight_map", "{}"), ("a list", "[]"),
                       ("shard missing", json.dumps({"weight_map": {"a": "shard-1.safetensors"}}))):
        folder = tmp / f"bert_index_{name.replace(' ', '_')}"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(hf))
        (folder / "model.safetensors.index.json").write_text(text)
        add(f"load_bert(index.json {name})", lambda f=folder: load_bert(f))
    bad = tmp / "bert_badweights"
    bad.mkdir(exist_ok=True)
    (bad / "config.json").write_text(json.dumps(hf))
    (bad / "model.safetensors").write_bytes(b"\x00" * 20)
    add("load_bert(model.safetensors of zeros)", lambda: load_bert(bad))
    save_file({"x": torch.zeros(2)}, str(tmp / "foreign.safetensors"))
    add("load_bert(foreign .safetensors, hf)", lambda: load_bert(tmp / "foreign.safetensors", hf))
    return P


def _pickles(tmp: Path) -> Path:
    folder = tmp / "bert_pickles"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    return folder


def data_probes(tmp: Path) -> list[Probe]:
    from headwise.data.text import make_tokenizer, read_pairs, read_text
    from headwise.data.tokenizers import tokenizer_from_dict

    D = "data"
    files = {"empty.txt": b"", "latin1.txt": "caf\xe9".encode("latin-1"),
             "text.txt": b"hello world\n", "blank.txt": b"\n\n  \n",
             "notab.tsv": b"a\tb\nno tab here\n", "emptytgt.tsv": b"a\t \n",
             "good.tsv": b"a\tb\n\nc\td\te\n", "nul.tsv": b"a\x00\tb\n"}
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    P = []

    def add(call, fn, expect="error"):
        P.append(Probe(D, call, fn, expect))

    add("read_text(missing file)", lambda: read_text(tmp / "missing.txt"))
    add("read_text(a directory)", lambda: read_text(tmp))
    add("read_text(empty file)", lambda: read_text(tmp / "empty.txt"))
    add("read_text(whitespace only)", lambda: read_text(tmp / "blank.txt"))
    add("read_text(latin-1 bytes)", lambda: read_text(tmp / "latin1.txt"))
    add("read_text(hello world)", lambda: len(read_text(tmp / "text.txt")), "ok")
    add("read_pairs(line without a tab)", lambda: read_pairs(tmp / "notab.tsv"))
    add("read_pairs(empty target)", lambda: read_pairs(tmp / "emptytgt.tsv"))
    add("read_pairs(2 pairs, a blank line, a 2nd tab kept in target)",
        lambda: read_pairs(tmp / "good.tsv"), "ok")
    add("read_pairs(NUL byte in source)", lambda: read_pairs(tmp / "nul.tsv"), "ok")
    add("make_tokenizer('wordpiece', text)", lambda: make_tokenizer("wordpiece", "abc"))
    add("tokenizer_from_dict({'kind': 'char', 'alphabet': ''})",
        lambda: tokenizer_from_dict({"kind": "char", "alphabet": ""}))
    add("tokenizer_from_dict({'kind': 'bpe'})", lambda: tokenizer_from_dict({"kind": "bpe"}))
    add("tokenizer_from_dict('char')", lambda: tokenizer_from_dict("char"))
    add("tokenizer_from_dict({'kind': 'char', 'alphabet': ['ab']})",
        lambda: tokenizer_from_dict({"kind": "char", "alphabet": ["ab"]}))
    return P


def viz_probes(tmp: Path) -> list[Probe]:
    from headwise.viz import head_view, heatmaps

    V = "viz"
    w = torch.softmax(_t(1, 2, 3, 3), -1)
    P = []

    def add(call, fn, expect="error"):
        P.append(Probe(V, call, fn, expect))

    def hm(weights, name="h.png", **kw):
        return heatmaps(weights, query_tokens=None, key_tokens=None, path=tmp / name, **kw)

    add("heatmaps(zero-size (1, 2, 0, 0) weights)", lambda: hm(torch.zeros(1, 2, 0, 0)))
    add("heatmaps(zero heads (1, 0, 3, 3))", lambda: hm(torch.zeros(1, 0, 3, 3)))
    add("heatmaps((3, 3) weights)  # 2-D", lambda: hm(w[0, 0]))
    add("heatmaps(path='h.jpg')", lambda: hm(w, "h.jpg"))
    add("heatmaps(layers=[5])", lambda: hm(w, layers=[5]))
    add("heatmaps(NaN weights)", lambda: hm(torch.full((1, 1, 2, 2), NAN)))
    add("heatmaps(100 x 100 grid of 4x4 panels)",
        lambda: hm(torch.rand(100, 100, 4, 4), "big.png"))
    add("heatmaps(path in a missing folder)", lambda: hm(w, "nowhere/h.png").path.name, "ok")
    add("head_view({'encoder_self': [w]}, tokens=['a'] * 5)",
        lambda: head_view({"encoder_self": [w]}, ["a"] * 5, tmp / "v.html"))
    add("head_view({'bogus': [w]}, ...)", lambda: head_view({"bogus": [w]}, ["a"] * 3,
                                                            tmp / "v.html"))
    add("head_view({'encoder_self': [w]}, path=a directory)",
        lambda: head_view({"encoder_self": [w]}, ["a"] * 3, tmp))
    return P


# ------------------------------------------------------------------------------ CLI
def cli_probes(tmp: Path) -> list[Probe]:
    ckpt = str(tmp / "ckpt")
    P = []

    def add(area, argv, expect="error"):
        P.append(Probe(area, "headwise " + " ".join(argv), lambda: _cli(argv), expect))

    def _cli(argv):
        result = cli(*argv)
        out = argv[argv.index("-o") + 1] if "-o" in argv else None
        return result + (f", wrote {Path(out).name}" if out and Path(out).is_file() else "")

    for value in ("0", "-1", "1000000001", "99999999999999999999999", "x"):
        add("cli params", ["params", "mha", "--embed-dim", value, "--heads", "2"])
    add("cli params", ["params", "mha", "--embed-dim", "10", "--heads", "4"])
    add("cli params", ["params", "lm", "--layers", "1000000"])
    add("cli params", ["params", "lm", "--vocab", "1000000000"])
    add("cli params", ["params", "gpt"])
    add("cli params", ["params", "mha", "--embed-dim", "8", "--heads", "2"], "ok")
    for extra in (["--embed-dim", "1000000001", "--heads", "2"], ["--seq", "0"],
                  ["--seq", "100000000"], ["--batch", "0"], ["--batch", "100000000"],
                  ["--device", "bogus"], ["--device", "meta"], ["--device", "mps"],
                  ["--device", "cuda:7"], ["--backend", "bogus"], ["--pad", "-1"],
                  ["--dropout", "nan"], ["--heads", "0"]):
        add("cli trace", ["trace", "mha", "--embed-dim", "8", "--heads", "2", *extra]
            if "--embed-dim" not in extra else ["trace", "mha", *extra])
    add("cli trace", ["trace", "--checkpoint", str(tmp / "nowhere")])
    add("cli trace", ["trace", "--checkpoint", str(tmp / "badjson")])
    add("cli trace", ["trace", "lm", "--layers", "1000000"])
    add("cli trace", ["trace", "mha", "--embed-dim", "8", "--heads", "2", "--seq", "3",
                      "--summary"], "ok")
    add("cli view", ["view", "--checkpoint", str(tmp / "nowhere"), "--text", "ab"])
    add("cli view", ["view", "--checkpoint", str(tmp / "layers"), "--text", "ab"])
    add("cli view", ["view", "--checkpoint", str(tmp / "trunc"), "--text", "ab"])
    for device in ("bogus", "meta", "mps", "cuda:7"):
        add("cli view", ["view", "--checkpoint", ckpt, "--text", "ab", "--device", device])
    add("cli view", ["view", "--checkpoint", ckpt, "--text", "ab", "--max-new-tokens", "-5"])
    add("cli view", ["view", "--checkpoint", ckpt, "--text", "ab", "--generate", "-1"])
    add("cli view", ["view", "--checkpoint", ckpt, "--text", "ab", "--generate", "100", "-o",
                     str(tmp / "v.html")], "ok")
    add("cli view", ["view", "--checkpoint", ckpt, "--text", "ab", "-o", str(tmp)], "ok")
    add("cli view", ["view", "--checkpoint", ckpt, "--text", "ab", "-o",
                     str(tmp / "v.html"), "--heatmaps", str(tmp / "h.jpg")])
    add("cli view", ["view", "--checkpoint", ckpt, "--text", "", "-o", str(tmp / "v.html")])
    add("cli view", ["view", "--checkpoint", ckpt, "--text", "abz", "-o", str(tmp / "v.html")])
    (tmp / "exists.html").write_text("old")
    add("cli view", ["view", "--checkpoint", ckpt, "--text", "ab", "-o",
                     str(tmp / "exists.html")], "ok")
    add("cli demo", ["demo", "--out", str(tmp / "exists.html"), "--steps", "1"])
    add("cli demo", ["demo", "--out", str(tmp), "--steps", "1"])
    add("cli explain", ["explain", "hi", "--device", "meta"])
    add("cli explain", ["explain", "hi", "--model-dir", str(tmp / "nowhere")])
    add("cli", ["bogus-command"])
    add("cli", [])
    return P


def _unfused_mode():
    from headwise.per_head import unfuse
    return f"training={unfuse(hw.MultiHeadAttention(8, 2, dropout=0.5).eval()).training}"


def _nan_head_entropy():
    q, k, _ = _qkv()
    stats = hw.stats.head_stats(_with(q, (0, 1), NAN), k)
    return f"per-head entropy {stats.per_head('entropy')[0].isnan().tolist()} is NaN"


def _masked_nan_entropy():
    q, k, _ = _qkv()
    pad = torch.tensor([True, True, False])
    got = hw.stats.head_stats(q, _with(k, (0, 1, 2), NAN), mask=pad).entropy
    want = hw.stats.head_stats(q, _with(k, (0, 1, 2), 0.0), mask=pad).entropy
    return f"entropy as with 0 there: {torch.allclose(got, want, atol=1e-6)}"


def _unequal_heads():
    from headwise.per_head import fuse, unfuse
    loop = unfuse(hw.MultiHeadAttention(8, 2))
    loop.q_heads[1] = torch.nn.Linear(8, 3)
    return fuse(loop)


def issue31_probes(tmp: Path) -> list[Probe]:
    """Issue 31's silent wrong answers and raw errors, each now a clear error or its result."""
    from headwise import checkpoint
    from headwise.data import make_task
    from headwise.data.tokenizers import ByteTokenizer
    from headwise.models import LMConfig, build
    from headwise.pretrained.gguf import load_gguf, read_gguf

    q, k, v = _qkv()
    lm = build(LMConfig(vocab_size=11, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                        max_len=32))
    P = []

    def add(area, call, fn, expect="error"):
        P.append(Probe(area, call, fn, expect))

    add("attention", "Selection(heads=torch.tensor([True, False]))",
        lambda: hw.Selection(heads=torch.tensor([True, False])))
    add("attention", "Selection(heads=[0.9, 2.7])", lambda: hw.Selection(heads=[0.9, 2.7]))
    add("attention", "Selection(heads='12')", lambda: hw.Selection(heads="12"))
    add("attention", "attention(q, k[:, :, :0], v[:, :, :0], return_weights=True)",
        lambda: hw.attention(q, k[:, :, :0], v[:, :, :0], return_weights=True), "ok")
    add("attention", "attention(q, k, v) on meta",
        lambda: hw.attention(*(x.to("meta") for x in (q, k, v))))
    add("MultiHeadAttention()", "unfuse(MHA(8, 2, dropout=0.5).eval())", _unfused_mode, "ok")
    add("MultiHeadAttention()", "fuse(per-head module with q_heads[1] = Linear(8, 3))",
        _unequal_heads)
    add("MultiHeadAttention()", "hw.trace(mha)  # no input",
        lambda: hw.trace(hw.MultiHeadAttention(8, 2)))
    add("heads", "stats.head_stats(q with head 1 NaN, k)", _nan_head_entropy, "ok")
    add("heads", "stats.head_stats(q, k with NaN at a padded key)", _masked_nan_entropy, "ok")
    add("heads", "stats.head_stats(q, k, token_ids=float ids)",
        lambda: hw.stats.head_stats(q, k, token_ids=torch.zeros(1, 3)))
    add("masks", "masks.causal(10**6)", lambda: masks.causal(10**6))
    add("masks", "masks.combine((2, 3) mask, (4, 5) mask)",
        lambda: masks.combine(torch.ones(2, 3, dtype=torch.bool),
                              torch.ones(4, 5, dtype=torch.bool)))
    add("masks", "masks.from_valid_lens([2, 'a'], 3)", lambda: masks.from_valid_lens([2, "a"], 3))
    add("models", "lm.new_cache(1, 10**12)", lambda: lm.new_cache(1, 10**12))
    add("checkpoint", "checkpoint.save(p, lm, config={...})  # a dict",
        lambda: checkpoint.save(tmp / "c31", lm, {"d_model": 16}))
    add("checkpoint", "checkpoint.save(p, lm, cfg, metadata={'x': tensor})",
        lambda: checkpoint.save(tmp / "c31", lm, lm.config, metadata={"x": torch.ones(2)}))
    add("data", "make_task('reverse', seed=-1)", lambda: make_task("reverse", seed=-1))
    add("data", "ByteTokenizer().encode('\\ud800')", lambda: ByteTokenizer().encode("\ud800"))
    add("pretrained", "read_gguf(None)", lambda: read_gguf(None))
    add("pretrained", "load_gguf(p, device='bogus')",
        lambda: load_gguf(tmp / "none.gguf", device="bogus"))
    add("cli chat", "headwise chat hi --temperature nan",
        lambda: cli("chat", "hi", "--temperature", "nan"))
    add("cli chat", "headwise chat hi --temperature 0.7 --top-p 1.5",
        lambda: cli("chat", "hi", "--temperature", "0.7", "--top-p", "1.5"))
    add("cli heads", "headwise heads score --checkpoint c --examples 1000000000",
        lambda: cli("heads", "score", "--checkpoint", str(tmp / "c"), "--examples",
                    "1000000000"))
    return P


def _without_corpora(tmp: Path, *argv: str) -> str:
    """``headwise argv`` with $HEADWISE_CORPORA naming an empty folder (a fresh clone after
    `make demo`, before `make corpora`)."""
    import os

    empty = tmp / "no-corpora"
    empty.mkdir(exist_ok=True)
    before = os.environ.get("HEADWISE_CORPORA")
    os.environ["HEADWISE_CORPORA"] = str(empty)
    try:
        return cli(*argv)
    finally:
        if before is None:
            del os.environ["HEADWISE_CORPORA"]
        else:
            os.environ["HEADWISE_CORPORA"] = before


def issue31_cli_probes(tmp: Path) -> list[Probe]:
    """#31's README and command-line items: chat --device, train's flags in its errors, a
    missing corpus reported before any model loads (within the row's time limit)."""
    P = []

    def add(area, call, fn, expect="error"):
        P.append(Probe(area, call, fn, expect))

    add("cli chat", "headwise chat hi --device meta", lambda: cli("chat", "hi", "--device", "meta"))
    add("cli chat", "headwise chat hi --device bogus",
        lambda: cli("chat", "hi", "--device", "bogus"))
    add("cli train", "headwise train reverse --heads 3 --steps 1",
        lambda: cli("train", "reverse", "--heads", "3", "--steps", "1", "--out",
                    str(tmp / "run-heads-3")))
    for model in ("minilm", "smollm2"):
        add("cli heads", f"headwise heads catalogue --model {model}  # before make corpora",
            lambda m=model: _without_corpora(tmp, "heads", "catalogue", "--model", m, "-o",
                                             str(tmp / f"cat-{m}")))
    return P


def probes(tmp: Path) -> list[Probe]:
    tmp = Path(tmp)
    out = attention_probes() + mha_probes() + mask_and_head_probes() + model_probes()
    out += checkpoint_probes(tmp) + bert_probes(tmp) + data_probes(tmp) + viz_probes(tmp)
    return out + cli_probes(tmp) + issue31_probes(tmp) + issue31_cli_probes(tmp)
