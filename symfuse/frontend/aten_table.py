"""The mapping from torch.export's ATen ops to symfuse registry ops.

One entry per ATen overload. A converter receives the `Converter` (which resolves FX
arguments to symfuse values, dims and scalars) and the bound arguments of the node, and
emits registry ops. Small compositions (split into slices, diff into slices and a
subtract, addmm into matmul and add) happen here so the registry stays small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from symfuse.frontend import composite as cs
from symfuse.frontend import paged as _paged  # noqa: F401  (registers symfuse::paged_attention)
from symfuse.frontend.composite import arg_extreme, conv_transpose2d, pad_constant
from symfuse.ir.dims import dim, exact_quotient, product, slice_bound
from symfuse.ir.dtypes import DType, promote
from symfuse.te.scalar import unary_ops

aten = torch.ops.aten


class Unsupported(Exception):
    """This use of a known op cannot be captured (a reason, not a crash)."""


ATEN: dict[Any, Callable] = {}


def converts(*targets):
    def register(fn):
        for t in targets:
            ATEN[t] = fn
        return fn

    return register


def _pair(v) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (int(v[0]), int(v[-1]))


def _single(v) -> int:
    """A 1-D op's stride, padding or dilation, given as a number or a one-element list."""
    return int(v[0] if isinstance(v, (list, tuple)) else v)


def _dt(v) -> DType | None:
    return DType.of(v) if v is not None else None


# -- element-wise --------------------------------------------------------------------

UNARY = {getattr(aten, f.name).default: f.name for f in unary_ops()}  # aten.exp.default: "exp", ...
for _t, _op in UNARY.items():
    ATEN[_t] = lambda cv, a, _op=_op: cv.emit(_op, [cv.tensor(a["self"])])

BINARY = {
    aten.add.Tensor: "add", aten.add.Scalar: "add", aten.sub.Tensor: "sub", aten.sub.Scalar: "sub",
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.maximum.default: "maximum",
    aten.minimum.default: "minimum", aten.max.other: "maximum", aten.min.other: "minimum",
    aten.pow.Tensor_Tensor: "pow", aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne",
    aten.ne.Scalar: "ne", aten.lt.Tensor: "lt", aten.lt.Scalar: "lt", aten.le.Tensor: "le",
    aten.le.Scalar: "le", aten.gt.Tensor: "gt", aten.gt.Scalar: "gt", aten.ge.Tensor: "ge",
    aten.ge.Scalar: "ge", aten.__and__.Tensor: "bitwise_and", aten.bitwise_and.Tensor: "bitwise_and",
    aten.__or__.Tensor: "bitwise_or", aten.bitwise_or.Tensor: "bitwise_or",
    aten.logical_and.default: "logical_and", aten.logical_or.default: "logical_or",
    aten.atan2.default: "atan2", aten.copysign.Tensor: "copysign", aten.copysign.Scalar: "copysign",
}  # fmt: skip


def _binary(op):
    def convert(cv, a):
        x, y = cv.operand(a["self"]), cv.operand(a["other"] if "other" in a else a["exponent"])
        alpha = a.get("alpha", 1)
        if alpha != 1:
            y = cv.emit("mul", [y, cv.operand(alpha)])
        return cv.emit(op, [x, y])

    return convert


for _t, _op in BINARY.items():
    ATEN[_t] = _binary(_op)


