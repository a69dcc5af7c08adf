"""A kernel's loops and where each of its members lives, decided once for both backends.

A native step is a group of TEs over the same rows. Before either backend writes a line, this
module decides how the kernel's flat row number splits into the rows' indices (`row_split`),
which members it computes and in what order, each as one value a row or as a loop over its
last axis (`loops`): whether that loop is element-wise (a vector loop on a CPU) and which
later row statistics accumulate in it instead of a loop of their own (`riders`). It decides
what the kernel reads, what it stores, and how each member it does not store is had where it
is read:

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
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from symfuse.ir.dims import Dim
from symfuse.ir.dtypes import DType
from symfuse.schedule.steps import NativeStep
from symfuse.te.analysis import has_reduce, in_row, is_window, loads, loads_through, reductions, row_scalar
from symfuse.te.ir import TE, Call, Load, Reduce, Scalar, substitute


@dataclass(frozen=True)
class RowIndex:
    """One index of a kernel's row, from the flat row number: taken from the last dim first,
    each the remainder by its extent (`extent`), the first dim what is left (`extent` None), a
    dim of size 1 always 0 (`zero`)."""

    k: int
    extent: Dim | None
    zero: bool = False


@dataclass(frozen=True)
class MemberLoop:
    """How one member is computed: one value a row, or a loop over its last axis."""

    name: str
    per_row: bool
    vector: bool = False  # the loop is element-wise (the reductions inside it are windows)
    riders: tuple[tuple[str, Reduce], ...] = ()  # later statistics (name, reduction) accumulated in it


@dataclass(frozen=True)
class LoopPlan:
    inputs: tuple[str, ...]  # buffers the kernel reads, sorted
    outputs: tuple[str, ...]  # members it stores
    per_row: dict[str, TE]  # one value a row, stored or not
    inline: dict[str, TE]  # not stored, element-wise, read at one place: computed there
    kept: dict[str, TE]  # not stored, held inside the kernel (a row buffer, or a per-row value)
    row_split: tuple[RowIndex, ...]  # the rows' indices from the flat row number, last dim first
    loops: tuple[MemberLoop, ...]  # the members the kernel computes, in order

    def recomputed(self, members: tuple[TE, ...]) -> dict[str, TE]:
        """The members a backend that holds no row computes where they are read: all but the
        per-row values (a member it stores too: another lane may not have stored it yet)."""
        return {m.name: m for m in members if m.name not in self.per_row}

    def describe(self) -> str:
        parts = [f"reads {', '.join(self.inputs) or 'nothing'}", f"stores {', '.join(self.outputs) or 'nothing'}"]
        for what, names in (("per row", self.per_row), ("inline", self.inline), ("kept", self.kept)):
            if names:
                parts.append(f"{what}: {', '.join(names)}")
        for lp in self.loops:
            if lp.riders:
                parts.append(f"{', '.join(r for r, _ in lp.riders)} accumulated in {lp.name}'s loop")
        return "; ".join(parts)


def row_split(rows: tuple[Dim, ...] | None) -> tuple[RowIndex, ...]:
    """The rows' indices from the flat row number, the last dim first."""
    out = []
    for k in range(len(rows or ()) - 1, -1, -1):
        d = rows[k]
        out.append(RowIndex(k, None if k == 0 else d, zero=d == 1))
    return tuple(out)


def stat_body(m: TE) -> Scalar:
    """A row statistic's body at its one element."""
    return substitute(m.body, {m.axes[-1]: sympy.Integer(0)}) if m.axes else m.body


def expand(s: Scalar, defs: dict[str, TE]) -> Scalar:
    """`s` with its loads of `defs` (what is computed where it is read) replaced by their
    bodies at the load's index, as an emitter writes them."""
    if isinstance(s, Load):
        index = tuple(i if isinstance(i, sympy.Expr) else expand(i, defs) for i in s.index)
        if s.tensor in defs:
            d = defs[s.tensor]
            return expand(substitute(d.body, dict(zip(d.axes, index))), defs)
        return Load(s.tensor, index)
    if isinstance(s, Call):
        return Call(s.fn, tuple(expand(a, defs) for a in s.args), s.dtype, s.params)
    if isinstance(s, Reduce):
        return Reduce(s.op, expand(s.body, defs), s.axes, s.dtype)
    return s


