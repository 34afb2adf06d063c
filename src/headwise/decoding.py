"""Generation lives in :mod:`headwise.decode.generation` (its settings in
:mod:`headwise.decode.config`); this name stays for users."""

from headwise.decode.config import STRATEGIES, GenerationConfig, check_sampling
from headwise.decode.generation import EOS_EVERY, generate, generate_with_logits

__all__ = ["EOS_EVERY", "GenerationConfig", "STRATEGIES", "check_sampling", "generate",
           "generate_with_logits"]
