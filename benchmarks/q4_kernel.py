"""The 4-bit kernel alone (``headwise_q4_matmul``, ``step_kernels_q4.c``): bytes of codes, scales
and minima read per second, per matrix shape, against the kernel of an earlier commit built from
its own sources, interleaved in one process (rotating order; best of the rounds, and the median
of the per-round ratios).

Shapes: the four products of a SmolLM2-135M layer in the step (q|k|v 960x576, o 576x576,
gate|up 3072x576, down 576x1536: q|k|v and gate|up are one product each), random codes, scales
and minima (the kernel's time does not depend on their values):

  in cache   one matrix called again and again (L2): the kernel's arithmetic
  streaming  as many distinct matrices of the shape as make 64 MiB (more than the 32 MiB L3),
             each called once per pass: what a decoding step sees
  model      the 120 products of SmolLM2's 30 layers in the step's order (63 MiB), once per pass

The earlier kernel (``--against``, default 52720a5: session 15's kernel, which reads the codes in
llama.cpp's nibble order, low nibbles weights 0-15, high 16-31) gets its codes in that order;
the working tree's kernel gets :class:`headwise.fast.int4.Int4`'s. Both are called through
``ctypes`` with the same arguments, so the call's own cost is the same for both
(``_kernels.py``: what this and ``bf16_kernel.py`` share).

    python benchmarks/q4_kernel.py [--threads 1 2] [--batches 1 4] [--budget 2] [--against REV]
        [--clock wall|cpu]

About 5 minutes with the defaults (2 thread counts x 2 batches x 9 rows, 2 s each, plus making
64 MiB sets of random matrices).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kernels import parser, repeated, sweep  # noqa: E402
from headwise.fast.int4 import GROUP, Int4  # noqa: E402


def old_codes(q: torch.Tensor) -> torch.Tensor:
    """``q (out, in)`` in llama.cpp's order: per group, byte i = weight i | weight 16 + i << 4."""
    out, n = q.shape
    g = q.to(torch.uint8).view(out, n // GROUP, 2, GROUP // 2)
    return (g[:, :, 0] | g[:, :, 1] << 4).reshape(out, n // 2).contiguous()


class Matrix:
    """One random 4-bit matrix in both layouts."""

    def __init__(self, out: int, n: int, gen: torch.Generator):
        q = torch.randint(0, 16, (out, n), generator=gen)
        w = Int4(q, torch.rand(out, n // GROUP, generator=gen) * 0.01,
                 -torch.rand(out, n // GROUP, generator=gen) * 0.1)
        self.out, self.n, self.scales, self.mins = out, n, w.scales, w.mins
        self.codes = {"old": old_codes(q), "new": w.codes}
        self.nbytes = w.nbytes()


def caller(lib, layout: str, mats: list[Matrix], x: dict, y: dict, threads: int, wide: int,
           repeat: int = 1):
    fn = lib.headwise_q4_matmul
    args = [(x[m.n].data_ptr(), m.n, m.codes[layout].data_ptr(), m.scales.data_ptr(),
             m.mins.data_ptr(), y[m.out].data_ptr(), m.out, None, 0, None, x[m.n].shape[0],
             m.out, m.n, threads, wide) for m in mats]
    return repeated(fn, args, repeat)


def main(argv=None) -> None:
    args = parser(__doc__, [1, 4]).parse_args(argv)
    sweep(args, "q4 kernel", ["headwise_q4_matmul"], Matrix, caller, torch.float32)


if __name__ == "__main__":
    main()
