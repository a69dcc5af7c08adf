"""Lowering a graph to a TE program.

Each node's registry entry may carry a `lower` rule: given accessors for its inputs (a
function from an index tuple to the scalar at that index) it returns the accessor of its
output. Layout ops (injective, broadcast) stay accessors, so their index maps compose into
the loads of whatever reads them; every other op becomes a `TE`. Ops without a rule, and
ops with several outputs, become `Opaque` and run through their torch reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from symfuse import ops
from symfuse.ir.dims import Dim
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Graph, Node, Value
from symfuse.te.ir import TE, Load, Opaque, Scalar, axis, fmt_te

Accessor = Callable[[tuple], Scalar]


@dataclass
class TEProgram:
    graph: Graph
    items: list[TE | Opaque] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    nodes: dict[str, Node] = field(default_factory=dict)  # opaque item name -> its node

    def __str__(self) -> str:
        return "\n".join(fmt_te(t) for t in self.items) + "\nreturn " + ", ".join(self.outputs)


class Lowerer:
    def __init__(self, graph: Graph) -> None:
        self.program = TEProgram(graph)
        self.access: dict[Value, Accessor] = {}
        self.node: Node | None = None
        self._names = {v.name for v in graph.values()}
        self.materialized = {v.name for v in list(graph.inputs) + list(graph.constants)}

    def load(self, name: str) -> Accessor:
        return lambda idx: Load(name, tuple(idx))

    def materialize(self, v: Value) -> Accessor:
        """`v` as a real tensor (a library call reads it whole): its composed layout, if any,
        becomes a TE of its own."""
        if v.name not in self.materialized:
            self.access[v] = self.te(v.name, v.type.shape, v.type.dtype, self.access[v])
        return self.access[v]

    def te(self, name: str, shape: tuple[Dim, ...], dtype: DType, body: Accessor, *, aux: bool = False) -> Accessor:
        """Materialise `body` as a TE and return its accessor. An auxiliary TE (a softmax's
        row maximum) gets a name of its own next to the node's."""
        if aux:
            base, i = name, 1
            while name in self._names:
                name, i = f"{base}_{i}", i + 1
            self._names.add(name)
        self.materialized.add(name)
        axes = tuple(axis(k) for k in range(len(shape)))
        origin = f"{self.node.op} %{self.node.outputs[0].name}" if self.node else ""
        self.program.items.append(TE(name, tuple(shape), dtype, axes, body(axes), origin))
        return self.load(name)


def lower(graph: Graph) -> TEProgram:
    lw = Lowerer(graph)
    for v in list(graph.inputs) + list(graph.constants):
        lw.access[v] = lw.load(v.name)
    for n in graph.nodes:
        lw.node = n
        opdef = ops.get(n.op)
        if opdef.lower is None or len(n.outputs) > 1:
            for v in n.inputs:  # an opaque op reads real tensors: materialise composed layouts
                if v is not None:
                    lw.materialize(v)
            lw.program.items.append(Opaque(n.outputs[0].name, n.op, n.loc))
            lw.materialized.update(v.name for v in n.outputs)
            lw.program.nodes[n.outputs[0].name] = n
            for v in n.outputs:
                lw.access[v] = lw.load(v.name)
            continue
        ins = opdef.pack([lw.access[v] if v is not None else None for v in n.inputs])
        acc = opdef.lower(lw, n, *ins, **dict(n.attrs))
        out = n.out
        if opdef.kind in (ops.Kind.INJECTIVE, ops.Kind.BROADCAST):
            lw.access[out] = acc
        else:
            lw.access[out] = lw.te(out.name, out.type.shape, out.type.dtype, acc)
    for v in graph.outputs:
        if v.name not in lw.materialized:  # a layout op's output: materialise it
            lw.te(v.name, v.type.shape, v.type.dtype, lw.access[v])
        lw.program.outputs.append(v.name)
    return lw.program


__all__ = ["Accessor", "Lowerer", "TEProgram", "lower"]
