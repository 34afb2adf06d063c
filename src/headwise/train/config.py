"""What a training run depends on: :class:`TrainConfig`, the task presets and their sizes, the
checks every value passes before anything is allocated, and a run-time estimate.

Torch-free on purpose (``headwise train --help`` lists the presets with their estimated time
without importing torch).

Model fields are not copied here: ``TrainConfig.model`` holds fields of the model config the
task builds (:class:`~headwise.models.LMConfig` or ``TransformerConfig``: ``d_model``,
``num_heads``, ``num_layers``, ``d_ff``, ``dropout``, ``positional``, ...), so a new model
option needs no edit here. Runs saved before this layout (those fields at the top level of the
saved JSON) load through :meth:`TrainConfig.from_dict`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from headwise import limits

__all__ = ["FAMILY", "PRESETS", "TrainConfig", "estimate_seconds", "model_fields",
           "tokens_per_example"]

# The Austen "small" run's training settings, shared by its Llama-style variant so the two
# differ only in the model.
_TEXT_SMALL_RUN = dict(batch_size=16, lr=2e-3, steps=500, warmup=50, eval_every=250,
                       label_smoothing=0.0, context=128)

# Per task family, named sizes; "small" (the default) finishes in minutes on a 2-core CPU,
# the larger ones are what the models need to be good (a GPU, or hours). A TrainConfig field
# left at None (or a model field not in TrainConfig.model) takes these.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "synthetic": {
        "small": dict(model=dict(d_model=64, num_heads=4, num_layers=2, d_ff=256, dropout=0.0),
                      batch_size=64, lr=3e-3, steps=1500, warmup=100, eval_every=250,
                      label_smoothing=0.0, context=256),
    },
    "induction": {
        "small": dict(model=dict(d_model=64, num_heads=4, num_layers=2, d_ff=256, dropout=0.0),
                      batch_size=32, lr=1e-3, steps=2000, warmup=100, eval_every=250,
                      label_smoothing=0.0, context=256),
    },
    "text": {
        "small": dict(model=dict(d_model=128, num_heads=4, num_layers=3, d_ff=512, dropout=0.1),
                      **_TEXT_SMALL_RUN),
        "large": dict(model=dict(d_model=384, num_heads=6, num_layers=6, d_ff=1536, dropout=0.1),
                      batch_size=8, lr=6e-4, steps=5000, warmup=200, eval_every=500,
                      label_smoothing=0.0, context=256),
        # "small" made Llama-style: RoPE, RMSNorm, SwiGLU, 4 query heads sharing 2 key/value
        # heads, no biases, tied embeddings. d_ff=344 (about 2/3 of 512, as Llama sizes its
        # three-matrix SwiGLU) keeps the feed-forward's parameters those of "small"'s.
        "llama": dict(model=dict(d_model=128, num_heads=4, num_kv_heads=2, num_layers=3, d_ff=344,
                                 dropout=0.1, positional="rope", norm="rms", ffn="glu",
                                 activation="silu", bias=False, tie_embeddings=True),
                      **_TEXT_SMALL_RUN),
    },
    "pairs": {
        "small": dict(model=dict(d_model=128, num_heads=4, num_layers=2, d_ff=512, dropout=0.1),
                      batch_size=16, lr=2e-3, steps=600, warmup=60, eval_every=300,
                      label_smoothing=0.1, context=256),
        "large": dict(model=dict(d_model=256, num_heads=4, num_layers=3, d_ff=1024, dropout=0.1),
                      batch_size=64, lr=7e-4, steps=6000, warmup=400, eval_every=1000,
                      label_smoothing=0.1, context=256),
    },
}
FAMILY = {"reverse": "synthetic", "copy": "synthetic", "sort": "synthetic",
          "induction": "induction", "text": "text", "austen": "text", "pairs": "pairs",
          "de-en": "pairs"}
_KIND = {"synthetic": "transformer", "induction": "lm", "text": "lm", "pairs": "transformer"}

# Stated maxima (anything larger is refused before a task, model or batch exists).
MAX_STEPS = 10**9
MAX_EVAL_SIZE = 100_000
MAX_BATCH = 1 << 20
MAX_CONTEXT = 1 << 16
MAX_SEED = 2**63 - 1
# model fields the task sets (vocabularies from its tokenizer, lengths from its data)
_TASK_OWNED = ("vocab_size", "src_vocab_size", "tgt_vocab_size", "max_len", "pad_id")
# fields of saved runs from before TrainConfig.model (moved into it by from_dict)
_LEGACY_MODEL_KEYS = ("d_model", "num_heads", "num_layers", "d_ff", "dropout", "positional",
                      "activation", "norm_first")


def model_fields(kind: str | None = None) -> tuple[str, ...]:
    """Model-config keywords a run may set (``kind`` ``"lm"``/``"transformer"``; None: either):
    the config's fields, and the flat keywords of its attention options
    (:data:`~headwise.models.config.FLAT_ATTENTION_KEYS`: ``num_kv_heads``, ``sliding_window``,
    ...), which the flags set and saved runs hold."""
    from headwise.models.config import CONFIGS, FLAT_ATTENTION_KEYS
    kinds = [kind] if kind else sorted(CONFIGS)
    names: dict[str, None] = {}
    for k in kinds:
        names.update((f.name, None) for f in dataclasses.fields(CONFIGS[k]))
    names.update((n, None) for n in FLAT_ATTENTION_KEYS)
    return tuple(n for n in names if n not in _TASK_OWNED)


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on. ``None`` fields take the preset of the task's family at
    ``size`` (:data:`PRESETS`; ``"small"`` finishes in minutes on a 2-core CPU).

    Task: ``task`` name (see :mod:`headwise.data`), ``text`` / ``pairs`` files, ``min_len`` /
    ``max_len`` / ``num_symbols`` (synthetic sizes; ``max_len`` caps sentence pairs),
    ``context`` (LM window), ``tokenizer`` (``"char"`` / ``"byte"``).
    Model: ``model``, fields of the model config the task builds (``d_model``, ``num_heads``,
    ``num_layers``, ``d_ff``, ``dropout``, ``positional``, ``activation``, ``norm_first``,
    ``num_kv_heads``, ...); the preset fills the sizes it names, the model config's defaults
    the rest.
    Optimisation: ``steps``, ``batch_size`` (global, over all processes), ``lr`` (peak),
    ``warmup`` (linear warm-up steps, then cosine to ``min_lr_ratio * lr``; must be < steps),
    ``weight_decay`` (AdamW, matrices only), ``betas``, ``grad_clip`` (max global norm;
    0 = off), ``label_smoothing``.
    Evaluation and saving: ``eval_every`` steps on ``eval_size`` held-out examples (also at
    the end); ``checkpoint_every`` (default ``eval_every``; 0 = only at the end).
    Runtime: ``seed``, ``precision`` (``"auto"``, ``"fp32"``, ``"bf16"``), ``device``
    (``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``...), ``threads`` (CPU intra-op threads
    per process, at most the machine's CPUs; default torch's).
    """

    task: str = "reverse"
    size: str = "small"
    text: str | None = None
    pairs: str | None = None
    min_len: int | None = None
    max_len: int | None = None
    num_symbols: int | None = None
    context: int | None = None
    tokenizer: str = "char"
    model: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    warmup: int | None = None
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    label_smoothing: float | None = None
    eval_every: int | None = None
    eval_size: int = 500
    checkpoint_every: int | None = None
    seed: int = 0
    precision: str = "auto"
    device: str = "auto"
    threads: int | None = None

    @property
    def family(self) -> str:
        return FAMILY[self.task]

    @property
    def kind(self) -> str:
        """The model kind the task trains: ``"lm"`` or ``"transformer"``."""
        return _KIND[FAMILY[self.task]]

    def updated(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes``: TrainConfig fields, or model-config fields (``d_model=64``)
        that go into ``model``. An unknown name is a ``TypeError`` listing the known ones."""
        own = {f.name for f in dataclasses.fields(self)}
        top = {k: v for k, v in changes.items() if k in own}
        rest = {k: v for k, v in changes.items() if k not in own}
        if rest:
            known_model = model_fields()
            unknown = sorted(k for k in rest if k not in known_model)
            if unknown:
                raise TypeError(f"unknown training option(s) {unknown}; known: TrainConfig "
                                f"fields {sorted(own)} and model fields {sorted(known_model)}")
            top["model"] = {**dict(top.get("model", self.model)), **rest}
        if "model" in top and not isinstance(top["model"], Mapping):
            raise TypeError(f"TrainConfig.model must be a dict of model-config fields; got "
                            f"{type(top['model']).__name__}")
        return dataclasses.replace(self, **top)

    def filled(self) -> TrainConfig:
        """A copy with the preset of ``task`` at ``size`` filled in (not checked; torch-free)."""
        if not isinstance(self.task, str) or self.task not in FAMILY:
            raise ValueError(f"unknown task {self.task!r}; expected one of: {', '.join(FAMILY)}")
        sizes = PRESETS[self.family]
        if self.size not in sizes:
            raise ValueError(f"unknown size {self.size!r} for task {self.task!r}; its sizes are "
                             f"{', '.join(sizes)} (see `headwise train --help`)")
        preset = sizes[self.size]
        filled = {k: v for k, v in preset.items() if k != "model" and getattr(self, k) is None}
        if not isinstance(self.model, Mapping):
            raise TypeError(f"TrainConfig.model must be a dict of model-config fields; got "
                            f"{type(self.model).__name__}")
        cfg = dataclasses.replace(self, **filled, model={**preset["model"], **self.model},
                                  betas=tuple(self.betas))
        if self.warmup is None and isinstance(cfg.steps, int) and cfg.warmup >= cfg.steps:
            cfg = dataclasses.replace(cfg, warmup=cfg.steps // 10)  # a short run: shorter warm-up
        if cfg.checkpoint_every is None:
            cfg = dataclasses.replace(cfg, checkpoint_every=cfg.eval_every)
        return cfg

    def resolved(self) -> TrainConfig:
        """A copy with every preset filled in and every value checked (sizes bounded)."""
        cfg = self.filled()
        _check(cfg)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        d["model"] = dict(self.model)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; also reads runs saved with the model fields at the top
        level (before ``model`` existed)."""
        if not isinstance(d, Mapping):
            raise TypeError(f"TrainConfig.from_dict expects a dict, got {type(d).__name__}")
        d = dict(d)
        legacy = {k: d.pop(k) for k in _LEGACY_MODEL_KEYS if k in d}
        if legacy:
            d["model"] = {**{k: v for k, v in legacy.items() if v is not None},
                          **dict(d.get("model") or {})}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"TrainConfig: unknown keys {unknown}")
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


