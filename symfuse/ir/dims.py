"""Symbolic dimension expressions.

A dimension is a sympy expression over named positive-integer symbols: an integer,
a symbol, or sums, products, floor-divisions, mods, mins and maxes of them. sympy keeps
sums and products in a canonical form, so two dimensions that are the same polynomial
compare equal. This module owns creating, printing and evaluating dimensions; nothing
else builds sympy objects for shapes. Evaluation at run time goes through `to_python`,
which turns an expression into plain Python source once, keeping sympy off the hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

import sympy
from sympy.printing.str import StrPrinter

Dim = sympy.Expr
DimLike = int | sympy.Expr


@cache
def sym(name: str) -> sympy.Symbol:
    """The symbol for a named dynamic dimension (always a positive integer)."""
    return sympy.Symbol(name, integer=True, positive=True)


def dim(value: DimLike) -> Dim:
    """Normalise an int or expression to a dimension expression."""
    if isinstance(value, sympy.Expr):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a dimension must be an int or a symbolic expression, got {value!r}")
    return sympy.Integer(value)


def floordiv(a: DimLike, b: DimLike) -> Dim:
    a, b = dim(a), dim(b)
    if isinstance(a, sympy.floor) and b.is_Integer and b > 0:
        return sympy.floor(a.args[0] / b)  # (x//p)//q == x//(p*q): one form for the same size
    return sympy.floor(a / b)


def ceildiv(a: DimLike, b: DimLike) -> Dim:
    return sympy.ceiling(dim(a) / dim(b))


def mod(a: DimLike, b: DimLike) -> Dim:
    return sympy.Mod(dim(a), dim(b))


def dmin(a: DimLike, b: DimLike) -> Dim:
    return sympy.Min(dim(a), dim(b))


def dmax(a: DimLike, b: DimLike) -> Dim:
    return sympy.Max(dim(a), dim(b))


SLICE_END = 2**62  # slice ends at or past this mean "to the end" (torch.export writes 2**63 - 1)


def slice_bound(d: DimLike, v) -> Dim:
    """A slice start or end clamped into [0, d] as Python does; None means d."""
    d = dim(d)
    if v is None or (isinstance(v, int) and v >= SLICE_END):
        return d
    v = dim(v)
    if v.is_Integer and v < 0:
        return dmax(d + v, 0)
    return dmin(v, d)


def product(dims) -> Dim:
    out: Dim = sympy.Integer(1)
    for d in dims:
        out = out * dim(d)
    return out


def exact_quotient(a: Dim, b: Dim) -> Dim | None:
    """a / b when it is a polynomial with integer coefficients, else None."""
    if b == 0:
        return None
    q = sympy.cancel(a / b)
    if sympy.fraction(q)[1] != 1:  # (on the cancelled quotient: a sum's fraction() is always over 1)
        return None
    q = sympy.expand(q)
    if all(term.as_coeff_Mul()[0].is_Integer for term in sympy.Add.make_args(q)):
        return q
    return None


class _DimPrinter(StrPrinter):
    """Prints `floor(x/y)` as `x//y` and `Min` as `min`, so dims read like Python."""

    def _print_floor(self, e):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"{self._wrap(num)}//{self._wrap(den)}"

    def _print_ceiling(self, e):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"ceil({self._print(num)}/{self._print(den)})"

    def _print_Mod(self, e):
        return f"{self._wrap(e.args[0])}%{self._wrap(e.args[1])}"

    def _print_Mul(self, e):
        coeff, rest = e.as_coeff_Mul()
        if not coeff.is_Integer:
            return super()._print_Mul(e)
        parts = [
            f"({self._print(f)})" if (f.is_Add or isinstance(f, (sympy.floor, sympy.Mod))) else self._print(f)
            for f in rest.as_ordered_factors()
        ]
        body = "*".join(parts)
        if coeff == 1:
            return body
        return f"-{body}" if coeff == -1 else f"{coeff}*{body}"

    def _print_Pow(self, e, rational=False):
        if e.exp.is_Integer and e.exp > 0:
            return f"{self._wrap(e.base)}**{e.exp}"
        return super()._print_Pow(e, rational)

    def _print_Min(self, e):
        return "min(" + ", ".join(self._print(a) for a in e.args) + ")"

    def _print_Max(self, e):
        return "max(" + ", ".join(self._print(a) for a in e.args) + ")"

    def _wrap(self, e):
        s = self._print(e)
        return s if (e.is_Atom or isinstance(e, (sympy.Min, sympy.Max, sympy.ceiling))) else f"({s})"


_printer = _DimPrinter()


def fmt(d: DimLike) -> str:
    """Stable human-readable text of a dimension: `B*S`, `S//2 + 1`, `min(S, 512)`."""
    return _printer.doprint(dim(d))


def fmt_shape(shape) -> str:
    return "[" + ", ".join(fmt(d) for d in shape) + "]"


@dataclass(frozen=True)
class Spelling:
    """How a target language writes integer arithmetic: Python here, C++ in the code
    generator. `render` walks the expression once for every spelling."""

    power: Callable[[str, int], str]
    floordiv: Callable[[str, str], str]
    ceildiv: Callable[[str, str], str]
    mod: Callable[[str, str], str]
    minmax: Callable[[str, list[str]], str]  # ("min" | "max", operands)
    error: type[Exception] = ValueError


PYTHON = Spelling(
    power=lambda b, n: f"({b} ** {n})",
    floordiv=lambda a, b: f"({a} // {b})",
    ceildiv=lambda a, b: f"(-((-{a}) // {b}))",
    mod=lambda a, b: f"({a} % {b})",
    minmax=lambda f, args: f"{f}(" + ", ".join(args) + ")",
)


def call_spelling(floordiv: str, minmax: str, error: type[Exception]) -> Spelling:
    """A language that writes floor division and min/max as calls: `floordiv` is the floor
    division's function (`sf_floordiv<int64_t>`), `minmax` the min or max call, `{f}` standing
    for "min" or "max" (`std::{f}<int64_t>`); ceiling division and modulo are spelt through
    the floor division, and min/max of several operands nests two-operand calls."""

    def fd(a: str, b: str) -> str:
        return f"{floordiv}({a}, {b})"

    def nested(f: str, args: list[str]) -> str:
        out = args[0]
        for a in args[1:]:
            out = f"{minmax.format(f=f)}({out}, {a})"
        return out

    return Spelling(
        power=lambda b, n: "(" + " * ".join([b] * n) + ")",
        floordiv=fd,
        ceildiv=lambda a, b: f"(-{fd('-' + a, b)})",
        mod=lambda a, b: f"({a} - {fd(a, b)} * {b})",
        minmax=nested,
        error=error,
    )


def render(d: DimLike, names: Mapping[sympy.Symbol, str], spell: Spelling) -> str:
    """Source in `spell`'s language that computes `d` from variables named by `names` (or
    after the symbols)."""
    d = dim(d)

    def go(e: sympy.Expr) -> str:
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return names.get(e, e.name)
        if e.is_Add:
            return "(" + " + ".join(go(a) for a in e.args) + ")"
        if e.is_Mul:
            num, den = sympy.fraction(e)
            if den != 1:
                raise spell.error(f"dimension {fmt(d)} is not an integer expression")
            return "(" + " * ".join(go(a) for a in e.args) + ")"
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return spell.power(go(e.base), int(e.exp))
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            div = spell.floordiv if isinstance(e, sympy.floor) else spell.ceildiv
            return div(go(num), go(den))
        if isinstance(e, sympy.Mod):
            return spell.mod(go(e.args[0]), go(e.args[1]))
        if isinstance(e, (sympy.Min, sympy.Max)):
            return spell.minmax("min" if isinstance(e, sympy.Min) else "max", [go(a) for a in e.args])
        raise spell.error(f"cannot write dimension expression {e}")

    return go(d)


def to_python(d: DimLike, names: Mapping[sympy.Symbol, str] | None = None) -> str:
    """Python source that computes `d` from variables named after its symbols."""
    return render(d, names or {}, PYTHON)


def evaluate(d: DimLike, binding: Mapping[str, int]) -> int:
    """Value of `d` for a binding of symbol names to ints (compile-time helper)."""
    d = dim(d)
    if d.is_Integer:
        return int(d)
    return int(eval(to_python(d), {"__builtins__": {"min": min, "max": max}}, dict(binding)))  # noqa: S307
