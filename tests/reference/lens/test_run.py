"""Every hook of ``hw.run_with_cache`` on the fused path against a float64 eager reference of the
same quantities, taken by plain torch hooks on a float64 copy of the model: tiny random GPT-2
and Llama (grouped-query, rotary) from configs, padded batches (left and right), and headwise's
own language model. Only real positions are compared: a padded query row's weights are HF eager's
uniform row but headwise's zero row (design.md: the only place zeros are promised)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import headwise as hw
from headwise.layers import AttentionConfig
from headwise.lens import names as N
from headwise.models import LMConfig, TransformerLM
from tests.hf.tiny import batch, build

TOL = 1e-5  # float32 through 2 layers of scores scaled up 16x (tiny.build): rounding, ~1e-6


def hf_reference(model, ids, mask) -> dict[str, torch.Tensor]:
    """Every hook name -> its float64 eager value, NaN at padding: each row run alone on its
    real tokens at their own positions (HF eager's float64 padded rows are NaN and would reach
    every row through the keys), its tensors put back at those positions."""
    m = copy.deepcopy(model).double()
    m.set_attn_implementation("eager")
    full: dict[str, torch.Tensor] = {}
    for b in range(ids.shape[0]):
        at = mask[b].nonzero()[:, 0]
        row = one_row(m, ids[b, at][None], at[None])
        for name, x in row.items():
            if name not in full:
                shape = (ids.shape[0], *x.shape[1:2], ids.shape[1], *x.shape[3:]) if x.dim() == 4 \
                    and name.endswith(("pattern", "scores")) else (ids.shape[0], ids.shape[1],
                                                                   *x.shape[2:])
                if name.endswith(("pattern", "scores")):
                    shape = (*shape[:3], ids.shape[1])
                full[name] = torch.full(shape, float("nan"), dtype=torch.float64)
            if name.endswith(("pattern", "scores")):
                full[name][b, :, at[:, None], at[None, :]] = x[0]
            else:
                full[name][b, at] = x[0]
    return full


def one_row(m, ids, positions) -> dict[str, torch.Tensor]:
    """The hooks of one unpadded row, by forward hooks on the float64 eager model ``m``."""
    got: dict[str, torch.Tensor] = {}
    handles = []
    blocks = m.transformer.h if hasattr(m, "transformer") else m.model.layers
    heads = m.config.num_attention_heads
    kv = getattr(m.config, "num_key_value_heads", None) or heads
    for l, block in enumerate(blocks):
        attn = getattr(block, "self_attn", None) or block.attn
        out_proj = getattr(attn, "o_proj", None) or attn.c_proj

        def keep(name, fn):
            return lambda mod, args, out: got.__setitem__(name, fn(args, out))
        p = f"blocks.{l}."
        handles += [
            block.register_forward_pre_hook(
                lambda mod, args, p=p: got.__setitem__(p + "hook_resid_pre", args[0])),
            block.register_forward_hook(keep(p + "hook_resid_post", lambda a, o: _first(o))),
            attn.register_forward_hook(keep(p + "hook_attn_out", lambda a, o: o[0])),
            block.mlp.register_forward_hook(keep(p + "hook_mlp_out", lambda a, o: o)),
            out_proj.register_forward_pre_hook(
                lambda mod, args, p=p: got.__setitem__(p + "attn.hook_z",
                                                       args[0].unflatten(-1, (heads, -1))))]
        if hasattr(attn, "c_attn"):
            handles.append(attn.c_attn.register_forward_hook(
                lambda mod, a, o, p=p: got.update(
                    {p + f"attn.hook_{s}": x.unflatten(-1, (heads, -1))
                     for s, x in zip("qkv", o.chunk(3, -1), strict=True)})))
        else:
            for s, n in (("q", heads), ("k", kv), ("v", kv)):
                handles.append(getattr(attn, f"{s}_proj").register_forward_hook(
                    keep(p + f"attn.hook_{s}", lambda a, o, n=n: o.unflatten(-1, (n, -1)))))
    try:
        with torch.no_grad():
            out = m(input_ids=ids, position_ids=positions, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    for l, w in enumerate(out.attentions):
        p = f"blocks.{l}."
        got[p + "attn.hook_pattern"] = w
        got[p + "hook_resid_mid"] = got[p + "hook_resid_pre"] + got[p + "hook_attn_out"]
        w_o = (blocks[l].attn.c_proj.weight.t() if hasattr(blocks[l], "attn")
               else blocks[l].self_attn.o_proj.weight)
        got[p + "attn.hook_result"] = torch.einsum(
            "bihd,mhd->bihm", got[p + "attn.hook_z"], w_o.unflatten(1, (w.shape[1], -1)))
    got["logits"] = out.logits
    return got


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def compare(name: str, got: torch.Tensor, want: torch.Tensor, real: torch.Tensor) -> None:
    """``got`` (float32) against ``want`` (float64, NaN at padding) at the real positions;
    a pattern is 0 on padded keys of real rows."""
    assert got.shape == want.shape, name
    known = want.isfinite()
    g, w = got.double()[known], want[known]
    assert (g - w).abs().max() <= TOL * max(1.0, w.abs().max()), name
    if name.endswith("pattern"):
        rows = real[:, None, :, None] & ~real[:, None, None, :]  # real rows, padded keys
        assert not got[rows.expand(got.shape)].any(), name


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("padding", ["left", "right"])
def test_every_hook_equals_the_float64_eager_reference(family, padding):
    model = build(family, "headwise")
    ids, mask = batch(padding)
    want = hf_reference(model, ids, mask)
    logits, cache = hw.run_with_cache(model, {"input_ids": ids, "attention_mask": mask})
    assert len(cache) == 12 * model.config.num_hidden_layers
    real = mask.bool()
    for name, tensor in cache.items():
        if not name.endswith("attn_scores"):
            compare(name, tensor, want[name], real)
    compare("logits", logits, want["logits"], real)
    for l in range(model.config.num_hidden_layers):  # softmax(scores) is the pattern
        s = cache["attn_scores", l].double()
        rows = real[:, None, :, None].expand(s.shape)
        compare(f"softmax {l}", torch.where(rows, s.softmax(-1), float("nan")),
                want[f"blocks.{l}.attn.hook_pattern"], real)
        pattern = cache["pattern", l]
        assert torch.equal(s[rows].isinf(), pattern[rows] == 0)  # masked: -inf, weight 0


def test_gpt2_scores_equal_q_k_over_sqrt_d_with_masked_keys_minus_inf():
    model = build("gpt2", "headwise")
    ids, mask = batch("right")
    want = hf_reference(model, ids, mask)
    _, cache = hw.run_with_cache(model, {"input_ids": ids, "attention_mask": mask},
                                 names="attn_scores")
    for l in range(2):
        q, k = (want[f"blocks.{l}.attn.hook_{s}"].transpose(1, 2) for s in "qk")
        s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        allowed = torch.ones(9, 9, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]
        s = s.masked_fill(~allowed, float("-inf"))
        got = cache["attn_scores", l]
        assert torch.equal(got.isinf(), s.isinf())
        assert (got[s.isfinite()].double() - s[s.isfinite()]).abs().max() < TOL * 10


def _lm(seed: int) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(LMConfig(
        vocab_size=31, d_model=24, num_heads=6, num_layers=3, d_ff=32, max_len=32, dropout=0.0,
        positional="rope", norm="rms", ffn="glu", activation="silu", bias=False,
        attention=AttentionConfig(num_kv_heads=3))).eval()


@given(seed=st.integers(0, 2**16), n=st.integers(2, 12))
def test_headwise_models_hooks_equal_their_float64_forward(seed, n):
    model = _lm(seed)
    ids = torch.randint(0, 31, (2, n), generator=torch.Generator().manual_seed(seed))
    logits, cache = hw.run_with_cache(model, ids)
    m64 = copy.deepcopy(model).double()
    want_logits, weights = m64(ids, return_weights=True)
    assert (logits.double() - want_logits).abs().max() < TOL
    x = m64.embed(ids)
    for l, block in enumerate(m64.blocks):
        p = f"blocks.{l}."
        assert (cache[p + "hook_resid_pre"].double() - x).abs().max() < TOL
        attn_in = block.attn_norm(x)
        attn_out, _ = block.self_attn(attn_in, causal=True)
        for s, proj in zip("qkv", (block.self_attn.q_proj, block.self_attn.k_proj,
                                   block.self_attn.v_proj), strict=True):
            assert (cache[p + f"attn.hook_{s}"].double().flatten(-2) - proj(attn_in)).abs().max() \
                < TOL
        assert (cache[p + "hook_attn_out"].double() - attn_out).abs().max() < TOL
        result = cache[p + "attn.hook_result"].double()
        assert (result.sum(2) - attn_out).abs().max() < TOL  # no bias in this model
        assert (cache[p + "attn.hook_pattern"].double() - weights["decoder_self"][l]).abs().max() \
            < TOL
        mid = x + attn_out
        assert (cache[p + "hook_resid_mid"].double() - mid).abs().max() < TOL
        mlp = block.ff(block.ff_norm(mid))
        assert (cache[p + "hook_mlp_out"].double() - mlp).abs().max() < TOL
        x = mid + mlp
        assert (cache[p + "hook_resid_post"].double() - x).abs().max() < TOL


# ------------------------------------------------------------- TransformerLens itself, as a peer
ROOT = Path(__file__).resolve().parents[3]
PEER = ROOT / ".peers" / "bin" / "python"  # built by `make peers`; never headwise's dependency


def _save_tiny(model, directory: Path) -> None:
    """``model`` and a word-level tokenizer of its vocabulary, saved for the peer to load."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast
    model.save_pretrained(directory)
    vocab = {f"w{i}": i for i in range(model.config.vocab_size - 1)}
    vocab["<unk>"] = model.config.vocab_size - 1
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                            pad_token="<unk>").save_pretrained(directory)


