"""The vocabulary of scalar functions: what a `Call` in a tensor expression may name.

Each function is declared once, here: its arity, its keyword parameters, the rule that gives
its result's dtype, and its reference on torch tensors (which the TE interpreter evaluates
and the element-wise ops of the registry run as their reference). A backend spells each one
in its own table (`codegen/cpu/spell.py`, `codegen/gpu/spell.py`), and a test fails when a
backend has no spelling and no stated reason for lacking one.

Adding an element-wise function: its entry here (a unary one becomes an op of the registry
and an aten mapping by its name), its spelling in each backend, its row in the tests' table.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


class Result(enum.Enum):
    """How a function's result dtype follows from its operands'."""

    FLOAT = "float"  # the operands promoted, float32 if that is not a float type (exp of an int)
    SAME = "same"  # the first operand's
    PROMOTED = "promoted"  # the operands promoted as torch promotes them
    BOOL = "bool"  # a predicate
    OWN = "own"  # a rule of the op's own (div, where, cast, pow_scalar), in its registry entry


@dataclass(frozen=True)
class ScalarFn:
    name: str
    arity: int
    result: Result
    ref: Callable  # the reference on torch tensors, with the keyword parameters
    params: tuple[str, ...] = ()
    libm: bool = False  # C's <math.h> has it under this name (`acosf` for float32)
    postop: str = ""  # oneDNN's name for it as a GEMM's epilogue ("swish" for silu), if it is one


def _fns(*fns: ScalarFn) -> dict[str, ScalarFn]:
    return {f.name: f for f in fns}


_LIBM_UNARY = {
    "acos": torch.acos,
    "asin": torch.asin,
    "atan": torch.atan,
    "acosh": torch.acosh,
    "asinh": torch.asinh,
    "atanh": torch.atanh,
    "erfc": torch.erfc,
}
_LIBM_BINARY = {"atan2": torch.atan2, "copysign": torch.copysign, "fmod": torch.fmod}

FUNCTIONS: dict[str, ScalarFn] = _fns(
    # unary, float results
    ScalarFn("exp", 1, Result.FLOAT, torch.exp),
    ScalarFn("log", 1, Result.FLOAT, torch.log),
    ScalarFn("sqrt", 1, Result.FLOAT, torch.sqrt),
    ScalarFn("rsqrt", 1, Result.FLOAT, torch.rsqrt),
    ScalarFn("tanh", 1, Result.FLOAT, torch.tanh, postop="tanh"),
    ScalarFn("sigmoid", 1, Result.FLOAT, torch.sigmoid, postop="sigmoid"),
    ScalarFn("erf", 1, Result.FLOAT, torch.erf),
    ScalarFn("sin", 1, Result.FLOAT, torch.sin),
    ScalarFn("cos", 1, Result.FLOAT, torch.cos),
    ScalarFn("reciprocal", 1, Result.FLOAT, torch.reciprocal),
    ScalarFn("silu", 1, Result.FLOAT, F.silu, postop="swish"),
    *(ScalarFn(n, 1, Result.FLOAT, f, libm=True) for n, f in _LIBM_UNARY.items()),
    # unary, the operand's dtype
    ScalarFn("abs", 1, Result.SAME, torch.abs),
    ScalarFn("neg", 1, Result.SAME, torch.neg),
    ScalarFn("relu", 1, Result.SAME, torch.relu, postop="relu"),
    ScalarFn("bitwise_not", 1, Result.SAME, torch.bitwise_not),
    ScalarFn("logical_not", 1, Result.BOOL, torch.logical_not),
    ScalarFn(
        "gelu",
        1,
        Result.SAME,
        lambda x, approximate="none": F.gelu(x, approximate=approximate),
        ("approximate",),
        postop="gelu",
    ),  # fmt: skip
    ScalarFn("clamp", 1, Result.SAME, lambda x, min=None, max=None: torch.clamp(x, min, max), ("min", "max")),
    ScalarFn("pow_scalar", 1, Result.OWN, lambda x, exponent: torch.pow(x, exponent), ("exponent",)),
    ScalarFn("cast", 1, Result.OWN, lambda x, dtype: x.to(dtype.torch), ("dtype",)),
    # binary
    ScalarFn("add", 2, Result.PROMOTED, torch.add),
    ScalarFn("sub", 2, Result.PROMOTED, torch.sub),
    ScalarFn("mul", 2, Result.PROMOTED, torch.mul),
    ScalarFn("maximum", 2, Result.PROMOTED, torch.maximum),
    ScalarFn("minimum", 2, Result.PROMOTED, torch.minimum),
    ScalarFn("pow", 2, Result.PROMOTED, torch.pow),
    ScalarFn("bitwise_and", 2, Result.PROMOTED, torch.bitwise_and),
    ScalarFn("bitwise_or", 2, Result.PROMOTED, torch.bitwise_or),
    ScalarFn(
        "div",
        2,
        Result.OWN,
        lambda a, b, rounding_mode=None: torch.div(a, b, rounding_mode=rounding_mode),
        ("rounding_mode",),
    ),  # fmt: skip
    *(ScalarFn(n, 2, Result.FLOAT, f, libm=True) for n, f in _LIBM_BINARY.items()),
    ScalarFn("eq", 2, Result.BOOL, torch.eq),
    ScalarFn("ne", 2, Result.BOOL, torch.ne),
    ScalarFn("lt", 2, Result.BOOL, torch.lt),
    ScalarFn("le", 2, Result.BOOL, torch.le),
    ScalarFn("gt", 2, Result.BOOL, torch.gt),
    ScalarFn("ge", 2, Result.BOOL, torch.ge),
    ScalarFn("logical_and", 2, Result.BOOL, torch.logical_and),
    ScalarFn("logical_or", 2, Result.BOOL, torch.logical_or),
    # ternary
    ScalarFn("where", 3, Result.OWN, torch.where),
    # an index read from memory counted from the end where negative (gathers): no op of its own
    ScalarFn("from_end", 2, Result.SAME, lambda i, n: torch.where(i < 0, i + n, i)),
)

# a GEMM's epilogue activation by oneDNN's name -> the function it is
POSTOPS = {f.name: f.postop for f in FUNCTIONS.values() if f.postop}


def unary_ops() -> list[ScalarFn]:
    """The functions that are element-wise ops of their own, by their name, with one tensor
    operand and no parameters (the registry defines these from this table)."""
    return [f for f in FUNCTIONS.values() if f.arity == 1 and not f.params and f.result is not Result.OWN]
