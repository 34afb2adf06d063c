"""The head tools on the real checkpoints loaded by transformers (headwise.hf.load: MiniLM's
folder, SmolLM2's GGUF) against the same tools on headwise's own loaders of the same files:
the catalogue's every score of every head, and the head view's weights."""

from __future__ import annotations

import pytest
import torch

hh = pytest.importorskip("headwise.hf", reason="the hf wing needs transformers")
import headwise as hw  # noqa: E402

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was "
        "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity")


def _assert_same_catalogue(ours, theirs, scale: float) -> None:
    assert ours.meta["kinds"] == theirs.meta["kinds"]
    assert len(ours.heads) == len(theirs.heads)
    for a, b in zip(ours.heads, theirs.heads, strict=True):
        assert (a["kind"], a["layer"], a["head"]) == (b["kind"], b["layer"], b["head"])
        for score, value in a["scores"].items():
            want = b["scores"][score]
            if want is None:
                assert value is None, score
            else:
                assert value == pytest.approx(want, abs=scale * max(1.0, abs(want))), score


def test_minilm_through_hf_catalogues_as_headwises_own_bert(minilm_folder):
    from headwise.pretrained import load_sentence_encoder

    model, tok = hh.load(minilm_folder)
    assert type(model).__name__ == "BertModel"
    own = load_sentence_encoder(minilm_folder)
    texts = ["The cat sat on the mat.", "Attention heads, one by one, in a longer line.",
             "Heads see."]
    batch = {k: v for k, v in own.tokenizer.batch(texts).items()
             if k in ("input_ids", "attention_mask", "token_type_ids")}
    n = int(batch["attention_mask"][0].sum())  # the same tokens (padding aside)
    assert batch["input_ids"][0, :n].tolist() == tok(texts[0])["input_ids"]
    _assert_same_catalogue(hw.catalogue(model, [batch]), hw.catalogue(own.model, [batch]), 1e-5)


def test_smollm2_from_its_gguf_catalogues_as_headwises_own_decoder(smollm2_path):
    from headwise.pretrained import load_gguf

    model, tok = hh.load(smollm2_path)
    assert type(model).__name__ == "LlamaForCausalLM"
    own = load_gguf(smollm2_path)
    ids = torch.tensor(own.tokenizer.encode(TEXT)[:32])[None]
    assert tok(TEXT, add_special_tokens=False)["input_ids"][:32] == ids[0].tolist()
    # float32 sums in another order over 30 layers: scores within 5e-5 of each other
    _assert_same_catalogue(hw.catalogue(model, [ids]), hw.catalogue(own.model, [ids]), 5e-5)
    run = hh.explain(model, tok, ["The capital of France is"])
    assert run.kv_heads == 3 and len(run.attentions["decoder_self"]) == 30
    assert run.tokens[0][:2] == ["The", " capital"]  # byte-level BPE decoded: no "Ġ"
