"""`explain`: what symfuse knows about a compiled model, in words.

Shows the graph with symbolic shapes, the classes of equal dims and why each member
joined, the classes of equal element counts, the symbols' ranges and divisibility, the
checks made on every call, and how the program runs.
"""

from __future__ import annotations

import math
from collections import Counter

from symfuse.ir.dims import fmt
from symfuse.ir.graph import Graph, print_graph
from symfuse.shape.store import ShapeStore


def explain(
    graph: Graph,
    store: ShapeStore,
    *,
    backend: str,
    notes: list[str] = (),
    with_graph: bool = True,
    with_te: bool = False,
) -> str:
    out = [f"symfuse: {graph.name}", f"  backend: {backend}"]
    out += [f"  note: {n}" for n in notes]
    ops = Counter(n.op for n in graph.nodes)
    out.append(f"  {len(graph.nodes)} ops ({', '.join(f'{k} x{v}' for k, v in ops.most_common())})")
    out.append(f"  {len(graph.constants)} constants, {sum(t.numel() for t in graph.constants.values()):,} elements")

    out.append("\nsymbols:")
    for name, info in store.symbols.items():
        hi = "inf" if math.isinf(info.hi) else int(info.hi)
        why = f"  <- {info.range_origin}" if info.range_origin else ""
        out.append(f"  {name} in [{info.lo}, {hi}] bound by {', '.join(info.bound_at) or '-'}{why}")

    out.append("\nequal dims (class representative: members, and why they joined):")
    classes = store.dim_classes()
    if not classes:
        out.append("  (none beyond identical expressions)")
    for rep, members, origins in classes:
        out.append(f"  {fmt(rep)}: {', '.join(fmt(m) for m in members)}")
        for m, o in zip(members[1:], origins):
            out.append(f"      {fmt(m)} == {fmt(rep)}  <- {o}")

    out.append("\nequal element counts (product class: values):")
    by_class: dict = {}
    for v in graph.values():
        if v in graph.constants:
            continue
        by_class.setdefault(store.numel_class(v.type.shape), []).append(v.name)
    for cls, names in sorted(by_class.items(), key=lambda kv: -len(kv[1])):
        if len(names) > 1 and not cls.is_Integer:
            shown = ", ".join("%" + n for n in names[:8]) + (f", ... ({len(names)} values)" if len(names) > 8 else "")
            out.append(f"  {fmt(cls)}: {shown}")

    checks = store.checks()
    out.append(f"\nchecked on every call ({len(checks)} facts beyond input ranks, dtypes and static dims):")
    for f in checks:
        out.append(f"  {f.text()}  <- {f.origin}")
    out += _te_section(graph, store, with_te)
    if with_graph:
        out.append("\ngraph:")
        out.append(print_graph(graph, with_constants=False))
    return "\n".join(out)


def _te_section(graph: Graph, store: ShapeStore, with_program: bool) -> list[str]:
    from symfuse.fusion.plan import plan
    from symfuse.te.analysis import analyse
    from symfuse.te.ir import Opaque
    from symfuse.te.lower import lower

    prog = lower(graph)
    analysis = analyse(prog)
    out = ["\ntensor expressions (layout ops composed into loads):", "  " + analysis.summary()]
    opaque = Counter(t.op for t in prog.items if isinstance(t, Opaque))
    if opaque:
        out.append("  no TE lowering yet, run through torch: " + ", ".join(f"{k} x{v}" for k, v in opaque.items()))
    if with_program:
        out += ["  " + line for line in str(prog).splitlines()]
    fp = plan(prog, analysis, store)
    kinds = Counter(k.kind for k in fp.kernels)
    out.append(
        f"\nfusion plan ({len(fp.kernels)} kernels: "
        + ", ".join(f"{v} {k}" for k, v in kinds.items())
        + f"; {len(fp.inlined)} generators inlined). Not executed yet: the backend above runs op by op."
    )
    out += [f"  {k}" for k in fp.kernels]
    refused = fp.refused()
    out.append(f"refused fusions ({len(refused)}):")
    out += [f"  {d.producer} -> {d.consumer}: {d.reason}" for d in refused]
    return out
