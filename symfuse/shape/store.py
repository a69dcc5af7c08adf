"""The global shape-constraint store.

Every fact about dimensions that op semantics imply lives here, with the op it came
from: equal dims (union-find over dimension expressions, so `min(S, 512)` can be known
equal to `S`), equal element counts (union-find over canonical products), ranges and
divisibility. Queries answer YES, NO or UNKNOWN, never a guess.

Facts are assumptions about run-time shapes as much as conclusions: when two dynamic dims
must be equal for the model to be valid (BladeDISC's broadcast rule), they are made equal
here and every such fact becomes a run-time check, so a call that breaks one gets a clear
error instead of a wrong answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import sympy

from symfuse.ir.dims import Dim, DimLike, dim, fmt, fmt_shape, product, sym, to_python
from symfuse.ir.tri import Tri


class ShapeError(ValueError):
    """The model's shapes contradict each other for every binding of its symbols."""


@dataclass(frozen=True)
class Origin:
    """Where a fact came from: the rule, the op and the value it produced."""

    rule: str
    op: str = ""
    value: str = ""
    loc: str = ""

    def __str__(self) -> str:
        where = f" at {self.op} %{self.value}" if self.op else ""
        return f"{self.rule}{where}" + (f" ({self.loc})" if self.loc else "")


@dataclass(frozen=True)
class Fact:
    """lhs REL rhs, with REL one of ==, <=, numel==, divides (rhs divides lhs)."""

    kind: str
    lhs: Dim
    rhs: Dim
    origin: Origin

    def text(self) -> str:
        if self.kind == "divisible":
            return f"{fmt(self.lhs)} % {fmt(self.rhs)} == 0"
        op = {"eq": "==", "le": "<=", "numel": "== (element count)"}[self.kind]
        return f"{fmt(self.lhs)} {op} {fmt(self.rhs)}"

    @property
    def trivial(self) -> bool:
        """True when the fact holds for every binding without any assumption."""
        diff = sympy.simplify(self.lhs - self.rhs) if self.kind in ("eq", "numel") else None
        if diff is not None:
            return diff == 0
        if self.kind == "divisible":
            return bool(self.lhs.is_Integer and int(self.lhs) % int(self.rhs) == 0)
        return bool((self.rhs - self.lhs).is_nonnegative)


@dataclass
class SymbolInfo:
    symbol: sympy.Symbol
    lo: int = 1
    hi: float = math.inf
    bound_at: list[str] = field(default_factory=list)  # "input 'x' dim 1"
    range_origin: Origin | None = None


