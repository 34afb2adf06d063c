"""``python -m headwise.train`` / ``torchrun --nproc_per_node=N -m headwise.train``: one
process of a run, with the options of ``headwise train`` (without ``--nproc``)."""

import sys

from headwise.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
