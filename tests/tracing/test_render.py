"""The trace reads structured records only: rewriting every human-readable step message (the
step table's labels and notes) changes the listing and nothing in the structured output."""

from __future__ import annotations

import json

import pytest
import torch

import headwise as hw
from headwise.models import LMConfig, TransformerConfig, build
from headwise.models.bert import BertConfig, BertModel
from headwise.observe import StepKind


def _tiny_transformer(**kw) -> TransformerConfig:
    return TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, num_heads=4,
                             num_layers=1, d_ff=32, max_len=32, **kw)


def _traces() -> list[hw.Trace]:
    """Runs that together record every step of the table, on every attention path."""
    torch.manual_seed(0)
    x, kv = torch.randn(2, 5, 16), torch.randn(2, 6, 12)
    lens = torch.tensor([5, 3])
    out = []
    mha = hw.MultiHeadAttention(16, 4, kdim=12, vdim=12, out_dim=10, backend="eager").eval()
    out.append(hw.trace(mha, x, kv, kv, valid_lens=lens, return_weights=True, causal=True))
    grouped = hw.MultiHeadAttention(16, 4, num_kv_heads=2).eval()
    out.append(hw.trace(grouped, x, head_mask=torch.tensor([1.0, 0.0, 1.0, 1.0])))
    dropped = hw.MultiHeadAttention(16, 4, dropout=0.5, backend="eager").train()
    torch.manual_seed(1)
    out.append(hw.trace(dropped, x))
    lm = build(LMConfig(40, d_model=16, num_heads=4, num_layers=1, d_ff=32, scale_embeddings=True)).eval()
    with torch.no_grad():
        cache = lm.new_cache(1, 16)
        lm(torch.randint(0, 40, (1, 4)), cache=cache)
        out.append(hw.trace(lm, torch.randint(0, 40, (1, 1)), cache=cache))
    model = build(_tiny_transformer()).eval()
    src, tgt = torch.randint(1, 30, (1, 6)), torch.randint(1, 30, (1, 1))
    with torch.no_grad():
        out.append(hw.trace(model, src, tgt, return_weights={"cross": [0]}))
        memory, memory_mask = model.encode(src)
        cache = model.new_cache(1, 8)
        model.decoder(tgt, memory, memory_mask=memory_mask, cache=cache)
        out.append(hw.trace(model.decoder, tgt, memory, memory_mask=memory_mask, cache=cache))
    # a Llama-style LM (RoPE, RMSNorm, SwiGLU, window) with soft-capping and learned sinks
    llama = build(LMConfig(40, d_model=16, num_heads=4, num_layers=1, d_ff=32, num_kv_heads=2, positional="rope",
                           norm="rms", ffn="glu", activation="silu", bias=False,
                           sliding_window=3, attn_softcap=5.0, attention_sinks=True)).eval()
    out.append(hw.trace(llama, torch.randint(0, 40, (1, 5))))
    bert = BertModel(BertConfig(vocab_size=50, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                                max_len=16)).eval()
    out.append(hw.trace(bert, torch.randint(0, 50, (1, 5))))
    return out


def _structured(traces: list[hw.Trace]) -> list[str]:
    return [t.to_json() for t in traces]


def test_renaming_every_step_message_leaves_the_structured_trace_unchanged(monkeypatch):
    before = _traces()
    shown = [t.render() for t in before]
    recorded = {s.name for t in before for s in t.steps}
    assert recorded >= {k.value for k in StepKind}, "the runs must record every table step"
    for n, kind in enumerate(StepKind):
        monkeypatch.setattr(kind, "label", f"renamed step {n}")
        monkeypatch.setattr(kind, "note", f"rewritten message {n}")
    after = _traces()
    assert _structured(after) == _structured(before)
    for old, new, text in zip(before, after, shown, strict=True):
        assert [r.verdict for r in new.attention] == [r.verdict for r in old.attention]
        assert [(r.kernel, r.memory, r.fused, r.weights) for r in new.attention] \
            == [(r.kernel, r.memory, r.fused, r.weights) for r in old.attention]
        assert new.render() != text  # the listing did take the new messages
        assert "renamed step" in new.render() and "rewritten message" in new.render()
        assert "renamed step" not in new.to_json() and "rewritten message" not in new.to_json()


