"""The rewriting driver: copy a graph node by node, letting a rule replace some nodes."""

from __future__ import annotations

from collections.abc import Callable

from symfuse.ir.graph import Graph, Node, Value
from symfuse.shape.infer import GraphBuilder
from symfuse.shape.store import ShapeStore


class Rewriter:
    """`rule(rw, node, inputs)` returns the new outputs for `node`, or None to copy it."""

    def __init__(self, graph: Graph, store: ShapeStore) -> None:
        self.src = graph
        self.b = GraphBuilder(graph.name, store)
        self.env: dict[Value, Value] = {}

    def emit(self, op: str, inputs, loc: str = "", name: str = "", **attrs) -> Value:
        return self.b.add(op, inputs, attrs, loc=loc, name=name)[0]

    def run(self, rule: Callable[[Rewriter, Node, list], tuple[Value, ...] | None]) -> Graph:
        g = self.src
        for v in g.inputs:
            self.env[v] = self.b.input(v.name, v.type.shape, v.type.dtype)
        for v, t in g.constants.items():
            self.env[v] = self.b.constant(v.name, t)
        for n in g.nodes:
            ins = [self.env[v] if v is not None else None for v in n.inputs]
            outs = rule(self, n, ins)
            if outs is None:
                outs = self.b.add(n.op, ins, dict(n.attrs), loc=n.loc, name=n.outputs[0].name)
            self.env.update(zip(n.outputs, outs))
        return self.b.finish([self.env[v] for v in g.outputs])
