"""Tensor expressions: each tensor as a compute rule over a symbolic iteration domain.

A `TE` defines every element of one tensor: `out[axes] = body`, where `axes` are loop
variables (sympy symbols `i0, i1, ...`) ranging over the tensor's symbolic shape and
`body` is a scalar expression. Scalars are loads (`Load(tensor, index)`, the index a tuple
of sympy expressions over loop variables and shape symbols, or of scalars for a gather),
constants, calls of scalar functions, the value of an index expression (`Index`), and
reductions over extra axes (`Reduce`). Layout ops leave no TE of their own once their
index maps are composed into the loads that read them (Souffle's vertical composition).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from symfuse.ir.dims import Dim, fmt
from symfuse.ir.dtypes import DType


@dataclass(frozen=True)
class Load:
    tensor: str
    index: tuple  # of sympy expressions, or Scalar for data-dependent (gather) indices


@dataclass(frozen=True)
class Const:
    value: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class Index:
    """The value of an integer index expression (an arange's elements)."""

    expr: sympy.Expr
    dtype: DType


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple
    dtype: DType
    params: tuple = ()  # non-tensor parameters as (name, value): gelu's approximate


def from_end(index: Scalar, extent: Dim) -> Call:
    """A gather index read as Python reads one: in [-extent, extent), a negative one counting
    from the end. A load's index, or its value where a generator (an arange) is read at it;
    the emitters check it against that range either way."""
    return Call("from_end", (Call("cast", (index,), DType.int64), Index(extent, DType.int64)), DType.int64)


@dataclass(frozen=True)
class Reduce:
    op: str  # sum | max | min
    body: Scalar
    axes: tuple[tuple[sympy.Symbol, Dim], ...]  # (variable, extent)
    dtype: DType


Scalar = Load | Const | Index | Call | Reduce


@dataclass(frozen=True)
class TE:
    name: str
    shape: tuple[Dim, ...]
    dtype: DType
    axes: tuple[sympy.Symbol, ...]
    body: Scalar
    origin: str = ""  # the graph node it came from


@dataclass(frozen=True)
class Opaque:
    """A node with no TE lowering: it runs through its torch reference."""

    name: str
    op: str
    origin: str


def axis(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"i{i}", integer=True, nonnegative=True)


def reduce_axis(name: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"r{i}_{name}", integer=True, nonnegative=True)


def fmt_scalar(s: Scalar) -> str:
    if isinstance(s, Load):
        return f"{s.tensor}[{', '.join(fmt_scalar(i) if not isinstance(i, sympy.Expr) else fmt(i) for i in s.index)}]"
    if isinstance(s, Const):
        return repr(s.value)
    if isinstance(s, Index):
        return fmt(s.expr)
    if isinstance(s, Call):
        params = [f"{k}={v!r}" for k, v in s.params]
        return f"{s.fn}({', '.join([fmt_scalar(a) for a in s.args] + params)})"
    axes = ", ".join(f"{a.name} < {fmt(e)}" for a, e in s.axes)
    return f"{s.op}({fmt_scalar(s.body)} for {axes})"


def fmt_short(s: Scalar, n: int = 150) -> str:
    """`fmt_scalar`, cut to `n` characters (for generated kernels' headers)."""
    text = fmt_scalar(s)
    return text if len(text) <= n else text[: n - 3] + "..."


def fmt_te(t: TE | Opaque) -> str:
    if isinstance(t, Opaque):
        return f"{t.name} = torch reference of {t.op}  # {t.origin}"
    idx = ", ".join(a.name for a in t.axes)
    dom = ", ".join(f"{a.name} < {fmt(d)}" for a, d in zip(t.axes, t.shape))
    return f"{t.name}[{idx}] = {fmt_scalar(t.body)}" + (f"   for {dom}" if dom else "")


def _as_scalar(e: sympy.Expr, data: dict, dtype: DType) -> Scalar:
    """An integer index expression whose variables in `data` stand for scalars, as a scalar."""
    if e in data:
        value = data[e]
        return value if value.dtype is dtype else Call("cast", (value,), dtype)
    if not e.free_symbols & data.keys():
        return Index(e, dtype)
    if e.is_Add or e.is_Mul:
        parts = [_as_scalar(a, data, dtype) for a in e.args]
        out = parts[0]
        for p in parts[1:]:
            out = Call("add" if e.is_Add else "mul", (out, p), dtype)
        return out
    raise NotImplementedError(f"an index {e} of a gathered value is not a sum of products")


def substitute(s: Scalar, mapping: dict) -> Scalar:
    """`s` with loop variables replaced by index expressions (a load of a generator
    becomes the generator's body at the load's index)."""

    # a variable mapped to a scalar (a gathered index) leaves sympy: expressions of it become calls
    data = {k: v for k, v in mapping.items() if not isinstance(v, sympy.Expr)}
    plain = {k: v for k, v in mapping.items() if k not in data}

    def idx(i):
        if not isinstance(i, sympy.Expr):
            return substitute(i, mapping)
        if data and i.free_symbols & data.keys():
            return _as_scalar(i.xreplace(plain), data, DType.int64)
        return i.xreplace(mapping)

    if isinstance(s, Load):
        return Load(s.tensor, tuple(idx(i) for i in s.index))
    if isinstance(s, Index):
        if data and s.expr.free_symbols & data.keys():
            return _as_scalar(s.expr.xreplace(plain), data, s.dtype)
        return Index(s.expr.xreplace(mapping), s.dtype)
    if isinstance(s, Call):
        return Call(s.fn, tuple(substitute(a, mapping) for a in s.args), s.dtype, s.params)
    if isinstance(s, Reduce):
        return Reduce(s.op, substitute(s.body, mapping), s.axes, s.dtype)
    return s
