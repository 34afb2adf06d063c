"""headwise as a transformers attention implementation: any Hugging Face model whose attention
goes through transformers' attention interface runs on headwise's fused path, and shows its
per-head weights only where asked.

    import headwise.hf                                   # registers attn_implementation="headwise"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="headwise")
    headwise.hf.use(model)                               # or switch a loaded model
    out = model(**batch, output_attentions=True)         # every layer's weights, from the LSE
    with headwise.hf.weights(model, {"layers": [5], "heads": [3], "rows": slice(-16, None)}) as got:
        model(**batch)                                   # got[5]: (b, 1, 16, j); no other weights
    headwise.hf.head_view(model, tokenizer, ["Some text."], "view.html")

Modules: ``interface`` (the function transformers calls, and its mask rule), ``select`` (which
layers, heads, rows and keys return weights), ``model`` (which modules are attention layers;
switching a model), ``prune`` (cutting heads out of Llama-family layers, and building a pruned
checkpoint's structure), ``local`` (:func:`load`, the one loader: a local model folder, pruned
or not, a GGUF file or an installed model's name, ``"minilm"``, ``"smollm2"``, as
``(model, tokenizer)`` on headwise; nothing downloaded; ``load_pruned`` is deprecated),
``folder`` (a folder checked before transformers reads it: one line for each problem),
``tools`` (the head view with the model's tokenizer, a traced forward, the next-token loss of
importance). This wing imports ``transformers`` (the ``pretrained`` extra). May import (the rule
and its check: the table in ``tests/test_wings.py``): ``attend``, ``weights``, ``heads``,
``observe``, ``installed``, ``kvplan`` and ``decode.ragged``,
and ``hf.tools`` also ``tracing`` and ``viz``; the core never
imports it (importing it registers its layer finder with :mod:`headwise.finders`, which the core
asks), and the head tools reach it only for a transformers model.
"""

from headwise import finders
from headwise.hf.interface import attention_forward, register
from headwise.hf.kvcache import HeadwiseKVCache
from headwise.hf.local import load
from headwise.hf.model import FINDER, NAME, attention_layers, use
from headwise.hf.prune import load_pruned, prune_heads
from headwise.hf.select import weights
from headwise.hf.tools import explain, head_view, next_token_loss

__all__ = ["HeadwiseKVCache", "NAME", "attention_forward", "attention_layers", "load_pruned", "prune_heads", "register",
           "use", "weights"]
__all__ += ["explain", "head_view", "load", "next_token_loss"]  # the head tools' HF side

register()  # attn_implementation="headwise", with transformers
finders.register(FINDER)  # this wing's layer finder, with the core (headwise.finders)