# --------------------------------------------------------------------------------------------
# checks: one table, applied once in TrainConfig.resolved()

# field -> (lowest, highest or None, what to pass instead)
_INTS: dict[str, tuple[int, int | None]] = {
    "steps": (1, MAX_STEPS), "batch_size": (1, MAX_BATCH), "eval_size": (1, MAX_EVAL_SIZE),
    "context": (2, MAX_CONTEXT), "warmup": (0, None), "eval_every": (0, None),
    "checkpoint_every": (0, None), "seed": (0, MAX_SEED),
}
_CHOICES = {"precision": ("auto", "fp32", "bf16"), "tokenizer": ("char", "byte")}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check(cfg: TrainConfig) -> None:
    for name, (lo, hi) in _INTS.items():
        value = getattr(cfg, name)
        if not _is_int(value):
            raise TypeError(f"{name} must be an int; got {value!r}")
        if value < lo or (hi is not None and value > hi):
            bound = f"in [{lo}, {hi:,}]" if hi is not None else f">= {lo}"
            raise ValueError(f"{name} must be {bound}; got {value:,}")
    for name in ("min_len", "max_len", "num_symbols"):
        value = getattr(cfg, name)
        if value is not None and not _is_int(value):
            raise TypeError(f"{name} must be an int or None; got {value!r}")
    if cfg.warmup >= cfg.steps:
        raise ValueError(f"warmup={cfg.warmup} must be smaller than steps={cfg.steps} (the "
                         f"learning rate would never finish warming up); pass --warmup "
                         f"{cfg.steps // 10} or more --steps")
    if cfg.threads is not None:
        limits.threads(cfg.threads)
    for name in ("lr", "weight_decay", "min_lr_ratio", "grad_clip", "label_smoothing"):
        if not _is_number(getattr(cfg, name)):
            raise TypeError(f"{name} must be a number; got {getattr(cfg, name)!r}")
    if not cfg.lr > 0:  # inf passes: a diverging run is stopped at its first non-finite loss
        raise ValueError(f"lr must be > 0; got {cfg.lr}")
    if not 0.0 <= cfg.label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1); got {cfg.label_smoothing}")
    if not 0.0 <= cfg.min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1]; got {cfg.min_lr_ratio}")
    if not cfg.grad_clip >= 0:
        raise ValueError(f"grad_clip must be >= 0 (0 = off); got {cfg.grad_clip}")
    if (len(cfg.betas) != 2 or not all(_is_number(b) and 0.0 <= b < 1.0 for b in cfg.betas)):
        raise ValueError(f"betas must be two numbers in [0, 1); got {cfg.betas!r}")
    for name, choices in _CHOICES.items():
        if getattr(cfg, name) not in choices:
            raise ValueError(f"{name} must be one of {choices}; got {getattr(cfg, name)!r}")
    if not isinstance(cfg.device, str):
        raise TypeError(f"device must be a string like 'cpu' or 'cuda:0'; got {cfg.device!r}")
    allowed = model_fields(cfg.kind)
    bad = sorted(k for k in cfg.model if k not in allowed)
    if bad:
        raise ValueError(f"model fields {bad} do not apply to task {cfg.task!r} (a {cfg.kind} "
                         f"model); it takes {sorted(allowed)}")


