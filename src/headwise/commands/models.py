"""``headwise models``: the real models headwise's packages install, where they are, and the
one line that loads each.

    headwise models

The table is :data:`headwise.installed.MODELS` (the names ``headwise.hf.load`` accepts).
Nothing is loaded or downloaded: each model is found by its package's folder.
"""

from __future__ import annotations

import argparse

HELP = "the real models installed (all-MiniLM-L6-v2, SmolLM2): paths and how to load each"
EXAMPLE = "headwise models"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "models",
        description="List the real models that headwise's pip packages carry (nothing is "
                    "downloaded): each one's name, what it is, where it is on disk and the "
                    "one line that loads it; a model not installed gets its install command.")
    p.set_defaults(func=run)


def lines() -> list[str]:
    """The listing, one entry of :data:`~headwise.installed.MODELS` after another."""
    from headwise.errors import CheckpointError
    from headwise.installed import MODELS

    width = max(len(m.name) for m in MODELS.values())
    out = ["Real models headwise's packages install (nothing is downloaded):", ""]
    for m in MODELS.values():
        out.append(f"  {m.name:<{width}}  {m.title} - {m.what}")
        pad = " " * (width + 4)
        try:
            out.append(f"{pad}path  {m.path()}")
            out.append(f"{pad}load  model, tokenizer = {m.load}")
            out.append(f"{pad}or    {m.native}  (headwise's own model)")
        except CheckpointError as exc:
            out.append(f"{pad}not installed: {exc}")
    out += ["", "headwise.hf.load(PATH) loads any other local model folder or .gguf file."]
    return out


def run(args: argparse.Namespace) -> int:
    print("\n".join(lines()))
    return 0
