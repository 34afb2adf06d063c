"""Hugging Face BERT checkpoints on headwise's :class:`~headwise.models.bert.BertModel`.

Hugging Face parameter names are translated once, here, by :data:`HF_TO_HEADWISE` (a table of
patterns); :class:`~headwise.models.bert.BertModel` itself never sees them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from headwise.errors import CheckpointError
from headwise.models.bert import BertConfig, BertModel
from headwise.pretrained.files import read_config, read_weights, skeleton

__all__ = ["HF_TO_HEADWISE", "bert_config_from_hf", "from_hf_state_dict", "hf_name", "load_bert",
           "to_hf_state_dict"]

# Hugging Face BERT name -> headwise name. ``{L}`` is the layer index. The left column is the
# layout of ``transformers.BertModel.state_dict()`` (a ``bert.`` prefix, as in
# ``BertForMaskedLM`` checkpoints, is stripped first).
HF_TO_HEADWISE: tuple[tuple[str, str], ...] = (
    ("embeddings.word_embeddings.weight", "embeddings.word.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position.weight"),
    ("embeddings.LayerNorm.weight", "embeddings.norm.weight"),
    ("embeddings.LayerNorm.bias", "embeddings.norm.bias"),
    ("encoder.layer.{L}.attention.self.query.weight", "layers.{L}.self_attn.q_proj.weight"),
    ("encoder.layer.{L}.attention.self.query.bias", "layers.{L}.self_attn.q_proj.bias"),
    ("encoder.layer.{L}.attention.self.key.weight", "layers.{L}.self_attn.k_proj.weight"),
    ("encoder.layer.{L}.attention.self.key.bias", "layers.{L}.self_attn.k_proj.bias"),
    ("encoder.layer.{L}.attention.self.value.weight", "layers.{L}.self_attn.v_proj.weight"),
    ("encoder.layer.{L}.attention.self.value.bias", "layers.{L}.self_attn.v_proj.bias"),
    ("encoder.layer.{L}.attention.output.dense.weight", "layers.{L}.self_attn.out_proj.weight"),
    ("encoder.layer.{L}.attention.output.dense.bias", "layers.{L}.self_attn.out_proj.bias"),
    ("encoder.layer.{L}.attention.output.LayerNorm.weight", "layers.{L}.attn_norm.weight"),
    ("encoder.layer.{L}.attention.output.LayerNorm.bias", "layers.{L}.attn_norm.bias"),
    ("encoder.layer.{L}.intermediate.dense.weight", "layers.{L}.ff.up.weight"),
    ("encoder.layer.{L}.intermediate.dense.bias", "layers.{L}.ff.up.bias"),
    ("encoder.layer.{L}.output.dense.weight", "layers.{L}.ff.down.weight"),
    ("encoder.layer.{L}.output.dense.bias", "layers.{L}.ff.down.bias"),
    ("encoder.layer.{L}.output.LayerNorm.weight", "layers.{L}.ff_norm.weight"),
    ("encoder.layer.{L}.output.LayerNorm.bias", "layers.{L}.ff_norm.bias"),
    ("pooler.dense.weight", "pooler.weight"),
    ("pooler.dense.bias", "pooler.bias"),
)
# Buffers Hugging Face saves that headwise derives (position ids are just arange(n)).
_HF_DERIVED = ("embeddings.position_ids", "embeddings.token_type_ids")
# Hugging Face activation names -> FeedForward's.
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
                   "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu",
                   "swish": "silu"}


def _compile(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{L\}", r"(?P<L>\d+)") + "$")


_FORWARD = tuple((_compile(hf), hw) for hf, hw in HF_TO_HEADWISE)
_BACKWARD = tuple((_compile(hw), hf) for hf, hw in HF_TO_HEADWISE)


# --------------------------------------------------------------------------------- configs
def bert_config_from_hf(hf: Mapping[str, Any], **overrides) -> BertConfig:
    """A :class:`BertConfig` from a Hugging Face BERT ``config.json`` dict.

    Raises :class:`~headwise.errors.CheckpointError` for another architecture or a BERT variant
    headwise does not implement (relative positions, decoders).
    """
    if not isinstance(hf, Mapping):
        raise TypeError(f"bert_config_from_hf expects the config.json dict, got "
                        f"{type(hf).__name__}")
    model_type = hf.get("model_type")
    architectures = list(hf.get("architectures") or [])
    if model_type != "bert":
        raise CheckpointError(
            f"config.json describes model_type={model_type!r} (architectures {architectures}),"
            " not a BERT encoder; load_bert reads checkpoints with model_type 'bert'")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"config.json: position_embedding_type="
                              f"{hf['position_embedding_type']!r} is not supported; headwise's "
                              "BERT has absolute learned positions")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise CheckpointError("config.json: a BERT decoder (is_decoder / add_cross_attention) "
                              "is not supported; load_bert builds the bidirectional encoder")
    act = hf.get("hidden_act", "gelu")
    if act not in _HF_ACTIVATIONS:
        raise CheckpointError(f"config.json: hidden_act={act!r} is not supported; expected one "
                              f"of {sorted(_HF_ACTIVATIONS)}")
    try:
        fields = dict(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
            num_heads=hf["num_attention_heads"], num_layers=hf["num_hidden_layers"],
            d_ff=hf["intermediate_size"], max_len=hf.get("max_position_embeddings", 512),
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            dropout=float(hf.get("hidden_dropout_prob", 0.1)),
            attention_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)),
            activation=_HF_ACTIVATIONS[act], pad_id=hf.get("pad_token_id") or 0)
    except (TypeError, ValueError) as exc:  # float("x"), float([1]), float(None)
        raise CheckpointError(f"config.json: a number field is not a number ({exc}); check "
                              "layer_norm_eps and the dropout probabilities") from None
    except KeyError as exc:
        raise CheckpointError(f"config.json: missing key {exc.args[0]!r}; a BERT config needs "
                              "vocab_size, hidden_size, num_attention_heads, num_hidden_layers, "
                              "intermediate_size") from None
    fields.update(overrides)
    try:
        return BertConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"config.json: {exc}") from None


# --------------------------------------------------------------------------- state dicts
def from_hf_state_dict(state_dict: Mapping[str, torch.Tensor], config: BertConfig,
                       ) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face BERT state dict to headwise's names (the whole mapping).

    A ``bert.`` prefix (``BertForMaskedLM``, ``BertForSequenceClassification``...) is stripped
    and the task heads outside it (``cls.*``, ``classifier.*``) are left out. Old TF-converted
    names (``LayerNorm.gamma`` / ``.beta``) are accepted. Raises
    :class:`~headwise.errors.CheckpointError` naming every missing and unexpected key.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"expected a state dict (str -> tensor), got {type(state_dict).__name__}")
    keys = list(state_dict)
    if any(k.startswith("bert.") for k in keys):
        keys = [k for k in keys if k.startswith("bert.")]
        strip = len("bert.")
    else:
        strip = 0
    renamed: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}  # headwise name -> the user's key, for the error message
    unexpected: list[str] = []
    for key in keys:
        hf = key[strip:].replace("LayerNorm.gamma", "LayerNorm.weight") \
                        .replace("LayerNorm.beta", "LayerNorm.bias")
        if hf in _HF_DERIVED:
            continue
        target = _translate(hf, _FORWARD)
        if target is None or target in renamed:
            unexpected.append(key)
        else:
            renamed[target] = state_dict[key]
            origin[target] = key
    expected = set(_expected_keys(config))
    missing = sorted(expected - set(renamed), key=_natural)
    unexpected += [origin[k] for k in sorted(set(renamed) - expected, key=_natural)]
    if missing or unexpected:
        prefix = "bert." if strip else ""  # name missing keys as the user's checkpoint would
        theirs = [prefix + hf_name(k) for k in missing]
        raise CheckpointError(_key_report(theirs, unexpected, config))
    return renamed


def to_hf_state_dict(model: BertModel) -> dict[str, torch.Tensor]:
    """The inverse mapping: a headwise :class:`BertModel`'s weights under Hugging Face's
    ``BertModel`` names (loadable with ``transformers.BertModel.load_state_dict``)."""
    return {hf_name(name): tensor for name, tensor in model.state_dict().items()}


def hf_name(name: str) -> str:
    """The Hugging Face ``BertModel`` name of a headwise parameter name
    (``layers.0.self_attn.q_proj.weight`` -> ``encoder.layer.0.attention.self.query.weight``)."""
    hf = _translate(name, _BACKWARD)
    if hf is None:
        raise CheckpointError(f"no Hugging Face name for {name!r}; headwise BERT names look like "
                              "'layers.0.self_attn.q_proj.weight'")
    return hf


def _translate(name: str, table) -> str | None:
    for pattern, template in table:
        match = pattern.match(name)
        if match:
            return template.replace("{L}", match.group("L")) if "{L}" in template else template
    return None


def _expected_keys(config: BertConfig) -> list[str]:
    keys = []
    for _hf, hw in HF_TO_HEADWISE:
        if hw.startswith("pooler.") and not config.pooler:
            continue
        if "{L}" in hw:
            keys += [hw.replace("{L}", str(layer)) for layer in range(config.num_layers)]
        else:
            keys.append(hw)
    return keys


def _natural(key: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def _key_report(missing: list[str], unexpected: list[str], config: BertConfig) -> str:
    def show(keys):
        head = ", ".join(keys[:8])
        return head + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
    parts = []
    if missing:
        parts.append(f"missing keys: {show(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {show(unexpected)}")
    return ("BERT state dict does not match the config (num_layers="
            f"{config.num_layers}, pooler={config.pooler}): " + "; ".join(parts)
            + "; pass the config.json that belongs to these weights")


def _check_shapes(model: BertModel, state: Mapping[str, torch.Tensor]) -> None:
    own = model.state_dict()
    wrong = [f"{hf_name(k)} {tuple(state[k].shape)} (expected {tuple(own[k].shape)})"
             for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if wrong:
        raise CheckpointError("BERT weights do not fit the config: " + "; ".join(wrong[:6])
                              + (f"; ... ({len(wrong)} in all)" if len(wrong) > 6 else "")
                              + "; pass the config.json that belongs to these weights")


# ---------------------------------------------------------------------------------- loading
def load_bert(path_or_state_dict: str | Path | Mapping[str, torch.Tensor],
              config: BertConfig | Mapping[str, Any] | None = None, *,
              device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
              backend: str | None = None) -> BertModel:
    """A headwise :class:`BertModel` carrying a Hugging Face BERT checkpoint's weights.

    Args:
        path_or_state_dict: a folder with ``config.json`` and ``model.safetensors`` (or a
            sharded ``model.safetensors.index.json``), a ``.safetensors`` file, or a state dict
            with Hugging Face names (then ``config`` is required).
        config: a :class:`BertConfig`, or a Hugging Face ``config.json`` dict; default: the
            folder's ``config.json``.
        device, dtype: where and in what precision to put the weights.
        backend: attention backend for every layer (default the config's, ``"auto"``).

    Returns the model in eval mode. Raises :class:`~headwise.errors.CheckpointError` (one line,
    naming the offending files or keys) for a missing or foreign checkpoint.
    """
    if isinstance(path_or_state_dict, Mapping):
        if config is None:
            raise TypeError("load_bert(state_dict) needs config=: a BertConfig or the "
                            "checkpoint's config.json dict (head count and LayerNorm epsilon "
                            "cannot be read from weights)")
        state = path_or_state_dict
    elif isinstance(path_or_state_dict, (str, Path)):
        path = Path(path_or_state_dict)
        config = _as_config(read_config(path) if config is None else config)
        state = read_weights(path, device)
    else:
        raise TypeError(f"load_bert expects a folder, a .safetensors path or a state dict, got "
                        f"{type(path_or_state_dict).__name__}")
    config = _as_config(config)
    if not any(k.removeprefix("bert.").startswith("pooler.") for k in state):
        config = config.replace(pooler=False)  # e.g. BertForMaskedLM checkpoints have none
    if backend is not None:
        config = config.replace(attention=config.attention.replace(backend=backend))
    renamed = from_hf_state_dict(state, config)
    with skeleton():
        model = BertModel(config)
    _check_shapes(model, renamed)
    model.load_state_dict(renamed, strict=True, assign=True)
    unloaded = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unloaded:  # strict loading should make this impossible; never hand out meta tensors
        raise CheckpointError(f"load_bert: {unloaded} were never loaded from the checkpoint")
    return model.to(device=device, dtype=dtype).eval()


def _as_config(config) -> BertConfig:
    if isinstance(config, Mapping):
        config = bert_config_from_hf(config)
    if not isinstance(config, BertConfig):
        raise TypeError(f"load_bert: config must be a BertConfig or a config.json dict, got "
                        f"{type(config).__name__}")
    return config
