"""The real all-MiniLM-L6-v2 checkpoint on headwise attention reproduces Hugging Face
``transformers.BertModel`` (eager and sdpa) and sentence-transformers."""

from __future__ import annotations

import pytest
import torch

TOL = 5e-5


@pytest.fixture(scope="module")
def hf_models(transformers, minilm_folder):
    return {impl: transformers.BertModel.from_pretrained(str(minilm_folder),
                                                         attn_implementation=impl).eval()
            for impl in ("eager", "sdpa")}


@pytest.fixture(scope="module")
def st_model(minilm_folder):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(minilm_folder), device="cpu")


@pytest.fixture(scope="module")
def batch(minilm, sentences):
    inputs = minilm.tokenizer.batch(sentences)
    lengths = inputs["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) == len(sentences), "want different lengths"
    assert int(lengths.min()) < inputs["input_ids"].shape[1] // 4  # plenty of padding
    return inputs


def _valid_max(a, b, mask):
    return (a - b)[mask.bool()].abs().max().item()


def test_tokenizer_matches_the_reference_tokenizer(minilm, st_model, sentences):
    st = st_model
    ref = st.tokenizer(sentences, padding=True, return_tensors="pt")
    ours = minilm.tokenizer.batch(sentences)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(ours[key], ref[key]), key
    pair = minilm.tokenizer.batch(["who is there?"], ["the heads are."])
    ref_pair = st.tokenizer(["who is there?"], ["the heads are."], return_tensors="pt")
    assert torch.equal(pair["token_type_ids"], ref_pair["token_type_ids"])
    assert pair["token_type_ids"].sum() > 0
    ids = minilm.tokenizer.encode("Hello world")
    assert minilm.tokenizer.tokens(ids) == ["[CLS]", "hello", "world", "[SEP]"]
    assert minilm.tokenizer.decode(ids) == "hello world"
    assert minilm.tokenizer.max_length == st.max_seq_length == 256


def test_last_hidden_state_matches_hf_eager_and_sdpa(minilm, hf_models, batch):
    model = minilm.model
    with torch.no_grad():
        fused, _ = model(**batch)                          # sdpa path, (b, 1, 1, j) mask
        seen, _ = model(**batch, return_weights=True)      # eager path (weights wanted)
        ref = {impl: m(**batch).last_hidden_state for impl, m in hf_models.items()}
    mask = batch["attention_mask"]
    figures = {
        "headwise sdpa vs HF sdpa (valid tokens)": _valid_max(fused, ref["sdpa"], mask),
        "headwise sdpa vs HF eager (valid tokens)": _valid_max(fused, ref["eager"], mask),
        "headwise eager vs HF eager (valid tokens)": _valid_max(seen, ref["eager"], mask),
        "headwise eager vs HF sdpa (valid tokens)": _valid_max(seen, ref["sdpa"], mask),
    }
    print("\nlast_hidden_state max|diff|, batch", tuple(mask.shape), figures)
    assert max(figures.values()) <= TOL, figures
    assert fused.shape == (len(mask), mask.shape[1], 384)
    # padded query rows are computed too (they attend to the real keys), as in HF
    assert (fused - ref["sdpa"]).abs().max().item() <= TOL


def test_every_attention_head_matches_hf_eager(minilm, hf_models, batch):
    with torch.no_grad():
        _, attentions = minilm.model(**batch, return_weights=True)
        ref = hf_models["eager"](**batch, output_attentions=True).attentions
    ours = attentions["encoder_self"]
    assert len(ours) == len(ref) == 6
    worst = max((a - b).abs().max().item() for a, b in zip(ours, ref, strict=True))
    print(f"\nattention weights, 6 layers x 12 heads, max|diff| vs HF eager: {worst:.3g}")
    assert worst <= TOL
    mask = batch["attention_mask"].bool()
    for w in ours:
        assert w.shape == (mask.shape[0], 12, mask.shape[1], mask.shape[1])
        assert torch.all(w[:, :, :, ~mask.any(0)] == 0)
        assert torch.all(w.masked_select(~mask[:, None, None, :].expand_as(w)) == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_sentence_embeddings_match_sentence_transformers(minilm, st_model, sentences):
    from headwise import pretrained

    ref = st_model.encode(sentences, convert_to_tensor=True, batch_size=len(sentences))
    ours = pretrained.embed(sentences)
    one_by_one = minilm.embed(sentences, batch_size=1)  # no padding at all
    chunked = minilm.embed(sentences, batch_size=2)  # sorted by length, then put back in order
    assert (chunked - ref).abs().max().item() <= TOL
    diff = (ours - ref).abs().max().item()
    print(f"\nsentence embeddings max|diff| vs sentence-transformers: {diff:.3g}; "
          f"batched vs one at a time: {(ours - one_by_one).abs().max().item():.3g}")
    assert ours.shape == (len(sentences), 384)
    assert diff <= TOL
    assert (ours - one_by_one).abs().max().item() <= TOL
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(sentences)))
    # the embeddings mean something: paraphrases are nearer than unrelated sentences
    a, b, c = pretrained.embed(["A man is playing a guitar.", "Someone plays the guitar.",
                                "The stock market fell sharply today."])
    assert a @ b > a @ c + 0.3


def test_float64_matches_hf_float64_tightly(transformers, minilm_folder, batch):
    from headwise.pretrained import load_bert

    ours = load_bert(minilm_folder, dtype=torch.float64, backend="eager")
    ref = transformers.BertModel.from_pretrained(str(minilm_folder),
                                                 attn_implementation="eager").double().eval()
    with torch.no_grad():
        got, _ = ours(**batch)
        want = ref(**batch).last_hidden_state
    diff = _valid_max(got, want, batch["attention_mask"])
    print(f"\nfloat64 last_hidden_state max|diff|: {diff:.3g}")
    assert diff < 1e-10


def test_selected_layers_keep_the_rest_fused(minilm, batch):
    with torch.no_grad():
        out_all, every = minilm.model(**batch, return_weights=True)
        out_sel, some = minilm.model(**batch, return_weights={"encoder_self": [2, -1]})
        out_none, nothing = minilm.model(**batch, return_weights=False)
    assert nothing is None
    got = some["encoder_self"]
    assert [i for i, w in enumerate(got) if w is not None] == [2, 5]
    # layers 0-1 ran fused, so layer 2 sees inputs equal only to float rounding
    assert (got[2] - every["encoder_self"][2]).abs().max().item() <= 1e-5
    mask = batch["attention_mask"]
    assert _valid_max(out_sel, out_all, mask) <= 1e-5
    assert _valid_max(out_none, out_all, mask) <= 1e-5


def test_padding_never_changes_real_tokens(minilm, sentences):
    """Each sentence alone equals its row in the padded batch; padded ids are never read."""
    inputs = minilm.tokenizer.batch(sentences)
    with torch.no_grad():
        batched, _ = minilm.model(**inputs)
        scrambled = dict(inputs, input_ids=torch.where(inputs["attention_mask"].bool(),
                                                       inputs["input_ids"],
                                                       torch.randint(1000, 2000,
                                                                     inputs["input_ids"].shape)))
        scrambled_out, _ = minilm.model(**scrambled)
        for row, text in enumerate(sentences):
            alone, _ = minilm.model(**minilm.tokenizer.batch([text]))
            n = alone.shape[1]
            assert (alone[0] - batched[row, :n]).abs().max().item() <= 1e-5
    mask = inputs["attention_mask"]
    assert _valid_max(scrambled_out, batched, mask) <= 1e-5
