"""The op registry: every op symfuse knows, declared once.

An `OpDef` holds everything about an op: its schema (input and attribute names), its
dtype rule, its symbolic shape rule (which also states the constraints the op implies,
through the `ShapeContext`), its fusion kind, an optional value-bounds rule for integer
tensors (how an `arange` bounds the indices of an embedding lookup), and its reference
implementation in torch. Adding an op means adding one `defop` call here or in a sibling
module, one entry in the frontend's mapping table, and one row in the op tests.

Conventions: rules receive inputs positionally (a list for a variadic input `xs*`, None
for an absent optional input `bias?`) and attributes by keyword. A shape rule returns a
tuple of dims for one output or a list of such tuples for several; a dtype rule likewise
returns one DType or a list.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from symfuse.ir.dtypes import DType, promote
from symfuse.ir.types import TensorType


class Kind(enum.Enum):
    """How an op takes part in fusion (Souffle's and BladeDISC's classes)."""

    ELEMENTWISE = "elementwise"  # out[i] relies on in[i] of each operand (with broadcast)
    BROADCAST = "broadcast"  # out[i] relies on one element of a smaller input
    INJECTIVE = "injective"  # layout: reshape, permute, slice, concat, gather; an index map
    REDUCTION = "reduction"  # out[i] relies on many inputs of one region
    COMPUTE = "compute"  # compute-intensive: GEMM, convolution, attention
    OPAQUE = "opaque"  # run as one unit (e.g. a recurrent layer)


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: Kind
    inputs: tuple[str, ...]
    attrs: tuple[str, ...]
    shape: Callable[..., Any]
    dtype: Callable[..., Any]
    ref: Callable[..., Any]
    bounds: Callable[..., Any] | None = None
    lower: Callable[..., Any] | None = None  # TE lowering rule (symfuse.te.rules); None: opaque
    constraints: str = ""
    doc: str = ""

    @property
    def variadic(self) -> bool:
        return any(i.endswith("*") for i in self.inputs)

    def optional(self, i: int) -> bool:
        return self.inputs[i].endswith("?")

    def pack(self, values: list) -> list:
        """Node inputs as the rules take them: a variadic input becomes one list."""
        if not self.variadic:
            return list(values)
        (k,) = [i for i, n in enumerate(self.inputs) if n.endswith("*")]
        tail = len(self.inputs) - k - 1
        return list(values[:k]) + [list(values[k : len(values) - tail])] + list(values[len(values) - tail :])

    def check_schema(self, n_inputs: int, attrs: dict) -> None:
        fixed = len([i for i in self.inputs if not i.endswith("*")])
        if (n_inputs != fixed) if not self.variadic else (n_inputs < fixed):
            raise TypeError(f"op {self.name} takes inputs ({', '.join(self.inputs)}), got {n_inputs}")
        if set(attrs) != set(self.attrs):
            raise TypeError(f"op {self.name} takes attributes {sorted(self.attrs)}, got {sorted(attrs)}")


REGISTRY: dict[str, OpDef] = {}


def defop(
    name: str, kind: Kind, inputs, attrs=(), *, shape, dtype, ref, bounds=None, lower=None, constraints="", doc=""
) -> OpDef:
    if name in REGISTRY:
        raise ValueError(f"op {name} is registered twice")
    REGISTRY[name] = OpDef(name, kind, tuple(inputs), tuple(attrs), shape, dtype, ref, bounds, lower, constraints, doc)
    return REGISTRY[name]


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op named {name!r} in the symfuse registry") from None


# -- dtype rules shared by many ops --------------------------------------------------


def same_dtype(i: int = 0):
    def rule(*ins, **_):
        return ins[i].dtype

    return rule


def promoted(*ins, **_) -> DType:
    ts = [t for t in ins if isinstance(t, TensorType)]
    return promote(*[(t.dtype, t.rank) for t in ts])


def fixed_dtype(dt: DType):
    return lambda *ins, **_: dt


def float_promoted(*ins, **_) -> DType:
    dt = promoted(*ins)
    return dt if dt.is_float else DType.float32


# -- shape rules shared by many ops --------------------------------------------------


def same_shape(i: int = 0):
    def rule(ctx, *ins, **_):
        return ins[i].shape

    return rule


def broadcast_shape(ctx, *ins, **_):
    return ctx.broadcast(*[t.shape for t in ins if isinstance(t, TensorType)])
