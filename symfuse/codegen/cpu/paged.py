"""Attention over a paged key/value cache in C++ (`include/sf_paged_attention.h`).

A decoding step's attention reads each sequence's past where it lies in the cache's blocks
and its new keys where the step computed them; one call does every sequence, head and row,
split over threads along the keys as flash-decoding does, so that one row over a long past
keeps every core busy. torch's reference (`runtime/kv.paged_attention`) copies the past
into a contiguous tensor at every step.
"""

from symfuse.codegen.cpu.c import header

PAGED_SOURCE = header("sf_paged_attention.h")