def _riders(m: TE, later: list[TE], defs: dict[str, TE], scalar_call: Callable[[Scalar], bool]):
    """The reductions of later row statistics that go over `m`'s row, read `m` at the element
    its loop computes and nothing computed after it: each is accumulated in m's loop instead of
    a loop of its own (a softmax's max over its masked scores, its sum over the exponentials),
    one pass over the row less; with the statistic's name. A reduction whose body makes a loop
    scalar (`scalar_call`) keeps a loop of its own, so that m's stays a vector loop."""
    after, last = {x.name for x in later}, m.axes[-1]
    found = []
    for stat in later:
        if not row_scalar(stat):
            continue
        for r in reductions(stat_body(stat)):
            single = len(r.axes) == 1 and r.axes[0][1] == m.shape[-1] and r.dtype is not DType.bool
            if not single or is_window(r) or has_reduce(r.body):
                continue
            body = expand(substitute(r.body, {r.axes[0][0]: last}), defs)
            if scalar_call(body):
                continue
            reads = [ld for ld, _ in loads(body)]
            mine = [ld for ld in reads if ld.tensor == m.name]
            if mine and not any(ld.tensor in after for ld in reads):
                if all(ld.index[-1] == last and in_row(ld.index, m.axes, m.shape) for ld in mine):
                    found.append((stat.name, r))
    return tuple(found)


def plan_loops(
    step: NativeStep,
    outputs: list[str],
    rows_in=(),
    rows_out=(),
    folded=(),
    buffers=(),
    keeps_rows: bool = True,
    scalar_call: Callable[[Scalar], bool] | None = None,
) -> LoopPlan:
    """The plan of `step` storing `outputs`; `rows_in`: tensors whose current row the caller
    hands over (the merged attention's scores), `rows_out`: members whose row goes to the caller,
    `folded`: members the caller computes another way, `buffers`: the schedule's buffers (an
    inline definition that is one is read, not recomputed). A backend that `keeps_rows` computes
    each kept row in a loop of its own (else where it is read); one that says which calls make a
    loop scalar (`scalar_call`) gets statistics accumulated in the loops they read."""
    members = {m.name for m in step.members}
    reads = {ld.tensor for m in step.members for ld in loads_through(m.body, step.inline)}
    inputs = tuple(sorted(reads - set(outputs) - members - set(rows_in)))
    unstored = {m.name: m for m in step.members if m.name not in outputs and m.name not in rows_out}
    sites = Counter(ld.tensor for m in step.members for ld, _ in loads(m.body))
    inline = {n: m for n, m in unstored.items() if sites[n] == 1 and not row_scalar(m) and not has_reduce(m.body)}
    kept = {n: m for n, m in unstored.items() if n not in inline}
    per_row = {m.name: m for m in step.members if row_scalar(m)}
    if keeps_rows:
        computed = [m for m in step.members if m.name not in inline and m.name not in folded]
    else:
        computed = [m for m in step.members if m.name in per_row or m.name in outputs]
    defs = {**{n: g for n, g in step.inline.items() if n not in buffers}, **inline}
    loops = []
    for i, m in enumerate(computed):
        if m.name in per_row:
            loops.append(MemberLoop(m.name, True))
            continue
        vector = all(is_window(r) for r in reductions(m.body))
        riders = _riders(m, computed[i + 1 :], defs, scalar_call) if vector and scalar_call else ()
        loops.append(MemberLoop(m.name, False, vector, riders))
    return LoopPlan(inputs, tuple(outputs), per_row, inline, kept, row_split(step.rows), tuple(loops))
