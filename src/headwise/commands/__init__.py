"""One module per ``headwise`` subcommand, discovered by :mod:`headwise.cli`.

May import (the rule and its check: the table in ``tests/test_wings.py``): anything; nothing imports a command but :mod:`headwise.cli` and
``python -m headwise.train`` (:mod:`headwise.train.__main__`).
"""
