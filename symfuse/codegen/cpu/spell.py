"""How the CPU backend spells each function of the scalar vocabulary (`te/scalar.py`) in C++.

`SPELLING[name](c)` is the C++ of one call, `c` a `CallSite`: its operands as C++ (already
computed, with their dtypes), the result's dtype and C type, its parameters and what of the
kernel a spelling may need (an error site for a checked division, the row's hoisted scalars).
A spelling returns None where the function has no C++ for that dtype; the kernel then runs
through torch, and `explain` says why. `LIBM` names the functions that become scalar calls
of C's math library (on targets without a vector math library, a loop over them does not
vectorise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from symfuse.codegen.cpu.c import CTYPE, literal
from symfuse.ir.dtypes import DType
from symfuse.te.scalar import FUNCTIONS


@dataclass
class CallSite:
    fn: str
    dtype: DType
    args: list[tuple[str, DType]]  # the operands as C++, each with its dtype
    params: dict
    site: Callable[[str], str] = field(repr=False)  # the error site of a checked operation
    row_scalars: set[str] = field(default_factory=set)  # values computed once a row (hoisted)
    data_mask: bool = False  # where's condition reads memory (not an index guard)

    @property
    def ct(self) -> str:
        return CTYPE[self.dtype]

    @property
    def f(self) -> str:  # libm's suffix for float32
        return "f" if self.dtype is DType.float32 else ""

    def cast(self, i: int) -> str:
        code, dt = self.args[i]
        return code if dt is self.dtype else f"{self.ct}({code})"

    @property
    def x(self) -> str:
        return self.cast(0)

    @property
    def one(self) -> str:
        return literal(1.0, self.dtype) if self.dtype.is_float else "1"

    @property
    def expf(self) -> str:
        return "sf_expf" if self.f else "exp"


def _div(c: CallSite) -> str:
    rm, a, b = c.params.get("rounding_mode"), c.cast(0), c.cast(1)
    if not c.dtype.is_float:  # floor or trunc: checked for a zero divisor
        checked = "sf_ifloordiv" if rm == "floor" else "sf_idiv"
        return f"{checked}<{c.ct}>({a}, {b}, {c.site('an integer division')})"
    if rm in ("floor", "trunc"):
        return f"{rm}{c.f}({a} / {b})"
    if c.args[1][0] in c.row_scalars:  # a softmax's sum, say
        return f"({a} * ({c.ct}(1) / {b}))"  # one division a row, hoisted; within an ulp, as ATen does
    return f"({a} / {b})"


def _pow_scalar(c: CallSite) -> str:
    e = c.params["exponent"]
    if e in (2, 3):
        return "(" + " * ".join([c.x] * int(e)) + ")"
    return f"sqrt{c.f}({c.x})" if e == 0.5 else f"pow{c.f}({c.x}, {literal(e, c.dtype)})"


def _clamp(c: CallSite) -> str:
    out = c.x
    if c.params.get("min") is not None:
        out = f"std::max<{c.ct}>({out}, {literal(c.params['min'], c.dtype)})"
    if c.params.get("max") is not None:
        out = f"std::min<{c.ct}>({out}, {literal(c.params['max'], c.dtype)})"
    return out


def _where(c: CallSite) -> str:
    if c.data_mask:  # a data-dependent mask: both sides are in range, select without a branch
        return f"sf_select<{c.ct}>({c.args[0][0]}, {c.cast(1)}, {c.cast(2)})"
    return f"({c.args[0][0]} ? {c.cast(1)} : {c.cast(2)})"  # an index guard (concat): lazy


def _infix(op: str, cast: bool = True) -> Callable[[CallSite], str]:
    return lambda c: f"({c.cast(0)} {op} {c.cast(1)})" if cast else f"({c.args[0][0]} {op} {c.args[1][0]})"


def _libm(name: str) -> Callable[[CallSite], str]:
    return lambda c: f"{name}{c.f}({', '.join(c.cast(i) for i in range(len(c.args)))})"


def _extremum(fn: str) -> Callable[[CallSite], str]:
    return lambda c: f"{'sf_' + fn if c.dtype.is_float else 'std::' + fn[:3]}<{c.ct}>({c.cast(0)}, {c.cast(1)})"


def _own_f32(name: str) -> Callable[[CallSite], str]:  # c.py's vector-friendly float32 version, else libm
    return lambda c: f"sf_{name}f({c.x})" if c.dtype is DType.float32 else f"{name}({c.x})"


SPELLING: dict[str, Callable[[CallSite], str | None]] = {
    "add": _infix("+"),
    "sub": _infix("-"),
    "mul": _infix("*"),
    "div": _div,
    **{
        fn: _infix(op, cast=False)
        for fn, op in (
            ("eq", "=="),
            ("ne", "!="),
            ("lt", "<"),
            ("le", "<="),
            ("gt", ">"),
            ("ge", ">="),
            ("logical_and", "&&"),
            ("logical_or", "||"),
            ("bitwise_and", "&"),
            ("bitwise_or", "|"),
        )
    },  # fmt: skip
    "maximum": _extremum("maximum"),
    "minimum": _extremum("minimum"),
    "where": _where,
    "cast": lambda c: f"{c.ct}({c.args[0][0]})",
    "exp": _own_f32("exp"),
    "erf": _own_f32("erf"),
    **{fn: _libm(fn) for fn in ("log", "sqrt", "tanh", "sin", "cos", "pow")},
    **{f.name: _libm(f.name) for f in FUNCTIONS.values() if f.libm},
    "pow_scalar": _pow_scalar,
    "rsqrt": lambda c: f"({c.one} / sqrt{c.f}({c.x}))",
    "reciprocal": lambda c: f"({c.one} / {c.x})",
    "sigmoid": lambda c: f"({c.one} / ({c.one} + {c.expf}(-{c.x})))",
    "silu": lambda c: f"({c.x} / ({c.one} + {c.expf}(-{c.x})))",
    "abs": lambda c: f"std::abs({c.x})" if c.dtype is not DType.bool else c.x,
    "neg": lambda c: f"(-{c.x})",
    "relu": lambda c: f"std::max<{c.ct}>({c.x}, {c.ct}(0))",
    "logical_not": lambda c: f"(!{c.args[0][0]})",
    "bitwise_not": lambda c: f"(!{c.x})" if c.dtype is DType.bool else f"(~{c.x})",
    "gelu": lambda c: (
        f"sf_gelu_{'tanh' if c.params.get('approximate') == 'tanh' else 'erf'}({c.x})"
        if c.dtype is DType.float32
        else None
    ),  # fmt: skip
    "clamp": _clamp,
    # from_end is spelled by the kernel itself: a checked index (kernel.py)
}
UNSPELLED = {"from_end": "a checked gather index, spelled by the kernel emitter"}
# functions that call C's math library (a scalar call on targets without vector math) but
# those c.py or the ISA computes itself: sqrt is an instruction, exp and erf float32 are c.py's
LIBM = {"log", "sqrt", "tanh", "sin", "cos", "exp", "erf", "pow"} | {f.name for f in FUNCTIONS.values() if f.libm}