# --------------------------------------------------------------------------------------------
# run-time estimate (no torch: a numpy matmul measures this machine)

_RATE: list[float] = []
# typical vocabularies and tokens per example, per family (before the data is read)
_TYPICAL = {"synthetic": (23, None), "induction": (29, None), "text": (80, None),
            "pairs": (110, 40)}
# Calibrated on the 2-core x86 CPU this was written on (numpy: ~45 GFLOP/s per core): the share
# of that rate a training step reaches (~18 GFLOP/s over the two cores, checked against the
# demo's and the presets' real run times), and a fixed cost per block
_EFFICIENCY, _PER_LAYER_S = 0.2, 0.002


def machine_flops() -> float:
    """Float32 matmul rate of this machine (FLOP/s): one core's rate on a 64x64 product (below
    the size where BLAS spawns threads, so other processes' load does not distort it) times
    the CPUs. Measured once per process, in about a millisecond."""
    if not _RATE:
        import time

        import numpy as np
        a = np.random.default_rng(0).standard_normal((64, 64), dtype=np.float32)
        best = math.inf
        for _ in range(30):
            t = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - t)
        _RATE.append(2 * 64**3 / max(best, 1e-9) * limits.cpu_count())
    return _RATE[0]


def tokens_per_example(cfg: TrainConfig) -> tuple[float, float]:
    """(source or input tokens, target tokens) of a typical example of ``cfg``'s task."""
    fam = cfg.family
    if fam == "synthetic":
        lo, hi = cfg.min_len or 4, cfg.max_len or 16
        return (lo + hi) / 2, (lo + hi) / 2 + 1
    if fam == "induction":
        lo, hi = cfg.min_len or 8, cfg.max_len or 32
        return 0.0, float(lo + hi)
    if fam == "text":
        return 0.0, float(cfg.context)
    avg = min(_TYPICAL["pairs"][1], cfg.max_len or 64)
    return float(avg), float(avg + 1)