class ShapeStore:
    def __init__(self) -> None:
        self.symbols: dict[str, SymbolInfo] = {}
        self.facts: list[Fact] = []
        self._subst: dict[Dim, Dim] = {}  # non-representative member -> its representative
        self._members: dict[Dim, list[Dim]] = {}  # representative -> every member, itself first
        self._eq_origin: dict[Dim, Origin] = {}  # member -> the fact that joined it
        self._numel_parent: dict[Dim, Dim] = {}
        self._divisors: dict[Dim, int] = {}
        self._seen: set[Fact] = set()

    # -- declaring -----------------------------------------------------------------
    def declare(self, name: str, *, lo: int = 1, hi: float = math.inf, bound_at: str = "") -> sympy.Symbol:
        info = self.symbols.get(name)
        if info is None:
            info = self.symbols[name] = SymbolInfo(sym(name), lo, hi)
        else:
            info.lo, info.hi = max(info.lo, lo), min(info.hi, hi)
        if bound_at:
            info.bound_at.append(bound_at)
        return info.symbol

    def _order(self, s: sympy.Symbol) -> int:
        return list(self.symbols).index(s.name) if s.name in self.symbols else len(self.symbols)

    def _cost(self, d: Dim) -> tuple:
        if d.is_Integer:
            return (0,)
        syms = sorted(self._order(s) for s in d.free_symbols)
        return (1, len(syms), syms, sympy.count_ops(d), str(d))

    # -- canonical forms -----------------------------------------------------------
    def canon(self, d: DimLike) -> Dim:
        d = dim(d)
        for _ in range(16):
            new = self._simplify(d.xreplace(self._subst)) if self._subst else self._simplify(d)
            if new == d:
                return d
            d = new
        return d

    def canon_shape(self, shape) -> tuple[Dim, ...]:
        return tuple(self.canon(d) for d in shape)

    def _simplify(self, d: Dim) -> Dim:
        if d.is_Atom:
            return d

        def minmax(e):
            lo_hi = [self.bounds(a) for a in e.args]
            if isinstance(e, sympy.Min):
                best = [
                    a
                    for a, (_, hi) in zip(e.args, lo_hi)
                    if all(hi <= lo for b, (lo, _) in zip(e.args, lo_hi) if b is not a)
                ]
            else:
                best = [
                    a
                    for a, (lo, _) in zip(e.args, lo_hi)
                    if all(lo >= hi for b, (_, hi) in zip(e.args, lo_hi) if b is not a)
                ]
            return best[0] if best else e

        return d.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), minmax)

    def members(self, d: DimLike) -> list[Dim]:
        r = self.canon(d)
        return self._members.get(r, [r])

    # -- adding facts --------------------------------------------------------------
    def eq(self, a: DimLike, b: DimLike, origin: Origin) -> Dim:
        a, b = self.canon(a), self.canon(b)
        if a == b:
            return a
        if a.is_Integer and b.is_Integer:
            raise ShapeError(f"{origin}: needs {fmt(a)} == {fmt(b)}, which never holds")
        rep, other = (a, b) if self._cost(a) <= self._cost(b) else (b, a)
        if rep.has(other):  # never substitute a term by an expression containing it
            rep, other = other, rep
            if rep.has(other):
                self.facts.append(Fact("eq", a, b, origin))
                return a
        self.facts.append(Fact("eq", other, rep, origin))
        moved = self._members.pop(other, [other])
        self._members.setdefault(rep, [rep]).extend(moved)
        for m in moved:
            self._subst[m] = rep
        self._eq_origin[other] = origin
        self._derive_from_eq(other, rep, origin)
        return rep

    def _derive_from_eq(self, a: Dim, b: Dim, origin: Origin) -> None:
        for x, y in ((a, b), (b, a)):
            if isinstance(x, sympy.Min) and y in x.args:  # min(y, c) == y  =>  y <= c
                for other in x.args:
                    if other != y:
                        self.le(y, other, origin)
            if isinstance(x, sympy.Max) and y in x.args:
                for other in x.args:
                    if other != y:
                        self.le(other, y, origin)
            if x.is_Symbol and y.is_Integer:
                self._tighten(x, int(y), int(y), origin)
        if a.is_Symbol and b.is_Symbol:  # equal symbols share one range
            for x, y in ((a, b), (b, a)):
                info = self.symbols.get(y.name)
                if info is not None:
                    self._tighten(x, info.lo, info.hi, info.range_origin or origin)

    def le(self, a: DimLike, b: DimLike, origin: Origin) -> None:
        a, b = self.canon(a), self.canon(b)
        fact = Fact("le", a, b, origin)
        lo_a, hi_a = self.bounds(a)
        lo_b, hi_b = self.bounds(b)
        if hi_a <= lo_b:  # already implied by the ranges
            return
        if a.is_Integer and b.is_Integer or lo_a > hi_b:
            if not (a.is_Integer and b.is_Integer and a <= b):
                raise ShapeError(f"{origin}: needs {fact.text()}, which never holds")
            return
        if fact in self._seen:
            return
        self._seen.add(fact)
        self.facts.append(fact)
        # a bound on a non-decreasing expression of one symbol tightens that symbol's range
        for lhs, rhs, upper in ((a, b, True), (b, a, False)):
            if rhs.is_Integer and len(lhs.free_symbols) == 1 and _nondecreasing(lhs):
                (s,) = lhs.free_symbols
                info = self.symbols.get(s.name)
                lo, hi = (info.lo, info.hi) if info else (1, math.inf)
                f = _evaluator(lhs, s)
                if upper:  # largest s with f(s) <= rhs
                    edge = _search(lambda v: f(v) <= int(rhs), lo, hi, want_last=True)
                    if edge is not None:
                        self._tighten(s, -math.inf, edge, origin)
                else:  # smallest s with f(s) >= rhs
                    edge = _search(lambda v: f(v) >= int(rhs), lo, hi, want_last=False)
                    if edge is not None:
                        self._tighten(s, edge, math.inf, origin)

    def _tighten(self, s: sympy.Symbol, lo: float, hi: float, origin: Origin) -> None:
        """Narrow the range of `s` and of every symbol known equal to it."""
        for m in self.members(s):
            if m.is_Symbol:
                self._tighten_one(m, lo, hi, origin)

    def _tighten_one(self, s: sympy.Symbol, lo: float, hi: float, origin: Origin) -> None:
        info = self.symbols.get(s.name)
        if info is None:
            return
        new_lo, new_hi = max(info.lo, lo), min(info.hi, hi)
        if new_lo > new_hi:
            raise ShapeError(f"{origin}: needs {s.name} in [{lo}, {hi}], but it is declared in [{info.lo}, {info.hi}]")
        if (new_lo, new_hi) != (info.lo, info.hi):
            info.lo, info.hi, info.range_origin = int(new_lo), new_hi, origin

    def numel_eq(self, a_shape, b_shape, origin: Origin) -> None:
        pa, pb = self.canon(product(a_shape)), self.canon(product(b_shape))
        fact = Fact("numel", pa, pb, origin)
        if pa == pb:
            return
        if pa.is_Integer and pb.is_Integer:
            raise ShapeError(f"{origin}: element counts {fmt_shape(a_shape)} and {fmt_shape(b_shape)} differ")
        ra, rb = self._numel_find(pa), self._numel_find(pb)
        if ra != rb:
            self._numel_parent[rb] = ra
            self.facts.append(fact)

    def divisible(self, d: DimLike, k: int, origin: Origin) -> None:
        d = self.canon(d)
        if self.divides(d, k) is Tri.YES:
            return
        if d.is_Integer:
            raise ShapeError(f"{origin}: {fmt(d)} is not divisible by {k}")
        self.facts.append(Fact("divisible", d, sympy.Integer(k), origin))
        self._divisors[d] = math.lcm(self._divisors.get(d, 1), k)

    def _numel_find(self, p: Dim) -> Dim:
        while p in self._numel_parent:
            p = self._numel_parent[p]
        return p

    # -- queries -------------------------------------------------------------------
    def bounds(self, d: DimLike) -> tuple[float, float]:
        """Interval [lo, hi] of a dimension expression (inf when unbounded)."""
        d = dim(d)
        if d.is_Integer:
            return (int(d), int(d))
        if d.is_Symbol:
            info = self.symbols.get(d.name)
            return (info.lo, info.hi) if info else (1, math.inf)
        if d.is_Add or d.is_Mul:
            parts = [self.bounds(a) for a in d.args]
            lo, hi = parts[0]
            for plo, phi in parts[1:]:
                if d.is_Add:
                    lo, hi = lo + plo, hi + phi
                else:
                    cands = [_mul(x, y) for x in (lo, hi) for y in (plo, phi)]
                    lo, hi = min(cands), max(cands)
            return (lo, hi)
        if isinstance(d, sympy.Min):
            parts = [self.bounds(a) for a in d.args]
            return (min(p[0] for p in parts), min(p[1] for p in parts))
        if isinstance(d, sympy.Max):
            parts = [self.bounds(a) for a in d.args]
            return (max(p[0] for p in parts), max(p[1] for p in parts))
        if isinstance(d, (sympy.floor, sympy.ceiling)):
            lo, hi = self.bounds(d.args[0])
            f = math.floor if isinstance(d, sympy.floor) else math.ceil
            return (f(lo) if math.isfinite(lo) else lo, f(hi) if math.isfinite(hi) else hi)
        if isinstance(d, sympy.Mod):
            _, hi = self.bounds(d.args[1])
            return (0, hi - 1)
        if d.is_Pow and d.exp.is_Integer and d.exp > 0:
            lo, hi = self.bounds(d.base)
            return (lo ** int(d.exp), hi ** int(d.exp)) if lo >= 0 else (-math.inf, math.inf)
        if d.is_Rational:
            return (float(d), float(d))
        return (-math.inf, math.inf)

    def range(self, d: DimLike) -> tuple[float, float]:
        return self.bounds(self.canon(d))

    def dims_equal(self, a: DimLike, b: DimLike) -> Tri:
        a, b = self.canon(a), self.canon(b)
        if a == b:
            return Tri.YES
        (alo, ahi), (blo, bhi) = self.bounds(a), self.bounds(b)
        if ahi < blo or bhi < alo:
            return Tri.NO
        return Tri.UNKNOWN

    def is_one(self, d: DimLike) -> Tri:
        return self.dims_equal(d, 1)

    def same_shape(self, a, b) -> Tri:
        a_shape, b_shape = getattr(a, "shape", a), getattr(b, "shape", b)
        if len(a_shape) != len(b_shape):
            return Tri.NO
        answers = [self.dims_equal(x, y) for x, y in zip(a_shape, b_shape)]
        if all(t is Tri.YES for t in answers):
            return Tri.YES
        return Tri.NO if any(t is Tri.NO for t in answers) else Tri.UNKNOWN

    def numel_class(self, shape) -> Dim:
        return self._numel_find(self.canon(product(getattr(shape, "shape", shape))))

    def same_numel(self, a, b) -> Tri:
        pa, pb = self.numel_class(a), self.numel_class(b)
        if pa == pb:
            return Tri.YES
        return self.dims_equal(pa, pb)

    def divides(self, d: DimLike, k: int) -> Tri:
        """Is `d` divisible by `k` for every valid binding?"""
        d = self.canon(d)
        if d.is_Integer:
            return Tri.YES if int(d) % k == 0 else Tri.NO
        coeff, rest = d.as_coeff_Mul()
        known = coeff * self._divisors.get(rest, 1) if coeff.is_Integer else self._divisors.get(d, 1)
        for factor in sympy.Mul.make_args(rest):
            known *= self._divisors.get(factor, 1)
        if int(known) % k == 0:
            return Tri.YES
        return Tri.UNKNOWN

    # -- reporting -----------------------------------------------------------------
    def dim_classes(self) -> list[tuple[Dim, list[Dim], list[Origin]]]:
        """Every class of equal dims with more than one member, and why each joined."""
        out = []
        for rep, members in self._members.items():
            if len(members) > 1 and rep not in self._subst:
                origins = [self._eq_origin[m] for m in members[1:] if m in self._eq_origin]
                out.append((rep, members, origins))
        return out

    def checks(self) -> list[Fact]:
        """Facts that are not true by construction: the run-time guard must check them."""
        return [f for f in self.facts if not f.trivial]


