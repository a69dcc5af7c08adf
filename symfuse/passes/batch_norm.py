"""Inference batch norm after a convolution folds into the convolution's weights and bias.

`batch_norm(conv2d(x, W, b))` with constant statistics and affine parameters is
`conv2d(x, W * s, (b - mean) * s + beta)` with `s = gamma / sqrt(var + eps)` per output
channel: the same function with one op fewer, computed once at compile time.
"""

from __future__ import annotations

import torch

from symfuse.ir.graph import Graph, Node
from symfuse.passes.horizontal import prune_constants
from symfuse.passes.linear import users
from symfuse.passes.rewrite import Rewriter
from symfuse.shape.store import ShapeStore


def fold_batch_norm(graph: Graph, store: ShapeStore) -> Graph:
    consts = graph.constants
    producer = graph.producers()
    count = users(graph)

    def foldable(n: Node) -> Node | None:
        if n.op != "batch_norm":
            return None
        conv = producer.get(n.inputs[0])
        if conv is None or conv.op != "conv2d" or count.get(conv.out) != 1:
            return None
        params = [v for v in (*n.inputs[1:], *conv.inputs[1:]) if v is not None]
        return conv if all(v in consts for v in params) else None

    folded = {c for c in map(foldable, graph.nodes) if c is not None}

    def rule(rw: Rewriter, n: Node, ins):
        if n in folded:
            return (ins[0],)  # never read: its one user, the batch norm, becomes the convolution
        conv = foldable(n)
        if conv is None:
            return None
        _, gamma, beta, mean, var = n.inputs
        w = consts[conv.inputs[1]]
        c = w.shape[0]
        scale = torch.rsqrt(consts[var] + n.attrs["eps"])
        if gamma is not None:
            scale = scale * consts[gamma]
        bias = consts[conv.inputs[2]] if conv.inputs[2] is not None else torch.zeros(c, dtype=w.dtype)
        bias = (bias - consts[mean]) * scale + (consts[beta] if beta is not None else 0)
        wv = rw.b.constant(conv.inputs[1].name + "_bn", (w * scale.view(c, 1, 1, 1)).contiguous())
        bv = rw.b.constant(conv.inputs[1].name + "_bn_bias", bias.contiguous())
        x = rw.env[conv.inputs[0]]
        return (rw.emit("conv2d", [x, wv, bv], conv.loc, conv.out.name, **dict(conv.attrs)),)

    return prune_constants(Rewriter(graph, store).run(rule))
