"""Horizontal merging (Souffle): independent linear layers that read the same input
become one GEMM over concatenated weights, followed by slices of its output.

BERT's query, key and value projections become one [K, 3N] GEMM; the slices are layout
ops, so they cost nothing once composed into the loads of the attention that reads them.
Only layers whose weights (and biases) are constants qualify; the concatenation happens
once, at compile time.
"""

from __future__ import annotations

import torch

from symfuse.ir.graph import Graph, Node, Value
from symfuse.passes.rewrite import Rewriter
from symfuse.shape.store import ShapeStore


def _groups(graph: Graph) -> dict[Value, list[Node]]:
    by_input: dict[Value, list[Node]] = {}
    for n in graph.nodes:
        if n.op != "linear":
            continue
        x, w, b = n.inputs
        if w not in graph.constants or (b is not None and b not in graph.constants):
            continue
        by_input.setdefault(x, []).append(n)
    out = {}
    for x, ns in by_input.items():
        same = [
            n
            for n in ns
            if (n.inputs[2] is None) == (ns[0].inputs[2] is None) and n.out.type.dtype == ns[0].out.type.dtype
        ]
        if len(same) > 1:
            out[x] = same
    return out


def merge_parallel_linears(graph: Graph, store: ShapeStore) -> Graph:
    groups = _groups(graph)
    first = {ns[0]: ns for ns in groups.values()}
    member = {n for ns in groups.values() for n in ns}
    done: dict[Node, Value] = {}

    def rule(rw: Rewriter, n: Node, ins):
        if n not in member:
            return None
        if n in first:
            ns = first[n]
            w = torch.cat([graph.constants[m.inputs[1]] for m in ns])
            wv = rw.b.constant("_".join(m.inputs[1].name for m in ns[:1]) + "_merged", w)
            bv = None
            if ns[0].inputs[2] is not None:
                bv = rw.b.constant(
                    ns[0].inputs[2].name + "_merged", torch.cat([graph.constants[m.inputs[2]] for m in ns])
                )
            names = "_".join(m.out.name for m in ns)
            merged = rw.emit("linear", [ins[0], wv, bv], n.loc, f"{names}")
            start = 0
            for m in ns:
                width = int(graph.constants[m.inputs[1]].shape[0])
                done[m] = rw.emit("slice", [merged], m.loc, m.out.name, dim=-1, start=start, end=start + width, step=1)
                start += width
        return (done[n],)

    return prune_constants(Rewriter(graph, store).run(rule))


def prune_constants(graph: Graph) -> Graph:
    used = {v for n in graph.nodes for v in n.inputs if v is not None} | set(graph.outputs)
    graph.constants = {v: t for v, t in graph.constants.items() if v in used}
    return graph
