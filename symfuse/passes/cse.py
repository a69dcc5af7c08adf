"""Common subexpressions: nodes that apply the same op with the same attributes to the same
inputs compute the same value, so the later ones are dropped and their readers read the
first.

Exported graphs repeat work a model wrote once per layer: Hugging Face's T5 encoder computes
its relative position bias (position buckets through a logarithm, a gather from the bias
table, the padding mask) in every layer's attention, and each copy was a member of that
layer's softmax kernel, recomputed for every score of every head (`symfuse bench --model
t5-encoder-small --profile`: attention). Merged, the bias is computed once, stored, and read by
every layer. Every op symfuse captures is a function of its inputs (dropout and random ops
are refused at capture), so any two such nodes may be merged.
"""

from __future__ import annotations

from typing import Any

from symfuse.ir.graph import Graph, Node, Value
from symfuse.passes.rewrite import Rewriter
from symfuse.shape.store import ShapeStore


def _hashable(x: Any) -> Any:
    """An attribute as a key: containers by content, anything else unhashable by identity."""
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_hashable(i) for i in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted((k, _hashable(v)) for k, v in x.items())))
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return (type(x).__name__, x)  # 1 and 1.0 and True are different attributes


def merge_common_subexpressions(graph: Graph, store: ShapeStore) -> Graph:
    """`graph` with each repeated computation done once. A repeat the model returns is kept:
    merged, two results eager gives as two tensors would come back as one (an in-place
    change to one would show in the other)."""
    seen: dict[tuple, tuple[Value, ...]] = {}
    returned = set(graph.outputs)

    def rule(rw: Rewriter, n: Node, ins):
        key = (n.op, tuple(id(v) if v is not None else None for v in ins), _hashable(dict(n.attrs)))
        if key in seen and not returned.intersection(n.outputs):
            return seen[key]
        outs = rw.b.add(n.op, ins, dict(n.attrs), loc=n.loc, name=n.outputs[0].name)
        seen.setdefault(key, tuple(outs))
        return outs

    return Rewriter(graph, store).run(rule)
