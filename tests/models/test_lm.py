"""TransformerLM: matches torch's layers after a weight copy, causal by gradients, weights
never change logits, a weight selection keeps other layers fused, chunked cached forward equals
the full forward, bad input errors, and a tiny model learns."""

import math

import pytest
import torch
from torch import nn

import headwise as hw
from headwise import MultiHeadAttention
from headwise.attend import BACKENDS
from headwise.models import LMConfig, TransformerLM, build


def tiny(**kw) -> TransformerLM:
    args = dict(vocab_size=37, d_model=32, num_heads=4, num_layers=3, d_ff=64, max_len=64,
                dropout=0.0)
    args.update(kw)
    torch.manual_seed(kw.pop("seed", 0))
    return TransformerLM(LMConfig(**args)).eval()


def test_shapes_weights_and_build():
    model = tiny()
    assert isinstance(build(model.config), TransformerLM)
    tokens = torch.randint(0, 37, (2, 9))
    logits, att = model(tokens)
    assert logits.shape == (2, 9, 37) and att is None
    logits_w, att = model(tokens, return_weights=True)
    assert list(att) == ["decoder_self"] and len(att["decoder_self"]) == 3
    for w in att["decoder_self"]:
        assert w.shape == (2, 4, 9, 9)
        assert (w.triu(1) == 0).all()  # causal: no weight on later positions
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 9))
    torch.testing.assert_close(logits_w, logits, atol=1e-5, rtol=1e-5)


LLAMA = dict(positional="rope", norm="rms", ffn="glu", activation="silu", bias=False)


@pytest.mark.parametrize("kw", [dict(norm_first=True), dict(norm_first=False), LLAMA,
                                dict(LLAMA, norm_first=False, rotary_dim=4)])
def test_causal_by_gradients(kw):
    model = tiny(num_kv_heads=2, **kw).double()
    tokens = torch.randint(0, 37, (2, 8))
    for t in range(8):
        grads = _input_grads(model, tokens, lambda logits, t=t: logits[:, t].sum())
        per_pos = grads.abs().sum((0, 2))  # (n,)
        assert (per_pos[t + 1:] == 0).all(), f"position {t} depends on later positions"
        assert (per_pos[: t + 1] > 0).all()


def _input_grads(model, tokens, loss_fn):
    """d loss / d (embedding output): (b, n, m)."""
    store = {}

    def hook(_module, _inputs, out):
        out = out.detach().requires_grad_(True)
        store["x"] = out
        return out

    handle = model.embed.register_forward_hook(hook)
    try:
        logits, _ = model(tokens)
        loss_fn(logits).backward()
    finally:
        handle.remove()
    return store["x"].grad


def _count_backends(monkeypatch):
    calls = {"eager": 0, "sdpa": 0}
    for name in calls:
        fn = BACKENDS[name]

        def counted(*a, _fn=fn, _name=name, **k):
            calls[_name] += 1
            return _fn(*a, **k)
        monkeypatch.setitem(BACKENDS, name, counted)
    return calls


def test_weight_selection_keeps_other_layers_fused(monkeypatch):
    model = tiny()
    tokens = torch.randint(0, 37, (2, 6))
    full, _ = model(tokens)
    calls = _count_backends(monkeypatch)
    logits, att = model(tokens, return_weights={"decoder_self": [-1]})
    assert [w is None for w in att["decoder_self"]] == [True, True, False]
    assert calls == {"eager": 0, "sdpa": 3}  # weights too come from the fused kernel's LSE
    torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown kind 'cross'"):
        model(tokens, return_weights={"cross"})
    with pytest.raises(ValueError, match="layer index 3 out of range for 3 layers"):
        model(tokens, return_weights={"decoder_self": [3]})


def test_heads_and_rows_selection_per_layer_equals_the_slice_of_all_weights():
    model = tiny(num_kv_heads=2)
    tokens = torch.randint(0, 37, (2, 9))
    _, full = model(tokens, return_weights=True)
    _, part = model(tokens, return_weights={"decoder_self": {"layers": [0, -1], "heads": [3, 1],
                                                             "rows": slice(-4, None)}})
    got = part["decoder_self"]
    assert got[1] is None
    for layer in (0, 2):
        want = full["decoder_self"][layer][:, [3, 1], -4:]
        torch.testing.assert_close(got[layer], want, rtol=1e-6, atol=2e-7)
    _, every = model(tokens, return_weights=hw.Selection(heads=0))
    assert [w.shape for w in every["decoder_self"]] == [(2, 1, 9, 9)] * 3
    with pytest.raises(ValueError, match="heads index 4 out of range"):
        model(tokens, return_weights={"decoder_self": {"heads": [4]}})
    with pytest.raises(ValueError, match="empty selection of rows"):
        model(tokens, return_weights=hw.Selection(rows=[]))
    with pytest.raises(ValueError, match="unknown keys"):
        model(tokens, return_weights={"decoder_self": {"head": 0}})


