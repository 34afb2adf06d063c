"""Physical head pruning of transformers models: the pruned model computes what the unpruned one
computes with those heads gated to 0 (hw.ablate zeroes their slice of the o_proj input) to
1e-6 x max(1, |logits|), in float32 and float64, padded, and generating with a dynamic and a
static cache; the parameters drop by exactly the cut rows and columns; a pruned checkpoint
round-trips through save_pretrained / headwise.hf.load (and prune.from_pretrained; load_pruned is
deprecated); bad selections are one readable line and
leave the model as it was."""

from __future__ import annotations

import copy
import itertools
import random

import pytest
import torch

from tests.hf import tiny
from tests.hf.tiny import VOCAB, batch, build

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
import headwise as hw  # noqa: E402
from headwise.heads import layer_plan  # noqa: E402
from headwise.hf.model import head_count  # noqa: E402

PRUNABLE = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "gpt_oss", "phi3", "gpt2",
            "bert"]
H, G = 4, 2  # the tiny models' query and key/value heads (tests/hf/tiny.py; GPT-2, BERT: 4, 4)


def _valid(removed) -> bool:
    try:
        layer_plan(H, G, removed, "x")
    except ValueError:
        return False
    return True


# every selection of a layer's heads the grouped-query rule allows (whole groups, or the same
# number of heads from every group), and those it refuses (with 4 groups of 1 all are allowed)
ALLOWED = [s for n in range(1, H) for s in itertools.combinations(range(H), n) if _valid(s)]
REFUSED = [s for n in range(1, H) for s in itertools.combinations(range(H), n) if not _valid(s)]


def _selection(seed: int) -> dict:
    """Random allowed heads in both layers, named in a random order, some negative."""
    rng = random.Random(seed)
    layers = {}
    for layer in (0, 1):
        heads = list(rng.choice(ALLOWED))
        rng.shuffle(heads)
        layers[layer] = [x - H if rng.random() < 0.5 else x for x in heads]
    return {"layers": layers}