def estimate_seconds(cfg: TrainConfig) -> float:
    """Rough wall time of the resolved run ``cfg`` on this machine (training + evaluations),
    from its FLOPs, the measured matmul rate and a per-layer step overhead; within about 2x."""
    m = cfg.model
    d, layers, ff = m["d_model"], m["num_layers"], m["d_ff"]
    vocab = _TYPICAL[cfg.family][0] if cfg.tokenizer == "char" else 259
    src, tgt = tokens_per_example(cfg)
    kind = cfg.kind
    fields = dict(m, vocab_size=vocab, src_vocab_size=vocab, tgt_vocab_size=vocab)
    params = limits.parameter_count(kind, fields)
    embed = vocab * d * (1 if kind == "lm" else 2)
    tokens = cfg.batch_size * (src + tgt)
    seq = max(src, tgt)
    flops = 6 * (params - embed) * tokens + 12 * layers * tokens * seq * d
    rate = machine_flops() * _EFFICIENCY
    blocks = layers * (1 if kind == "lm" else 3)
    step = flops / rate + _PER_LAYER_S * blocks + 0.002 * max(1.0, ff / 256)
    evals = (cfg.steps // cfg.eval_every if cfg.eval_every else 0) + 1
    eval_tokens = cfg.eval_size * (src + tgt)
    one_eval = 2 * (params - embed) * eval_tokens / rate
    if kind == "transformer":  # greedy decoding: one cached step per target position
        one_eval += (tgt + 1) * math.ceil(cfg.eval_size / 250) * _PER_LAYER_S * blocks
    return cfg.steps * step + evals * one_eval


def format_seconds(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
