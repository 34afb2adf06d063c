"""The speed layer: what makes headwise's paths fast on a given device, changing no value.

Holds the CPU decoding step's weight layouts and products (``rows``), headwise's C kernels and
their loader (``native`` + ``step_kernels.c``), the 4-bit GGUF weight form (``int4``), huge-page
and recycled buffers (``large``), and the CPU flash kernel that returns its log-sum-exp
(``flash_cpu``). Everything here is an optimisation of a computation the plain torch path
(:mod:`headwise.layers`, :mod:`headwise.attend`, :mod:`headwise.step`) also does: switching it
off (``HEADWISE_NATIVE=0``, another device, autograd) gives the same numbers.

May import: torch, :mod:`headwise.errors`, :mod:`headwise.limits`, :mod:`headwise.masks`,
:mod:`headwise.heads`, :mod:`headwise.observe`; never a model, a layer or a tool.
"""
