"""headwise.decode.embedding: the embeddings' one-row form at a Python-int position (the growing
cache) and at a ``(1,)`` position tensor (the fixed-shape step) gives the module's vectors."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headwise.decode.embedding import embedding_row
from headwise.models.embedding import Embeddings


@settings(max_examples=20, deadline=None)
@given(positional=st.sampled_from(["sinusoidal", "learned", "rope"]), scale=st.booleans(),
       b=st.integers(1, 4), pos=st.integers(0, 11), seed=st.integers(0, 2**31 - 1))
def test_the_form_at_an_int_and_at_a_tensor_position_is_the_modules_vector(positional, scale, b,
                                                                           pos, seed):
    torch.manual_seed(seed)
    emb = Embeddings(13, 8, 12, positional=positional, dropout=0.0, scale=scale).eval()
    if positional == "learned":
        with torch.no_grad():
            emb.positions.weight.normal_()
    ids = torch.randint(0, 13, (b,))
    want = emb(ids[:, None], pos)[:, 0]
    form = embedding_row(emb)
    torch.testing.assert_close(form(ids, pos), want, atol=0, rtol=0)
    torch.testing.assert_close(form(ids, torch.tensor([pos])), want, atol=0, rtol=0)
