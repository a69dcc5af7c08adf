"""Semantics-preserving vertical transformations (Souffle) for graphs exporters wrote.

- `hoist_scales`: `matmul(a * c1, b * c2)` with scalar constants becomes
  `matmul(a, b) * (c1 * c2)`. ONNX exports of attention scale q and k by sqrt(scale)
  each; hoisted, the scale is one multiply on the scores inside the softmax's row kernel,
  and two element-wise passes over q and k disappear.
- `fold_layout_chains`: `reshape(permute(reshape(x)))` that merges dims, moves the merged
  dims as wholes and splits them back is one `permute` of `x` (`[B, H, S, D] -> [B*H, S,
  D] -> [B*H, D, S] -> [B, H, D, S]` is `permute(x, (0, 1, 3, 2))`), a strided view a GEMM
  reads in place instead of a copy.
- `recognise_gelu_tanh`: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` written out in
  element-wise ops (GPT-2's `gelu_new`) is `gelu(x, approximate="tanh")`: one op that the
  GEMM before it takes as its epilogue, instead of a pass of eight ops over its output.
"""

from __future__ import annotations

import math

from symfuse.ir.dims import Dim
from symfuse.ir.graph import Graph, Node, Value
from symfuse.passes.linear import users
from symfuse.passes.rewrite import Rewriter
from symfuse.shape.store import ShapeStore


def _scalar_const(v: Value, producer: dict[Value, Node]) -> float | None:
    n = producer.get(v)
    if n is None or n.op != "full" or v.type.rank != 0 or not isinstance(n.attrs["value"], (int, float)):
        return None
    return float(n.attrs["value"])


def _with_constant(v: Value | None, producer: dict[Value, Node], op: str) -> list[tuple[Value, float]]:
    """Every (x, c) with `v = x op c` (either order) and c a scalar constant."""
    n = producer.get(v) if v is not None else None
    if n is None or n.op != op:
        return []
    a, b = n.inputs
    return [(x, k) for x, c in ((a, b), (b, a)) if (k := _scalar_const(c, producer)) is not None]


def hoist_scales(graph: Graph, store: ShapeStore) -> Graph:
    producer = graph.producers()
    count = users(graph)

    def scaled(v: Value) -> tuple[Value, float] | None:
        """`v = x * c` (either order) with a scalar constant c and v read only here."""
        if count.get(v) != 1 or not v.type.dtype.is_float:
            return None
        same = (xk for xk in _with_constant(v, producer, "mul") if xk[0].type == v.type)
        return next(same, None)

    def rule(rw: Rewriter, n: Node, ins):
        if n.op != "matmul":
            return None
        sa, sb = scaled(n.inputs[0]), scaled(n.inputs[1])
        if sa is None and sb is None:
            return None
        a = rw.env[sa[0]] if sa else ins[0]
        b = rw.env[sb[0]] if sb else ins[1]
        k = (sa[1] if sa else 1.0) * (sb[1] if sb else 1.0)
        y = rw.emit("matmul", [a, b], n.loc, n.out.name + "_unscaled")
        return (rw.emit("mul", [y, rw.b.scalar(k, y.type.dtype, loc=n.loc)], n.loc, n.out.name),)

    return Rewriter(graph, store).run(rule)


def _groups(store: ShapeStore, fine: tuple[Dim, ...], coarse: tuple[Dim, ...]) -> list[list[int]] | None:
    """For each dim of `coarse`, the run of consecutive `fine` dims whose product it is
    (unit dims of `fine` join the run before them); None if the reshape is not such a merge."""
    out: list[list[int]] = []
    i = 0
    for c in coarse:
        group, prod = [], store.canon(1)
        while i < len(fine) and (not group or store.canon(prod) != store.canon(c)):
            group.append(i)
            prod = prod * fine[i]
            i += 1
        if store.canon(prod) != store.canon(c):
            return None
        while i < len(fine) and store.canon(fine[i]) == 1 and store.canon(c) != 1:
            group.append(i)
            i += 1
        out.append(group)
    return out if i == len(fine) else None


def fold_layout_chains(graph: Graph, store: ShapeStore) -> Graph:
    producer = graph.producers()
    count = users(graph)

    def chain(n: Node) -> tuple[Value, tuple[int, ...]] | None:
        if n.op != "reshape":
            return None
        p = producer.get(n.inputs[0])
        if p is None or p.op != "permute" or count.get(p.out) != 1:
            return None
        r = producer.get(p.inputs[0])
        if r is None or r.op != "reshape" or count.get(r.out) != 1:
            return None
        x = r.inputs[0]
        merged = _groups(store, x.type.shape, r.out.type.shape)  # x dims per merged dim
        split = _groups(store, n.out.type.shape, p.out.type.shape)  # output dims per permuted dim
        if merged is None or split is None:
            return None
        perm = p.attrs["dims"]
        order: list[int] = []
        for i, src in enumerate(perm):
            src = src % len(perm)
            want = [store.canon(x.type.shape[j]) for j in merged[src]]
            got = [store.canon(n.out.type.shape[j]) for j in split[i]]
            if want != got:
                return None
            order += merged[src]
        return x, tuple(order)

    def rule(rw: Rewriter, n: Node, ins):
        found = chain(n)
        if found is None:
            return None
        x, order = found
        if order == tuple(range(len(order))):
            return (rw.env[x],)
        return (rw.emit("permute", [rw.env[x]], n.loc, n.out.name, dims=order),)

    return Rewriter(graph, store).run(rule)


def recognise_gelu_tanh(graph: Graph, store: ShapeStore) -> Graph:
    producer = graph.producers()

    def op(v: Value | None, name: str) -> Node | None:
        n = producer.get(v) if v is not None else None
        return n if n is not None and n.op == name else None

    def times(v: Value | None, c: float) -> Value | None:
        """x when `v = x * c` (either order), c within 1e-6 relative."""
        return next((x for x, k in _with_constant(v, producer, "mul") if math.isclose(k, c, rel_tol=1e-6)), None)

    def plus_one(v: Value) -> Value | None:
        """t when `v = t + 1` (either order)."""
        return next((x for x, k in _with_constant(v, producer, "add") if k == 1.0), None)

    def gelu_input(n: Node) -> Value | None:
        """x when `n` is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in any order."""
        for half, rest in (n.inputs, n.inputs[::-1]):
            x = times(half, 0.5)
            t = op(plus_one(rest), "tanh")
            inner = times(t.inputs[0], math.sqrt(2 / math.pi)) if t is not None and x is not None else None
            s = op(inner, "add")
            if s is None:
                continue
            for a, b in (s.inputs, s.inputs[::-1]):
                cube = op(times(b, 0.044715), "pow_scalar")
                if a is x and cube is not None and cube.inputs[0] is x and cube.attrs["exponent"] == 3:
                    return x
        return None

    def rule(rw: Rewriter, n: Node, ins):
        x = gelu_input(n) if n.op == "mul" and n.out.type.dtype.is_float else None
        if x is None:
            return None
        return (rw.emit("gelu", [rw.env[x]], n.loc, n.out.name, approximate="tanh"),)

    return Rewriter(graph, store).run(rule)


__all__ = ["fold_layout_chains", "hoist_scales", "recognise_gelu_tanh"]
