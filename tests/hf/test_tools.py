"""The head tools on Hugging Face models, against HF's own computations: the next-token loss
equals HF's ``labels=`` loss; importance by ablation equals the loss with that head's slice of
the ``o_proj`` input zeroed by hand on HF eager; the greedy default removes first the head whose
lone removal costs least; the catalogue's statistics equal those of HF eager's
``output_attentions`` reduced in float64; the head view's weights equal eager's, with the
model's tokens and its key/value heads; the trace names every layer's kernel and weights."""

from __future__ import annotations

import json

import pytest
import torch
from einops import rearrange

from tests.hf import tiny
from tests.hf.tiny import batch, build

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
import headwise as hw  # noqa: E402
from headwise.hf.model import head_count  # noqa: E402


def _inputs(padding: str, seed: int = 1, n: int = 9) -> dict:
    ids, mask = batch(padding, seed=seed, n=n)
    return {"input_ids": ids, "attention_mask": mask}


def _hf_loss(model, inputs) -> float:
    """HF's own causal-LM loss: ``labels=`` with the padded positions set to -100."""
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    with torch.no_grad():
        return float(model(**inputs, labels=labels).loss)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
def test_next_token_loss_equals_hfs_labels_loss(family):
    model = build(family, "headwise")
    for padding in ("none", "right"):
        inputs = _inputs(padding)
        with torch.no_grad():
            ours = float(hh.next_token_loss(model, inputs))
        assert ours == pytest.approx(_hf_loss(model, inputs), abs=1e-5)
    with torch.no_grad():  # ids alone: no padding
        ids = _inputs("none")["input_ids"]
        assert float(hh.next_token_loss(model, ids)) == pytest.approx(
            _hf_loss(model, _inputs("none")), abs=1e-5)


def test_an_encoder_has_no_default_loss_and_says_what_to_pass():
    model = build("bert", "headwise")
    with pytest.raises(TypeError, match="no default loss for BertForMaskedLM .*pass loss="):
        hw.importance(model, [_inputs("right")], method="ablation")


def _zeroed_by_hand(model, layer: int, head: int, inputs) -> float:
    """HF's loss on eager attention with ``head``'s slice of ``layer``'s o_proj input zeroed by
    a forward pre-hook."""
    module = hh.attention_layers(model)[layer]
    proj = module.c_proj if hasattr(module, "c_proj") else module.o_proj
    h = head_count(module)

    def hook(_, args):
        x = rearrange(args[0], "b i (h d) -> b h i d", h=h).clone()
        x[:, head] = 0.0
        return (rearrange(x, "b h i d -> b i (h d)"),)

    handle = proj.register_forward_pre_hook(hook)
    try:
        return _hf_loss(model, inputs)
    finally:
        handle.remove()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_importance_by_ablation_equals_zeroing_the_o_proj_slice_by_hand(family):
    model = build(family, "headwise")
    data = [_inputs("right"), _inputs("none", seed=4)]
    scores = hw.importance(model, data, method="ablation")["layers"]
    eager = build(family, "eager")
    base = sum(_hf_loss(eager, x) for x in data) / len(data)
    want = torch.tensor([[sum(_zeroed_by_hand(eager, layer, head, x) for x in data) / len(data)
                          - base for head in range(4)] for layer in range(2)],
                        dtype=torch.float64)
    torch.testing.assert_close(scores, want, atol=2e-5, rtol=0)
    assert want.abs().max() > 1e-3  # removing heads moves the loss


