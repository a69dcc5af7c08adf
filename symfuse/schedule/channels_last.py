"""Channels-last activations around convolutions (the CPU backend).

oneDNN's convolutions run fastest on NHWC data: given NCHW tensors they convert the input,
or take a slower path, on every call (`symfuse bench --model resnet --image 160,224 --profile`). This pass keeps the
tensor shapes logical (N, C, H, W) and changes only where the values lie:

- every 4-d temp buffer a convolution reads or writes is stored in dim order (0, 2, 3, 1),
  and so is a buffer a native kernel computes from such buffers (a pool, a residual add),
  unless something that needs a fixed layout reads it (a library GEMM's view, torch, the
  caller): those stay row-major;
- a convolution's weight is kept channels-last, so oneDNN takes its NHWC path even on a
  program input, which stays NCHW as the caller passed it;
- a native kernel whose outputs are all channels-last runs its loops in that order: rows
  over (N, H, W), the vectorised inner loop over C, so it reads and writes memory in order
  instead of at a stride of C elements.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from symfuse.schedule.attention import AttentionStep, native_steps
from symfuse.schedule.layout import View, row_major
from symfuse.schedule.steps import Buffer, GemmStep, NativeStep, OpaqueStep, Schedule
from symfuse.te.analysis import loads, row_scalar
from symfuse.te.ir import TE, Call, Load, Reduce, Scalar, axis, substitute

NHWC = (0, 2, 3, 1)


def channels_last(sched: Schedule) -> Schedule:
    """`sched` with the buffers around its convolutions stored channels-last (in place)."""
    convs = [s for s in sched.steps if isinstance(s, GemmStep) and s.conv is not None]
    if not convs:
        return sched
    fixed = _fixed_layout(sched)

    def movable(name: str) -> bool:
        b = sched.buffers.get(name)
        return b is not None and b.kind == "temp" and len(b.shape) == 4 and name not in fixed

    chosen: dict[str, str] = {}  # buffer -> why
    for st in convs:
        chosen |= {n: f"convolution {st.anchor} {'reads' if n == st.a.buffer else 'writes'} it"
                   for n in (st.a.buffer, st.out) if movable(n)}  # fmt: skip
    for st in _natives(sched):  # forward: a kernel over channels-last inputs writes channels-last
        reads = sorted({ld.tensor for m in st.members for ld, _ in loads(m.body)} & chosen.keys())
        if reads and st.outputs and all(movable(n) for n in st.outputs):
            chosen |= {n: chosen.get(n, f"{st.name} computes it from {', '.join(reads)}") for n in st.outputs}
    for name, why in chosen.items():
        b = sched.buffers[name]
        b.strides = row_major(b.shape, NHWC)
        sched.notes.append(f"{name} is stored channels-last (dim order {NHWC}): {why}")
    for st in convs:
        buf = sched.buffers[st.a.buffer]
        st.a = View(st.a.buffer, buf.shape, buf.strides, st.a.offset)
    for st in _natives(sched):
        if st.outputs and all(n in chosen for n in st.outputs):
            why = in_loop_order(st, NHWC)
            if why:
                sched.notes.append(f"{st.name} loops in its rows' order, not its outputs' ({why})")
    return sched


def _natives(sched: Schedule) -> list[NativeStep]:
    return [st for st in native_steps(sched) if isinstance(st, NativeStep)]


def _fixed_layout(sched: Schedule) -> set[str]:
    """Buffers whose strides something outside the native kernels depends on: returned, read
    through a library GEMM's view (its strides were fixed when the view was made), produced
    or read by torch (an opaque op's result has torch's strides), or by merged attention."""
    fixed = set(sched.outputs)
    for st in sched.steps:
        if isinstance(st, OpaqueStep):
            fixed |= {v.name for v in (*st.node.inputs, *st.node.outputs) if v is not None}
        elif isinstance(st, GemmStep) and st.conv is None:
            fixed |= {v.buffer for v in (st.a, st.b) if v is not None}
        elif isinstance(st, AttentionStep):
            for part in (st.scores, st.context):
                fixed |= {v.buffer for v in (part.a, part.b) if v is not None} | {part.out}
            fixed |= {ld.tensor for m in st.softmax.members for ld, _ in loads(m.body)} | set(st.softmax.outputs)
            fixed |= {st.out} | ({st.library.mask.buffer} if st.library and st.library.mask else set())
    return fixed


def in_loop_order(st: NativeStep, order: tuple[int, ...]) -> str:
    """Permute `st`'s members so that their dims run in `order` (member dim k is the old dim
    `order[k]`); the emitter stores each output through its buffer's strides taken in the same
    order. Returns why not, and leaves `st` alone, when a member is not a plain element of a
    4-d grid every member shares (a row statistic, another shape, a neighbour's element)."""
    shape = tuple(st.members[-1].shape)
    names = {m.name for m in st.members}
    for m in st.members:
        if tuple(m.shape) != shape or len(shape) != len(order):
            return f"{m.name} has another shape"
        if row_scalar(m):
            return f"{m.name} is one value per row"
        if any(ld.tensor in names and tuple(ld.index) != tuple(m.axes) for ld, _ in loads(m.body)):
            return f"{m.name} reads another element of a member"
    new = tuple(axis(k) for k in range(len(order)))
    members = []
    for m in st.members:
        body = substitute(m.body, {m.axes[old]: new[k] for k, old in enumerate(order)})
        members.append(TE(m.name, tuple(shape[k] for k in order), m.dtype, new, _relabel(body, names, new), m.origin))
    st.members = members
    st.order = order
    return ""


def _relabel(s: Scalar, names: set[str], index: tuple) -> Scalar:
    """`s` with its loads of the members in `names` at `index` (the same element, permuted)."""
    if isinstance(s, Load):
        if s.tensor in names:
            return Load(s.tensor, index)
        return Load(s.tensor, tuple(i if isinstance(i, sympy.Expr) else _relabel(i, names, index) for i in s.index))
    if isinstance(s, Call):
        return replace(s, args=tuple(_relabel(a, names, index) for a in s.args))
    if isinstance(s, Reduce):
        return replace(s, body=_relabel(s.body, names, index))
    return s


def in_step_order(b: Buffer, order: tuple[int, ...] | None) -> Buffer:
    """A buffer as a step looping in `order` indexes it (dims and strides permuted alike)."""
    if order is None:
        return b
    return replace(b, shape=tuple(b.shape[k] for k in order), strides=tuple(b.strides[k] for k in order))