def test_lm_compiles_with_fullgraph_on_the_fused_path():
    """No graph break in the whole LM forward (torch.compile's fullgraph=True): the token-range
    check is skipped while compiling. The eager backend of torch.compile keeps this fast; the
    inductor speed-up is a benchmark row (benchmarks/run_all.py)."""
    model = tiny(num_layers=2)
    tokens = torch.randint(0, 37, (2, 9))
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens)[0], model(tokens)[0], rtol=0, atol=0)
    torch._dynamo.reset()


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
def test_chunked_cached_forward_equals_full_forward(kv_heads):
    """Bottom-right causal alignment: a query block shorter than the cache sees every earlier
    position and no later one, with and without weights (eager and fused paths)."""
    model = tiny(num_kv_heads=kv_heads, positional="learned")
    tokens = torch.randint(0, 37, (2, 12))
    with torch.no_grad():
        full, att = model(tokens, return_weights=True)
        cache = model.new_cache(2, 16)
        parts, weights = [], []
        for lo, hi in ((0, 5), (5, 6), (6, 12)):
            part, a = model(tokens[:, lo:hi], cache=cache, return_weights=True)
            parts.append(part)
            weights.append(a["decoder_self"][0])
        fused = [model(tokens[:, :5], cache=model.new_cache(2, 16))[0]]
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused[0], full[:, :5], atol=1e-5, rtol=1e-5)
    # the last chunk's weights are rows 6..11 of the full causal weights
    torch.testing.assert_close(weights[2], att["decoder_self"][0][:, :, 6:12, :12])
    assert model.blocks[0].self_attn.k_proj.out_features == (kv_heads or 4) * 8


def test_tied_embeddings_and_final_norm():
    tied, untied = tiny(tie_embeddings=True), tiny()
    assert tied.lm_head.weight is tied.embed.tokens.weight
    assert untied.num_parameters() - tied.num_parameters() == 37 * 32
    assert isinstance(tiny().final_norm, nn.LayerNorm)
    assert isinstance(tiny(norm_first=False).final_norm, nn.Identity)
    assert "embed.positions.weight" in tiny(positional="learned").state_dict()
    assert all(isinstance(b.self_attn, MultiHeadAttention) for b in tied.blocks)


def test_bad_input_is_a_clear_error():
    model = tiny()
    with pytest.raises(ValueError, match=r"contains id 37, outside the vocabulary \[0, 37\)"):
        model(torch.tensor([[1, 37]]))
    with pytest.raises(ValueError, match="contains id -1"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="65 positions, more than max_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids, got dtype torch.float32"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"must be \(b, n\), got shape \(4,\); add a batch axis"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="batch sizes differ \\(tokens 2, cache 3\\)"):
        model(torch.zeros(2, 4, dtype=torch.long), cache=model.new_cache(3, 10))
    cache = model.new_cache(1, 10)
    model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="8 cached \\+ 3 new positions, more than max_len=10"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(TypeError, match="expects an LMConfig"):
        TransformerLM({"vocab_size": 3})


def test_tiny_lm_learns_a_periodic_task():
    """Sequences repeat a random block of 4 tokens; after the first block every token is
    determined by the one 4 positions back, so the loss there can fall to 0 from ln V."""
    torch.manual_seed(0)
    V, period, n = 16, 4, 20
    model = TransformerLM(LMConfig(V, d_model=32, num_heads=4, num_layers=2, d_ff=64,
                                   max_len=32, dropout=0.0, pad_id=None, positional="learned"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(120):
        block = torch.randint(0, V, (32, period))
        seq = block.repeat(1, n // period + 1)[:, :n]
        logits, _ = model(seq[:, :-1])
        loss = nn.functional.cross_entropy(logits[:, period - 1:].reshape(-1, V),
                                           seq[:, period:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        block = torch.randint(0, V, (256, period))
        seq = block.repeat(1, n // period + 1)[:, :n]
        logits, _ = model(seq[:, :-1])
        final = nn.functional.cross_entropy(logits[:, period - 1:].reshape(-1, V),
                                            seq[:, period:].reshape(-1)).item()
    assert final < 0.1 * math.log(V), f"held-out loss {final:.3f} vs uniform {math.log(V):.3f}"


@pytest.mark.parametrize("window, layers", [(1, 2), (2, 3), (3, 2)])
def test_sliding_window_receptive_field_by_gradients(window, layers):
    """With a window of w, L layers reach exactly L * (w - 1) positions back: position t's
    logits depend on positions max(0, t - L(w-1)) .. t and no other."""
    model = tiny(num_layers=layers, sliding_window=window, d_model=16, d_ff=24, **LLAMA).double()
    tokens = torch.randint(0, 37, (1, 8))
    for t in range(8):
        grads = _input_grads(model, tokens, lambda logits, t=t: logits[:, t].sum())
        per_pos = grads.abs().sum((0, 2))
        first = max(0, t - layers * (window - 1))
        assert (per_pos[t + 1:] == 0).all() and (per_pos[:first] == 0).all()
        assert (per_pos[first:t + 1] > 0).all()


def test_large_inference_logits_are_the_heads_product_in_recyclable_memory():
    """Under no_grad a large logits tensor (over headwise.fast.large's 16 MiB) is the head's own
    product bit for bit, written into memory headwise.fast.large hands out (a dropped result's
    memory comes back to the next call); a hook on the head still sees every call."""
    from headwise.fast import large as _large
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(vocab_size=9000, d_model=16, num_heads=2, num_layers=1,
                                   d_ff=32, max_len=600, dropout=0.0)).eval()
    ids = torch.randint(0, 9000, (1, 600))  # 600 x 9000 float32: 20.6 MiB
    want = model(ids)
    want = (want[0] if isinstance(want, tuple) else want).detach()
    with torch.no_grad():
        got = model(ids)
        got = got[0] if isinstance(got, tuple) else got
        assert torch.equal(got, want)
        ptr = got.data_ptr()
        del got
        again = model(ids)
        again = again[0] if isinstance(again, tuple) else again
        assert torch.equal(again, want) and again.data_ptr() == ptr  # recycled
        calls = []
        handle = model.lm_head.register_forward_hook(lambda m, a, o: calls.append(o.shape))
        hooked = model(ids)
        hooked = hooked[0] if isinstance(hooked, tuple) else hooked
        handle.remove()
    assert calls == [(1, 600, 9000)] and torch.equal(hooked, want)
    _large.release()
