"""The decoder head view's pieces: prompt, greedy continuation, one traced forward."""

import pytest

from headwise.commands import _decoder_view as dv
from tests.commands.test_explain import tiny_llama  # noqa: F401  (the fixture)


def test_decoder_weights_in_the_view_are_the_models_causal_weights(tiny_llama):  # noqa: F811
    import torch

    from headwise.pretrained import load_gguf
    chat = load_gguf(tiny_llama)
    prompt = dv.prompt_ids(chat, "he the", template=False, generate=3)
    answer = dv.continue_greedily(chat, prompt, 3)
    run = dv.forward(chat, prompt, answer)
    ids = torch.tensor([prompt + answer])
    # the continuation is the model's own greedy choice at every step
    logits, _ = chat.model(ids)
    assert logits[0, len(prompt) - 1:-1].argmax(-1).tolist() == answer
    for w in run.attentions["decoder_self"]:
        assert w.shape == (1, 4, ids.shape[1], ids.shape[1])
        torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, ids.shape[1]))
        assert (w.triu(1) == 0).all()  # causal: no query sees a later key


def test_an_empty_prompt_is_refused_and_zero_tokens_generate_nothing(tiny_llama):  # noqa: F811
    from headwise.pretrained import load_gguf
    chat = load_gguf(tiny_llama)
    with pytest.raises(ValueError, match="empty after tokenization"):
        dv.prompt_ids(chat, "", template=False, generate=1)
    prompt = dv.prompt_ids(chat, "the", template=False, generate=0)
    assert dv.continue_greedily(chat, prompt, 0) == []
    assert dv.forward(chat, prompt, []).generated_start is None
