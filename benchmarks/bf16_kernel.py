"""The bfloat16 product kernel alone (``headwise_rows_matmul_bf16``, ``step_kernels_bf16.c``):
bytes of W read per second, per SmolLM2 matrix shape, against the kernel of an earlier commit
built from its own sources, interleaved in one process (rotating order; best of the rounds, and
the median of the per-round ratios).

Shapes: SmolLM2-135M's products in the step (q|k|v 960x576, o 576x576, gate|up 3072x576, down
576x1536: q|k|v and gate|up are one product each), random bfloat16 weights (the time does not
depend on their values):

  in cache   one matrix called again and again (L2): the kernel's arithmetic
  streaming  as many distinct matrices of the shape as make 64 MiB (more than the 32 MiB L3),
             each called once per pass: what a decoding step sees
  model      the 120 products of SmolLM2's 30 layers in the step's order (203 MiB)
  head       the vocabulary head 49152x576 (its tied embedding, 54 MiB), once per pass

Both kernels are called through ``ctypes`` with the same arguments (``_kernels.py``).

    python benchmarks/bf16_kernel.py [--threads 1 2] [--batches 1 2 4] [--budget 2]
        [--against REV] [--clock wall|cpu]

About 4 minutes with the defaults.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kernels import parser, repeated, sweep  # noqa: E402


class Matrix:
    """One random bfloat16 matrix ``(out, n)``."""

    def __init__(self, out: int, n: int, gen: torch.Generator):
        self.w = torch.randn(out, n, generator=gen).to(torch.bfloat16)
        self.nbytes = self.w.numel() * 2


def caller(lib, variant: str, mats: list[Matrix], x: dict, y: dict, threads: int, wide: int,
           repeat: int = 1):
    fn = lib.headwise_rows_matmul_bf16
    args = [(x[n].data_ptr(), n, m.w.data_ptr(), n, y[out].data_ptr(), out, None, 0, None,
             x[n].shape[0], out, n, threads, wide) for m in mats for out, n in [m.w.shape]]
    return repeated(fn, args, repeat)


def main(argv=None) -> None:
    args = parser(__doc__, [1, 2, 4]).parse_args(argv)
    sweep(args, "bf16 kernel", ["headwise_rows_matmul_bf16"], Matrix, caller, torch.bfloat16,
          head=True)


if __name__ == "__main__":
    main()
