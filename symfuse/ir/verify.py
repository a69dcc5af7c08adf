"""Structural verification of a graph: the SSA rules every later stage relies on.

Checks that value names are unique, that every node input is a graph input, a constant or
an output of an earlier node, that outputs are defined, and that no value is produced
twice. Type consistency (each node's types are what its op's rules give) is checked by
`symfuse.shape.infer.reinfer`, which needs the op registry.
"""

from __future__ import annotations

from symfuse.ir.graph import Graph


class VerifyError(AssertionError):
    pass


def verify(graph: Graph) -> None:
    problems: list[str] = []
    defined = set()
    names: dict[str, str] = {}

    def define(v, where: str) -> None:
        if v in defined:
            problems.append(f"%{v.name} is defined twice ({where})")
        if v.name in names:
            problems.append(f"name %{v.name} is used by two values ({names[v.name]} and {where})")
        defined.add(v)
        names[v.name] = where

    for v in graph.inputs:
        define(v, "input")
    for v in graph.constants:
        define(v, "constant")
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is not None and v not in defined:
                problems.append(f"node {i} ({n.op} -> %{n.outputs[0].name}) uses %{v.name} before it is defined")
        if not n.outputs:
            problems.append(f"node {i} ({n.op}) has no outputs")
        for v in n.outputs:
            define(v, f"node {i} ({n.op})")
    for v in graph.outputs:
        if v not in defined:
            problems.append(f"output %{v.name} is not defined")
    if problems:
        raise VerifyError(f"graph {graph.name} is malformed:\n  " + "\n  ".join(problems))
