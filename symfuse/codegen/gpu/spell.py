"""How the GPU backend spells each function of the scalar vocabulary (`te/scalar.py`) in Triton.

`SPELLING[name](c)` is the Triton expression of one call, `c` a `CallSite`: its operands as
Triton (with their dtypes), the dtype it is computed in (`wide`: half-precision values are
computed in float32), its parameters and the emitter, for the spellings that write lines of
their own (an integer division reports a zero divisor). A spelling returns None where the
function has no Triton for that dtype; `UNSPELLED` says why a function has no spelling at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from symfuse.ir.dtypes import DType
from symfuse.te.scalar import FUNCTIONS


def literal(v, dt: DType) -> str:
    if dt is DType.bool:
        return "1" if v else "0"
    if not dt.is_float:
        return str(int(v))
    v = float(v)
    if v != v:
        return 'float("nan")'
    if v in (float("inf"), float("-inf")):
        return f'float("{"" if v > 0 else "-"}inf")'
    return repr(v)


def wide_of(a: DType, b: DType) -> DType:
    if a is b:
        return a
    if a.is_float or b.is_float:
        return DType.float64 if DType.float64 in (a, b) else DType.float32
    if DType.bool in (a, b):
        return b if a is DType.bool else a
    return DType.int64


@dataclass
class CallSite:
    fn: str
    dtype: DType
    wide: DType  # what it is computed in
    args: list[tuple[str, DType]]
    params: dict
    call: Any  # the TE call itself (te.ir.Call)
    ctx: Any  # the emitter's context: the axes and mask the call is evaluated under
    emitter: Any  # the Triton kernel emitter: to(), integer_division(), cast()

    def cast(self, i: int) -> str:
        return self.emitter.to(self.args[i], self.wide)

    @property
    def x(self) -> str:
        return self.cast(0)


def _div(c: CallSite) -> str:
    a, b = c.cast(0), c.cast(1)
    rm = c.params.get("rounding_mode")
    if not c.dtype.is_float:
        return c.emitter.integer_division(a, b, rm == "floor", c.ctx)
    if rm == "floor":
        return f"tl.floor({a} / {b})"
    if rm == "trunc":
        return f"sf_trunc({a} / {b})"
    return f"({a} / {b})"


def _compare(op: str) -> Callable[[CallSite], str]:
    def spell(c: CallSite) -> str:
        a, b = c.args
        common = wide_of(a[1], b[1])
        return f"({c.emitter.to(a, common)} {op} {c.emitter.to(b, common)})"

    return spell


def _logical(op: str) -> Callable[[CallSite], str]:
    def operand(c: CallSite, i: int) -> str:
        code, dt = c.args[i]
        return f"({code} != 0)" if c.fn.startswith("logical") and dt is not DType.bool else code

    return lambda c: f"({operand(c, 0)} {op} {operand(c, 1)})"


def _bitwise_not(c: CallSite) -> str:
    if c.dtype is DType.bool:
        return f"({c.args[0][0]} == 0)"
    # uint8 by xor (Triton's interpreter has no ~ for unsigned types)
    return f"({c.args[0][0]} ^ 255)" if c.dtype is DType.uint8 else f"(~{c.args[0][0]})"


def _extremum(fn: str) -> Callable[[CallSite], str]:
    def spell(c: CallSite) -> str:
        nan = ", propagate_nan=tl.PropagateNan.ALL" if c.dtype.is_float else ""
        return f"tl.{fn}({c.cast(0)}, {c.cast(1)}{nan})"

    return spell


def _where(c: CallSite) -> str:
    code, dt = c.args[0]
    cond = code if dt is DType.bool else f"({code} != 0)"
    return f"tl.where({cond}, {c.cast(1)}, {c.cast(2)})"


def _pow_scalar(c: CallSite) -> str:
    e = c.params["exponent"]
    if e in (1, 2, 3):
        return "(" + " * ".join([c.x] * int(e)) + ")"
    return f"tl.sqrt({c.x})" if e == 0.5 else f"sf_pow({c.x}, {literal(e, DType.float32)})"


def _gelu(c: CallSite) -> str | None:
    if not c.wide.is_float:
        return None
    x = c.x
    if c.params.get("approximate") == "tanh":
        return f"(0.5 * {x} * (1.0 + sf_tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x}))))"
    return f"(0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476)))"


def _clamp(c: CallSite) -> str:
    out = c.x
    if c.params.get("min") is not None:
        lo = literal(c.params["min"], c.wide)
        out = f"tl.where({out} < {lo}, {lo}, {out})"
    if c.params.get("max") is not None:
        hi = literal(c.params["max"], c.wide)
        out = f"tl.where({out} > {hi}, {hi}, {out})"
    return out


def _float(fn: str) -> Callable[[CallSite], str | None]:
    return lambda c: f"{fn}({c.x})" if c.wide.is_float else None


SPELLING: dict[str, Callable[[CallSite], str | None]] = {
    "add": lambda c: f"({c.cast(0)} + {c.cast(1)})",
    "sub": lambda c: f"({c.cast(0)} - {c.cast(1)})",
    "mul": lambda c: f"({c.cast(0)} * {c.cast(1)})",
    "div": _div,
    **{
        fn: _compare(op)
        for fn, op in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))
    },  # fmt: skip
    "logical_and": _logical("&"),
    "bitwise_and": _logical("&"),
    "logical_or": _logical("|"),
    "bitwise_or": _logical("|"),
    "logical_not": lambda c: f"({c.args[0][0]} == 0)",
    "bitwise_not": _bitwise_not,
    "maximum": _extremum("maximum"),
    "minimum": _extremum("minimum"),
    "where": _where,
    "cast": lambda c: c.emitter.cast(c),  # rounds through the logical type (kernel.py)
    **{fn: _float(f"tl.{fn}") for fn in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf", "sigmoid")},
    "tanh": _float("sf_tanh"),
    "abs": lambda c: f"tl.abs({c.x})" if c.dtype is not DType.bool else c.x,
    "neg": lambda c: f"(-{c.x})",
    "reciprocal": lambda c: f"(1.0 / {c.x})",
    "silu": lambda c: f"({c.x} * tl.sigmoid({c.x}))",
    "relu": lambda c: f"tl.where({c.x} < 0, 0, {c.x})",
    "pow": lambda c: f"sf_pow({c.x}, {c.cast(1)})",
    "pow_scalar": _pow_scalar,
    "gelu": _gelu,
    "fmod": lambda c: f"({c.x} % {c.cast(1)})" if c.wide.is_float else None,  # Triton's % of floats is fmod
    "clamp": _clamp,
}
UNSPELLED = {
    "from_end": "a checked gather index, spelled by the kernel emitter",
    **{
        f.name: "a function of C's math library, which Triton has no portable form of"
        for f in FUNCTIONS.values()
        if f.libm and f.name not in SPELLING
    },
}
