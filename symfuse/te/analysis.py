"""Global dependence analysis of a TE program, as Souffle does it.

For every producer/consumer pair it decides whether each consumer element relies on one
producer element (an index map with no reduction variable: the pair can fuse element by
element), on many (a reduction variable appears in the index: the consumer needs a whole
region, so fusing it means a barrier or recomputation), or on a data-dependent one (a
gather). Every TE is compute-intensive (it contracts two operands over a reduction axis: a
GEMM) or memory-intensive (everything else). Tensors read by several TEs are reuse
candidates.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import sympy

from symfuse.ir.dims import fmt
from symfuse.te.ir import TE, Call, Const, Load, Opaque, Reduce, Scalar
from symfuse.te.lower import TEProgram
from symfuse.te.rules import linear_index

ONE = "one-relies-on-one"
MANY = "one-relies-on-many"
GATHER = "gather"


def loads(s: Scalar, bound: frozenset = frozenset()):
    """Every load in `s`, with the reduction variables in scope at it."""
    if isinstance(s, Load):
        yield s, bound
        for i in s.index:
            if not isinstance(i, sympy.Expr):
                yield from loads(i, bound)
    elif isinstance(s, Call):
        for a in s.args:
            yield from loads(a, bound)
    elif isinstance(s, Reduce):
        yield from loads(s.body, bound | {a for a, _ in s.axes})


def loads_through(s: Scalar, inline: dict[str, TE]):
    """Every load in `s`, with loads of the generators in `inline` replaced by theirs."""
    for ld, _ in loads(s):
        if ld.tensor in inline:
            yield from loads_through(inline[ld.tensor].body, inline)
        else:
            yield ld


def gather_site(index: Scalar, k: int, tensor: str | None, size, step: str) -> tuple[Scalar, bool, str]:
    """A data-dependent index of dim `k` of `tensor`: the value to check, whether it counts
    from the end (`from_end`: valid in [-size, size)) or not ([0, size)), and what it is, in
    words, for the error an out-of-range value raises (`tensor` None: a generator such as an
    arange, computed where it is read, is read at the index)."""
    python = isinstance(index, Call) and index.fn == "from_end"
    value = index.args[0] if python else index
    source = ", ".join(sorted({x.tensor for x, _ in loads(value)})) or "a computed index"
    where = f"dim {k} of {tensor}" if tensor else "a computed tensor's dim"
    return value, python, f"{source} indexing {where} (size {fmt(size)}) in {step}"


def same_element(load: Load, shape: tuple, reader: TE) -> bool:
    """Does `reader` read, through `load`, the element of a tensor of `shape` at its own
    offset when both are dense: the same index, or through a reshape ([B*S, N] read as
    [B, S, N])?"""
    if load.index == tuple(reader.axes):
        return True
    if not all(isinstance(i, sympy.Expr) for i in load.index) or len(load.index) != len(shape):
        return False
    return sympy.expand(linear_index(load.index, shape) - linear_index(reader.axes, reader.shape)) == 0


def row_scalar(t: TE) -> bool:
    """One value per row (rank 0, or a last dim of 1): a row statistic such as a mean."""
    return not t.shape or t.shape[-1] == 1


def relation(load: Load, reduce_vars: frozenset) -> str:
    if any(not isinstance(i, sympy.Expr) for i in load.index):
        return GATHER
    if any(i.free_symbols & reduce_vars for i in load.index):
        return MANY
    return ONE


def in_row(index: tuple, axes: tuple, shape: tuple) -> bool:
    """Does a load at `index` read the row its reader computes (every dim but the last
    indexed by the reader's own loop variable, or 0 where the dim is 1)?"""
    return all(i == a or (d == 1 and i == 0) for i, a, d in zip(index[:-1], axes[:-1], shape[:-1]))


def has_reduce(s: Scalar) -> bool:
    """Does `s` contain a reduction (in its body or in a gather index)?"""
    if isinstance(s, Reduce):
        return True
    if isinstance(s, Call):
        return any(has_reduce(a) for a in s.args)
    if isinstance(s, Load):
        return any(not isinstance(i, sympy.Expr) and has_reduce(i) for i in s.index)
    return False


# a reduction over at most this many elements, every extent a constant, is a window (a
# pooling's): its loops unroll and the loop over outputs around it is the vectorised one
WINDOW = 64


def reductions(s: Scalar) -> list[Reduce]:
    """The outermost reductions in `s` (those not inside another)."""
    if isinstance(s, Reduce):
        return [s]
    if isinstance(s, Call):
        return [r for a in s.args for r in reductions(a)]
    if isinstance(s, Load):
        return [r for i in s.index if not isinstance(i, sympy.Expr) for r in reductions(i)]
    return []


def is_window(r: Reduce) -> bool:
    """A reduction over a small window of constant extents, holding no other reduction."""
    sizes = [ext for _, ext in r.axes]
    return (
        all(isinstance(e, (int, sympy.Integer)) for e in sizes)
        and math.prod(int(e) for e in sizes) <= WINDOW
        and not has_reduce(r.body)
    )


def reduced_elements(s: Scalar) -> sympy.Expr:
    """Elements the reductions in `s` go over for one value of it (1 where it has none)."""
    return sympy.Integer(1) + sum((math.prod(ext for _, ext in r.axes) for r in reductions(s)), sympy.Integer(0))


def operand(s: Scalar) -> Load | None:
    """The load a contraction multiplies: plain, or guarded by a zero outside a padding."""
    if isinstance(s, Load):
        return s
    if isinstance(s, Call) and s.fn == "where" and isinstance(s.args[1], Load) and isinstance(s.args[2], Const):
        return s.args[1] if s.args[2].value == 0 else None
    return None


def is_contraction(s: Scalar) -> bool:
    """A reduction whose body multiplies two loads that both run along its axis."""
    if isinstance(s, Reduce) and s.op == "sum":
        body = s.body
        if isinstance(body, Call) and body.fn == "mul" and len(body.args) == 2:
            vars_ = {a for a, _ in s.axes}
            ops_ = [operand(a) for a in body.args]
            return all(
                a is not None and any(isinstance(i, sympy.Expr) and i.free_symbols & vars_ for i in a.index)
                for a in ops_
            )
    if isinstance(s, Call):
        return any(is_contraction(a) for a in s.args)
    return False


@dataclass
class Analysis:
    kind: dict[str, str] = field(default_factory=dict)  # TE -> compute-intensive | memory-intensive | opaque
    edges: dict[tuple[str, str], str] = field(default_factory=dict)  # (producer, consumer) -> relation
    readers: dict[str, list[str]] = field(default_factory=dict)  # tensor -> TEs that read it

    def summary(self) -> str:
        kinds = Counter(self.kind.values())
        rel = Counter(self.edges.values())
        reused = sum(1 for r in self.readers.values() if len(r) > 1)
        return (
            f"{len(self.kind)} TEs: {kinds['compute-intensive']} compute-intensive, "
            f"{kinds['memory-intensive']} memory-intensive, {kinds['opaque']} opaque; "
            f"edges: {rel[ONE]} {ONE}, {rel[MANY]} {MANY}, {rel[GATHER]} gather; "
            f"{reused} tensors read by more than one TE"
        )


def analyse(prog: TEProgram) -> Analysis:
    a = Analysis()
    for item in prog.items:
        if isinstance(item, Opaque):
            a.kind[item.name] = "opaque"
            n = prog.nodes[item.name]
            for v in n.inputs:
                if v is not None:
                    a.edges[(v.name, item.name)] = MANY
                    a.readers.setdefault(v.name, []).append(item.name)
            continue
        assert isinstance(item, TE)
        a.kind[item.name] = "compute-intensive" if is_contraction(item.body) else "memory-intensive"
        for ld, bound in loads(item.body):
            key = (ld.tensor, item.name)
            r = relation(ld, bound)
            # the strongest relation wins: many > gather > one
            if a.edges.get(key) != MANY and not (a.edges.get(key) == GATHER and r == ONE):
                a.edges[key] = r
            readers = a.readers.setdefault(ld.tensor, [])
            if item.name not in readers:
                readers.append(item.name)
    return a