def test_structured_output_names_kernel_memory_and_weights_source():
    first = _traces()[0]
    [run] = json.loads(first.to_json())["attention"]
    assert run["kernel"] is None and run["ran"] == "eager" and run["memory"] == "O(n^2)"
    assert run["weights"]["method"] == "softmax" and not run["fused"]
    out = [s for s in first.steps if s.name == "output projection"][0]
    assert out.axes == ("b", "i", "out") and out.shape == (2, 5, 10)
    fused = hw.trace(hw.MultiHeadAttention(16, 4).eval(), torch.randn(1, 4, 16))
    [run] = fused.to_dict()["attention"]
    assert run["kernel"] == "FLASH_ATTENTION" and run["memory"] == "O(n)" and run["fused"]
    assert run["weights"] is None
    assert [s.axes for s in fused.steps if s.name == "output projection"] == [("b", "i", "m")]


@pytest.mark.parametrize("kind", list(StepKind))
def test_every_table_step_names_its_axes(kind):
    assert kind.axes and all(a for a in kind.axes)
    assert StepKind(kind.value) is kind


def test_the_trace_function_shadows_no_module():
    """``headwise.trace`` is the function; the implementation is the package ``headwise.tracing``
    and no ``headwise/trace.py`` module exists for the function to hide."""
    import importlib.util

    import headwise.tracing

    assert hw.trace is headwise.tracing.trace and hw.Trace is headwise.tracing.Trace
    assert importlib.util.find_spec("headwise.trace") is None


@pytest.mark.parametrize("layers, asked", [(7, None), (5, 2), (4, 0), (3, 2), (1, None)])
def test_the_summary_gives_calls_that_ran_alike_one_line(layers, asked):
    """`explain --model smollm2` printed 30 near-identical lines; the summary now has one line
    per group of layers whose calls ran alike, and the groups hold every call once."""
    torch.manual_seed(layers)
    model = build(LMConfig(40, d_model=16, num_heads=2, num_layers=layers, d_ff=16)).eval()
    weights = False if asked is None else {"decoder_self": [asked]}
    record = hw.trace(model, torch.randint(0, 40, (1, 6)), return_weights=weights)
    head, *lines = record.summary().splitlines()
    assert head.startswith(f"attention: {layers} call")
    fused = [n for n in range(layers) if n != asked]
    want = [] if not fused else [("fused kernel", fused)]
    if asked is not None:
        want.append(("weights recomputed", [asked]))
    want.sort(key=lambda w: w[1][0])  # groups in the order their first call ran
    assert len(lines) == len(want), lines
    for line, (verdict, members) in zip(lines, want, strict=True):
        path = line.split()[0]
        runs: list[list[int]] = []  # consecutive layers as [first, last]
        for n in members:
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
        assert path == f"blocks.{text}.self_attn", line
        assert (f"({len(members)} calls)" in line) == (len(members) > 1), line
        assert verdict in line and (verdict == "weights recomputed") == ("weights" in line), line


def test_the_summary_head_says_what_the_weights_cost_and_where_the_output_came_from():
    """Weights asked for some heads: the output stays on the fused kernel and the head line
    says the weights cost O(n^2) in what was asked; only an unfused call materialises every
    head's scores."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, 16)
    mha = hw.MultiHeadAttention(16, 2, backend="sdpa")
    plain = hw.trace(mha, x).summary().splitlines()[0]
    assert plain == "attention: 1 call, 1 fused (output on the fused kernel, O(n) memory)"
    asked = hw.trace(mha, x, return_weights=True).summary().splitlines()[0]  # autograd on
    assert asked == ("attention: 1 call, 1 fused (output on the fused kernel, O(n) memory; 1 of "
                     "them also computed the weights for the heads asked, O(n^2) in what you "
                     "asked for)")
    eager = hw.trace(hw.MultiHeadAttention(16, 2, backend="eager"), x).summary().splitlines()[0]
    assert eager == ("attention: 1 call, 0 fused, 1 unfused: every head's (b, h, i, j) scores "
                     "materialised (eager math or a fallback, O(n^2))")
