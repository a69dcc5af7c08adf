"""Buffer layouts and the index arithmetic over them.

A materialised tensor lives in a buffer with a stride per dim (symbolic, in elements). A
load `t[e0, e1, ...]` reads address `sum(e_k * stride_k)`. This module decides whether
such an address is affine in the loop variables, so a library GEMM can read the operand as
a strided view instead of a copy, and it chooses a buffer's dim order when that makes a
GEMM operand affine (BERT's attention context is written as `[B, S, H, D]` so the output
projection reads it as a plain matrix).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy

from symfuse.ir.dims import Dim


def row_major(shape: tuple[Dim, ...], order: tuple[int, ...] | None = None) -> tuple[Dim, ...]:
    """Strides of a dense buffer whose dims are stored outermost-first in `order`."""
    order = tuple(range(len(shape))) if order is None else order
    strides: list[Dim] = [sympy.Integer(0)] * len(shape)
    acc: Dim = sympy.Integer(1)
    for k in reversed(order):
        strides[k] = acc
        acc = acc * shape[k]
    return tuple(strides)


def fold_div_mod(e: sympy.Expr) -> sympy.Expr:
    """Rewrite `c*floor(x/c)*k + Mod(x, c)*k` back to `x*k`, which sympy leaves alone."""
    e = sympy.expand(e)
    terms = list(sympy.Add.make_args(e))
    changed = True
    while changed:
        changed = False
        for t in terms:
            mods = [f for f in sympy.Mul.make_args(t) if isinstance(f, sympy.Mod)]
            if len(mods) != 1:
                continue
            x, c = mods[0].args
            coef = t / mods[0]
            want = sympy.expand(coef * c * sympy.floor(x / c))
            if want in terms:
                terms.remove(t)
                terms.remove(want)
                terms.extend(sympy.Add.make_args(sympy.expand(coef * x)))
                changed = True
                break
    return sympy.Add(*terms)


def address(index: tuple, strides: tuple[Dim, ...], offset: Dim = 0) -> sympy.Expr:
    return fold_div_mod(sum((i * s for i, s in zip(index, strides)), sympy.Integer(offset)))


def affine(expr: sympy.Expr, variables: tuple[sympy.Symbol, ...]) -> tuple[dict, sympy.Expr] | None:
    """`expr` as `sum(coef[v] * v) + offset` with coefficients free of the variables,
    or None when a variable sits inside a floor, a mod or a product with another."""
    vs = set(variables)
    coef: dict[sympy.Symbol, sympy.Expr] = {v: sympy.Integer(0) for v in variables}
    offset = sympy.Integer(0)
    for t in sympy.Add.make_args(sympy.expand(expr)):
        inside = [f for f in sympy.Mul.make_args(t) if f.free_symbols & vs]
        if not inside:
            offset += t
        elif len(inside) == 1 and inside[0] in vs:
            coef[inside[0]] += t / inside[0]
        else:
            return None
    return coef, offset


@dataclass(frozen=True)
class View:
    """A strided view of a buffer: `sizes[k]` and `strides[k]` per view dim, symbolic."""

    buffer: str
    sizes: tuple[Dim, ...]
    strides: tuple[Dim, ...]
    offset: Dim


def strided_view(
    buffer: str, index: tuple, strides: tuple[Dim, ...], variables: tuple[sympy.Symbol, ...], sizes: tuple[Dim, ...]
) -> View | None:
    """The view that reads `buffer[index]` at every point of `variables` (extents `sizes`)."""
    if any(not isinstance(i, sympy.Expr) for i in index):
        return None
    aff = affine(address(index, strides), variables)
    if aff is None:
        return None
    coef, offset = aff
    return View(buffer, tuple(sizes), tuple(coef[v] for v in variables), offset)


def reorder_for(shape: tuple[Dim, ...], reads) -> tuple[int, ...] | None:
    """A dim order of a buffer under which every `(index, variables, sizes)` read is a
    strided view; None when no order does. Orders that give every view a unit-stride last
    dim (what a GEMM reads fastest) win, then those that move the fewest dims."""
    n = len(shape)
    best, best_key = None, None
    for order in itertools.permutations(range(n)):
        strides = row_major(shape, order)
        views = [strided_view("", idx, strides, vs, sz) for idx, vs, sz in reads]
        if any(v is None for v in views):
            continue
        key = (sum(v.strides[-1] != 1 for v in views), sum(a != b for a, b in zip(order, range(n))))
        if best_key is None or key < best_key:
            best, best_key = order, key
    return best


def as_matrix(v: View) -> tuple[Dim, Dim] | None:
    """(rows, row stride) when the view is a row-major matrix: unit stride along its last dim
    and every leading dim nested in the next (so the leading dims flatten to one). Leading dims
    of size 1 have no say (a decoder's last position, [B, 1, H] at row stride S * H)."""
    if not v.sizes or v.strides[-1] != 1:
        return None
    lead = [(d, s) for d, s in zip(v.sizes[:-1], v.strides[:-1]) if d != 1]
    if not lead:
        return sympy.Integer(1), v.sizes[-1]
    for (_, s_outer), (d_inner, s_inner) in zip(lead, lead[1:]):
        if sympy.expand(s_outer - s_inner * d_inner) != 0:
            return None
    rows = sympy.Mul(*(d for d, _ in lead))
    return rows, lead[-1][1]
