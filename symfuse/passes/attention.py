"""Attention as tensor algebra: `sdpa` becomes matmul, scale, mask, safe softmax, matmul.

Whole-model analysis and fusion (Souffle) need the attention scores as a tensor of their
own: `[B, H, S, S]` with the same `S` on both sides. A boolean mask becomes `where(mask,
scores, -inf)` and a float mask an add, exactly as torch's math attention does.
"""

from __future__ import annotations

import math

from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Graph
from symfuse.passes.rewrite import Rewriter
from symfuse.shape.store import ShapeStore


def _sdpa(rw: Rewriter, n, ins):
    if n.op != "sdpa":
        return None
    q, k, v, mask = ins
    loc, name = n.loc, n.outputs[0].name
    rank = k.type.rank
    perm = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    scale = n.attrs["scale"]
    if scale is None:
        e = q.type.shape[-1]
        if not e.is_Integer:
            return None  # a dynamic head dim keeps the fused op
        scale = 1.0 / math.sqrt(int(e))
    kt = rw.emit("permute", [k], loc, f"{name}_kt", dims=perm)
    scores = rw.emit("matmul", [q, kt], loc, f"{name}_scores")
    scores = rw.emit("mul", [scores, rw.b.scalar(float(scale), loc=loc)], loc, f"{name}_scaled")
    if n.attrs["is_causal"]:
        L, S = scores.type.shape[-2], scores.type.shape[-1]
        rows = rw.emit(
            "reshape", [rw.emit("arange", [], loc, start=0, end=L, step=1, dtype=DType.int64)], loc, shape=(L, 1)
        )
        cols = rw.emit("arange", [], loc, start=0, end=S, step=1, dtype=DType.int64)
        causal = rw.emit("ge", [rows, cols], loc, f"{name}_causal")
        mask = causal if mask is None else rw.emit("logical_and", [mask, causal], loc)
    if mask is not None:
        if mask.type.dtype == DType.bool:
            scores = rw.emit("where", [mask, scores, rw.b.scalar(-math.inf, loc=loc)], loc, f"{name}_masked")
        else:
            scores = rw.emit("add", [scores, mask], loc, f"{name}_masked")
    # as torch's attention does, a query that may attend to nothing gets zeros, not NaN
    probs = rw.emit("safe_softmax", [scores], loc, f"{name}_probs", dim=-1)
    return (rw.emit("matmul", [probs, v], loc, name),)


def decompose_attention(graph: Graph, store: ShapeStore) -> Graph:
    return Rewriter(graph, store).run(_sdpa)