@pytest.mark.skipif(not PEER.exists(), reason=".peers/ absent: `make peers` builds "
                                              "TransformerLens 4.3's environment")
@pytest.mark.parametrize("padding", ["right", "left"])
def test_every_hook_equals_transformer_lens_own_values(tmp_path, padding):
    """TransformerBridge on eager attention (run by .peers' interpreter) against headwise's cache
    on the fused path, every hook name, on a padded batch: real positions, to 1e-5."""
    from safetensors.torch import load_file
    model = build("gpt2", "headwise")
    _save_tiny(model, tmp_path / "tiny")
    ids, mask = batch(padding)
    (tmp_path / "batch.json").write_text(json.dumps({"input_ids": ids.tolist(),
                                                     "attention_mask": mask.tolist()}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(PEER), str(Path(__file__).with_name("transformer_lens_peer.py")),
                          str(tmp_path / "tiny"), str(tmp_path / "batch.json"),
                          str(tmp_path / "tl.safetensors")], capture_output=True, text=True,
                         env=dict(env, HF_HUB_OFFLINE="1"), timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = load_file(tmp_path / "tl.safetensors")
    # TransformerLens counts a padded row's positions from its first real token (cumsum of the
    # mask); transformers' GPT-2 counts from 0 unless told: the same positions are passed here
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    logits, cache = hw.run_with_cache(model, {"input_ids": ids, "attention_mask": mask,
                                              "position_ids": positions})
    names = set(N.all_names(model.config.num_hidden_layers))
    assert names <= set(theirs), sorted(names - set(theirs))  # every hook name, both sides
    real = mask.bool()
    for name in sorted(names):
        peer_value(name, cache[name], theirs[name], real)
    peer_value("logits", logits, theirs["logits"], real)


def peer_value(name: str, ours: torch.Tensor, theirs: torch.Tensor, real: torch.Tensor) -> None:
    """At real query rows (and, for patterns and scores, real keys): equal to 1e-5."""
    assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
    by_head = name.endswith(("pattern", "scores"))
    keep = (real[:, None, :, None] & real[:, None, None, :]).expand(ours.shape) if by_head \
        else real.reshape(real.shape + (1,) * (ours.dim() - 2)).expand(ours.shape)
    a, b = ours[keep].double(), theirs[keep].double()
    assert torch.equal(a.isinf(), b.isinf()), name  # scores: causally masked keys -inf in both
    a, b = a[b.isfinite()], b[b.isfinite()]
    assert (a - b).abs().max() <= TOL * max(1.0, b.abs().max()), name
