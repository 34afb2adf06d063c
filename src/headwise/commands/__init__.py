"""One module per ``headwise`` subcommand, discovered by :mod:`headwise.cli`.

May import anything in headwise; nothing imports a command but :mod:`headwise.cli` and
``python -m headwise.train`` (:mod:`headwise.train.__main__`).
"""
