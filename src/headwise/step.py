"""The cached decoding step lives in :mod:`headwise.decode.step`; this name stays for users."""

from headwise.decode.step import COPY_BUDGET, DecodeStep, usable

__all__ = ["COPY_BUDGET", "DecodeStep", "usable"]
