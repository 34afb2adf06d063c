"""run_with_cache's stop, run_with_hooks' per-head edits (the same as hw.ablate / hw.patch),
capture during generation (each step's new row, the same as the whole sequence recomputed), and
the boundary's one-line errors."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.layers import AttentionConfig
from headwise.models import LMConfig, TransformerLM
from tests.hf.tiny import build


def lm(layers: int = 3) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(LMConfig(
        vocab_size=20, d_model=16, num_heads=4, num_layers=layers, d_ff=24, max_len=32,
        dropout=0.0, positional="rope", norm="rms", ffn="glu", activation="silu", bias=False,
        attention=AttentionConfig(num_kv_heads=2))).eval()


def model_of(kind: str):
    return lm() if kind == "headwise" else build(kind, "headwise")


def ids_of(kind: str) -> torch.Tensor:
    return torch.randint(1, 20, (2, 8), generator=torch.Generator().manual_seed(3))


def blocks_run(model, fn) -> list[int]:
    ran = []
    blocks = model.transformer.h if hasattr(model, "transformer") else model.blocks
    handles = [block.register_forward_hook(lambda *a, n=n: ran.append(n))
               for n, block in enumerate(blocks)]
    try:
        fn()
    finally:
        for h in handles:
            h.remove()
    return ran


@pytest.mark.parametrize("kind", ["gpt2", "headwise"])
def test_a_run_stops_after_the_last_layer_it_needs(kind):
    model, ids = model_of(kind), ids_of(kind)
    out = {}
    ran = blocks_run(model, lambda: out.update(
        got=hw.run_with_cache(model, ids, names="blocks.0.attn.hook_z")))
    logits, cache = out["got"]
    assert ran == [0] and logits is None and cache.names() == ["blocks.0.attn.hook_z"]
    logits, _ = hw.run_with_cache(model, ids, names="blocks.0.attn.hook_z",
                                  stop_at_layer=2 if kind == "gpt2" else 3)
    assert logits is not None  # the model's own layer count: everything, logits too
    ran = blocks_run(model, lambda: hw.run_with_cache(model, ids, names="z", stop_at_layer=1))
    assert ran == [0]


@pytest.mark.parametrize("kind", ["llama", "headwise"])
def test_zeroing_a_head_at_hook_z_or_hook_result_is_hw_ablate(kind):
    model, ids = model_of(kind), ids_of(kind)
    heads = {"layers" if kind == "llama" else "decoder_self": {1: [2]}}
    with hw.ablate(model, heads):
        want = hw.run_with_hooks(model, ids)
    zero = lambda x, hook: x.index_fill(2, torch.tensor([2]), 0.0)  # noqa: E731
    for name in ("blocks.1.attn.hook_z", "blocks.1.attn.hook_result"):
        got = hw.run_with_hooks(model, ids, fwd_hooks=[(name, zero)])
        assert (got - want).abs().max() < 1e-5, name
    plain = hw.run_with_hooks(model, ids)
    assert (plain - want).abs().max() > 1e-3  # the edit changed something


@pytest.mark.parametrize("kind", ["llama", "headwise"])
def test_replacing_hook_z_from_another_run_is_hw_patch(kind):
    model, ids = model_of(kind), ids_of(kind)
    other = torch.randint(1, 20, ids.shape, generator=torch.Generator().manual_seed(9))
    _, source = hw.run_with_cache(model, other, names="blocks.0.attn.hook_z")
    heads = {"layers" if kind == "llama" else "decoder_self": {0: [1, 3]}}
    with hw.patch(model, heads, source=lambda: model(other)):
        want = hw.run_with_hooks(model, ids)

    def put(z, hook):
        z = z.clone()
        z[:, :, [1, 3]] = source[hook.name][:, :, [1, 3]]
        return z
    got = hw.run_with_hooks(model, ids, fwd_hooks=[("blocks.0.attn.hook_z", put)])
    assert (got - want).abs().max() < 1e-5


def test_scaling_a_head_result_and_the_residual_edits_reach_the_logits():
    model, ids = lm(), ids_of("headwise")
    _, cache = hw.run_with_cache(model, ids, names=lambda n: n.startswith("blocks.2"))
    want = model.final_norm(cache["resid_post", 2]) @ model.lm_head.weight.t()
    twice = hw.run_with_hooks(model, ids, fwd_hooks=[(lambda n: n.endswith("resid_post") and
                                                      n.startswith("blocks.2"), lambda x, hook: x)])
    assert (twice - want).abs().max() < 1e-5
    no_mlp = hw.run_with_hooks(model, ids, fwd_hooks=[("blocks.2.hook_mlp_out",
                                                        lambda x, hook: torch.zeros_like(x))])
    want = model.final_norm(cache["resid_mid", 2]) @ model.lm_head.weight.t()
    assert (no_mlp - want).abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["llama", "headwise"])
def test_capture_keeps_each_generated_tokens_row_without_recomputing(kind):
    model, ids = model_of(kind), ids_of(kind)[:1, :5]
    select = {"layers": [1], "heads": [0, 3]}
    with hw.capture(model, names="pattern", select=select) as steps:
        if kind == "llama":
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
        else:
            out = hw.generate(model, ids, hw.GenerationConfig(max_new_tokens=4))
    assert len(steps) == 4 and steps[0]["pattern", 1].shape == (1, 2, 5, 5)
    assert [s["pattern", 1].shape[2] for s in steps[1:]] == [1, 1, 1]  # the new token only
    _, whole = hw.run_with_cache(model, out[:, :-1], names="pattern", select=select)
    for t, step in enumerate(steps[1:], start=5):
        row = step["pattern", 1][:, :, 0]
        assert (row - whole["pattern", 1][:, :, t, :t + 1]).abs().max() < 1e-5


def test_bad_input_is_one_readable_line():
    model, ids = lm(), ids_of("headwise")
    cases = [
        (lambda: hw.run_with_cache(model, ids, names="blocks.1.attn.hook_patern"),
         "did you mean 'blocks.1.attn.hook_pattern'?"),
        (lambda: hw.run_with_cache(model, ids, names="blocks.3.hook_resid_pre"),
         "out of range: the model has 3 layers"),
        (lambda: hw.run_with_cache(model, ids, names="z", select={"layers": [1]},
                                   stop_at_layer=1), "pick no hook before layer 1"),
        (lambda: hw.run_with_cache(model, ids, names=lambda n: False), "selects no hook"),
        (lambda: hw.run_with_cache(model, ids, stop_at_layer=4), "stop_at_layer must be"),
        (lambda: hw.run_with_cache(model, ids, select={"layer": 1}), "unknown keys ['layer']"),
        (lambda: hw.run_with_cache(model, ids, names="pattern", select={"heads": [7]}),
         "heads index 7 out of range"),
        (lambda: hw.run_with_hooks(model, ids, [("blocks.0.attn.hook_pattern", print)]),
         "needs eager attention for layer 0"),
        (lambda: hw.run_with_hooks(model, ids, [("blocks.0.attn.hook_q", print)]),
         "is read only on the fused path"),
        (lambda: hw.run_with_hooks(model, ids, ["z"]), "each fwd_hooks entry must be"),
        (lambda: hw.run_with_cache(model, [[1, 2]]), "expected token ids (b, i)"),
    ]
    for call, says in cases:
        with pytest.raises((ValueError, TypeError, KeyError)) as e:
            call()
        assert says in str(e.value) and "\n" not in str(e.value), (says, str(e.value))


def test_a_transformers_model_on_another_implementation_is_refused_as_every_tool_refuses_it():
    model = build("llama", "sdpa")
    for call in (lambda: hw.run_with_cache(model, ids_of("llama")),
                 lambda: hw.ablate(model, {"layers": {0: [1]}}).__enter__()):
        with pytest.raises(ValueError, match=r"runs attn_implementation='sdpa'; call "
                                             r"headwise.hf.use\(model\) first") as e:
            call()
        assert "\n" not in str(e.value)
