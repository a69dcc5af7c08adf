"""From a fusion plan to the steps that run it.

Every kernel of the plan becomes one step:
- a `NativeStep`: a loop or reduction kernel, generated as C++ (`codegen/cpu`);
- a `GemmStep`: a library GEMM (oneDNN for linear layers, with weights reordered once and
  an activation as a post-op; `torch.matmul` for batched products) reading its operands
  as strided views of their buffers, and the rest of its epilogue as a native kernel
  over the GEMM's output;
- an `OpaqueStep`: an op with no TE lowering, run through its torch reference.

Buffers are the materialised tensors: inputs, constants, and every kernel output read by
another step or returned. Their strides are row-major unless a GEMM needs another dim
order to read them without a copy; where no order helps, a copy kernel is inserted and
`explain` lists it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from symfuse.fusion.plan import Kernel, Plan
from symfuse.ir.dims import Dim
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Graph, Node
from symfuse.schedule.layout import View, reorder_for, row_major, strided_view
from symfuse.te.analysis import Analysis, operand, same_element
from symfuse.te.ir import TE, Call, Load, Opaque, Reduce, Scalar, axis, substitute
from symfuse.te.lower import TEProgram
from symfuse.te.scalar import POSTOPS  # activations oneDNN applies as a linear layer's post-op


@dataclass
class Buffer:
    name: str
    shape: tuple[Dim, ...]
    dtype: DType
    strides: tuple[Dim, ...]
    kind: str  # input | constant | temp


@dataclass
class NativeStep:
    name: str
    kind: str  # loop | reduction | epilogue | copy
    members: list[TE]
    outputs: list[str]  # members written to buffers
    inline: dict[str, TE] = field(default_factory=dict)  # generators substituted into loads
    # the members' dims are their outputs' dims in this order (channels_last.py: (0, 2, 3, 1)
    # loops over C innermost); their buffers are indexed in it too. None: as the graph has them
    order: tuple[int, ...] | None = None

    @property
    def rows(self) -> tuple[Dim, ...]:
        return self.members[-1].shape[:-1]


@dataclass
class GemmStep:
    name: str
    op: str  # linear | matmul | conv2d
    anchor: str  # the GEMM's own result
    out: str  # what the library call returns: the anchor, or the post-op's member
    a: View | None = None
    b: View | None = None  # matmul's right operand
    weight: str | None = None  # linear: the constant weight [N, K]
    bias: str | None = None
    postop: tuple[str, str] | None = None  # (oneDNN attr, algorithm)
    conv: tuple | None = None  # conv2d: (padding, stride, dilation, groups)
    epilogue: NativeStep | None = None


@dataclass
class OpaqueStep:
    name: str
    node: Node


Step = NativeStep | GemmStep | OpaqueStep


@dataclass
class Schedule:
    graph: Graph
    buffers: dict[str, Buffer]
    steps: list[Step]
    outputs: list[str]
    notes: list[str] = field(default_factory=list)


def _contraction(body: Scalar) -> Reduce:
    if isinstance(body, Reduce):
        return body
    assert isinstance(body, Call), body
    return next(_contraction(a) for a in body.args if isinstance(a, (Reduce, Call)))


class _Builder:
    def __init__(self, prog: TEProgram, analysis: Analysis, fp: Plan) -> None:
        self.prog, self.a, self.fp = prog, analysis, fp
        g = prog.graph
        self.items = {t.name: t for t in prog.items}
        self.nodes = {v.name: n for n in g.nodes for v in n.outputs}
        self.kernel_of = {m: k for k in fp.kernels for m in k.members}
        self.buffers: dict[str, Buffer] = {}
        for v in g.inputs:
            self.buffers[v.name] = Buffer(v.name, v.type.shape, v.type.dtype, row_major(v.type.shape), "input")
        for v in g.constants:
            self.buffers[v.name] = Buffer(v.name, v.type.shape, v.type.dtype, row_major(v.type.shape), "constant")
        self.steps: list[Step] = []
        self.notes: list[str] = []
        self.inline = {t: self.items[t] for t in fp.inlined}
        self.pending: list[tuple] = []  # GEMM operands (step, attr, load, variables, sizes) to resolve

    def materialised(self, name: str, kernel: Kernel | None) -> bool:
        if name in self.prog.outputs:
            return True
        return any(self.kernel_of.get(r) is not kernel for r in self.a.readers.get(name, []))

    def temp(self, name: str) -> None:
        t = self.items[name]
        if isinstance(t, Opaque):
            for v in self.prog.nodes[name].outputs:
                self.buffers[v.name] = Buffer(v.name, v.type.shape, v.type.dtype, row_major(v.type.shape), "temp")
            return
        self.buffers[name] = Buffer(name, t.shape, t.dtype, row_major(t.shape), "temp")

    def run(self) -> Schedule:
        # generators read as whole tensors (by torch or a GEMM, or returned) need a buffer
        for g in list(self.inline):
            readers = self.a.readers.get(g, [])
            if g in self.prog.outputs or any(isinstance(self.items[r], Opaque) or self.gemm(r) for r in readers):
                del self.inline[g]
                self.temp(g)
                self.steps.append(NativeStep(f"k_{g}", "loop", [self.items[g]], [g], self.inline))
        for k in self.fp.kernels:
            if k.kind == "opaque":
                (m,) = k.members
                self.temp(m)
                self.steps.append(OpaqueStep(k.name, self.prog.nodes[m]))
            elif k.kind.startswith("gemm"):
                self.steps.append(self.gemm_step(k))
            else:
                self.steps.append(self.native_step(k, k.kind, k.members))
        self.assign_layouts()
        return Schedule(self.prog.graph, self.buffers, self.steps, list(self.prog.outputs), self.notes)

    def gemm(self, name: str) -> bool:
        return self.a.kind.get(name) == "compute-intensive"

    def native_step(self, k: Kernel, kind: str, members: list[str]) -> NativeStep:
        outs = [m for m in members if self.materialised(m, k)]
        for m in outs:
            self.temp(m)
        return NativeStep(k.name, kind, [self.items[m] for m in members], outs, self.inline)

    def gemm_step(self, k: Kernel) -> GemmStep:
        anchor = next(m for m in k.members if self.gemm(m))
        te = self.items[anchor]
        node = self.nodes[anchor]
        consts = self.prog.graph.constants
        const_names = {v.name for v in consts}
        epi = [m for m in k.members if m != anchor]
        step = GemmStep(k.name, node.op, anchor, anchor)
        if node.op == "conv2d":  # oneDNN's convolution reads its input whole (the rule materialised it)
            xv, wv, bv = node.inputs
            buf = self.buffers[xv.name]
            step.a = View(xv.name, buf.shape, buf.strides, sympy.Integer(0))
            step.b = View(wv.name, wv.type.shape, row_major(wv.type.shape), sympy.Integer(0))
            step.bias = bv.name if bv is not None else None
            step.conv = tuple(node.attrs[a] for a in ("padding", "stride", "dilation", "groups"))
            return self.epilogue(step, k, anchor, epi)
        red = _contraction(te.body)
        ((r, extent),) = red.axes
        x, y = (operand(a) for a in red.body.args)
        ax = te.axes
        plain_weight = (  # W[n, k] itself, not a view of a larger constant
            y.tensor in const_names
            and tuple(y.index) == (ax[-1], r)
            and tuple(self.buffers[y.tensor].shape) == tuple(node.inputs[1].type.shape)
        )
        if node.op == "linear" and plain_weight and (node.inputs[2] is None or node.inputs[2] in consts):
            self.pending.append((step, "a", x, ax[:-1] + (r,), te.shape[:-1] + (extent,)))
            step.weight = y.tensor
            step.bias = node.inputs[2].name if node.inputs[2] is not None else None
        else:  # matmul, or a linear whose weight is computed: two strided operands (y read as [K, N])
            step.op = "matmul"
            self.pending.append((step, "a", x, ax[:-2] + (ax[-2], r), te.shape[:-2] + (te.shape[-2], extent)))
            self.pending.append((step, "b", y, ax[:-2] + (r, ax[-1]), te.shape[:-2] + (extent, te.shape[-1])))
            if node.op == "linear" and node.inputs[2] is not None:
                step.bias = node.inputs[2].name
        return self.epilogue(step, k, anchor, epi)

    def epilogue(self, step: GemmStep, k: Kernel, anchor: str, epi: list[str]) -> GemmStep:
        """One activation the library applies as a post-op, or a native kernel over the output."""
        if step.op in ("linear", "conv2d") and len(epi) == 1 and not self.materialised(anchor, k):
            e = self.items[epi[0]]
            b = e.body
            if (
                isinstance(b, Call)
                and b.fn in POSTOPS
                and len(b.args) == 1
                and isinstance(b.args[0], Load)
                and b.args[0].tensor == anchor
                and same_element(b.args[0], self.items[anchor].shape, e)
                and dict(b.params).get("approximate", "none") in ("none", "tanh")
            ):
                step.postop = (POSTOPS[b.fn], dict(b.params).get("approximate", "none") if b.fn == "gelu" else "")
                step.out = e.name
                self.temp(e.name)
                return step
        self.temp(anchor)
        if epi:
            step.epilogue = self.native_step(k, "epilogue", epi)
            step.epilogue.name = k.name + "_epilogue"
        return step

    # -- layouts ------------------------------------------------------------------------
    def assign_layouts(self) -> None:
        """Resolve every GEMM operand to a strided view of a buffer; reorder a temp
        buffer's dims when that makes its GEMM reads strided; otherwise insert a copy."""
        producer_op = {}
        for s in self.steps:
            if isinstance(s, GemmStep):
                producer_op[s.anchor] = s.op
        reads: dict[str, list] = {}
        for _, _, load, variables, sizes in self.pending:
            reads.setdefault(load.tensor, []).append((load.index, variables, sizes))
        for name, rs in reads.items():
            buf = self.buffers.get(name)
            if buf is None or all(strided_view(name, i, buf.strides, vs, sz) for i, vs, sz in rs):
                continue
            movable = buf.kind == "temp" and producer_op.get(name) != "linear" and name in self.items
            order = reorder_for(buf.shape, rs) if movable and not isinstance(self.items[name], Opaque) else None
            if order is not None and name not in self.prog.outputs:
                buf.strides = row_major(buf.shape, order)
                self.notes.append(f"{name} is stored in dim order {order} so a GEMM reads it as a strided view")
        for s, attr, load, variables, sizes in self.pending:
            view = strided_view(load.tensor, load.index, self.buffers[load.tensor].strides, variables, sizes)
            setattr(s, attr, view if view is not None else self.copy_for(s, attr, load, variables, sizes))

    def copy_for(self, s: GemmStep, operand: str, load: Load, variables: tuple, sizes: tuple) -> View:
        name = f"{load.tensor}_for_{s.anchor}"
        step_name = f"{s.name}_copy"
        if name in self.items:  # both operands copy the same tensor (x @ x^T): one copy each
            name, step_name = f"{name}_{operand}", f"{step_name}_{operand}"
        elif any(st.name == step_name for st in self.steps):  # both operands copy, each its own tensor
            step_name = f"{step_name}_{operand}"
        axes = tuple(axis(i) for i in range(len(sizes)))
        body = substitute(load, dict(zip(variables, axes)))
        te = TE(name, tuple(sizes), self.buffers[load.tensor].dtype, axes, body, f"copy for {s.anchor}")
        self.items[name] = te
        self.temp(name)
        self.steps.insert(self.steps.index(s), NativeStep(step_name, "copy", [te], [name], self.inline))
        self.notes.append(f"{load.tensor} is copied to {name}: the library GEMM of {s.anchor} cannot read it as a view")
        return View(name, tuple(sizes), row_major(tuple(sizes)), sympy.Integer(0))


def build(prog: TEProgram, analysis: Analysis, fp: Plan) -> Schedule:
    return _Builder(prog, analysis, fp).run()
