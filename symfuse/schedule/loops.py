"""Where each member of a kernel lives, decided once for both backends.

A native step is a group of TEs over the same rows. Before either backend writes a line, this
module decides what the kernel reads, what it stores, and how each member it does not store
is had where it is read:

- `per_row`: one value per row (a softmax's max and sum, a layer norm's statistics): computed
  once a row, before the members that read it;
- `inline`: element-wise, read at one place: computed there, never held;
- `kept`: the rest (a row read by several members, or by a reduction): held inside the
  kernel. The CPU keeps such a row in a buffer of the row's length; a GPU program, whose lanes
  cannot read each other's registers, recomputes it where it is read (`recomputed`).

The emitters render this plan; neither decides it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from symfuse.schedule.steps import NativeStep
from symfuse.te.analysis import has_reduce, loads, loads_through, row_scalar
from symfuse.te.ir import TE


@dataclass(frozen=True)
class LoopPlan:
    inputs: tuple[str, ...]  # buffers the kernel reads, sorted
    outputs: tuple[str, ...]  # members it stores
    per_row: dict[str, TE]  # one value a row, stored or not
    inline: dict[str, TE]  # not stored, element-wise, read at one place: computed there
    kept: dict[str, TE]  # not stored, held inside the kernel (a row buffer, or a per-row value)

    def recomputed(self, members: tuple[TE, ...]) -> dict[str, TE]:
        """The members a backend that holds no row computes where they are read: all but the
        per-row values (a member it stores too: another lane may not have stored it yet)."""
        return {m.name: m for m in members if m.name not in self.per_row}

    def describe(self) -> str:
        parts = [f"reads {', '.join(self.inputs) or 'nothing'}", f"stores {', '.join(self.outputs) or 'nothing'}"]
        for what, names in (("per row", self.per_row), ("inline", self.inline), ("kept", self.kept)):
            if names:
                parts.append(f"{what}: {', '.join(names)}")
        return "; ".join(parts)


def plan_loops(step: NativeStep, outputs: list[str], rows_in=(), rows_out=()) -> LoopPlan:
    """The plan of `step` storing `outputs`; `rows_in`: tensors whose current row the caller
    hands over (the merged attention's scores), `rows_out`: members whose row goes to the caller."""
    members = {m.name for m in step.members}
    reads = {ld.tensor for m in step.members for ld in loads_through(m.body, step.inline)}
    inputs = tuple(sorted(reads - set(outputs) - members - set(rows_in)))
    unstored = {m.name: m for m in step.members if m.name not in outputs and m.name not in rows_out}
    sites = Counter(ld.tensor for m in step.members for ld, _ in loads(m.body))
    inline = {n: m for n, m in unstored.items() if sites[n] == 1 and not row_scalar(m) and not has_reduce(m.body)}
    kept = {n: m for n, m in unstored.items() if n not in inline}
    per_row = {m.name: m for m in step.members if row_scalar(m)}
    return LoopPlan(inputs, tuple(outputs), per_row, inline, kept)
