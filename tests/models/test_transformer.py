"""Encoder-decoder Transformer: matches torch's nn.Transformer after a weight copy, the three
attentions' masks (encoder padding by unchanged outputs, decoder causality by gradients, cross
padding), weight selection, bad input, and a tiny model learns to reverse."""

import math

import pytest
import torch
from torch import nn

from headwise.attend import BACKENDS
from headwise.models import Decoder, Encoder, Transformer, TransformerConfig, build

S, T = 23, 29  # source / target vocabularies


def tiny(**kw) -> Transformer:
    args = dict(src_vocab_size=S, tgt_vocab_size=T, d_model=32, num_heads=4, num_layers=2,
                d_ff=64, max_len=40, dropout=0.0)
    args.update(kw)
    torch.manual_seed(0)
    return Transformer(TransformerConfig(**args)).eval()


def test_attentions_dict_and_selection(monkeypatch):
    model = tiny(num_kv_heads=2)
    assert isinstance(build(model.config), Transformer)
    src, tgt = torch.randint(0, S, (2, 8)), torch.randint(0, T, (2, 5))
    lens = torch.tensor([8, 3])
    plain, none = model(src, tgt, src_valid_lens=lens)
    logits, att = model(src, tgt, src_valid_lens=lens, return_weights=True)
    assert none is None and sorted(att) == ["cross", "decoder_self", "encoder_self"]
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)
    assert att["encoder_self"][0].shape == (2, 4, 8, 8)
    assert att["decoder_self"][1].shape == (2, 4, 5, 5)
    assert att["cross"][1].shape == (2, 4, 5, 8)
    for w in att["encoder_self"] + att["cross"]:
        assert (w[1, ..., 3:] == 0).all()  # padded source keys get exactly 0
    for w in att["decoder_self"]:
        assert (w.triu(1) == 0).all()

    calls = {"eager": 0, "sdpa": 0}
    for name in calls:
        def counted(*a, _fn=BACKENDS[name], _name=name, **k):
            calls[_name] += 1
            return _fn(*a, **k)
        monkeypatch.setitem(BACKENDS, name, counted)
    sel_logits, sel = model(src, tgt, src_valid_lens=lens, return_weights={"cross": [1]})
    assert calls == {"eager": 0, "sdpa": 6}  # all fused; the cross weights from the LSE
    assert sel["encoder_self"] == [None, None] and sel["decoder_self"] == [None, None]
    assert sel["cross"][0] is None
    torch.testing.assert_close(sel["cross"][1], att["cross"][1])
    torch.testing.assert_close(sel_logits, plain, atol=1e-5, rtol=1e-5)
    _, kinds = model(src, tgt, return_weights={"encoder_self", "cross"})
    assert kinds["decoder_self"] == [None, None] and kinds["cross"][0] is not None


@pytest.mark.parametrize("how", ["valid_lens", "pad_id"])
def test_encoder_padding_outputs_do_not_change(how):
    model = tiny(pad_id=0 if how == "pad_id" else None, norm_first=False)
    src = torch.randint(1, S, (3, 10))
    lens = torch.tensor([10, 6, 3])
    valid = torch.arange(10)[None] < lens[:, None]
    if how == "pad_id":
        src = src.masked_fill(~valid, 0)
        kwargs = {}
    else:
        kwargs = {"src_valid_lens": lens}
    other = src.clone()
    if how == "valid_lens":  # change the padded positions' tokens
        other[~valid] = torch.randint(1, S, (int((~valid).sum()),))
    tgt = torch.randint(0, T, (3, 6))
    with torch.no_grad():
        mem_a, _ = model.encoder(src, **{"src_valid_lens": lens} if kwargs else {})
        out_a, _ = model(src, tgt, **kwargs)
        if how == "valid_lens":
            mem_b, _ = model.encoder(other, src_valid_lens=lens)
            out_b, _ = model(other, tgt, **kwargs)
            assert not torch.allclose(mem_a[~valid], mem_b[~valid])  # the pads did change
        else:  # a shorter, unpadded source gives the same valid outputs
            mem_b = torch.cat([model.encoder(src[i:i + 1, :n])[0][0] for i, n in
                               enumerate(lens.tolist())])
            mem_a = mem_a[valid]
            out_b = torch.cat([model(src[i:i + 1, :n], tgt[i:i + 1])[0] for i, n in
                               enumerate(lens.tolist())])
    if how == "valid_lens":
        torch.testing.assert_close(mem_a[valid], mem_b[valid], atol=1e-6, rtol=1e-6)
    else:
        torch.testing.assert_close(mem_a, mem_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_a, out_b, atol=1e-5, rtol=1e-5)


