"""Building a graph with shape inference: every node's type comes from its op's rules.

`GraphBuilder` is how the frontends (and later the passes) create nodes: it checks the
op's schema, runs its dtype and shape rules against the shared `ShapeStore`, tracks value
bounds of integer tensors, and at the end rewrites every type into the store's canonical
form, so equal dims print the same and compare identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from symfuse import ops
from symfuse.ir.dims import Dim, dim
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Graph, Node, Value, identifier
from symfuse.ir.types import TensorType
from symfuse.shape.context import ShapeContext
from symfuse.shape.store import ShapeStore


class GraphBuilder:
    def __init__(self, name: str, store: ShapeStore | None = None) -> None:
        self.graph = Graph(name)
        self.store = store or ShapeStore()
        self.bounds: dict[Value, tuple[Dim, Dim]] = {}
        self._names: set[str] = set()
        self._scalars: dict[tuple, Value] = {}

    def _fresh(self, base: str, user: bool = False) -> str:
        """A new value name from `base`; a model input (`user`) keeps its name here (its
        users call it by that name) and becomes an identifier when the graph is finished."""
        base = (base or "v") if user else identifier(base)
        name, i = base, 1
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return name

    def input(self, name: str, shape: Sequence[Any], dtype: DType) -> Value:
        v = Value(self._fresh(name, user=True), TensorType.of(tuple(shape), dtype))
        self.graph.inputs.append(v)
        return v

    def constant(self, name: str, tensor: torch.Tensor) -> Value:
        v = Value(self._fresh(name), TensorType.of(tuple(tensor.shape), DType.of(tensor.dtype)))
        self.graph.constants[v] = tensor
        if tensor.numel() and not tensor.dtype.is_floating_point and tensor.dtype != torch.bool:
            self.bounds[v] = (dim(int(tensor.min())), dim(int(tensor.max())))
        return v

    def scalar(self, value: Any, dtype: DType | None = None, loc: str = "") -> Value:
        if dtype is None:
            dtype = (
                DType.bool
                if isinstance(value, bool)
                else DType.int64
                if isinstance(value, (int, sympy.Expr))
                else DType.float32
            )
        key = (str(value), dtype)
        if key not in self._scalars:
            self._scalars[key] = self.add(
                "full", [], {"shape": (), "value": value, "dtype": dtype}, loc=loc, name="scalar"
            )[0]
        return self._scalars[key]

    def add(
        self, op: str, inputs: Sequence[Value | None], attrs: dict | None = None, *, loc: str = "", name: str = ""
    ) -> tuple[Value, ...]:
        opdef = ops.get(op)
        attrs = dict(attrs or {})
        opdef.check_schema(len(inputs), attrs)
        types = [
            TensorType(self.store.canon_shape(v.type.shape), v.type.dtype) if v is not None else None for v in inputs
        ]
        out_name = self._fresh(name or op)
        ctx = ShapeContext(self.store, op, out_name, loc)
        packed = opdef.pack(types)
        for i, t in enumerate(packed):
            if t is None and not opdef.optional(i):
                raise TypeError(f"op {op}: input {opdef.inputs[i]} is required")
        ctx.input_bounds = [self.bounds.get(v) if v is not None else None for v in inputs]
        shapes = opdef.shape(ctx, *packed, **attrs)
        dtypes = opdef.dtype(*packed, **attrs)
        shapes = shapes if isinstance(shapes, list) else [shapes]
        dtypes = dtypes if isinstance(dtypes, list) else [dtypes]
        names = [out_name] + [self._fresh(f"{out_name}_{i}") for i in range(1, len(shapes))]
        outputs = tuple(
            Value(n, TensorType.of(self.store.canon_shape(s), dt)) for n, s, dt in zip(names, shapes, dtypes)
        )
        if opdef.bounds is not None and not outputs[0].type.dtype.is_float:
            b = opdef.bounds(ctx, *opdef.pack(ctx.input_bounds), **attrs)
            if b is not None:
                self.bounds[outputs[0]] = (self.store.canon(b[0]), self.store.canon(b[1]))
        self.graph.nodes.append(Node(op, tuple(inputs), attrs, outputs, loc))
        return outputs

    def finish(self, outputs: Sequence[Value]) -> Graph:
        """The graph computing `outputs`: nodes and constants nothing reads are dropped."""
        self.graph.outputs = list(outputs)
        live = set(outputs)
        kept = []
        for n in reversed(self.graph.nodes):
            if any(v in live for v in n.outputs):
                kept.append(n)
                live.update(v for v in n.inputs if v is not None)
        self.graph.nodes = kept[::-1]
        self.graph.constants = {v: t for v, t in self.graph.constants.items() if v in live}
        return canonicalize(self.graph, self.store)


def _canon_attr(store: ShapeStore, v: Any) -> Any:
    if isinstance(v, sympy.Expr):
        return store.canon(v)
    if isinstance(v, tuple):
        return tuple(_canon_attr(store, x) for x in v)
    return v


def canonicalize(graph: Graph, store: ShapeStore) -> Graph:
    """A copy of `graph` whose types and dim attributes are in canonical form, and whose
    inputs are named by identifiers (`identifier`; the capture keeps the names its users
    call them by)."""
    new: dict[Value, Value] = {}
    taken = {v.name for v in graph.values()}
    names = {}
    for v in graph.inputs:
        base = identifier(v.name)
        if base != v.name:
            name, i = base, 1
            while name in taken:
                name, i = f"{base}_{i}", i + 1
            taken.add(name)
            names[v] = name

    def conv(v: Value | None) -> Value | None:
        if v is None:
            return None
        if v not in new:
            new[v] = Value(names.get(v, v.name), TensorType(store.canon_shape(v.type.shape), v.type.dtype))
        return new[v]

    out = Graph(graph.name)
    out.inputs = [conv(v) for v in graph.inputs]
    out.constants = {conv(v): t for v, t in graph.constants.items()}
    for n in graph.nodes:
        attrs = {k: _canon_attr(store, a) for k, a in n.attrs.items()}
        out.nodes.append(Node(n.op, tuple(conv(v) for v in n.inputs), attrs, tuple(conv(v) for v in n.outputs), n.loc))
    out.outputs = [conv(v) for v in graph.outputs]
    return out


def reinfer(graph: Graph, store: ShapeStore) -> list[str]:
    """Re-run every shape rule on `graph` in a fresh store seeded with the same symbols.

    Returns the mismatches between recorded and re-derived types (empty when the graph's
    types are exactly what its ops imply). Used by the verifier and by pass tests.
    """
    fresh = ShapeStore()
    for name, info in store.symbols.items():
        fresh.declare(name, lo=info.lo, hi=info.hi)
    b = GraphBuilder(graph.name, fresh)
    env: dict[Value, Value] = {}
    for v in graph.inputs:
        env[v] = b.input(v.name, v.type.shape, v.type.dtype)
    for v, t in graph.constants.items():
        env[v] = b.constant(v.name, t)
    problems = []
    for n in graph.nodes:
        outs = b.add(n.op, [env[v] if v is not None else None for v in n.inputs], dict(n.attrs), loc=n.loc)
        for old, newv in zip(n.outputs, outs):
            env[old] = newv
    for n in graph.nodes:
        for old in n.outputs:
            got = TensorType(fresh.canon_shape(env[old].type.shape), env[old].type.dtype)
            want = TensorType(fresh.canon_shape(old.type.shape), old.type.dtype)
            if got != want:
                problems.append(f"%{old.name}: recorded {want}, rules give {got}")
    return problems


__all__ = ["GraphBuilder", "canonicalize", "reinfer"]
