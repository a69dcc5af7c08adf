"""Canonical linear layers: `matmul(x, W)` with a constant 2-D `W` becomes `linear(x, W^T)`,
and an add of a constant `[N]` bias right after a bias-free linear folds into it.

GPT-2's Conv1D arrives as `addmm`, which the frontend splits into matmul + add; in this
form it gets the same library GEMM (weights reordered once, bias inside) as `nn.Linear`.
The transposes happen once, at compile time.
"""

from __future__ import annotations

from symfuse.ir.graph import Graph, Node, Value
from symfuse.passes.horizontal import prune_constants
from symfuse.passes.rewrite import Rewriter
from symfuse.shape.store import ShapeStore


def users(graph: Graph) -> dict[Value, int]:
    count: dict[Value, int] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None:
                count[v] = count.get(v, 0) + 1
    for v in graph.outputs:
        count[v] = count.get(v, 0) + 1
    return count


def canonical_linears(graph: Graph, store: ShapeStore) -> Graph:
    count = users(graph)
    consts = graph.constants
    producer = graph.producers()

    def weight_of(n: Node) -> bool:
        if n.op != "matmul":
            return False
        x, w = n.inputs
        return w in consts and w.type.rank == 2 and x.type.rank >= 2 and x.type.dtype == w.type.dtype

    def bias_of(n: Node):
        """The constant bias of `add(matmul-or-linear, bias)`, and the GEMM's node."""
        if n.op != "add":
            return None
        for a, b in (n.inputs, n.inputs[::-1]):
            p = producer.get(a)
            if p is None or count.get(a) != 1 or b not in consts or b.type.rank != 1:
                continue
            if (weight_of(p) or (p.op == "linear" and p.inputs[2] is None)) and a.type.dtype == b.type.dtype:
                if b.type.shape[0] == a.type.shape[-1]:
                    return p, b
        return None

    skip = {fb[0] for fb in map(bias_of, graph.nodes) if fb is not None}  # GEMMs whose add takes them over

    def rule(rw: Rewriter, n: Node, ins):
        if n in skip:
            return (ins[0],)  # never read: its one user, the add, becomes the linear
        fb = bias_of(n)
        if fb is not None:
            p, b = fb
            x = rw.env[p.inputs[0]]
            if p.op == "matmul":
                w = rw.b.constant(p.inputs[1].name + "_t", consts[p.inputs[1]].t().contiguous())
            else:
                w = rw.env[p.inputs[1]]
            return (rw.emit("linear", [x, w, rw.env[b]], p.loc, p.out.name),)
        if weight_of(n):
            w = rw.b.constant(n.inputs[1].name + "_t", consts[n.inputs[1]].t().contiguous())
            return (rw.emit("linear", [ins[0], w, None], n.loc, n.out.name),)
        return None

    return prune_constants(Rewriter(graph, store).run(rule))