def test_attribution_and_gradient_equal_the_o_proj_input_gradient_by_hand():
    """Attribution: ``sum dL/dx * (0 - x)`` over each head's slice ``x`` of the o_proj input;
    gradient (Michel et al.): ``mean_b |sum dL/dx * x|``, over each layer's L2 norm; both from
    HF eager's gradient at o_proj's input, taken by hand with a pre-hook."""
    model, eager = build("qwen3", "headwise"), build("qwen3", "eager")
    data = _inputs("right")
    found: dict[int, torch.Tensor] = {}
    for n, layer in enumerate(hh.attention_layers(eager)):
        def keep(_, args, n=n):
            args[0].retain_grad()
            found[n] = args[0]
        layer.o_proj.register_forward_pre_hook(keep)
    hh.next_token_loss(eager, data).backward()
    attribution, gradient = [], []
    for n in range(2):
        x, dx = (rearrange(t, "b i (h d) -> b h i d", h=4).double()
                 for t in (found[n], found[n].grad))
        attribution.append((dx * -x).sum((0, 2, 3)))
        per_example = (dx * x).sum((2, 3)).abs().mean(0)  # (h,)
        gradient.append(per_example / per_example.norm())
    torch.testing.assert_close(hw.importance(model, [data], method="attribution")["layers"],
                               torch.stack(attribution).detach(), atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(hw.importance(model, [data], method="gradient")["layers"],
                               torch.stack(gradient).detach(), atol=1e-6, rtol=1e-4)


def test_the_greedy_default_removes_first_the_head_whose_lone_removal_costs_least():
    model = build("llama", "headwise")
    data = [_inputs("right")]
    greedy = hw.importance(model, data)
    lone = hw.importance(model, data, method="ablation")["layers"]
    assert greedy.method == "greedy"
    first = (greedy["layers"] == 0).nonzero().tolist()
    assert first == [list(divmod(int(lone.argmin()), lone.shape[1]))]
    assert sorted(greedy["layers"].flatten().tolist()) == list(range(8))  # every head ranked


def test_head_tools_refuse_a_model_not_running_headwise():
    model = build("llama", "sdpa")
    for tool in (lambda: hw.importance(model, [_inputs("none")], method="entropy"),
                 lambda: hw.catalogue(model, [_inputs("none")]),
                 lambda: hh.explain(model, tiny.tokenizer(), ["the cat"]),
                 lambda: hw.stats.collect(model).__enter__()):
        with pytest.raises(ValueError, match="runs attn_implementation='sdpa'; call "
                                             r"headwise.hf.use\(model\) first"):
            tool()
    hh.use(model)  # then the statistics come, one per layer
    with hw.stats.collect(model) as found, torch.no_grad():
        model(**_inputs("none"))
    assert len(found) == model.config.num_hidden_layers


def _eager_weights(family, inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        out = build(family, "eager")(**inputs, output_attentions=True)
    return [w.double() for w in out.attentions]


@pytest.mark.parametrize("family, padding", [("llama", "right"), ("gpt2", "none"),
                                             ("bert", "right")])
def test_catalogue_statistics_equal_hf_eagers_weights_in_float64(family, padding):
    model = build(family, "headwise")
    inputs = _inputs(padding)
    cat = hw.catalogue(model, [inputs])
    kind = "encoder_self" if family == "bert" else "decoder_self"
    assert cat.meta["kinds"] == {kind: [4, 4]}
    real = inputs["attention_mask"].bool()  # (b, i): the real query rows
    for layer, w in enumerate(_eager_weights(family, inputs)):  # (b, h, i, j)
        rows = real[:, None, :].expand(-1, w.shape[1], -1)  # (b, h, i)
        entropy = -(w * w.clamp_min(1e-300).log()).sum(-1)
        diag = torch.diagonal(w, dim1=-2, dim2=-1)  # (b, h, i): weight on the query itself
        want = {"entropy": entropy, "max_weight": w.amax(-1), "sink": w[..., 0], "self": diag}
        for score, per_row in want.items():
            mean = (per_row * rows).sum((0, 2)) / rows.sum((0, 2))  # (h,)
            got = torch.tensor([cat.head(kind, layer, h)["scores"][score] for h in range(4)],
                               dtype=torch.float64)
            torch.testing.assert_close(got, mean, atol=2e-6, rtol=0, msg=score)


def test_a_padded_batch_catalogues_as_its_rows_alone():
    """Padding changes nothing: every score and every top token's share and lift equal those of
    the rows run alone, unpadded. (The lift's uniform baseline must read HF's mask, which
    carries causality itself: ignoring it moved lifts by up to 2.)"""
    model = build("llama", "headwise")
    inputs = _inputs("right")
    n = int(inputs["attention_mask"][0].sum())
    ids = inputs["input_ids"]
    padded, alone = hw.catalogue(model, [inputs]), hw.catalogue(model, [ids[:1, :n], ids[1:]])
    for a, b in zip(padded.heads, alone.heads, strict=True):
        for score, value in a["scores"].items():
            assert value == pytest.approx(b["scores"][score], abs=1e-5), score
        assert [t["id"] for t in a["top_tokens"]] == [t["id"] for t in b["top_tokens"]]
        for x, y in zip(a["top_tokens"], b["top_tokens"], strict=True):
            assert (x["share"], x["lift"]) == pytest.approx((y["share"], y["lift"]), abs=2e-4)


@pytest.mark.parametrize("family, why", [("gemma2", "soft-caps its attention scores"),
                                         ("gpt_oss", "has attention sinks")])
def test_the_catalogue_refuses_layers_statistics_do_not_model(family, why):
    with pytest.raises(ValueError, match=f"catalogue: .* {why}, which head statistics do not "
                                         "model"):
        hw.catalogue(build(family, "headwise"), [_inputs("none")])
    with pytest.raises(ValueError, match=rf"importance\(method='entropy'\): .* {why}, which head "
                                         "statistics do not model .*method 'greedy'"):
        hw.importance(build(family, "headwise"), [_inputs("none")], method="entropy")


def test_explain_gives_eagers_weights_the_models_tokens_and_its_key_value_heads():
    model, tok = build("llama", "headwise"), tiny.tokenizer()
    texts = ["the cat sat on the mat", "a dog ran"]
    run = hh.explain(model, tok, texts)
    assert run.tokens == [["[BOS]", *t.split()] for t in texts]
    assert run.kv_heads == 2 and list(run.attentions) == ["decoder_self"]
    inputs = run.inputs
    assert inputs["attention_mask"].tolist() == [[1] * 7, [1] * 4 + [0] * 3]  # right padding
    real = inputs["attention_mask"].bool()
    for ours, eager in zip(run.attentions["decoder_self"], _eager_weights("llama", inputs),
                           strict=True):
        torch.testing.assert_close(ours.transpose(1, 2)[real].double(),
                                   eager.transpose(1, 2)[real], atol=1e-6, rtol=0)
    # the trace's report: every layer ran headwise's path and says how its weights came
    assert [a.path for a in run.record.attention] == ["model.layers.0.self_attn",
                                                      "model.layers.1.self_attn"]
    assert all(a.weights is not None for a in run.record.attention)
    assert "model.layers.0-1.self_attn (2 calls)" in run.record.summary()


def test_the_trace_of_an_hf_model_without_weights_is_fused_everywhere_and_names_a_selection():
    model = build("qwen3", "headwise")
    inputs = _inputs("left")
    with torch.no_grad():
        plain = hw.trace(model, **inputs)
        with hh.weights(model, {"layers": [1], "heads": [2]}):
            picked = hw.trace(model, **inputs)
    assert all(a.fused and a.memory == "O(n)" and a.weights is None for a in plain.attention)
    assert [a.weights is not None for a in picked.attention] == [False, True]
    assert all(a.fused for a in picked.attention)  # the selected layer too: weights from LSE


@pytest.mark.parametrize("family, kv", [("llama", 2), ("gpt2", 4), ("bert", 4)])
def test_head_view_writes_the_page_with_grouped_heads(family, kv, tmp_path):
    model = build(family, "headwise")
    view = hh.head_view(model, tiny.tokenizer(), ["the cat sat", "heads see one by one"],
                        tmp_path / "v.html", title="tiny")
    page = (tmp_path / "v.html").read_text()
    assert view.path == tmp_path / "v.html" and "<title>tiny</title>" in page
    meta = json.loads(page.split('<script type="application/json" id="hw-meta">', 1)[1]
                      .split("</script>", 1)[0])
    (kind, entry), = meta["kinds"].items()
    assert kind == ("encoder_self" if family == "bert" else "decoder_self")
    assert entry["heads"] == [4, 4] and entry["kvHeads"] == (kv if kv < 4 else None)
    assert meta["tokens"]["tgt" if family != "bert" else "src"][1] == \
        ["[BOS]", "heads", "see", "one", "by", "one"]


@pytest.mark.parametrize("texts", [[], "the cat", ["the cat", ""], ["[PAD]"] * 0])
def test_bad_texts_are_one_readable_error(texts):
    with pytest.raises(ValueError, match="texts must be a non-empty list of non-empty strings"):
        hh.explain(build("llama", "headwise"), tiny.tokenizer(), texts)
