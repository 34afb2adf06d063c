"""Helpers shared by subcommands (not a subcommand: the leading underscore hides it)."""

from __future__ import annotations

from headwise._device import parse_device

__all__ = ["parse_device"]  # the one device rule lives in headwise._device (train uses it too)