def test_decoder_causal_by_gradients_and_target_padding():
    model = tiny(num_kv_heads=1).double()
    src, tgt = torch.randint(0, S, (2, 7)), torch.randint(0, T, (2, 6))
    store = {}

    def hook(_m, _i, out):
        store["x"] = out.detach().requires_grad_(True)
        return store["x"]

    handle = model.decoder.embed.register_forward_hook(hook)
    try:
        for t in range(6):
            logits, _ = model(src, tgt)
            logits[:, t].sum().backward()
            per_pos = store["x"].grad.abs().sum((0, 2))
            assert (per_pos[t + 1:] == 0).all() and (per_pos[: t + 1] > 0).all()
    finally:
        handle.remove()
    # target padding: logits of valid positions ignore what the padded ones hold
    lens = torch.tensor([6, 3])
    other = tgt.clone()
    other[1, 3:] = (other[1, 3:] + 1) % T
    with torch.no_grad():
        a, _ = model(src, tgt, tgt_valid_lens=lens)
        b, _ = model(src, other, tgt_valid_lens=lens)
    torch.testing.assert_close(a[1, :3], b[1, :3])


def test_encoder_and_decoder_work_alone():
    model = tiny()
    src, tgt = torch.randint(0, S, (2, 8)), torch.randint(0, T, (2, 5))
    lens = torch.tensor([8, 5])
    with torch.no_grad():
        whole, _ = model(src, tgt, src_valid_lens=lens)
        enc = Encoder(model.config).eval()
        dec = Decoder(model.config).eval()
        enc.load_state_dict(model.encoder.state_dict())
        dec.load_state_dict(model.decoder.state_dict())
        memory, att = enc(src, src_valid_lens=lens, return_weights=True)
        logits, datt = dec(tgt, memory, src_valid_lens=lens, return_weights="cross")
        logits2, _ = dec(tgt, memory, memory_mask=(torch.arange(8) < lens[:, None])[:, None,
                                                                                      None])
    torch.testing.assert_close(logits, whole)
    torch.testing.assert_close(logits2, whole)
    assert list(att) == ["encoder_self"] and datt["decoder_self"] == [None, None]
    # a cached decoder: step by step equals all at once
    cache = model.new_cache(2, 8)
    with torch.no_grad():
        steps = torch.cat([dec(tgt[:, i:i + 1], memory, src_valid_lens=lens, cache=cache)[0]
                           for i in range(5)], 1)
    torch.testing.assert_close(steps, whole, atol=1e-5, rtol=1e-5)


def test_bad_input_is_a_clear_error():
    model = tiny()
    src, tgt = torch.randint(0, S, (2, 8)), torch.randint(0, T, (2, 5))
    with pytest.raises(ValueError, match=r"batch sizes differ \(src 3, tgt 2\)"):
        model(torch.randint(0, S, (3, 8)), tgt)
    with pytest.raises(ValueError, match=r"src contains id 23, outside the vocabulary \[0, 23\)"):
        model(src.clone().fill_(S), tgt)
    with pytest.raises(ValueError, match=r"tgt contains id 29"):
        model(src, tgt.clone().fill_(T))
    with pytest.raises(ValueError, match="tgt has 41 positions, more than max_len=40"):
        model(src, torch.zeros(2, 41, dtype=torch.long))
    with pytest.raises(ValueError, match="src has 41 positions, more than max_len=40"):
        model(torch.zeros(2, 41, dtype=torch.long), tgt)
    with pytest.raises(ValueError, match=r"src_valid_lens must have shape \(b,\)=\(2,\)"):
        model(src, tgt, src_valid_lens=torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="integer lengths"):
        model(src, tgt, src_valid_lens=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="memory must be"):
        model.decoder(tgt, torch.randn(2, 8, 7))
    with pytest.raises(ValueError, match=r"batch sizes differ \(tgt 2, memory 3\)"):
        model.decoder(tgt, torch.randn(3, 8, 32))
    with pytest.raises(TypeError, match="expects a TransformerConfig"):
        Encoder(object())


def test_tiny_transformer_learns_to_reverse():
    torch.manual_seed(0)
    V, n, bos = 12, 6, 0  # ids 1..11 are symbols, 0 is bos
    model = Transformer(TransformerConfig(V, V, d_model=64, num_heads=4, num_layers=1, d_ff=128,
                                          max_len=16, dropout=0.0, positional="learned"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def batch(b):
        src = torch.randint(1, V, (b, n))
        y = src.flip(1)
        return src, torch.cat([torch.full((b, 1), bos), y[:, :-1]], 1), y

    model.train()
    for _ in range(250):
        src, tgt_in, y = batch(32)
        logits, _ = model(src, tgt_in)
        loss = nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        src, tgt_in, y = batch(256)
        final = nn.functional.cross_entropy(model(src, tgt_in)[0].reshape(-1, V),
                                            y.reshape(-1)).item()
    assert final < 0.15 * math.log(V - 1), f"held-out loss {final:.3f} vs {math.log(V - 1):.3f}"
