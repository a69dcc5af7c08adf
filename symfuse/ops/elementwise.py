"""Element-wise ops, scalars and tensor creation.

Binary ops broadcast numpy-style; two dynamic dims that meet in a broadcast are made
equal (see `ShapeContext.broadcast`). Python scalars in a model become 0-d `full` nodes,
which promote exactly as torch promotes a Python scalar.
"""

from __future__ import annotations

import sympy
import torch
import torch.nn.functional as F

from symfuse.ir.dims import ceildiv, dim
from symfuse.ir.dtypes import DType
from symfuse.ops.registry import (
    Kind,
    broadcast_shape,
    defop,
    fixed_dtype,
    float_promoted,
    promoted,
    same_dtype,
    same_shape,
)
from symfuse.te.rules import arange_rule, batch_norm_rule, cast_rule, full_rule, pointwise
from symfuse.te.scalar import FUNCTIONS, Result, unary_ops

# -- unary ---------------------------------------------------------------------------

_RESULT = {Result.FLOAT: float_promoted, Result.SAME: same_dtype(), Result.BOOL: fixed_dtype(DType.bool)}

for _f in unary_ops():  # exp, silu, abs, ... : one op per function of the vocabulary
    defop(_f.name, Kind.ELEMENTWISE, ("x",), shape=same_shape(), dtype=_RESULT[_f.result], ref=_f.ref,
          lower=pointwise(_f.name))  # fmt: skip
defop(
    "gelu",
    Kind.ELEMENTWISE,
    ("x",),
    ("approximate",),
    shape=same_shape(),
    dtype=same_dtype(),
    ref=FUNCTIONS["gelu"].ref,
    lower=pointwise("gelu"),
    doc="approximate is 'none' (erf) or 'tanh'",
)
defop(
    "pow_scalar",
    Kind.ELEMENTWISE,
    ("x",),
    ("exponent",),
    shape=same_shape(),
    dtype=lambda x, exponent: x.dtype if (x.dtype.is_float or isinstance(exponent, int)) else DType.float32,
    ref=FUNCTIONS["pow_scalar"].ref,
    lower=pointwise("pow_scalar"),
)
defop(
    "clamp",
    Kind.ELEMENTWISE,
    ("x",),
    ("min", "max"),
    shape=same_shape(),
    dtype=same_dtype(),
    ref=FUNCTIONS["clamp"].ref,
    lower=pointwise("clamp"),
)
defop(
    "cast",
    Kind.ELEMENTWISE,
    ("x",),
    ("dtype",),
    shape=same_shape(),
    dtype=lambda x, dtype: dtype,
    ref=FUNCTIONS["cast"].ref,
    lower=cast_rule,
    bounds=lambda ctx, b, dtype: b if not dtype.is_float else None,
)

# -- binary and ternary --------------------------------------------------------------

_BINARY = [f for f in FUNCTIONS.values() if f.arity == 2 and f.result is not Result.OWN and f.name != "from_end"]
_BROADCAST = "operands are equal after broadcast"


def _add_bounds(ctx, a, b):
    return (a[0] + b[0], a[1] + b[1]) if a and b else None


def _sub_bounds(ctx, a, b):
    return (a[0] - b[1], a[1] - b[0]) if a and b else None


_BOUNDS = {"add": _add_bounds, "sub": _sub_bounds}

for _f in _BINARY:  # add, eq, atan2, ...: one op per function of the vocabulary
    defop(
        _f.name,
        Kind.ELEMENTWISE,
        ("a", "b"),
        shape=broadcast_shape,
        dtype={**_RESULT, Result.PROMOTED: promoted}[_f.result],
        ref=_f.ref,
        bounds=_BOUNDS.get(_f.name),
        lower=pointwise(_f.name),
        constraints=_BROADCAST,
    )

defop(
    "div",
    Kind.ELEMENTWISE,
    ("a", "b"),
    ("rounding_mode",),
    shape=broadcast_shape,
    dtype=lambda a, b, rounding_mode: float_promoted(a, b) if rounding_mode is None else promoted(a, b),
    ref=FUNCTIONS["div"].ref,
    lower=pointwise("div"),
    constraints=_BROADCAST,
)
defop(
    "where",
    Kind.ELEMENTWISE,
    ("cond", "a", "b"),
    shape=broadcast_shape,
    dtype=lambda cond, a, b: promoted(a, b),
    ref=FUNCTIONS["where"].ref,
    lower=pointwise("where"),
    constraints=_BROADCAST,
)


def _batch_norm_shape(ctx, x, *stats):
    if x.rank < 2:
        raise ctx.error(f"batch norm needs rank >= 2, got {x}")
    for t in stats:
        if t is not None:
            ctx.eq(x.shape[1], t.shape[0], "channels match batch-norm statistics")
    return x.shape


defop(
    "batch_norm",
    Kind.ELEMENTWISE,
    ("x", "weight?", "bias?", "mean", "var"),
    ("eps",),
    shape=lambda ctx, x, w, b, mean, var, eps: _batch_norm_shape(ctx, x, w, b, mean, var),
    dtype=same_dtype(),
    ref=lambda x, w, b, mean, var, eps: F.batch_norm(x, mean, var, w, b, False, 0.0, eps),
    lower=batch_norm_rule,
    constraints="x.shape[1] equals the length of every statistic",
    doc="inference-mode batch norm: a per-channel affine map",
)

# -- creation ------------------------------------------------------------------------


def _full_bounds(ctx, shape, value, dtype):
    if dtype.is_float or isinstance(value, float):
        return None
    return (dim(value), dim(value)) if isinstance(value, sympy.Expr) else (dim(int(value)), dim(int(value)))


defop(
    "full",
    Kind.ELEMENTWISE,
    (),
    ("shape", "value", "dtype"),
    shape=lambda ctx, shape, value, dtype: tuple(shape),
    dtype=lambda shape, value, dtype: dtype,
    ref=lambda shape, value, dtype: torch.full(tuple(shape), value, dtype=dtype.torch),
    lower=full_rule,
    bounds=_full_bounds,
    doc="a tensor filled with one value; 0-d `full` nodes are a model's scalars",
)


def _arange_shape(ctx, start, end, step, dtype):
    if step == 0:
        raise ctx.error("arange step is 0")
    n = ctx.canon(ceildiv(dim(end) - dim(start), step) if step != 1 else dim(end) - dim(start))
    ctx.le(0, n, "arange length is not negative")
    return (n,)


defop(
    "arange",
    Kind.ELEMENTWISE,
    (),
    ("start", "end", "step", "dtype"),
    shape=_arange_shape,
    dtype=lambda start, end, step, dtype: dtype,
    ref=lambda start, end, step, dtype: torch.arange(start, end, step, dtype=dtype.torch),
    lower=arange_rule,
    bounds=lambda ctx, start, end, step, dtype: (dim(start), dim(end) - 1) if step == 1 else None,
)
