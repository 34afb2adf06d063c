"""How to generate: one frozen :class:`GenerationConfig` (Hugging Face's ``GenerationConfig``
is the anchor), validated once, when it is made.

Axis legend: ``v`` vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["GenerationConfig", "STRATEGIES", "check_sampling", "settle"]

STRATEGIES = ("greedy", "sample", "beam")


@dataclass(frozen=True)
class GenerationConfig:
    """The settings of :func:`headwise.generate`, checked here once, whatever the model.

    Args:
        max_new_tokens: how many tokens to add at most (an int >= 0).
        strategy: ``"greedy"``, ``"sample"`` (temperature / top-k / top-p) or ``"beam"``
            (``beam_size > 1`` with ``"greedy"`` also means beam search: :attr:`mode`).
        temperature: divides the logits before sampling (> 0).
        top_k: sample among the ``k`` most likely tokens. top_p: among the smallest set whose
            probability reaches ``p`` (nucleus sampling, Holtzman et al. 2020).
        beam_size: beams per row; the best finished beam (by ``log p / length**length_penalty``)
            is returned.
        eos_id: a row stops when it emits this id; later positions are filled with ``pad_id``
            (default: the model config's ``pad_id``, else ``eos_id``). Generation ends early
            once every row has stopped.
        length_penalty: the exponent of the beam score's length normalisation.
        use_cache: decode with the KV cache (True) or recompute the prefix every step.
        seed: seeds a private generator for sampling (the global RNG is untouched).
        compile: replay the decoding step as a CUDA graph (the model on a CUDA device, the
            cache on, greedy or sampling): the first step after the prompt is captured, every
            later one is a single launch. The same tokens as without it.
        kv_plan: a :class:`~headwise.kvplan.KVPlan`: decode with the head-wise cache it
            describes (:mod:`headwise.decode.ragged`; decoder-only models, the cache on).

    What depends on the model (``eos_id`` / ``pad_id`` within its vocabulary, the prompt plus
    ``max_new_tokens`` within its ``max_len``, ``compile`` on a CUDA device) is checked by
    :func:`headwise.generate` against the model it is given.
    """

    max_new_tokens: int
    strategy: str = "greedy"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    beam_size: int = 1
    eos_id: int | None = None
    pad_id: int | None = None
    length_penalty: float = 1.0
    use_cache: bool = True
    seed: int | None = None
    compile: bool = False
    kv_plan: object = None

    def __post_init__(self):
        for name, low in (("max_new_tokens", 0), ("beam_size", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"generate: {name} must be an int >= {low}, got {value!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"generate: strategy must be one of {STRATEGIES}, got "
                             f"{self.strategy!r}")
        if self.beam_size > 1 and self.strategy == "sample":
            raise ValueError(f"generate: beam_size={self.beam_size} cannot be combined with "
                             "strategy='sample'; use strategy='beam' or beam_size=1")
        check_sampling(self.temperature, self.top_k, self.top_p)
        if not isinstance(self.length_penalty, (int, float)):
            raise TypeError(f"generate: length_penalty must be a number, got "
                            f"{self.length_penalty!r}")
        for name in ("eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise ValueError(f"generate: {name} must be None or a token id (an int >= 0), "
                                 f"got {value!r}")
        if self.kv_plan is not None and type(self.kv_plan).__name__ != "KVPlan":
            raise TypeError(f"generate: kv_plan must be a headwise KVPlan, got "
                            f"{type(self.kv_plan).__name__}; load one with KVPlan.load(path)")
        if self.kv_plan is not None and (not self.use_cache or self.compile):
            raise ValueError("generate: kv_plan shapes the KV cache: it needs use_cache=True "
                             "and compile=False")
        if not isinstance(self.compile, bool):
            raise TypeError(f"generate: compile must be True or False, got {self.compile!r}")

    @property
    def mode(self) -> str:
        """The strategy that runs: ``"beam"`` for ``beam_size > 1`` with ``"greedy"``."""
        return "beam" if self.beam_size > 1 and self.strategy == "greedy" else self.strategy

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The settings' names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))


def settle(config: GenerationConfig | None, settings: dict,
           where: str = "generate") -> GenerationConfig:
    """The config a call runs with: ``config`` with the keyword ``settings`` on top (a keyword
    overrides the config's field, as Hugging Face's ``generate(**kwargs)`` overrides its
    ``generation_config``), or the settings alone. TypeError for a name that is not a setting, a
    ``config`` that is not a :class:`GenerationConfig`, or neither naming ``max_new_tokens``."""
    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"{where}: config must be a headwise.GenerationConfig, got "
                        f"{type(config).__name__}; e.g. config=GenerationConfig(max_new_tokens=20)")
    unknown = sorted(set(settings) - set(GenerationConfig.fields()))
    if unknown:
        raise TypeError(f"{where}: unknown setting(s) {', '.join(unknown)}; the generation "
                        f"settings are {', '.join(GenerationConfig.fields())}")
    if config is None:
        if "max_new_tokens" not in settings:
            raise TypeError(f"{where}: say how many tokens to add: max_new_tokens=N, or "
                            "config=GenerationConfig(max_new_tokens=N, ...)")
        return GenerationConfig(**settings)
    return dataclasses.replace(config, **settings) if settings else config


def check_sampling(temperature, top_k, top_p, *, flags: bool = False) -> None:
    """The sampling settings' one rule: ``temperature`` > 0 and finite (None: greedy, for the
    command line), ``top_k`` None or an int >= 1, ``top_p`` None or in (0, 1]. ``flags``: name
    them as the command line does (``--top-p``), which checks them before a model loads."""
    def name(n: str) -> str:
        return "--" + n.replace("_", "-") if flags else f"generate: {n}"

    greedy = ("omit --temperature for greedy decoding" if flags
              else "for the most likely token use strategy='greedy'")
    if temperature is not None and (not isinstance(temperature, (int, float))
                                    or isinstance(temperature, bool)
                                    or not 0 < temperature < float("inf")):
        raise ValueError(f"{name('temperature')} must be > 0 and finite, got {temperature!r}; "
                         f"{greedy}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool)
                              or top_k < 1):
        raise ValueError(f"{name('top_k')} must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and not isinstance(top_p, bool)
                                  and 0 < top_p <= 1):
        raise ValueError(f"{name('top_p')} must be in (0, 1], got {top_p!r}; e.g. 0.9 keeps the "
                         "most likely tokens that make up 90% of the probability" if flags else
                         f"{name('top_p')} must be None or in (0, 1], got {top_p!r}")
