"""A GGUF's own 4-bit blocks as the weights of the cached decoding step (``load_gguf(q4=True)``;
:func:`headwise.pretrained.gguf.attach_q4` gives each layer its codes).

After the prompt, decoding one token per row is a matrix-vector product per weight matrix: its
speed is the bytes of weights read per token. llama.cpp's 4-bit block formats keep 32 weights in
20 bytes (Q4_1: a float16 scale ``d``, a float16 minimum ``m``, 32 codes ``q`` in [0, 15],
``w = d * q + m``) or 18 (Q4_0: ``w = d * (q - 8)``). :class:`~headwise.fast.int4.Int4` holds
``w = q * scale + min`` per group of 32 input features, so both map onto it without
re-quantizing: the file's own codes and float16 values, with

    Q4_1: scale = d, min = m          Q4_0: scale = d, min = -8 d (exact in float16)

What is not exact: the products round the activations to bfloat16 (and sum in float32); where
torch's int4 kernel runs instead of headwise's (no C kernel: ``HEADWISE_NATIVE=0``, no
compiler), it also holds scale and zero in bfloat16 (8 significant bits; the file's float16
has 11). The figures below were measured with torch's kernel, bfloat16 scales included. ``tests/pretrained/test_q4.py`` and ``tests/reference/pretrained/test_gguf.py``
measure both. Measured on SmolLM2-135M-Instruct against HF's float32 model of the same file
(four chat prompts, teacher-forced on HF's 48 greedy tokens; logits up to ~43): q4's max
|logit difference| is 0.66-0.77 on the new tokens (1.12 over the whole sequence), of which the
bfloat16 scales and zeros alone (those weights with float32 activations) give 0.31-0.40 and
the bfloat16 activations the rest; float32 headwise differs by 5e-5 to 9e-5. The top token
agreed at every position and the greedy answers for all 48 tokens; over a 256-token answer
such perturbations flip a near-tie now and then, and the continuations part from there.
Everything else (norms, RoPE, attention, the cache, the residual stream, the lm_head) stays in
the model's dtype. The matrices exist only as codes
(:class:`~headwise.fast.int4.Int4Linear`): the prompt through the modules multiplies by them too, so
the model's resident memory is the codes plus the float32 embedding, not the float32 matrices.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["BLOCK", "KINDS", "attach_q8", "fields", "fields_q8"]

BLOCK = 32
KINDS = ("Q4_0", "Q4_1")  # the block formats that map onto Int4 as they are


def fields(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``raw (rows, blocks * bytes)`` of a Q4_0 / Q4_1 tensor as
    :class:`~headwise.fast.int4.Int4`'s ``codes (rows, cols)`` in [0, 15] and ``scales, mins
    (rows, blocks)`` (float32, each a float16 of the file: ``w = q * scale + min``).

    A block is ``d`` (float16), for Q4_1 ``m`` (float16), then 16 bytes whose low nibbles are
    weights 0-15 and high nibbles weights 16-31 (llama.cpp's ``block_q4_1``).
    """
    if kind not in KINDS:
        raise ValueError(f"fields: kind must be one of {KINDS}, got {kind!r}")
    head = 4 if kind == "Q4_1" else 2
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(rows, -1, head + BLOCK // 2)
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    nibbles = blocks[..., head:]
    codes = np.concatenate((nibbles & 0xF, nibbles >> 4), axis=-1).reshape(rows, -1)
    if kind == "Q4_1":
        mins = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    else:
        mins = -8 * d
    return (torch.from_numpy(codes.astype(np.uint8)), torch.from_numpy(d),
            torch.from_numpy(mins))


def fields_q8(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``raw (rows, blocks * 34)`` of a Q8_0 tensor as :class:`~headwise.fast.q8.Q8`'s ``codes
    (rows, cols)`` int8 and ``scales (rows, blocks)`` float16 (``w = q * scale``): a block is
    ``d`` (float16) then 32 int8 codes (llama.cpp's ``block_q8_0``)."""
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, 2 + BLOCK)
    d = blocks[..., :2].copy().view(np.float16)[..., 0]
    codes = blocks[..., 2:].copy().view(np.int8).reshape(raw.shape[0], -1)
    return torch.from_numpy(codes), torch.from_numpy(d)


def attach_q8(model: torch.nn.Module, weight: torch.Tensor, raw: np.ndarray) -> int:
    """Give every float32 ``nn.Linear`` of ``model`` whose weight is ``weight`` (a tied
    embedding's head too) the Q8_0 codes ``raw`` of that weight as ``layer.q8``
    (:class:`~headwise.fast.q8.Q8`, which checks they dequantize to it exactly); how many."""
    from headwise.fast.q8 import Q8

    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)
              and m.weight is weight and weight.dtype is torch.float32]
    for layer in layers:
        layer.q8 = Q8(*fields_q8(raw), weight)
    return len(layers)
