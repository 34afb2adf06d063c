"""What the catalogue feeds a model: batches checked against the model's kind, with lengths."""

import pytest
import torch

from headwise.analysis.catalogue.inputs import attention_modules, prepare
from headwise.models.bert import BertConfig, BertModel
from tests.analysis.catalogue.test_init import _seq2seq


def test_seq2seq_sides_have_the_real_lengths():
    model, task = _seq2seq(2)
    batch = task.eval_set(6)
    prepared = prepare(model, batch)
    q_lens, k_lens, k_ids = prepared.lengths("cross", batch.tgt_in.shape[1], batch.src.shape[1])
    assert torch.equal(k_lens, batch.src_lens) and torch.equal(k_ids, batch.src)
    assert torch.equal(q_lens, batch.src_lens + 1)  # <bos> + the reversed source
    with pytest.raises(ValueError, match="no KV cache"):
        prepared.lengths("cross", 1, batch.src.shape[1])


def test_bert_batches_need_right_padding():
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=20, d_model=8, num_heads=2, num_layers=1, d_ff=8,
                                max_len=16)).eval()
    assert list(attention_modules(bert)) == ["encoder_self"]
    ids = torch.randint(1, 20, (2, 5))
    ok = prepare(bert, {"input_ids": ids, "attention_mask": torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])})
    assert ok.sides["src"][1].tolist() == [5, 3]
    with pytest.raises(ValueError, match="must mark a prefix"):
        prepare(bert, {"input_ids": ids, "attention_mask": torch.tensor([[1] * 5, [0, 1, 1, 1, 1]])})
    with pytest.raises(ValueError, match="got keys"):
        prepare(bert, {"ids": ids})
