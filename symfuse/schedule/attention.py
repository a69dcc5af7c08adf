"""Subprogram merging (Souffle): attention's scores GEMM, its softmax kernel and the
context GEMM run as one kernel, so the `[B, H, S, S]` scores never reach memory.

The pattern is found on the schedule, from what the steps read and write, not from op
names: a batched GEMM whose result only a row kernel reads, whose one output only a second
batched GEMM reads as its left operand. Steps between the GEMM and the row kernel that do not
read the scores (a mask inverted for `masked_fill`) run before the GEMM. Inside the merged
kernel each (batch, head) packs its keys and values once, then every block of query rows
computes its scores with the GEMM micro-kernel, runs the row kernel's code on them in cache
(the barrier between the two kernels becomes program order inside one thread) and
multiplies by the values.
The host keeps a second version and picks per call from the number of keys: torch's fused
attention (a library kernel, as GEMMs are) when the row kernel is exactly attention's
scale, mask and safe softmax, else the three steps (library batched GEMMs around the row
kernel). Where the merged kernel stops winning depends on the CPU: the switch point is
measured per machine (`codegen/cpu/calibrate.py`) and `explain` shows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from symfuse.schedule.layout import View, strided_view
from symfuse.schedule.steps import GemmStep, NativeStep, Schedule, Step
from symfuse.te.analysis import has_reduce, loads
from symfuse.te.ir import Call, Load


@dataclass(frozen=True)
class LibraryForm:
    """The row kernel is exactly attention's `safe_softmax(mask(scores * scale))`: torch's
    fused attention computes the same thing, faster on this CPU than the merged kernel."""

    scale: float
    mask: View | None  # a bool mask (where) or an additive float mask, as a (broadcast) view


@dataclass
class AttentionStep:
    name: str
    scores: GemmStep  # q @ k^T
    softmax: NativeStep  # the row kernel between them
    context: GemmStep  # probs @ v
    out: str
    rows: tuple = ()  # the kernel walks (batch, head) pairs itself
    library: LibraryForm | None = None


def find_step(sched: Schedule, name: str) -> NativeStep:
    """A native step by name: a step of the schedule, a part of merged attention, or a GEMM's
    epilogue."""
    for st in sched.steps:
        parts = (st.scores, st.softmax, st.context) if isinstance(st, AttentionStep) else ()
        for s in (st, *parts):
            if s.name == name:
                return s
            if isinstance(s, GemmStep) and s.epilogue is not None and s.epilogue.name == name:
                return s.epilogue
    raise KeyError(name)


def native_steps(sched: Schedule) -> list:
    """The steps that run generated code: native steps, GEMM epilogues, merged attention (and
    its row kernel where the three steps may run instead)."""
    out = []
    for st in sched.steps:
        if isinstance(st, AttentionStep):  # the merged kernel; its row kernel too where the three steps may run
            out += [st] if st.library else [st, st.softmax]
        elif isinstance(st, NativeStep):
            out.append(st)
        elif isinstance(st, GemmStep) and st.epilogue is not None:
            out.append(st.epilogue)
    return out


def _reads(st: Step) -> set[str]:

    if isinstance(st, GemmStep):
        return {v.buffer for v in (st.a, st.b) if v is not None} | ({st.bias} if st.bias else set())
    if isinstance(st, NativeStep):
        return {ld.tensor for m in st.members for ld, _ in loads(m.body)}
    return {v.name for v in st.node.inputs if v is not None}


def _unit_last(v: View | None) -> bool:
    return v is not None and len(v.sizes) == 4 and v.strides[-1] == 1


def _candidate(a: Step, b: Step, c: Step, sched: Schedule, readers: dict[str, int]) -> bool:
    if not (isinstance(a, GemmStep) and isinstance(b, NativeStep) and isinstance(c, GemmStep)):
        return False
    if a.op != "matmul" or c.op != "matmul" or a.epilogue or c.epilogue or a.bias or c.bias:
        return False
    if b.kind != "reduction" or b.outputs != [c.a.buffer] or a.out in sched.outputs or c.a.buffer in sched.outputs:
        return False
    scores, probs = a.out, c.a.buffer
    if readers.get(scores) != 1 or readers.get(probs) != 1 or scores not in _reads(b):
        return False
    pbuf = sched.buffers[probs]
    if c.a.strides != pbuf.strides or c.a.offset != 0 or tuple(c.a.sizes) != tuple(pbuf.shape):
        return False
    if sched.buffers[scores].dtype.name != "float32" or pbuf.dtype.name != "float32":
        return False
    # q and the output need unit stride along their last dim (the micro-kernel's rows)
    out = sched.buffers[c.out]
    return _unit_last(a.a) and len(a.b.sizes) == 4 and len(c.b.sizes) == 4 and out.strides[-1] == 1


def _scalar(v, producer) -> float | None:
    n = producer.get(v)
    if n is None or n.op != "full" or v.type.rank != 0 or not isinstance(n.attrs["value"], (int, float)):
        return None
    return float(n.attrs["value"])


def _mask_view(st: AttentionStep, masked: str, sched: Schedule) -> View | None:
    """The mask as the row kernel reads it: a strided view of its buffer over the scores'
    shape (stride 0 where it broadcasts)."""

    te = next((m for m in st.softmax.members if m.name == masked), None)
    if te is None or not isinstance(te.body, Call):
        return None
    args = te.body.args
    loads_ = [a for a in (args[:1] if te.body.fn == "where" else args) if isinstance(a, Load)]
    loads_ = [ld for ld in loads_ if ld.tensor in sched.buffers and ld.tensor != st.scores.out]
    if len(loads_) != 1:
        return None
    ld = loads_[0]
    v = strided_view(ld.tensor, ld.index, sched.buffers[ld.tensor].strides, te.axes, te.shape)
    if v is None:
        return None  # a broadcast dim stays 1, so the library need not expand the mask
    return View(v.buffer, tuple(1 if s == 0 else d for d, s in zip(v.sizes, v.strides)), v.strides, v.offset)


def library_form(st: AttentionStep, sched: Schedule) -> LibraryForm | None:
    """Read the row kernel back as scale, mask and safe softmax, or None if it is more."""
    g = sched.graph
    producer = g.producers()
    nodes = {v.name: n for n in g.nodes for v in n.outputs}
    members = [m.name for m in st.softmax.members]
    seq = [nodes[m] for m in members if m in nodes]
    if not seq or seq[-1].op != "safe_softmax" or seq[-1].attrs["dim"] not in (-1, seq[-1].out.type.rank - 1):
        return None
    probs = seq[-1].out.name
    if any(m not in nodes and not m.startswith(probs + "_") for m in members):
        return None  # a TE of its own besides the softmax's statistics
    x, mask, scale, rest = seq[-1].inputs[0], None, 1.0, seq[:-1]
    if rest and rest[-1].out is x and rest[-1].op in ("where", "add"):
        n = rest.pop()
        if n.op == "where":
            m, x, other = n.inputs
            if m.type.dtype.name != "bool" or _scalar(other, producer) != -math.inf:
                return None
        else:
            a, b = n.inputs
            x, m = (a, b) if producer.get(a) is not None and producer[a].op == "mul" else (b, a)
            if not m.type.dtype.is_float:
                return None
        mask = _mask_view(st, n.out.name, sched)
        if mask is None:
            return None
    if rest and rest[-1].out is x and rest[-1].op == "mul":
        n = rest.pop()
        a, b = n.inputs
        c, x = (_scalar(b, producer), a) if _scalar(b, producer) is not None else (_scalar(a, producer), b)
        if c is None:
            return None
        scale = c
    if rest or x.name != st.scores.out:
        return None
    return LibraryForm(scale, mask)


def _apart(a: Step, b: Step, c: Step) -> NativeStep | None:
    """The members of a row kernel `b` between two batched GEMMs that it also stores for other
    steps and that do not depend on the first GEMM's scores (T5's position bias, which every
    layer reads), as a kernel of their own to run before the scores; `b` keeps the rest. None
    when there are none."""

    if not (isinstance(a, GemmStep) and isinstance(b, NativeStep) and isinstance(c, GemmStep)):
        return None
    if a.op != "matmul" or c.op != "matmul" or c.a is None or c.a.buffer not in b.outputs or a.out not in _reads(b):
        return None  # not scores -> row kernel -> probs @ v
    extra = [n for n in b.outputs if n != c.a.buffer]
    if not extra:
        return None
    by_name = {m.name: m for m in b.members}
    needs: dict[str, set[str]] = {}  # a member -> the members it reads, transitively
    for m in b.members:
        direct = {ld.tensor for ld, _ in loads(m.body) if ld.tensor in by_name}
        needs[m.name] = direct.union(*(needs[d] for d in direct))
    apart = set(extra).union(*(needs[n] for n in extra))
    if any(a.out in {ld.tensor for ld, _ in loads(by_name[n].body)} for n in apart):
        return None  # computed from the scores: it stays in the row kernel
    moved = [m for m in b.members if m.name in apart]
    kept = [m for m in b.members if m.name not in set(extra)]
    kind = "reduction" if any(has_reduce(m.body) for m in moved) else "loop"
    b.members = [m for m in kept if m.name not in apart or any(m.name in needs[k.name] for k in kept)]
    b.outputs = [n for n in b.outputs if n not in set(extra)]
    return NativeStep(f"{b.name}_apart", kind, moved, extra, b.inline)


def merge_attention(sched: Schedule) -> Schedule:
    # a row kernel that also stores values computed without the scores gives them to a kernel
    # of its own first (else it could not merge: the merged kernel stores only its output)
    i = 0
    while i + 2 < len(sched.steps):
        pre = _apart(*sched.steps[i : i + 3])
        if pre is not None:
            sched.steps.insert(i, pre)
            sched.notes.append(
                f"{', '.join(pre.outputs)} computed apart from {sched.steps[i + 2].name}, before its scores"
            )
            i += 1
        i += 1
    readers: dict[str, int] = {}
    for st in sched.steps:
        for name in _reads(st):
            readers[name] = readers.get(name, 0) + 1
    steps: list = []
    i, old = 0, sched.steps
    while i < len(old):
        a = old[i]
        # the row kernel is the first step to read the scores; steps between that do not (a mask
        # inverted for `masked_fill`) run before the scores' GEMM instead
        batched = isinstance(a, GemmStep) and a.op == "matmul"
        j = next((j for j in range(i + 1, len(old)) if a.out in _reads(old[j])), 0) if batched else 0
        if j and j + 1 < len(old) and _candidate(a, old[j], old[j + 1], sched, readers):
            b, c = old[j], old[j + 1]
            steps += old[i + 1 : j]
            if j > i + 1:
                moved = ", ".join(s.name for s in old[i + 1 : j])
                sched.notes.append(f"{moved} run before {a.name} (not reading its scores), so that it merges")
            st = AttentionStep(f"{b.name}_attention", a, b, c, c.out)
            st.library = library_form(st, sched)
            steps.append(st)
            how = "torch's fused attention" if st.library else "one kernel"
            sched.notes.append(f"{a.name}, {b.name} and {c.name} run as {how}: the scores never reach memory")
            i = j + 2
        else:
            steps.append(a)
            i += 1
    sched.steps = steps
    return sched


__all__ = ["AttentionStep", "LibraryForm", "library_form", "merge_attention", "native_steps"]
