"""headwise.long.profile on whole models: every statistic equals the float64 statistics of the
model's own attention weights (headwise's eager weights; HF eager ``output_attentions``) at
n = 1024, on headwise models and tiny HF models (Llama GQA, Mistral window, Gemma 2 soft-cap
and Gemma 3 alternating windows, gpt-oss sinks), causal and padded; the boundary checks."""

from __future__ import annotations

import pytest
import torch

import headwise as hw
from headwise.layers import AttentionConfig
from headwise.long import MaxLogit, profile
from headwise.models import LMConfig, TransformerLM
from tests.long import dense

N = 1024
OPTS = dict(block=64, sinks=4, window=16, far=100, top_k=4, progress=False)


def lm(**attention) -> TransformerLM:
    torch.manual_seed(0)
    config = LMConfig(vocab_size=50, d_model=32, num_heads=4, num_layers=2, d_ff=48,
                      max_len=N, positional="rope", norm="rms", ffn="glu", activation="silu",
                      attention=AttentionConfig(num_kv_heads=2, **attention))
    model = TransformerLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "sinks" in name:
                p.normal_()
            elif "proj" in name:
                p.mul_(3.0)
    return model


def check(prof, weights, layers, heads, *, tol=1e-6):
    """``prof`` against the dense statistics of ``weights[layer] (b, h, i, j)``."""
    for li, layer in enumerate(layers):
        p = weights[layer].double()[:, heads]
        allowed = p > 0  # the model's own weights: 0 exactly where masked (no underflow here)
        want = dense.statistics(p, allowed, p, block=64, sinks=4, window=16, far=100, top_k=4)
        for name, got in (("maps", prof.maps), ("distance", prof.distance),
                          ("sink", prof.sink), ("local", prof.local),
                          ("streaming", prof.scores["streaming"]), ("far", prof.scores["far"]),
                          ("topk_mass", prof.topk_mass)):
            err = (got[li].double() - want[name]).abs().max().item()
            assert err <= tol, (layer, name, err)
        rel = (prof.received[li].double() - want["received"]).abs() / want["received"].clamp(min=1)
        assert rel.max() <= 1e-5, (layer, "received")
        d = (prof.scores["mean_distance"][li].double() - want["mean_distance"]).abs()
        assert d.max() <= 1e-6 * N, (layer, "mean_distance")
        m = want["topk_mass"]
        for h in range(m.shape[0]):
            for i in range(m.shape[1]):
                gaps = (m[h, i, :-1] - m[h, i, 1:]).abs()
                if gaps.min() > 1e-6 and m[h, i, -1] > 1e-6:
                    assert set(prof.topk_keys[li, h, i].tolist()) == \
                        set(want["topk_keys"][h, i].tolist()), (layer, h, i)


@pytest.mark.parametrize("attention", [{}, {"window": 40}, {"softcap": 3.0}, {"sinks": True}],
                         ids=["causal", "window", "softcap", "sinks"])
