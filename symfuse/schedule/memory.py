"""The memory plan: intermediate buffers packed into one workspace by lifetime.

Every buffer the host allocates for an intermediate (a native kernel's output, a batched
GEMM's output, a copy) gets a slot; buffers whose lifetimes do not overlap share one. A
slot's size is the largest of its buffers' sizes, a symbolic expression evaluated per
call, so the plan holds for every binding. The workspace persists across calls and only
grows: a call makes no fresh allocation (and takes no page faults) for intermediates.
Returned tensors never live in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from symfuse.ir.dims import Dim

ALIGN = 64  # bytes: one cache line, and what oneDNN and AVX-512 loads like


@dataclass
class MemoryPlan:
    slot_of: dict[str, int]  # buffer -> slot
    slot_sizes: list[list[Dim]]  # per slot, the byte sizes of its buffers (the slot is their max)

    def slot_bytes(self) -> list[Dim]:
        """Each slot's size: the largest of its buffers'."""
        return [sizes[0] if len(sizes) == 1 else sympy.Max(*sizes) for sizes in self.slot_sizes]


def plan_memory(defs: list[list[str]], uses: list[set[str]], sizes: dict[str, Dim]) -> MemoryPlan:
    """defs[i]: buffers step i writes (planned ones only); uses[i]: buffers it reads."""
    last: dict[str, int] = {}
    for i, names in enumerate(uses):
        for n in names:
            last[n] = i
    slot_of: dict[str, int] = {}
    slots: list[list[Dim]] = []
    free_after: list[int] = []  # per slot: the last step that reads its current buffer
    for i, names in enumerate(defs):
        for n in names:
            size = sizes[n]
            free = [s for s in range(len(slots)) if free_after[s] < i]
            same = [s for s in free if size in slots[s]]
            s = same[0] if same else (free[0] if free else None)
            if s is None:
                slots.append([])
                free_after.append(-1)
                s = len(slots) - 1
            if size not in slots[s]:
                slots[s].append(size)
            slot_of[n] = s
            free_after[s] = max(last.get(n, i), i)
    return MemoryPlan(slot_of, slots)


def aligned(nbytes: Dim) -> Dim:
    return sympy.ceiling(nbytes / ALIGN) * ALIGN
