"""The head view of a llama GGUF (SmolLM2-135M-Instruct by default) on a text, optionally with
the model's own continuation: what ``headwise explain --model smollm2`` and ``headwise chat
--view`` write.

One forward pass over prompt + continuation gives every layer's decoder self-attention
``(1, h, i, j)``; the page groups the ``h`` query heads under the ``g`` key/value heads they
share and marks the generated tokens (``head_view(kv_heads=g, generated_start=n)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class DecoderRun:
    """What one forward over ``ids`` gave: the trace record (its ``output`` is ``(logits,
    attentions)``), the token strings, and where the generated part starts (None: none)."""

    record: Any
    tokens: list[str]
    ids: list[int]
    generated_start: int | None

    @property
    def attentions(self) -> dict[str, list[torch.Tensor]]:
        return self.record.output[1]


def load(gguf: str | None, device):
    """The :class:`~headwise.pretrained.ChatModel` of ``gguf`` (default: SmolLM2), float32."""
    from headwise.pretrained import find_smollm2, load_gguf

    return load_gguf(gguf or find_smollm2(), device=device)


def prompt_ids(chat, text: str, *, template: bool, generate: int) -> list[int]:
    """``text`` encoded as is (or through the chat template), checked to fit with
    ``generate`` new tokens in the model's context."""
    ids = chat.tokenizer.chat(text) if template else chat.tokenizer.encode(text)
    if not ids:
        raise ValueError("the text is empty after tokenization; give some text")
    chat.check_length(len(ids), generate)
    return ids


def continue_greedily(chat, ids: list[int], generate: int) -> list[int]:
    """Up to ``generate`` greedy tokens after ``ids`` (stopping at the end-of-turn token)."""
    import torch

    from headwise.decode.generation import generate as decode

    if generate < 1:
        return []
    device = chat.model.lm_head.weight.device
    out = decode(chat.model, torch.tensor([ids], device=device), max_new_tokens=generate,
                 eos_id=chat.tokenizer.eos_id)
    new = out[0, len(ids):].tolist()
    eos = chat.tokenizer.eos_id
    return new[:new.index(eos) + 1] if eos in new else new


def forward(chat, prompt: list[int], answer: list[int]) -> DecoderRun:
    """One traced forward over ``prompt + answer`` with every layer's weights."""
    import torch

    from headwise.tracing import trace

    ids = prompt + answer
    device = chat.model.lm_head.weight.device
    with torch.no_grad():
        record = trace(chat.model, torch.tensor([ids], device=device), return_weights=True)
    return DecoderRun(record, chat.tokenizer.tokens(ids), ids,
                      len(prompt) if answer else None)


def write_view(chat, run: DecoderRun, path: str | Path, title: str):
    """The head view page of ``run`` (query heads grouped under their key/value heads)."""
    from headwise import viz

    return viz.head_view(run.attentions, run.tokens, path, title=title,
                         kv_heads=chat.config.num_kv_heads,
                         generated_start=run.generated_start)
