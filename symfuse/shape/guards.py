"""From the shape store to the run-time guard: which facts must be checked, and how."""

from __future__ import annotations

from symfuse.ir.dims import fmt, to_python
from symfuse.ir.graph import Value
from symfuse.runtime.guard import Check, GuardSpec, InputSpec
from symfuse.shape.store import Fact, ShapeStore


def _check(f: Fact) -> Check:
    lhs, rhs = to_python(f.lhs), to_python(f.rhs)
    expr = {
        "eq": f"{lhs} == {rhs}",
        "numel": f"{lhs} == {rhs}",
        "le": f"{lhs} <= {rhs}",
        "divisible": f"{lhs} % {rhs} == 0",
    }[f.kind]
    shows = ((fmt(f.lhs), lhs),) if f.kind == "divisible" else ((fmt(f.lhs), lhs), (fmt(f.rhs), rhs))
    syms = tuple(sorted({s.name for s in f.lhs.free_symbols | f.rhs.free_symbols}))
    return Check(expr, f"{f.text()} ({f.origin})", shows, syms)


def guard_spec(
    declared: list[Value], store: ShapeStore, device: str = "cpu", traced: tuple[Check, ...] = ()
) -> GuardSpec:
    """`declared`: the graph inputs with the dims as declared, before unification; `device`:
    the device type every input must be on; `traced`: the conditions the capture traced the
    model under."""
    inputs = []
    sites: dict[str, str] = {}
    for v in declared:
        dims = []
        for d, e in enumerate(v.type.shape):
            if e.is_Integer:
                dims.append(int(e))
            elif e.is_Symbol:
                dims.append(e.name)
                sites.setdefault(e.name, f"input '{v.name}' dim {d}")
            else:
                raise AssertionError(f"input {v.name} dim {d} is declared as {fmt(e)}, not a symbol")
        inputs.append(InputSpec(v.name, v.type.dtype.torch, tuple(dims)))
    ranges = tuple(
        (name, info.lo, info.hi, str(info.range_origin) if info.range_origin else "declared")
        for name, info in store.symbols.items()
    )
    checks = tuple(_check(f) for f in store.checks())
    known = {_sides(c.expr) for c in checks}
    traced = tuple(c for c in traced if _sides(c.expr) not in known)  # (the store's fact says why)
    return GuardSpec(tuple(inputs), ranges, checks, sites, device, traced)


def _sides(expr: str) -> frozenset | str:
    """An equality as the set of its two sides (spaces and outer parentheses dropped)."""
    parts = expr.replace(" ", "").split("==")
    return frozenset(p.strip("()") for p in parts) if len(parts) == 2 else expr
