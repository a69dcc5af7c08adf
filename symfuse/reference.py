"""The reference executor: a graph run op by op through the registry's torch references.

It is the semantic ground truth for every later stage (passes, fusion, generated code are
all tested against it), so it checks as it goes: each op's result must have exactly the
shape and dtype its type promises under the current binding. A mismatch is a bug in a
shape rule and raises `AssertionError` naming the node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sympy
import torch

from symfuse import ops
from symfuse.ir.dims import to_python
from symfuse.ir.graph import Graph, Node, Value


def _compile_dims(exprs: list[sympy.Expr]) -> Callable[[dict[str, int]], list[int]]:
    names = {s: f"b[{s.name!r}]" for e in exprs for s in e.free_symbols}
    src = "lambda b: [" + ", ".join(to_python(e, names) for e in exprs) + "]"
    return eval(src, {"min": min, "max": max})  # noqa: S307


def attr_evaluator(attrs: dict[str, Any]) -> Callable[[dict[str, int]], dict[str, Any]]:
    exprs: list[sympy.Expr] = []

    def collect(v):
        if isinstance(v, sympy.Expr):
            exprs.append(v)
        elif isinstance(v, tuple):
            for x in v:
                collect(x)

    for v in attrs.values():
        collect(v)
    if not exprs:
        return lambda b: attrs
    ev = _compile_dims(exprs)

    def evaluate(b: dict[str, int]) -> dict[str, Any]:
        it = iter(ev(b))

        def put(v):
            if isinstance(v, sympy.Expr):
                return next(it)
            if isinstance(v, tuple):
                return tuple(put(x) for x in v)
            return v

        return {k: put(v) for k, v in attrs.items()}

    return evaluate


class ReferenceExecutor:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._steps = []
        # free each intermediate after its last use, as eager PyTorch does: keeping them
        # all alive makes every call allocate fresh memory
        last_use: dict[Value, int] = {}
        for i, n in enumerate(graph.nodes):
            for v in n.inputs:
                if v is not None:
                    last_use[v] = i
        keep = set(graph.outputs) | set(graph.constants) | set(graph.inputs)
        dead_after: dict[int, list[Value]] = {}
        for v, i in last_use.items():
            if v not in keep:
                dead_after.setdefault(i, []).append(v)
        for i, n in enumerate(graph.nodes):
            opdef = ops.get(n.op)
            shapes = _compile_dims([d for v in n.outputs for d in v.type.shape])
            unused = [v for v in n.outputs if v not in last_use and v not in keep]
            self._steps.append((n, opdef, attr_evaluator(dict(n.attrs)), shapes, dead_after.get(i, []) + unused))

    def run(self, binding: dict[str, int], inputs: list[torch.Tensor], on_node=None) -> list[torch.Tensor]:
        """Run the graph; `on_node(node, inputs, outputs, seconds)` is called after each op."""
        env: dict[Value, torch.Tensor] = dict(self.graph.constants)
        env.update(zip(self.graph.inputs, inputs))
        for n, opdef, attrs, shapes, dead in self._steps:
            ins = [env[v] if v is not None else None for v in n.inputs]
            t0 = time.perf_counter()
            out = opdef.ref(*opdef.pack(ins), **attrs(binding))
            seconds = time.perf_counter() - t0
            outs = out if isinstance(out, tuple) else (out,)
            if on_node is not None:
                on_node(n, [t for t in ins if t is not None], outs, seconds)
            self._check(n, outs, shapes(binding))
            env.update(zip(n.outputs, outs))
            for v in dead:
                del env[v]
        return [env[v] for v in self.graph.outputs]

    @staticmethod
    def _check(n: Node, outs: tuple, dims: list[int]) -> None:
        it = iter(dims)
        for v, t in zip(n.outputs, outs):
            want = [next(it) for _ in v.type.shape]
            if list(t.shape) != want or t.dtype != v.type.dtype.torch:
                raise AssertionError(
                    f"shape rule of {n.op} is wrong for %{v.name} ({n.loc}): type {v.type} means "
                    f"{want} {v.type.dtype}, the reference gave {list(t.shape)} {t.dtype}"
                )