@converts(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(cv, a):
    y = cv.operand(a["self"])
    if a.get("alpha", 1) != 1:
        y = cv.emit("mul", [y, cv.operand(a["alpha"])])
    return cv.emit("sub", [cv.operand(a["other"]), y])


@converts(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div(cv, a):
    x, y, mode = cv.operand(a["self"]), cv.operand(a["other"]), a.get("rounding_mode")
    return cs.floor_divide(cv, x, y) if mode == "floor" else cv.emit("div", [x, y], rounding_mode=mode)


@converts(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def _where(cv, a):
    return cv.emit("where", [cv.tensor(a["condition"]), cv.operand(a["self"]), cv.operand(a["other"])])


@converts(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(cv, a):
    x = cv.tensor(a["self"])
    return cv.emit("where", [cv.tensor(a["mask"]), _filler(cv, a["value"], x.type.dtype), x])


def _filler(cv, value, dtype: DType):
    """`value` (a Python number or a 0-dim tensor) as a scalar of `dtype`, as torch converts a
    fill value to the filled tensor's dtype."""
    if isinstance(value, torch.fx.Node):  # a tensor, or a size the model computed
        v = cv.operand(value)
        return v if v.type.dtype == dtype else cv.emit("cast", [v], dtype=dtype)
    v = bool(value) if dtype == DType.bool else float(value) if dtype.is_float else int(value)
    return cv.b.scalar(v, dtype=dtype, loc=cv.loc)


@converts(aten.log1p.default)
def _log1p(cv, a):
    return cv.emit("log", [cv.emit("add", [cv.tensor(a["self"]), cv.operand(1.0)])])


@converts(aten.elu.default, aten.celu.default)
def _elu(cv, a):
    x = cv.tensor(a["self"])
    if cv.target is aten.celu.default:
        alpha = float(a.get("alpha", 1.0))
        return cs.elu(cv, x, alpha, input_scale=1 / alpha)
    alpha, scale, in_scale = (float(a.get(k, 1.0)) for k in ("alpha", "scale", "input_scale"))
    return cs.elu(cv, x, alpha, scale, in_scale)


@converts(aten.leaky_relu.default, aten.rrelu.default)
def _leaky_relu(cv, a):
    """Leaky ReLU; RReLU at inference is one with the mean of its slopes (training draws them)."""
    x = cv.tensor(a["self"])
    if cv.target is aten.rrelu.default:
        if a.get("training", False):
            raise Unsupported("rrelu in training mode (random slopes)")
        slope = (float(a.get("lower", 0.125)) + float(a.get("upper", 1.0 / 3.0))) / 2
    else:
        slope = float(a.get("negative_slope", 0.01))
    return cv.emit("where", [cv.emit("gt", [x, cv.operand(0.0)]), x, cv.emit("mul", [x, cv.operand(slope)])])


@converts(aten.round.decimals)
def _round_decimals(cv, a):
    """Round half to even at `decimals` digits, as torch: x * 10^d rounded, divided by 10^d
    (for negative d: x / 10^-d rounded, times 10^-d), with 10^|d| in the tensor's type."""
    x, d = cv.tensor(a["self"]), int(a.get("decimals", 0))
    if d == 0 or not x.type.dtype.is_float:
        return cs.round_half_even(cv, x)
    ten = cs.scalar(cv, x, float(torch.tensor(10.0 ** abs(d), dtype=x.type.dtype.torch)))
    if d > 0:
        return cv.emit("div", [cs.round_half_even(cv, cv.emit("mul", [x, ten])), ten], rounding_mode=None)
    return cv.emit("mul", [cs.round_half_even(cv, cv.emit("div", [x, ten], rounding_mode=None)), ten])


@converts(aten.fmod.Scalar, aten.fmod.Tensor, aten.remainder.Scalar, aten.remainder.Tensor)
def _fmod(cv, a):
    """fmod: C's remainder (the dividend's sign); remainder: Python's (the divisor's)."""
    x, y = cv.operand(a["self"]), cv.operand(a["other"])
    return cs.remainder(cv, x, y, c_style=cv.target in (aten.fmod.Scalar, aten.fmod.Tensor))


_UNARY_COMPOSITES = {
    aten.round.default: cs.round_half_even, aten.sign.default: cs.sign_to_zero, aten.trunc.default: cs.trunc,
    aten.sgn.default: cs.sign_to_zero,
    aten.floor.default: cs.floor, aten.ceil.default: cs.ceil, aten.tan.default: cs.tan,
    aten.sinh.default: lambda cv, x: cs.hyperbolic(cv, x, odd=True),
    aten.cosh.default: lambda cv, x: cs.hyperbolic(cv, x, odd=False),
    aten.frac.default: lambda cv, x: cv.emit("sub", [x, cs.trunc(cv, x)]),
    aten.expm1.default: lambda cv, x: cv.emit("sub", [cv.emit("exp", [x]), cs.scalar(cv, x, 1)]),
    aten.exp2.default: lambda cv, x: cv.emit("exp", [cv.emit("mul", [x, cs.scalar(cv, x, 0.6931471805599453)])]),
    aten.log2.default: lambda cv, x: cv.emit("mul", [cv.emit("log", [x]), cs.scalar(cv, x, 1.4426950408889634)]),
    aten.log10.default: lambda cv, x: cv.emit("mul", [cv.emit("log", [x]), cs.scalar(cv, x, 0.4342944819032518)]),
    aten.isinf.default: cs.isinf, aten.isnan.default: cs.isnan, aten.signbit.default: cs.signbit,
    aten.isposinf.default: lambda cv, x: cs.isinf(cv, x, negative=False),
    aten.isneginf.default: lambda cv, x: cs.isinf(cv, x, positive=False),
}  # fmt: skip


@converts(*_UNARY_COMPOSITES)
def _unary_composite(cv, a):
    """Element-wise ops written as several registry ops (`composite`); exp2, log2 and log10
    through exp and log by a constant factor, expm1 as exp(x) - 1 (which loses the digits
    of a tiny x that torch's keeps, within 1e-7 of the output's scale)."""
    x = cv.tensor(a["self"])
    if not x.type.dtype.is_float and cv.target in (aten.exp2.default, aten.log2.default, aten.log10.default,
                                                   aten.expm1.default, aten.tan.default, aten.sinh.default,
                                                   aten.cosh.default):  # fmt: skip
        x = cv.emit("cast", [x], dtype=DType.float32)
    return _UNARY_COMPOSITES[cv.target](cv, x)


@converts(aten.logical_xor.default, aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)
def _xor(cv, a):
    x, y = cv.operand(a["self"]), cv.operand(a["other"])
    if cv.target is aten.logical_xor.default:
        return cv.emit("ne", [cs.truth(cv, x), cs.truth(cv, y)])
    return cs.bitwise_xor(cv, x, y)


@converts(aten.fmax.default, aten.fmin.default)
def _fmax(cv, a):
    op = "maximum" if cv.target is aten.fmax.default else "minimum"
    return cs.nan_ignoring_extreme(cv, cv.tensor(a["self"]), cv.tensor(a["other"]), op)


@converts(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
def _xlogy(cv, a):
    return cs.xlogy(cv, cv.operand(a["self"]), cv.operand(a["other"]))


@converts(aten.heaviside.default)
def _heaviside(cv, a):
    return cs.heaviside(cv, cv.tensor(a["self"]), cv.tensor(a["values"]))


@converts(aten.hypot.default)
def _hypot(cv, a):
    x, y = cv.tensor(a["self"]), cv.tensor(a["other"])
    return cv.emit("sqrt", [cv.emit("add", [cv.emit("mul", [x, x]), cv.emit("mul", [y, y])])])


@converts(aten.nan_to_num.default)
def _nan_to_num(cv, a):
    """NaN to `nan` (0), +-inf to `posinf`/`neginf` (the dtype's largest and smallest)."""
    x = cv.tensor(a["self"])
    if not x.type.dtype.is_float:
        return x
    info = torch.finfo(x.type.dtype.torch)
    nan, pos, neg = (a.get(k) for k in ("nan", "posinf", "neginf"))
    y = cv.emit("where", [cv.emit("ne", [x, x]), cs.scalar(cv, x, 0.0 if nan is None else nan), x])
    y = cv.emit("where", [cs.isinf(cv, x, negative=False), cs.scalar(cv, x, info.max if pos is None else pos), y])
    return cv.emit("where", [cs.isinf(cv, x, positive=False), cs.scalar(cv, x, info.min if neg is None else neg), y])


@converts(aten.one_hot.default)
def _one_hot(cv, a):
    depth = int(a.get("num_classes", -1))
    if depth < 0:
        raise Unsupported("one_hot without num_classes (its size would depend on the data)")
    return cv.emit("cast", [cs.one_hot(cv, cv.tensor(a["self"]), depth)], dtype=DType.int64)


@converts(aten.pow.Tensor_Scalar)
def _pow_scalar(cv, a):
    return cv.emit("pow_scalar", [cv.tensor(a["self"])], exponent=a["exponent"])


@converts(aten.pow.Scalar)
def _pow_base(cv, a):
    return cv.emit("pow", [cv.operand(a["self"]), cv.tensor(a["exponent"])])


@converts(aten.gelu.default)
def _gelu(cv, a):
    return cv.emit("gelu", [cv.tensor(a["self"])], approximate=a.get("approximate", "none"))


@converts(
    aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default, aten.clamp.Tensor,
    aten.clamp_min.Tensor, aten.clamp_max.Tensor,
)  # fmt: skip
def _clamp(cv, a):
    lo = a.get("min", a.get("min_val"))
    hi = a.get("max", a.get("max_val"))
    x = cv.tensor(a["self"])
    if all(v is None or isinstance(v, (int, float)) for v in (lo, hi)):
        # the bounds take part in type promotion: a bool tensor clamped by integers is int64,
        # an integer one clamped by a float is float
        bounds = [(DType.float32 if isinstance(v, float) else DType.int64, 0) for v in (lo, hi) if v is not None]
        dt = promote((x.type.dtype, x.type.rank), *bounds)
        x = x if dt == x.type.dtype else cv.emit("cast", [x], dtype=dt)
        return cv.emit("clamp", [x], min=lo, max=hi)
    for v, op in ((lo, "maximum"), (hi, "minimum")):  # a bound that is a size (H - 1): as a scalar operand
        if v is not None:
            x = cv.emit(op, [x, _filler(cv, v, x.type.dtype)])
    return x


@converts(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.type_as.default)
def _to(cv, a):
    x = cv.tensor(a["self"])
    if "other" in a:
        dtype = cv.tensor(a["other"]).type.dtype
    else:
        dtype = _dt(a.get("dtype"))
    if dtype is None or dtype == x.type.dtype:
        return x
    return cv.emit("cast", [x], dtype=dtype)


@converts(
    aten.clone.default, aten.contiguous.default, aten.alias.default, aten.detach.default,
    aten.lift_fresh_copy.default, aten.dropout.default,
)  # fmt: skip
def _identity(cv, a):
    if a.get("train", False):
        raise Unsupported("dropout in training mode; call model.eval() before compiling")
    return cv.tensor(a["self"] if "self" in a else a["input"])


@converts(aten._assert_tensor_metadata.default)
def _assert_metadata(cv, a):
    x = cv.tensor(a["a"])
    if a.get("dtype") is not None and DType.of(a["dtype"]) != x.type.dtype:
        raise Unsupported(f"model asserts dtype {a['dtype']} for a tensor of dtype {x.type.dtype}")
    return None


# -- creation --------------------------------------------------------------------------


def _default_dtype(value) -> DType:
    if isinstance(value, bool):
        return DType.bool
    return DType.float32 if isinstance(value, float) else DType.int64


@converts(aten.full.default)
def _full(cv, a):
    v = cv.scalar(a["fill_value"])
    return cv.emit("full", [], shape=cv.dims(a["size"]), value=v, dtype=_dt(a.get("dtype")) or _default_dtype(v))


@converts(aten.zeros.default, aten.ones.default)
def _zeros_ones(cv, a, value=None):
    v = 1 if cv.target is aten.ones.default else 0
    return cv.emit("full", [], shape=cv.dims(a["size"]), value=v, dtype=_dt(a.get("dtype")) or DType.float32)


@converts(aten.new_ones.default, aten.new_zeros.default, aten.new_full.default, aten.new_empty.default)
def _new_full(cv, a):
    x = cv.tensor(a["self"])
    v = {aten.new_ones.default: 1, aten.new_zeros.default: 0, aten.new_empty.default: 0}.get(cv.target)
    v = cv.scalar(a["fill_value"]) if v is None else v
    return cv.emit("full", [], shape=cv.dims(a["size"]), value=v, dtype=_dt(a.get("dtype")) or x.type.dtype)


@converts(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default)
def _full_like(cv, a):
    x = cv.tensor(a["self"])
    v = {aten.zeros_like.default: 0, aten.ones_like.default: 1}.get(cv.target)
    v = cv.scalar(a["fill_value"]) if v is None else v
    return cv.emit("full", [], shape=x.type.shape, value=v, dtype=_dt(a.get("dtype")) or x.type.dtype)


@converts(aten.scalar_tensor.default)
def _scalar_tensor(cv, a):
    v = cv.scalar(a["s"])
    return cv.emit("full", [], shape=(), value=v, dtype=_dt(a.get("dtype")) or DType.float32)


@converts(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(cv, a):
    start, end, step = cv.scalar(a.get("start", 0)), cv.scalar(a["end"]), a.get("step", 1)
    if any(isinstance(v, float) for v in (start, end, step)):
        raise Unsupported("arange with float bounds")
    return cv.emit(
        "arange", [], start=dim(start), end=dim(end), step=int(step), dtype=_dt(a.get("dtype")) or DType.int64
    )


# -- layout ---------------------------------------------------------------------------


@converts(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _reshape(cv, a):
    return cv.emit("reshape", [cv.tensor(a["self"])], shape=cv.dims(a["size" if "size" in a else "shape"]))


@converts(aten.flatten.using_ints)
def _flatten(cv, a):
    x = cv.tensor(a["self"])
    s = list(x.type.shape)
    if not s:
        return cv.emit("reshape", [x], shape=(dim(1),))
    lo, hi = a.get("start_dim", 0) % len(s), a.get("end_dim", -1) % len(s)
    return cv.emit("reshape", [x], shape=tuple(s[:lo] + [product(s[lo : hi + 1])] + s[hi + 1 :]))


@converts(aten.unsqueeze.default)
def _unsqueeze(cv, a):
    x = cv.tensor(a["self"])
    s = list(x.type.shape)
    d = a["dim"] % (len(s) + 1)
    return cv.emit("reshape", [x], shape=tuple(s[:d] + [dim(1)] + s[d:]))


@converts(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(cv, a):
    x = cv.tensor(a["self"])
    s = list(x.type.shape)
    dims = a.get("dim", a.get("dims"))
    dims = range(len(s)) if dims is None else ([dims] if isinstance(dims, int) else dims)
    drop = {d % max(len(s), 1) for d in dims if s[d % max(len(s), 1)] == 1}
    for d in dims:
        if not s[d % max(len(s), 1)].is_Integer:
            raise Unsupported(f"squeeze of dynamic dim {d}: whether it is 1 depends on the input")
    return cv.emit("reshape", [x], shape=tuple(v for i, v in enumerate(s) if i not in drop))


@converts(aten.permute.default)
def _permute(cv, a):
    return cv.emit("permute", [cv.tensor(a["self"])], dims=tuple(a["dims"]))


@converts(aten.transpose.int, aten.t.default)
def _transpose(cv, a):
    x = cv.tensor(a["self"])
    r = x.type.rank
    d0, d1 = (a["dim0"] % r, a["dim1"] % r) if "dim0" in a else (0, 1)
    if r < 2:
        return x
    dims = list(range(r))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return cv.emit("permute", [x], dims=tuple(dims))


@converts(aten.expand.default)
def _expand(cv, a):
    return cv.emit("expand", [cv.tensor(a["self"])], sizes=cv.dims(a["size"]))


@converts(aten.slice.Tensor)
def _slice(cv, a):
    start, end = a.get("start"), a.get("end")
    return cv.emit(
        "slice",
        [cv.tensor(a["self"])],
        dim=a.get("dim", 0),
        start=0 if start is None else cv.scalar(start),
        end=None if end is None else cv.scalar(end),
        step=a.get("step", 1),
    )


@converts(aten.select.int)
def _select(cv, a):
    return cv.emit("select", [cv.tensor(a["self"])], dim=a["dim"], index=a["index"])


@converts(aten.copy.default)
def _copy(cv, a):
    """`self.copy_(src)` as a value: src broadcast to self's shape in self's dtype."""
    return _like(cv, cv.tensor(a["src"]), cv.tensor(a["self"]))


@converts(aten.fill.Tensor, aten.fill.Scalar)
def _fill(cv, a):
    x = cv.tensor(a["self"])
    return _like(cv, _filler(cv, a["value"], x.type.dtype), x)


def _like(cv, v, x):
    """`v` in the dtype and shape of `x`."""
    if v.type.dtype != x.type.dtype:
        v = cv.emit("cast", [v], dtype=x.type.dtype)
    if v.type.shape != x.type.shape:
        v = cv.emit("expand", [v], sizes=x.type.shape)
    return v


@converts(aten.slice_scatter.default, aten.select_scatter.default)
def _slice_scatter(cv, a):
    """`self` with `src` written over a slice (or one index) of `dim`: the parts of `self`
    before and after it concatenated around `src`."""
    x = cv.tensor(a["self"])
    k = a.get("dim", 0) % x.type.rank
    size = x.type.shape[k]
    src = cv.tensor(a["src"])
    if "index" in a:
        start = slice_bound(size, cv.scalar(a["index"]))
        shape = list(src.type.shape)
        src = cv.emit("reshape", [src], shape=tuple(shape[:k] + [dim(1)] + shape[k:]))
    else:
        if a.get("step", 1) != 1:
            raise Unsupported("slice_scatter with a step other than 1")
        start = slice_bound(size, 0 if a.get("start") is None else cv.scalar(a["start"]))
    if src.type.dtype != x.type.dtype:
        src = cv.emit("cast", [src], dtype=x.type.dtype)
    end = cv.b.store.canon(start + src.type.shape[k])
    parts = []
    if cv.b.store.canon(start) != 0:
        parts.append(cv.emit("slice", [x], dim=k, start=0, end=start, step=1))
    parts.append(src)
    if end != cv.b.store.canon(size):
        parts.append(cv.emit("slice", [x], dim=k, start=end, end=None, step=1))
    return parts[0] if len(parts) == 1 else cv.emit("cat", parts, dim=k)


@converts(aten.pad.default, aten.constant_pad_nd.default)
def _pad(cv, a):
    mode = a.get("mode", "constant")
    x = cv.tensor(a["self"] if "self" in a else a["input"])
    pads = [cv.scalar(p) for p in a["pad"]]
    if len(pads) % 2 or len(pads) > 2 * x.type.rank:
        raise Unsupported(f"pad of {len(pads)} values for a rank-{x.type.rank} tensor")
    sides = {x.type.rank - 1 - i // 2: (pads[i], pads[i + 1]) for i in range(0, len(pads), 2)}
    if mode in cs.PAD_MODES:
        if not all(isinstance(p, int) for p in pads):
            raise Unsupported(f"{mode} padding by a size computed from the input")
        return cs.pad_by_index(cv, x, sides, mode, crop_first=mode == "circular")
    if mode != "constant":
        raise Unsupported(f"{mode} padding")
    fill = _filler(cv, 0 if a.get("value") is None else a["value"], x.type.dtype)
    return pad_constant(cv, x, sides, fill)


@converts(aten.repeat.default)
def _repeat(cv, a):
    """`x.repeat(r0, r1, ...)`: each dim d tiled r times as a new outer dim (r, d), merged."""
    x = cv.tensor(a["self"])
    reps = [cv.scalar(r) for r in a["repeats"]]
    s = [dim(1)] * (len(reps) - x.type.rank) + list(x.type.shape)
    if len(s) != x.type.rank:
        x = cv.emit("reshape", [x], shape=tuple(s))
    inner = [d for d in s for d in (dim(1), d)]
    outer = [d for r, d in zip(reps, s) for d in (dim(r), d)]
    y = cv.emit("expand", [cv.emit("reshape", [x], shape=tuple(inner))], sizes=tuple(outer))
    return cv.emit("reshape", [y], shape=tuple(dim(r) * d for r, d in zip(reps, s)))


@converts(aten.repeat_interleave.self_int)
def _repeat_interleave(cv, a):
    """`x.repeat_interleave(r, dim)`: each element of the dim r times in a row."""
    x = cv.tensor(a["self"])
    if a.get("dim") is None:
        x = cv.emit("reshape", [x], shape=(x.type.numel,))
    k = (0 if a.get("dim") is None else a["dim"]) % x.type.rank
    r = dim(cv.scalar(a["repeats"]))
    s = list(x.type.shape)
    y = cv.emit("reshape", [x], shape=tuple(s[: k + 1] + [dim(1)] + s[k + 1 :]))
    y = cv.emit("expand", [y], sizes=tuple(s[: k + 1] + [r] + s[k + 1 :]))
    return cv.emit("reshape", [y], shape=tuple(s[:k] + [s[k] * r] + s[k + 1 :]))


@converts(aten.index_select.default)
def _index_select(cv, a):
    x = cv.tensor(a["self"])
    return cv.emit("index", [x, cv.tensor(a["index"])], dims=(a["dim"] % x.type.rank,))


@converts(aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default)
def _upsample_nearest(cv, a):
    """Nearest upsampling by whole factors: each pixel repeated s times along H and W (the
    factors from `scale_factors`, or from an output size that is a whole multiple)."""
    x = cv.tensor(a["input"] if "input" in a else a["self"])
    n, c, h, w = x.type.shape
    factors = a.get("scale_factors") or a.get("scales")
    if factors is not None and all(f is not None for f in factors):
        if any(float(f) != int(f) or f < 1 for f in factors):
            raise Unsupported(f"nearest upsampling by {list(factors)} (whole factors only)")
        sh, sw = (int(f) for f in factors)
    else:
        size = [dim(cv.scalar(v)) for v in a["output_size"]]
        quotients = [exact_quotient(o, i) for o, i in zip(size, (h, w))]
        if any(q is None or not q.is_Integer or q < 1 for q in quotients):
            raise Unsupported(f"nearest upsampling from {h}x{w} to {size[0]}x{size[1]} (whole factors only)")
        sh, sw = (int(q) for q in quotients)
    y = cv.emit("reshape", [x], shape=(n, c, h, dim(1), w, dim(1)))
    y = cv.emit("expand", [y], sizes=(n, c, h, dim(sh), w, dim(sw)))
    return cv.emit("reshape", [y], shape=(n, c, h * sh, w * sw))


@converts(aten.flip.default)
def _flip(cv, a):
    """Each flipped dim read through the index `size - 1 - i`."""
    x = cv.tensor(a["self"])
    for k in sorted({d % x.type.rank for d in a["dims"]}):
        n = x.type.shape[k]
        i = cv.emit("arange", [], start=dim(0), end=n, step=1, dtype=DType.int64)
        rev = cv.emit("sub", [cv.operand(n - 1), i])
        x = cv.emit("index", [x, rev], dims=(k,))
    return x


@converts(aten.cat.default)
def _cat(cv, a):
    return cv.emit("cat", [cv.tensor(t) for t in a["tensors"]], dim=a.get("dim", 0))


@converts(aten.stack.default)
def _stack(cv, a):
    xs = [cv.tensor(t) for t in a["tensors"]]
    d = a.get("dim", 0) % (xs[0].type.rank + 1)
    ups = [cv.emit("reshape", [x], shape=tuple(list(x.type.shape[:d]) + [dim(1)] + list(x.type.shape[d:]))) for x in xs]
    return cv.emit("cat", ups, dim=d)


def _slices(cv, x, d, sizes):
    out, start = [], dim(0)
    for s in sizes:
        out.append(cv.emit("slice", [x], dim=d, start=start, end=start + s, step=1))
        start = start + s
    return tuple(out)


@converts(aten.split.Tensor, aten.split_with_sizes.default)
def _split(cv, a):
    x = cv.tensor(a["self"])
    d = a.get("dim", 0) % x.type.rank
    n = x.type.shape[d]
    if "split_sizes" in a:
        return _slices(cv, x, d, cv.dims(a["split_sizes"]))
    size = a["split_size"]
    if not n.is_Integer:
        raise Unsupported(f"split of dynamic dim {d}: the number of pieces would depend on the input")
    n = int(n)
    return _slices(cv, x, d, [min(size, n - i) for i in range(0, n, size)])


@converts(aten.chunk.default)
def _chunk(cv, a):
    x = cv.tensor(a["self"])
    d = a.get("dim", 0) % x.type.rank
    n = x.type.shape[d]
    if not n.is_Integer:
        raise Unsupported(f"chunk of dynamic dim {d}")
    size = -(-int(n) // a["chunks"])
    return _slices(cv, x, d, [min(size, int(n) - i) for i in range(0, int(n), size)])


@converts(aten.unbind.int)
def _unbind(cv, a):
    x = cv.tensor(a["self"])
    d = a.get("dim", 0) % x.type.rank
    if not x.type.shape[d].is_Integer:
        raise Unsupported(f"unbind of dynamic dim {d}")
    return tuple(cv.emit("select", [x], dim=d, index=i) for i in range(int(x.type.shape[d])))


@converts(aten.gather.default)
def _gather(cv, a):
    return cv.emit("gather", [cv.tensor(a["self"]), cv.tensor(a["index"])], dim=a["dim"])


@converts(aten.embedding.default)
def _embedding(cv, a):
    return cv.emit("embedding", [cv.tensor(a["weight"]), cv.tensor(a["indices"])])


@converts(aten.index.Tensor)
def _index(cv, a):
    idx = list(a["indices"])
    dims = tuple(i for i, t in enumerate(idx) if t is not None)
    tensors = [cv.tensor(idx[i]) for i in dims]
    if any(t.type.dtype == DType.bool for t in tensors):
        raise Unsupported("boolean-mask indexing gives a data-dependent shape")
    return cv.emit("index", [cv.tensor(a["self"]), *tensors], dims=dims)


@converts(aten.diff.default)
def _diff(cv, a):
    x = cv.tensor(a["self"])
    d = a.get("dim", -1) % x.type.rank
    parts = [cv.opt(a.get("prepend")), x, cv.opt(a.get("append"))]
    parts = [p for p in parts if p is not None]
    if len(parts) > 1:
        x = cv.emit("cat", parts, dim=d)
    for _ in range(a.get("n", 1)):
        hi = cv.emit("slice", [x], dim=d, start=1, end=None, step=1)
        lo = cv.emit("slice", [x], dim=d, start=0, end=-1, step=1)
        x = cv.emit("ne" if x.type.dtype == DType.bool else "sub", [hi, lo])
    return x


# -- reductions -------------------------------------------------------------------------


@converts(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default)
def _sum_mean(cv, a):
    op = "sum" if cv.target in (aten.sum.dim_IntList, aten.sum.default) else "mean"
    dims = a.get("dim")
    return cv.emit(
        op, [cv.tensor(a["self"])], dims=tuple(dims or ()), keepdim=a.get("keepdim", False), dtype=_dt(a.get("dtype"))
    )


@converts(aten.linalg_vector_norm.default)
def _vector_norm(cv, a):
    """The p-norm over `dim` as the reductions it is made of (F.normalize's norm is p=2)."""
    x, p = cv.tensor(a["self"]), float(a.get("ord", 2))
    if p != p:
        raise Unsupported(f"linalg_vector_norm with ord={p}")
    if a.get("dtype") is not None and DType.of(a["dtype"]) != x.type.dtype:
        x = cv.emit("cast", [x], dtype=DType.of(a["dtype"]))
    dims, keep = tuple(a.get("dim") or ()), a.get("keepdim", False)
    if p == 0:  # the count of nonzero entries
        nonzero = cv.emit("cast", [cv.emit("ne", [x, cs.scalar(cv, x, 0)])], dtype=x.type.dtype)
        return cv.emit("sum", [nonzero], dims=dims, keepdim=keep, dtype=None)
    if p == 2:
        return cv.emit("sqrt", [cv.emit("sum", [cv.emit("mul", [x, x])], dims=dims, keepdim=keep, dtype=None)])
    ax = cv.emit("abs", [x])
    if p == 1:
        return cv.emit("sum", [ax], dims=dims, keepdim=keep, dtype=None)
    if p in (float("inf"), -float("inf")):
        return cv.emit("amax" if p > 0 else "amin", [ax], dims=dims, keepdim=keep)
    powered = cv.emit("sum", [cv.emit("pow_scalar", [ax], exponent=p)], dims=dims, keepdim=keep, dtype=None)
    return cv.emit("pow_scalar", [powered], exponent=1.0 / p)


@converts(
    aten.var.correction, aten.var.dim, aten.std.correction, aten.std.dim, aten.var_mean.correction,
    aten.var_mean.dim, aten.std_mean.correction, aten.std_mean.dim,
)  # fmt: skip
def _var_std(cv, a):
    """Variance as the mean of squared deviations over n - correction elements; std its root;
    `var_mean` and `std_mean` return the mean too."""
    x = cv.tensor(a["self"])
    if not x.type.dtype.is_float:
        raise Unsupported(f"variance of a {x.type.dtype} tensor")
    dims = tuple(d % x.type.rank for d in (a.get("dim") or range(x.type.rank)))
    correction = a.get("correction")
    correction = (1 if a.get("unbiased", True) else 0) if correction is None else correction
    keep = a.get("keepdim", False)
    mean = cv.emit("mean", [x], dims=dims, keepdim=True, dtype=None)
    dev = cv.emit("sub", [x, mean])
    total = cv.emit("sum", [cv.emit("mul", [dev, dev])], dims=dims, keepdim=keep, dtype=None)
    count = product(x.type.shape[d] for d in dims)
    if float(correction).is_integer():
        n = cv.emit("cast", [cv.operand(count - dim(int(correction)))], dtype=x.type.dtype)
    else:  # a fractional correction (torch takes any number)
        n = cv.emit("cast", [cv.operand(count)], dtype=x.type.dtype)
        n = cv.emit("sub", [n, cs.scalar(cv, n, correction)])
    out = cv.emit("div", [total, n], rounding_mode=None)
    std = cv.target in (aten.std.correction, aten.std.dim, aten.std_mean.correction, aten.std_mean.dim)
    out = cv.emit("sqrt", [out]) if std else out
    if cv.target in (aten.var.correction, aten.var.dim, aten.std.correction, aten.std.dim):
        return out
    return out, (mean if keep else cv.emit("reshape", [mean], shape=out.type.shape))


@converts(aten.max.dim, aten.min.dim)
def _max_dim(cv, a):
    """`x.max(dim)`: values and indices."""
    return arg_extreme(cv, cv.tensor(a["self"]), a["dim"], a.get("keepdim", False), cv.target is aten.max.dim)


@converts(aten.topk.default)
def _topk(cv, a):
    try:
        return cs.top_k(cv, cv.tensor(a["self"]), int(a["k"]), a.get("dim", -1), a.get("largest", True))
    except ValueError as e:
        raise Unsupported(str(e)) from None


@converts(aten.argmax.default, aten.argmin.default)
def _argmax(cv, a):
    x, largest = cv.tensor(a["self"]), cv.target is aten.argmax.default
    return arg_extreme(cv, x, a.get("dim"), a.get("keepdim", False), largest)[1]


@converts(aten.max.default, aten.min.default)
def _max_all(cv, a):
    x = cv.tensor(a["self"])
    return cv.emit(
        "amax" if cv.target is aten.max.default else "amin", [x], dims=tuple(range(x.type.rank)), keepdim=False
    )


@converts(aten.amax.default, aten.amin.default)
def _amax(cv, a):
    op = "amax" if cv.target is aten.amax.default else "amin"
    return cv.emit(op, [cv.tensor(a["self"])], dims=tuple(a.get("dim") or ()), keepdim=a.get("keepdim", False))


@converts(aten._softmax.default, aten.softmax.int, aten._log_softmax.default, aten.log_softmax.int)
def _softmax(cv, a):
    x = cv.tensor(a["self"])
    if a.get("dtype") is not None and DType.of(a["dtype"]) != x.type.dtype:
        x = cv.emit("cast", [x], dtype=DType.of(a["dtype"]))
    log = cv.target in (aten._log_softmax.default, aten.log_softmax.int)
    return cv.emit("log_softmax" if log else "softmax", [x], dim=a["dim"])


@converts(aten.cumsum.default)
def _cumsum(cv, a):
    return cv.emit("cumsum", [cv.tensor(a["self"])], dim=a["dim"], dtype=_dt(a.get("dtype")))


@converts(aten.layer_norm.default)
def _layer_norm(cv, a):
    return cv.emit(
        "layer_norm",
        [cv.tensor(a["input"]), cv.opt(a.get("weight")), cv.opt(a.get("bias"))],
        normalized_shape=cv.dims(a["normalized_shape"]),
        eps=float(a.get("eps", 1e-5)),
    )


@converts(aten.max_pool2d.default)
def _max_pool2d(cv, a):
    if a.get("ceil_mode", False):
        raise Unsupported("max_pool2d with ceil_mode=True")
    k = _pair(a["kernel_size"])
    return cv.emit(
        "max_pool2d", [cv.tensor(a["self"])], kernel_size=k, stride=_pair(a.get("stride") or k),
        padding=_pair(a.get("padding", 0)), dilation=_pair(a.get("dilation", 1)),
    )  # fmt: skip


@converts(aten.avg_pool2d.default)
def _avg_pool2d(cv, a):
    if a.get("ceil_mode", False):
        raise Unsupported("avg_pool2d with ceil_mode=True")
    k = _pair(a["kernel_size"])
    return cv.emit(
        "avg_pool2d", [cv.tensor(a["self"])], kernel_size=k, stride=_pair(a.get("stride") or k),
        padding=_pair(a.get("padding", 0)), count_include_pad=a.get("count_include_pad", True),
        divisor_override=a.get("divisor_override"),
    )  # fmt: skip


@converts(aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(cv, a):
    x, size = cv.tensor(a["self"]), list(a["output_size"])
    for i, n in enumerate(size):
        if not isinstance(n, int):
            if cv.b.store.canon(dim(cv.scalar(n))) != cv.b.store.canon(x.type.shape[-2 + i]):
                raise Unsupported("adaptive_avg_pool2d to an output size that depends on the input (a fixed one is)")
            size[i] = None  # the input's own size there (torch's None): the pool leaves that axis as it is
    if None not in size:
        return cv.emit("adaptive_avg_pool2d", [x], output_size=_pair(size))
    if size == [None, None]:
        return x
    swap = tuple(range(x.type.rank - 2)) + (x.type.rank - 1, x.type.rank - 2)
    if size[0] is None:
        return _adaptive_pool_width(cv, x, int(size[1]))
    return cv.emit("permute", [_adaptive_pool_width(cv, cv.emit("permute", [x], dims=swap), int(size[0]))], dims=swap)


def _adaptive_pool_width(cv, x, n: int):
    """Adaptive average pooling of the last axis alone to `n`: each row a channel of its own."""
    s = x.type.shape
    rows = cv.emit("reshape", [x], shape=s[:-3] + (s[-3] * s[-2], dim(1), s[-1]))
    y = cv.emit("adaptive_avg_pool2d", [rows], output_size=(1, n))
    return cv.emit("reshape", [y], shape=s[:-1] + (dim(n),))


@converts(aten.adaptive_avg_pool1d.default)
def _adaptive_avg_pool1d(cv, a):
    """As the 2-D pool over a height of 1."""
    x = cv.tensor(a["self"])
    s = list(x.type.shape)
    (n,) = a["output_size"] if isinstance(a["output_size"], (list, tuple)) else (a["output_size"],)
    y = cv.emit("reshape", [x], shape=tuple(s[:-1] + [dim(1)] + s[-1:]))
    y = cv.emit("adaptive_avg_pool2d", [y], output_size=(1, int(n)))
    return cv.emit("reshape", [y], shape=tuple(s[:-1] + [dim(int(n))]))


@converts(aten._native_batch_norm_legit_no_training.default, aten.batch_norm.default)
def _batch_norm(cv, a):
    if a.get("training", False):
        raise Unsupported("batch norm in training mode; call model.eval() before compiling")
    out = cv.emit(
        "batch_norm",
        [cv.tensor(a["input"]), cv.opt(a.get("weight")), cv.opt(a.get("bias")),
         cv.tensor(a["running_mean"]), cv.tensor(a["running_var"])],
        eps=float(a["eps"]),
    )  # fmt: skip
    return out if cv.target is aten.batch_norm.default else (out, None, None)


# -- compute-intensive ---------------------------------------------------------------------


@converts(aten.linear.default)
def _linear(cv, a):
    x, w = cv.tensor(a["input"]), cv.tensor(a["weight"])
    if x.type.rank > 1 and w.type.rank == 2:
        return cv.emit("linear", [x, w, cv.opt(a.get("bias"))])
    # a vector input or weight (torch's 1-D forms): as rows and columns of one
    rows = cv.emit("reshape", [x], shape=(dim(1), x.type.shape[0])) if x.type.rank == 1 else x
    cols = cv.emit("reshape", [w], shape=(dim(1), w.type.shape[0])) if w.type.rank == 1 else w
    y = cv.emit("linear", [rows, cols, None])
    shape = x.type.shape[:-1] + w.type.shape[:-1]
    y = cv.emit("reshape", [y], shape=shape)
    return y if a.get("bias") is None else cv.emit("add", [y, cv.tensor(a["bias"])])


@converts(aten.addmm.default, aten.baddbmm.default)
def _addmm(cv, a):
    """beta * self + alpha * (mat1 @ mat2); with beta 0, self is not read (torch's rule: a NaN
    there does not propagate)."""
    mats = (a["mat1"], a["mat2"]) if "mat1" in a else (a["batch1"], a["batch2"])
    out = cv.emit("matmul", [cv.tensor(m) for m in mats])
    alpha, beta = cv.scalar(a.get("alpha", 1)), cv.scalar(a.get("beta", 1))
    if alpha != 1:
        out = cv.emit("mul", [out, cv.operand(alpha)])
    if beta == 0:
        return out
    x = cv.tensor(a["self"])
    if beta != 1:
        x = cv.emit("mul", [x, cv.operand(beta)])
    return cv.emit("add", [out, x])


@converts(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _matmul(cv, a):
    x, y = cv.tensor(a["self"]), cv.tensor(a["mat2" if "mat2" in a else "other"])
    if x.type.rank < 2 or y.type.rank < 2:
        raise Unsupported("matmul with a 1-D operand")
    return cv.emit("matmul", [x, y])


@converts(aten.conv2d.default)
def _conv2d(cv, a):
    return _conv(
        cv, cv.tensor(a["input"]), cv.tensor(a["weight"]), cv.opt(a.get("bias")),
        stride=_pair(a.get("stride", 1)), padding=_pair(a.get("padding", 0)),
        dilation=_pair(a.get("dilation", 1)), groups=int(a.get("groups", 1)),
    )  # fmt: skip


def _triple(v) -> tuple[int, int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(int(v[min(i, len(v) - 1)]) for i in range(3))


def _batched(cv, x, spatial: int, op: str, emit):
    """`emit(x)` on a batched input; an unbatched one (C, *spatial), which torch takes too, as
    a batch of one."""
    if x.type.rank == spatial + 2:
        return emit(x)
    if x.type.rank != spatial + 1:
        raise Unsupported(f"{op} of a {x.type.rank}-D input")
    y = emit(cv.emit("reshape", [x], shape=(dim(1),) + x.type.shape))
    return cv.emit("reshape", [y], shape=y.type.shape[1:])


@converts(aten.conv3d.default)
def _conv3d(cv, a):
    attrs = dict(stride=_triple(a.get("stride", 1)), padding=_triple(a.get("padding", 0)),
                 dilation=_triple(a.get("dilation", 1)), groups=int(a.get("groups", 1)))  # fmt: skip
    w, bias = cv.tensor(a["weight"]), cv.opt(a.get("bias"))
    return _batched(cv, cv.tensor(a["input"]), 3, "conv3d", lambda x: cv.emit("conv3d", [x, w, bias], **attrs))


@converts(aten.max_pool3d.default)
def _max_pool3d(cv, a):
    if a.get("ceil_mode", False):
        raise Unsupported("max_pool3d with ceil_mode=True")
    k = _triple(a["kernel_size"])
    attrs = dict(kernel_size=k, stride=_triple(a.get("stride") or k), padding=_triple(a.get("padding", 0)),
                 dilation=_triple(a.get("dilation", 1)))  # fmt: skip
    return _batched(cv, cv.tensor(a["self"]), 3, "max_pool3d", lambda x: cv.emit("max_pool3d", [x], **attrs))


@converts(aten.avg_pool3d.default)
def _avg_pool3d(cv, a):
    if a.get("ceil_mode", False):
        raise Unsupported("avg_pool3d with ceil_mode=True")
    k = _triple(a["kernel_size"])
    attrs = dict(kernel_size=k, stride=_triple(a.get("stride") or k), padding=_triple(a.get("padding", 0)),
                 count_include_pad=a.get("count_include_pad", True),
                 divisor_override=a.get("divisor_override"))  # fmt: skip
    return _batched(cv, cv.tensor(a["self"]), 3, "avg_pool3d", lambda x: cv.emit("avg_pool3d", [x], **attrs))


def _conv(cv, x, w, bias, **attrs):
    """The conv2d op; an unbatched input (C, H, W), which torch takes too, as a batch of one."""
    if x.type.rank != 3:
        return cv.emit("conv2d", [x, w, bias], **attrs)
    y = cv.emit("conv2d", [cv.emit("reshape", [x], shape=(dim(1),) + x.type.shape), w, bias], **attrs)
    return cv.emit("reshape", [y], shape=y.type.shape[1:])


@converts(aten.conv_transpose2d.input)
def _conv_transpose2d(cv, a):
    return conv_transpose2d(
        cv, cv.tensor(a["input"]), _constant(cv, a["weight"], "conv_transpose2d's weight"), cv.opt(a.get("bias")),
        _pair(a.get("stride", 1)), [(p, p) for p in _pair(a.get("padding", 0))], _pair(a.get("output_padding", 0)),
        _pair(a.get("dilation", 1)), int(a.get("groups", 1)),
    )  # fmt: skip


@converts(aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit.default)
def _batch_norm_from_batch(cv, a):
    """Batch norm normalised by the batch's own statistics (instance norm reaches it so:
    each sample's channels as channels of one batch): the mean and biased variance over
    every dim but the channels'."""
    x = cv.tensor(a["input"])
    if a.get("training") is False and "running_mean" in a:
        raise Unsupported("batch norm in eval mode with running statistics through _native_batch_norm_legit")
    dims = tuple(d for d in range(x.type.rank) if d != 1)
    dev = cv.emit("sub", [x, cv.emit("mean", [x], dims=dims, keepdim=True, dtype=None)])
    var = cv.emit("mean", [cv.emit("mul", [dev, dev])], dims=dims, keepdim=True, dtype=None)
    y = cv.emit("mul", [dev, cv.emit("rsqrt", [cv.emit("add", [var, cv.operand(float(a.get("eps", 1e-5)))])])])
    return _channel_affine(cv, y, a), None, None


def _channel_affine(cv, y, a):
    """`y * weight + bias` with both per channel (dim 1), either absent."""
    per_channel = (y.type.shape[1],) + (dim(1),) * (y.type.rank - 2)
    if a.get("weight") is not None:
        y = cv.emit("mul", [y, cv.emit("reshape", [cv.tensor(a["weight"])], shape=per_channel)])
    if a.get("bias") is not None:
        y = cv.emit("add", [y, cv.emit("reshape", [cv.tensor(a["bias"])], shape=per_channel)])
    return y


@converts(aten.conv1d.default, aten.conv1d.padding)
def _conv1d(cv, a):
    """As a 2-D convolution over a height of 1 (the weight reshaped once, at capture)."""
    x, w = cv.tensor(a["input"]), _constant(cv, a["weight"], "conv1d's weight")
    padding = a.get("padding", 0)
    if isinstance(padding, str):
        if padding != "valid":
            raise Unsupported(f"conv1d with padding={padding!r} (give the padding as a number)")
        padding = 0
    s = list(x.type.shape)
    x = cv.emit("reshape", [x], shape=tuple(s[:-1] + [dim(1)] + s[-1:]))
    w = cv.b.constant(f"{cv.name}_weight", w.unsqueeze(2).contiguous())
    y = _conv(
        cv, x, w, cv.opt(a.get("bias")), stride=(1, _single(a.get("stride", 1))),
        padding=(0, _single(padding)), dilation=(1, _single(a.get("dilation", 1))), groups=int(a.get("groups", 1)),
    )  # fmt: skip
    t = list(y.type.shape)
    return cv.emit("reshape", [y], shape=tuple(t[:-2] + t[-1:]))


def _constant(cv, node, what: str) -> torch.Tensor:
    """The value of a model constant (a parameter or buffer), for ops that rewrite it at capture."""
    v = cv.tensor(node)
    t = cv.b.graph.constants.get(v)
    if t is None:
        raise Unsupported(f"{what} computed by the model (symfuse takes it as a parameter)")
    return t


@converts(aten._weight_norm.default)
def _weight_norm(cv, a):
    """A weight-normalised parameter (`nn.utils.parametrizations.weight_norm`), computed once
    at capture from its direction and magnitude."""
    v = _constant(cv, a["v"], "weight norm's direction")
    g = _constant(cv, a["g"], "weight norm's magnitude")
    return cv.b.constant(cv.name, torch._weight_norm(v, g, a.get("dim", 0)).detach())


@converts(aten.group_norm.default)
def _group_norm(cv, a):
    """Normalised over each group of channels (a layer norm over [C/G, *spatial] after a
    reshape), then the per-channel affine map."""
    x = cv.tensor(a["input"])
    s = list(x.type.shape)
    groups = int(a["num_groups"])
    y = cv.emit("reshape", [x], shape=(s[0], dim(groups), -1))
    y = cv.emit("layer_norm", [y, None, None], normalized_shape=(y.type.shape[-1],), eps=float(a.get("eps", 1e-5)))
    return _channel_affine(cv, cv.emit("reshape", [y], shape=tuple(s)), a)


@converts(aten.scaled_dot_product_attention.default)
def _sdpa(cv, a):
    if a.get("dropout_p", 0.0) != 0.0:
        raise Unsupported("attention dropout; call model.eval() before compiling")
    if a.get("enable_gqa", False):
        raise Unsupported("grouped-query attention (enable_gqa=True)")
    return cv.emit(
        "sdpa",
        [cv.tensor(a["query"]), cv.tensor(a["key"]), cv.tensor(a["value"]), cv.opt(a.get("attn_mask"))],
        is_causal=bool(a.get("is_causal", False)),
        scale=a.get("scale"),
    )


@converts(aten.lstm.input, torch.ops.symfuse.lstm.default)
def _lstm(cv, a):
    if cv.target is aten.lstm.input:
        if a["train"]:
            raise Unsupported("LSTM in training mode")
        h0, c0 = (cv.tensor(t) for t in a["hx"])
        params = [cv.tensor(p) for p in a["params"]]
        hidden = int(h0.type.shape[-1])
        attrs = dict(
            num_layers=a["num_layers"],
            bidirectional=a["bidirectional"],
            batch_first=a["batch_first"],
            has_biases=a["has_biases"],
        )
    else:
        h0, c0 = cv.opt(a.get("h0")), cv.opt(a.get("c0"))
        params = [cv.tensor(p) for p in a["params"]]
        hidden = a["hidden_size"]
        attrs = dict(
            num_layers=a["num_layers"],
            bidirectional=a["bidirectional"],
            batch_first=a["batch_first"],
            has_biases=a["has_biases"],
        )
    return cv.emit_multi(
        "lstm", [cv.tensor(a["input" if "input" in a else "x"]), h0, c0, *params], hidden_size=hidden, **attrs
    )


@converts(torch.ops.symfuse.paged_attention.default)
def _paged_attention(cv, a):
    names = ("q", "k", "v", "k_pool", "v_pool", "table", "lengths")
    return cv.emit(
        "paged_attention", [cv.tensor(a[n]) for n in names], scale=float(a["scale"]), window=int(a["window"])
    )