def _nondecreasing(e: sympy.Expr) -> bool:
    """True when `e` cannot decrease as its symbols grow (sums and products with positive
    coefficients, floor/ceil divisions by positive constants, min and max of such)."""
    if e.is_Integer or e.is_Symbol:
        return True
    if e.is_Add:
        return all(_nondecreasing(t) for t in e.args)
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        return coeff > 0 and all(_nondecreasing(t) for t in sympy.Mul.make_args(rest))
    if e.is_Pow:
        return e.exp.is_Integer and e.exp > 0 and _nondecreasing(e.base)
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return den.is_Integer and den > 0 and _nondecreasing(num)
    if isinstance(e, (sympy.Min, sympy.Max)):
        return all(_nondecreasing(t) for t in e.args)
    return False


def _evaluator(e: sympy.Expr, s: sympy.Symbol):

    return eval(f"lambda {s.name}: {to_python(e)}", {"min": min, "max": max})  # noqa: S307


def _search(pred, lo: float, hi: float, *, want_last: bool) -> int | None:
    """Binary search on a monotone predicate over [lo, hi] (hi may be inf).

    want_last: pred holds then fails; return the last value where it holds.
    otherwise: pred fails then holds; return the first value where it holds.
    """
    lo = int(lo)
    top = int(hi) if math.isfinite(hi) else 2**62
    if want_last:
        if not pred(lo):
            return lo - 1
        if pred(top):
            return None
        a, b = lo, top  # pred(a) holds, pred(b) fails
    else:
        if pred(lo):
            return None
        if not pred(top):
            return top + 1
        a, b = lo, top  # pred(a) fails, pred(b) holds
    while b - a > 1:
        mid = (a + b) // 2
        if pred(mid) == want_last:
            a = mid
        else:
            b = mid
    return a if want_last else b


def _mul(x: float, y: float) -> float:
    if x == 0 or y == 0:
        return 0
    return x * y