def test_headwise_model_equals_its_own_weights(attention):
    model = lm(**attention)
    ids = torch.randint(0, 50, (1, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        weights = model(ids, return_weights=True)[1]["decoder_self"]
    prof = profile(model, ids, dtype=torch.float64, **OPTS)
    check(prof, weights, [0, 1], [0, 1, 2, 3])
    assert prof.heads_per_layer == 4 and prof.groups_per_layer == 2
    assert prof.group_scores["streaming"].shape == (2, 2)


def test_max_logit_equals_the_dense_max_and_selection_keeps_heads():
    model = lm()
    ids = torch.randint(0, 50, (1, 300), generator=torch.Generator().manual_seed(2))
    seen = {}

    def keep(module, q, k, mask, causal, scale, self_attention, softcap, sinks):
        seen.setdefault(len(seen), (q, k.repeat_interleave(q.shape[1] // k.shape[1], 1)))

    with hw.observe.observing(hw.observe.Observer(softmax=keep)), torch.no_grad():
        model(ids)
    prof = profile(model, ids, layers=[1], heads=[3, 1], reductions=[MaxLogit()],
                   dtype=torch.float64, progress=False)
    q, k = seen[1]
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~torch.ones(300, 300, dtype=torch.bool).tril(), float("-inf"))
    want = s.amax(dim=(0, 2, 3))[[1, 3]]
    assert torch.allclose(prof.scores["max_logit"][0].double(), want, rtol=1e-6)
    assert prof.layers == [1] and prof.heads == [1, 3] and prof.maps.shape[:2] == (1, 2)


HF = ["llama", "mistral", "gemma2", "gemma3", "gpt_oss"]


@pytest.mark.parametrize("padding", ["none", "left"])
@pytest.mark.parametrize("family", HF)
def test_tiny_hf_models_equal_eager_output_attentions(family, padding):
    tiny = pytest.importorskip("tests.hf.tiny")
    model = tiny.build(family)
    model.config.max_position_embeddings = N
    for m in model.modules():  # a sliding window that matters at n = 1024
        if getattr(m, "sliding_window", None):
            m.sliding_window = 50
    if getattr(model.config, "sliding_window", None):
        model.config.sliding_window = 50
    g = torch.Generator().manual_seed(3)
    n = N if padding == "none" else 512
    ids = torch.randint(3, tiny.VOCAB, (2 if padding != "none" else 1, n), generator=g)
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[0, :37] = 0
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    hw.hf.use(model)
    prof = profile(model, ids, attention_mask=mask, dtype=torch.float64, **OPTS)
    weights = {x: w for x, w in enumerate(eager)}
    if padding == "left":  # a pad row sees only pad keys: no key at all (eager spreads it
        for w in weights.values():  # uniformly over every key, the mask's finite minimum)
            w[0, :, :37] = 0.0
    check(prof, weights, [0, 1], [0, 1, 2, 3])
    if family != "llama":  # layer 0 slides (a 50-token window): nothing from 100 tokens back;
        assert prof.scores["far"][0].max() == 0  # Mistral's layer 1 too, the others' does not
        assert (prof.scores["far"][1].max() == 0) == (family == "mistral")


@pytest.mark.parametrize("kwargs, words", [
    (dict(block=0), "block size 0 does not fit"),
    (dict(block=N + 1), "does not fit a 1,024-token"),
    (dict(layers=[]), "empty selection of layers"),
    (dict(heads=[]), "empty selection of heads"),
    (dict(heads=[7]), "heads 7 out of range for 4"),
])
def test_bad_input_is_one_line_before_any_work(kwargs, words):
    model = lm()
    ids = torch.zeros(1, N, dtype=torch.long)
    with pytest.raises(ValueError, match=words) as e:
        profile(model, ids, progress=False, **kwargs)
    assert "\n" not in str(e.value)


def test_a_document_longer_than_the_context_names_both_lengths():
    with pytest.raises(ValueError, match="1,025 tokens but TransformerLM's context is 1,024"):
        profile(lm(), torch.zeros(1, N + 1, dtype=torch.long), progress=False)


class WrongShape(MaxLogit):
    name = "wrong"

    def finish(self):
        return self.top[:1]


def test_a_reduction_with_the_wrong_shape_is_refused_before_the_forward():
    model = lm()
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=r"'wrong' returned shape \(1,\) where its shape"):
        profile(model, torch.zeros(1, 64, dtype=torch.long), reductions=[WrongShape()],
                progress=False)
    assert calls == []


def test_smollm2_through_the_gguf_loader_three_heads_against_float64():
    """SmolLM2 (the project's GGUF loader: a headwise model), 3 heads of layer 15 at 512
    tokens: every statistic against float64 dense statistics of the same q and k
    (``benchmarks/long.py`` runs it at 8,192)."""
    gguf = pytest.importorskip("headwise.pretrained.gguf")
    try:
        chat = gguf.load_smollm2()
    except (FileNotFoundError, ValueError) as e:
        pytest.skip(f"SmolLM2's GGUF is not installed: {e}")
    model, heads, n = chat.model, [0, 4, 8], 512
    ids = torch.randint(0, 49152, (1, n), generator=torch.Generator().manual_seed(0))
    seen = []
    with hw.observe.observing(hw.observe.Observer(softmax=lambda m, q, k, *a: seen.append(
            (q, k)))), torch.no_grad():
        model(ids)
    q, k = seen[15]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)[:, heads]
    prof = profile(model, ids, layers=[15], heads=heads, dtype=torch.float64, **OPTS)
    p, allowed, s = dense.probabilities(q[:, heads], k, causal=True)
    check(prof, {15: p}, [15], list(range(3)))