def _pair(family: str, dtype=torch.float32, seed: int = 0):
    """``(unpruned, pruned copy, selection)`` on attn_implementation="headwise"."""
    model = build(family, "headwise").to(dtype)
    selection = _selection(seed)
    return model, hh.prune_heads(copy.deepcopy(model), selection), selection


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within 1e-6 x max(1, |want|) elementwise (float32's rounding of the products whose sums
    lost terms is ~1e-7 relative)."""
    bound = 1e-6 * want.abs().clamp(min=1)
    assert ((got - want).abs() <= bound).all(), (got - want).abs().max()


@pytest.mark.parametrize("family", PRUNABLE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("padding", ["left", "right"])
def test_the_pruned_model_equals_the_model_with_those_heads_gated(family, dtype, padding):
    if family == "gpt_oss" and dtype == torch.float64:
        pytest.skip("gpt-oss's experts (torch grouped_mm) take no float64")
    seed = PRUNABLE.index(family) * 4 + (dtype == torch.float64) * 2 + (padding == "left")
    model, pruned, selection = _pair(family, dtype, seed)
    ids, mask = batch(padding, seed=seed)
    with torch.no_grad():
        with hw.ablate(model, selection):
            gated = model(input_ids=ids, attention_mask=mask).logits
        plain = model(input_ids=ids, attention_mask=mask).logits
        got = pruned(input_ids=ids, attention_mask=mask).logits
    _close(got, gated)
    assert (plain - gated).abs().max() > 1e-3  # the gate did something
    # the pruned layers keep their own head counts, and eager attention reads them too
    kept = [H - len(selection["layers"][layer]) for layer in (0, 1)]
    assert [head_count(m) for m in hh.attention_layers(pruned)] == kept
    if dtype == torch.float32:  # HF eager gives NaN rows in float64 with padding, pruned or not
        pruned.set_attn_implementation("eager")
        with torch.no_grad():
            eager = pruned(input_ids=ids, attention_mask=mask).logits
        real = mask.bool()
        torch.testing.assert_close(eager[real], gated[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma2", "phi3", "gpt2"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_the_pruned_model_generates_the_gated_models_tokens(family, cache):
    model, pruned, selection = _pair(family, seed=7)
    ids, mask = batch("left") if cache == "dynamic" else (batch("none", b=1)[0], None)
    options = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    if cache == "static":
        options["cache_implementation"] = "static"
    with torch.no_grad():
        with hw.ablate(model, selection):
            want = model.generate(input_ids=ids, attention_mask=mask, **options)
        got = pruned.generate(input_ids=ids, attention_mask=mask, **options)
    assert got.shape[1] == ids.shape[1] + 6
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt_oss", "phi3", "gpt2", "bert"])
def test_the_parameters_drop_by_exactly_the_cut_rows_and_columns(family):
    model, pruned, selection = _pair(family, seed=11)
    m = model.config.hidden_size
    d = m // H
    g = getattr(model.config, "num_key_value_heads", None) or H
    before = dict(model.named_parameters())
    drop = 0
    for layer, module in enumerate(hh.attention_layers(model)):
        removed = [x % H for x in selection["layers"][layer]]
        kv_removed = g - len(layer_plan(H, g, removed, "x")[1])
        qkv = {"q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "query", "key", "value"}
        bias = any(n.endswith("bias") and n.split(".")[0] in qkv
                   for n, _ in module.named_parameters())
        drop += len(removed) * d * (m + bias)          # q rows (and bias)
        drop += 2 * kv_removed * d * (m + bias)        # k and v rows (and bias)
        drop += len(removed) * d * m                   # o columns (its bias is per model dim)
        drop += len(removed) * hasattr(module, "sinks")
    after = dict(pruned.named_parameters())
    assert sum(p.numel() for p in after.values()) == sum(p.numel() for p in before.values()) - drop
    assert drop > 0
    # the same parameters, and every one whose shape did not change is untouched
    assert before.keys() == after.keys()
    assert all(torch.equal(before[n], after[n]) for n in before if before[n].shape == after[n].shape)


@pytest.mark.parametrize("family", ["qwen3", "phi3", "gpt_oss"])
def test_a_pruned_checkpoint_round_trips_through_save_pretrained_and_from_pretrained(
        family, tmp_path, transformers):
    _, pruned, _ = _pair(family, seed=5)
    pruned.save_pretrained(tmp_path)
    loaded = hh.prune.from_pretrained(tmp_path, attn_implementation="headwise").eval()
    assert type(loaded) is type(pruned)
    assert loaded.config.headwise_pruned_heads == pruned.config.headwise_pruned_heads
    ids, mask = batch("left")
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids, attention_mask=mask).logits,
                           pruned(input_ids=ids, attention_mask=mask).logits)
    again = hh.prune.from_pretrained(tmp_path, transformers.AutoModelForCausalLM)
    assert type(again) is type(pruned)
    # transformers alone cannot rebuild per-layer head counts: it stops, it does not guess
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


def test_from_pretrained_loads_an_unpruned_checkpoint_as_transformers_does(tmp_path,
                                                                          transformers):
    model = build("llama")
    model.save_pretrained(tmp_path)
    loaded = hh.prune.from_pretrained(tmp_path)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 plain.state_dict().values(), strict=True))


def test_load_and_the_deprecated_load_pruned_give_the_pruned_model_load_on_headwise(tmp_path):
    _, pruned, _ = _pair("qwen3", seed=6)
    pruned.save_pretrained(tmp_path)
    tiny.tokenizer().save_pretrained(tmp_path)
    model, tok = hh.load(tmp_path)  # the one loader: (model, tokenizer), on headwise
    assert model.config._attn_implementation == hh.NAME and not model.training
    assert tok("the cat")["input_ids"] == tiny.tokenizer()("the cat")["input_ids"]
    with pytest.warns(DeprecationWarning, match=r"headwise.hf.load\(path\) loads a pruned"):
        old = hh.load_pruned(tmp_path)  # still the model alone, as before, with the warning
    assert type(old) is type(pruned) is type(model)
    ids, mask = batch("left")
    with torch.no_grad():
        want = pruned(input_ids=ids, attention_mask=mask).logits
        for got in (model, old.eval()):
            torch.testing.assert_close(got(input_ids=ids, attention_mask=mask).logits, want,
                                       atol=1e-5, rtol=0)


def test_pruning_twice_names_heads_as_the_model_is_now_and_records_original_indices():
    model = build("llama", "headwise")
    twice = hh.prune_heads(copy.deepcopy(model), {"layers": {0: [0, 2]}})
    hh.prune_heads(twice, {"layers": {0: [1], 1: [3, 2]}})  # now heads 1, 3 -> original 3, 1..
    once = hh.prune_heads(copy.deepcopy(model), {"layers": {0: [0, 2, 3], 1: [2, 3]}})
    assert twice.config.headwise_pruned_heads == [[0, 2, 3], [2, 3]]
    assert once.config.headwise_pruned_heads == [[0, 2, 3], [2, 3]]
    assert all(torch.equal(a, b) for a, b in zip(twice.state_dict().values(),
                                                 once.state_dict().values(), strict=True))


def test_hw_prune_heads_hands_a_transformers_model_to_the_hf_pruner():
    model = build("llama", "headwise")
    ours = hw.prune_heads(copy.deepcopy(model), {"layers": {0: [0, 2], -1: [2, 3]}})
    theirs = hh.prune_heads(copy.deepcopy(model), {"layers": {0: [0, 2], 1: [2, 3]}})
    assert ours.config.headwise_pruned_heads == [[0, 2], [2, 3]]
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                 theirs.state_dict().values(), strict=True))
    assert sum(p.numel() for p in ours.parameters()) < sum(p.numel() for p in model.parameters())


def test_a_pruned_layers_weights_are_the_kept_heads_weights_of_the_gated_model():
    model, pruned, selection = _pair("qwen3", seed=3)
    ids, mask = batch("right")
    with torch.no_grad():
        with hw.ablate(model, selection):
            want = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        got = pruned(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for layer in (0, 1):
        removed = {x % H for x in selection["layers"][layer]}
        kept = [x for x in range(H) if x not in removed]
        torch.testing.assert_close(got[layer], want[layer][:, kept], atol=1e-6, rtol=0)


def _one_line(error_type, match, model, heads):
    state = {n: p.clone() for n, p in model.state_dict().items()}
    with pytest.raises(error_type, match=match) as info:
        hh.prune_heads(model, heads)
    assert "\n" not in str(info.value)
    after = model.state_dict()  # nothing was cut
    assert state.keys() == after.keys()
    assert all(torch.equal(state[n], after[n]) for n in state)
    assert getattr(model.config, "headwise_pruned_heads", None) is None


@pytest.mark.parametrize("heads, error_type, match", [
    ({"layers": {0: [1, 3], 1: [0, 1, 2, 3]}}, ValueError,
     r"layer 1 \(original head indices\): pruning heads \[0, 1, 2, 3\] would remove all 4 heads"),
    ({"layers": {1: True}}, ValueError, "would remove all 4 heads"),
    ({"layers": {2: [0]}}, ValueError, r"layer 2 does not exist \(there are 2: 0\.\.1"),
    ({"layers": {0: [4]}}, ValueError, "head 4 of layer 0 does not exist"),
    ({"layers": {0: [1, -3]}}, ValueError, "layer 0 names a head twice"),
    ({"layers": {0: [0], -2: [1]}}, ValueError, "names layer 0 twice"),
    ({"layers": {0: ["1"]}}, ValueError, "head '1' of layer 0 does not exist"),
    ({0: [1]}, ValueError, r"unknown attention kind 0; this model has \['layers'\]"),
    ([0], TypeError, r"heads must be a dict \{kind: \{layer: \[heads\]\}\} such as \{'layers'"),
    ({"layers": [0]}, TypeError, r"heads\['layers'\] must be a dict"),
    ({"layers": {0: [2, 3], 1: [0]}}, ValueError,
     r"layer 1 \(original head indices\): 4 query heads share 2 key/value heads in groups of 2"),
])
def test_a_bad_selection_is_one_line_and_changes_nothing(heads, error_type, match):
    _one_line(error_type, match, build("llama", "headwise"), heads)


@pytest.mark.parametrize("removed", REFUSED)
def test_every_selection_leaving_unequal_groups_is_refused(removed):
    _one_line(ValueError, "every key/value head must serve the same number of query heads",
              build("mistral", "headwise"), {"layers": {0: list(removed)}})


def test_a_model_whose_attention_is_laid_out_otherwise_is_refused_by_name(transformers):
    _one_line(ValueError, r"layer 0: ModernBertAttention is laid out as none of Llama's .*"
                          r"hw\.ablate", build("modernbert", "headwise"), {"layers": {0: [1]}})
    bloom = transformers.BloomForCausalLM(
        transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=4))
    with pytest.raises(ValueError, match="BloomForCausalLM does not call transformers' "
                                         "attention interface"):
        hh.prune_heads(bloom, {"layers": {0: [1]}})


def test_an_empty_selection_changes_nothing():
    model = build("llama", "headwise")
    assert hh.prune_heads(model, {"layers": {0: []}}) is model
    assert getattr(model.config, "headwise_pruned_heads", None) is None


def test_a_pruned_model_copies_and_switches_implementation_with_its_layers():
    """A pruned layer's config view (its own head counts) reads and writes everything else on
    the model's config: a deep copy keeps one config, and set_attn_implementation reaches the
    pruned layers."""
    model, pruned, selection = _pair("phi3", seed=2)
    twin = copy.deepcopy(pruned)
    layer = hh.attention_layers(twin)[0]
    assert layer.config.base is twin.config and layer.config.num_attention_heads == layer.num_heads
    twin.set_attn_implementation("eager")
    assert layer.config._attn_implementation == "eager"
    assert hh.attention_layers(pruned)[0].config._attn_implementation == "headwise"
    ids, mask = batch("right")
    real = mask.bool()
    with torch.no_grad():
        want = pruned(input_ids=ids, attention_mask=mask).logits
        got = twin(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)


def test_from_pretrained_passes_its_options_and_refuses_a_damaged_record(tmp_path):
    _, pruned, _ = _pair("qwen2", seed=4)
    pruned.save_pretrained(tmp_path)
    loaded = hh.prune.from_pretrained(tmp_path, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in loaded.parameters())
    assert all(torch.equal(a.double(), b) for a, b in zip(pruned.state_dict().values(),
                                                          loaded.state_dict().values(), strict=True))
    config = pruned.config
    config.headwise_pruned_heads = [[0, 1]]  # one layer's record for two layers
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="config.headwise_pruned_heads must list the pruned "
                                         "heads of each of the model's 2 attention layers"):
        hh.prune.from_pretrained(tmp_path)
    config.headwise_pruned_heads = [[0, 1], [5]]
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"headwise_pruned_heads\[1\] names head 5 but the layer "
                                         r"has 4 heads"):
        hh.load(tmp_path)


def test_the_head_tools_address_a_pruned_layer_by_its_remaining_heads():
    model, pruned, selection = _pair("llama", seed=9)
    kept = hw.hf.model.head_count(hh.attention_layers(pruned)[1])
    ids, mask = batch("none")
    with torch.no_grad(), hh.weights(pruned, {"layers": [1], "heads": [kept - 1]}) as got:
        pruned(input_ids=ids, attention_mask=mask)
    assert got[1].shape == (2, 1, 9, 9)
    with pytest.raises(ValueError, match=f"head {kept} of layer 1 does not exist"):
        with hw.ablate(pruned, {"layers": {1: [kept]}}):
            pass
