"""The mapping from ONNX ops to symfuse registry ops, one entry per op type.

A converter receives the `OnnxConverter` (values, constants, the store) and an `OnnxNode`
(its inputs as symfuse values or known numpy arrays, its attributes) and returns its
outputs: symfuse values, or known arrays when it computes something known at compile time
(`Shape` of a tensor is an array of its dims). `FOLD` holds the ops that also compute on
known arrays holding symbolic dims, so shape arithmetic stays symbolic; known numeric
inputs fold through onnx's reference implementation instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import sympy
import torch

from symfuse.frontend import composite as cs
from symfuse.frontend.aten_table import Unsupported
from symfuse.frontend.composite import arg_extreme, conv_transpose2d, pad_constant
from symfuse.ir.dims import ceildiv, dim, dmax, dmin, exact_quotient, floordiv, mod, product
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Value
from symfuse.shape.context import ShapeContext


@dataclass
class OnnxNode:
    proto: onnx.NodeProto
    ins: list  # Value | np.ndarray | None per input
    attrs: dict[str, Any]
    opset: int
    op_type: str = ""  # the op it converts as, when not its own (`Mean` as `Sum`)

    @property
    def op(self) -> str:
        return self.op_type or self.proto.op_type

    def input(self, i: int) -> Any:
        return self.ins[i] if i < len(self.ins) else None

    def used(self, i: int) -> bool:
        """Output `i` exists and has a name (ONNX leaves optional outputs unnamed)."""
        return i < len(self.proto.output) and bool(self.proto.output[i])


ONNX_OPS: dict[str, Callable[..., Any]] = {}
FOLD: dict[str, Callable[..., Any]] = {}
_TAKEN = object()  # an output another node's pattern computed; never read


def converts(*ops: str, table: dict = ONNX_OPS):
    def register(fn):
        for op in ops:
            table[op] = fn
        return fn

    return register


def np_dtype_to_symfuse(dt: np.dtype) -> DType:
    if dt == np.dtype(object):
        return DType.int64
    if dt.name == "bfloat16":  # onnx's numpy type for it (ml_dtypes), which torch does not read
        return DType.bfloat16
    return DType.of(torch.from_numpy(np.empty(0, dtype=dt)).dtype)


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A copy of a known array as a tensor (a bfloat16 array through its bits)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.array(a, copy=True).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def onnx_dtype(elem_type: int) -> DType:
    try:
        return np_dtype_to_symfuse(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        name = onnx.TensorProto.DataType.Name(elem_type)
        raise ValueError(f"ONNX element type {name} is not supported by symfuse") from None


def _axes(cx, n: OnnxNode, input_index: int) -> list[int] | None:
    """Axes given as an attribute (older opsets) or as an input (newer ones)."""
    if "axes" in n.attrs:
        return [int(a) for a in n.attrs["axes"]]
    v = n.input(input_index)
    if v is None:
        return None
    return [int(a) for a in cx.ints(v, f"input {input_index} (axes) of {n.op}")]


# -- known values: shape arithmetic on arrays of dims ------------------------------------


def _elem(x):
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, sympy.Basic):
        return int(x) if x.is_Integer else x
    return x


def _symbolic(n: OnnxNode) -> bool:
    return any(isinstance(x, np.ndarray) and x.dtype == object for x in n.ins)


def _obj(fn, *arrays) -> np.ndarray:
    out = np.frompyfunc(lambda *xs: _elem(fn(*map(_elem, xs))), len(arrays), 1)(*arrays)
    return np.asarray(out, dtype=object)


def _decide(cx, a, b, rel: str) -> bool:
    """Compare two dims at compile time, or say why it cannot be known."""
    if isinstance(a, int) and isinstance(b, int):
        return {"==": a == b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[rel]
    lo, hi = cx.store.bounds(cx.store.canon(dim(a) - dim(b)))
    if rel == "==":
        if lo > 0 or hi < 0:
            return False
        if lo == hi == 0:
            return True
    else:
        sign = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0), ">": (lo > 0, hi <= 0), ">=": (lo >= 0, hi < 0)}[rel]
        if sign[0] or sign[1]:
            return bool(sign[0])
    raise Unsupported(f"whether {a} {rel} {b} depends on the input sizes; symfuse decides it at compile time")


def _trunc_div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return floordiv(a, b)  # dims are positive


_SYM_BINARY = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b, "Div": _trunc_div,
    "Mod": lambda a, b: a % b if isinstance(a, int) and isinstance(b, int) else mod(a, b),
    "Max": lambda a, b: max(a, b) if isinstance(a, int) and isinstance(b, int) else dmax(a, b),
    "Min": lambda a, b: min(a, b) if isinstance(a, int) and isinstance(b, int) else dmin(a, b),
}  # fmt: skip
_SYM_COMPARE = {"Equal": "==", "Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">="}


@converts(*_SYM_BINARY, table=FOLD)
def _fold_binary(cx, n):
    if not _symbolic(n):
        return None
    fn = _SYM_BINARY[n.op]
    out = n.ins[0]
    for x in n.ins[1:]:
        out = _obj(fn, out, x)
    return out


@converts(*_SYM_COMPARE, table=FOLD)
def _fold_compare(cx, n):
    if not _symbolic(n):
        return None
    rel = _SYM_COMPARE[n.op]
    return np.frompyfunc(lambda a, b: _decide(cx, _elem(a), _elem(b), rel), 2, 1)(*n.ins).astype(bool)


@converts("Neg", "Abs", table=FOLD)
def _fold_unary(cx, n):
    if not _symbolic(n):
        return None
    return _obj((lambda a: -a) if n.op == "Neg" else (lambda a: a if not isinstance(a, int) else abs(a)), n.ins[0])


@converts("Identity", table=FOLD)
def _fold_identity(cx, n):
    return n.ins[0]


@converts("Cast", table=FOLD)
def _fold_cast(cx, n):
    x = n.ins[0]
    if x.dtype != object:
        return None
    to = onnx_dtype(n.attrs["to"])
    return x if to.is_int else None  # dims as floats become a tensor (the table's Cast)


@converts("Gather", table=FOLD)
def _fold_gather(cx, n):
    data, idx = n.ins
    if not _symbolic(n) or idx.dtype == object:
        return None
    axis = n.attrs.get("axis", 0) % data.ndim
    return np.take(data, np.where(idx < 0, idx + data.shape[axis], idx), axis=axis)


def _slice_args(cx, n, rank):
    starts = cx.ints(n.input(1), "Slice starts")
    ends = cx.ints(n.input(2), "Slice ends")
    axes = cx.ints(n.input(3), "Slice axes") if n.input(3) is not None else list(range(len(starts)))
    steps = cx.ints(n.input(4), "Slice steps") if n.input(4) is not None else [1] * len(starts)
    return starts, ends, [a % rank for a in axes], steps


@converts("Slice", table=FOLD)
def _fold_slice(cx, n):
    data = n.ins[0]
    if not _symbolic(n):
        return None
    starts, ends, axes, steps = _slice_args(cx, n, data.ndim)
    if not all(isinstance(v, int) for v in starts + ends + steps):
        return None
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a] = slice(s, e, st)
    return data[tuple(index)]


@converts("Concat", table=FOLD)
def _fold_concat(cx, n):
    if not _symbolic(n):
        return None
    return np.concatenate([x.astype(object) for x in n.ins], axis=n.attrs["axis"])


@converts("Unsqueeze", table=FOLD)
def _fold_unsqueeze(cx, n):
    x = n.ins[0]
    if x.dtype != object:
        return None
    axes = sorted(a % (x.ndim + len(_axes(cx, n, 1))) for a in _axes(cx, n, 1))
    for a in axes:
        x = np.expand_dims(x, a)
    return x


@converts("Squeeze", table=FOLD)
def _fold_squeeze(cx, n):
    x = n.ins[0]
    if x.dtype != object:
        return None
    axes = _axes(cx, n, 1)
    return np.squeeze(x, axis=tuple(a % x.ndim for a in axes) if axes else None)


@converts("Reshape", table=FOLD)
def _fold_reshape(cx, n):
    x = n.ins[0]
    if x.dtype != object:
        return None
    shape = cx.ints(n.ins[1], "Reshape shape")
    if not all(isinstance(s, int) for s in shape):
        return None
    shape = [x.shape[i] if s == 0 and not n.attrs.get("allowzero", 0) else s for i, s in enumerate(shape)]
    return x.reshape(shape)


@converts("Where", table=FOLD)
def _fold_where(cx, n):
    c, a, b = n.ins
    if not _symbolic(n) or c.dtype == object:
        return None
    return np.where(c, a.astype(object), b.astype(object))


@converts("ReduceProd", "ReduceSum", table=FOLD)
def _fold_reduce(cx, n):
    x = n.ins[0]
    if x.dtype != object:
        return None
    axes = _axes(cx, n, 1)
    axes = tuple(a % x.ndim for a in axes) if axes else tuple(range(x.ndim))
    fn = product if n.op == "ReduceProd" else (lambda xs: sum(xs, sympy.Integer(0)))
    keep = bool(n.attrs.get("keepdims", 1))
    moved = np.moveaxis(x, axes, range(-len(axes), 0)) if axes else x
    flat = moved.reshape(moved.shape[: moved.ndim - len(axes)] + (-1,))
    out = np.empty(flat.shape[:-1], dtype=object)
    for i in np.ndindex(out.shape):
        out[i] = _elem(fn(flat[i].tolist()))
    if keep:
        for a in sorted(axes):
            out = np.expand_dims(out, a)
    return out


@converts("Constant", table=FOLD)
def _constant(cx, n):
    a = n.attrs
    for key, make in (
        ("value", np.asarray), ("value_float", lambda v: np.array(v, np.float32)),
        ("value_floats", lambda v: np.array(v, np.float32)), ("value_int", lambda v: np.array(v, np.int64)),
        ("value_ints", lambda v: np.array(v, np.int64)),
    ):  # fmt: skip
        if key in a:
            return make(a[key])
    raise Unsupported(f"a Constant with {', '.join(a) or 'no value'}")


# -- shapes of tensors ----------------------------------------------------------------------


@converts("Shape", table=FOLD)
@converts("Shape")
def _shape(cx, n):
    x = n.ins[0]
    shape = np.array([_elem(cx.store.canon(d)) for d in x.type.shape] if isinstance(x, Value) else x.shape, object)
    lo, hi = n.attrs.get("start", 0), n.attrs.get("end", None)
    return shape[lo:hi] if len(shape) else np.zeros(0, np.int64)


@converts("Size")
def _size(cx, n):
    x = n.ins[0]
    return np.array(_elem(cx.store.canon(product(x.type.shape))), dtype=object)


# -- element-wise -----------------------------------------------------------------------------

_UNARY = {
    "Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
    "Tanh": "tanh", "Sigmoid": "sigmoid", "Erf": "erf", "Sin": "sin", "Cos": "cos", "Relu": "relu",
    "Not": "logical_not", "BitwiseNot": "bitwise_not", "Acos": "acos", "Asin": "asin", "Atan": "atan",
    "Acosh": "acosh", "Asinh": "asinh", "Atanh": "atanh",
}  # fmt: skip
_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt",
    "GreaterOrEqual": "ge", "And": "logical_and", "Or": "logical_or", "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or",
}  # fmt: skip


for _op, _sym in _UNARY.items():
    ONNX_OPS[_op] = lambda cx, n, _sym=_sym: cx.emit(_sym, [cx.tensor(n.ins[0])])


def _binary(sym: str):
    def convert(cx, n):
        return cx.emit(sym, [cx.tensor(n.ins[0]), cx.tensor(n.ins[1])])

    return convert


for _op, _sym in _BINARY.items():
    ONNX_OPS[_op] = _binary(_sym)


@converts("Div")
def _div(cx, n):
    a, b = cx.tensor(n.ins[0]), cx.tensor(n.ins[1])
    return cx.emit("div", [a, b], rounding_mode=None if a.type.dtype.is_float else "trunc")


@converts("Max", "Min", "Sum")
def _variadic(cx, n):
    op = {"Max": "maximum", "Min": "minimum", "Sum": "add"}[n.op]
    out = cx.tensor(n.ins[0])
    for x in n.ins[1:]:
        out = cx.emit(op, [out, cx.tensor(x)])
    return out


@converts("Pow")
def _pow(cx, n):
    x, e = cx.tensor(n.ins[0]), n.ins[1]
    if isinstance(e, np.ndarray) and e.size == 1 and e.dtype != object:
        y = cx.emit("pow_scalar", [x], exponent=float(e.reshape(-1)[0]))
    else:
        y = cx.emit("pow", [x, cx.tensor(e)])
    return y if y.type.dtype == x.type.dtype else cx.emit("cast", [y], dtype=x.type.dtype)  # ONNX: the base's type


@converts("IsNaN")
def _isnan(cx, n):
    return cs.isnan(cx, cx.tensor(n.ins[0]))


@converts("Where")
def _where(cx, n):
    return cx.emit("where", [cx.tensor(x) for x in n.ins])


@converts("Cast", "CastLike")
def _cast(cx, n):
    x = cx.tensor(n.ins[0])
    to = onnx_dtype(n.attrs["to"]) if n.op == "Cast" else cx.tensor(n.ins[1]).type.dtype
    return x if to == x.type.dtype else cx.emit("cast", [x], dtype=to)


@converts("Identity", "Dropout")
def _identity(cx, n):
    """Dropout at inference is the identity; in training mode (a `training_mode` input that
    is not a known false, with a ratio that is not a known 0) it is random: refused."""
    if n.op == "Dropout" and n.used(1):
        raise Unsupported("Dropout's mask output")
    if n.op == "Dropout" and n.input(2) is not None:
        training, ratio = n.input(2), n.input(1)
        off = isinstance(training, np.ndarray) and not training.reshape(-1)[0]
        zero = isinstance(ratio, np.ndarray) and ratio.dtype != object and float(ratio.reshape(-1)[0]) == 0.0
        if not (off or zero):
            raise Unsupported("Dropout in training mode (random; symfuse compiles inference)")
    return cx.tensor(n.ins[0])


@converts("Clip")
def _clip(cx, n):
    def bound(i):
        v = n.input(i)
        if v is None:
            return None
        return float(cx.known(v, f"Clip's {'min' if i == 1 else 'max'}").reshape(-1)[0])

    return cx.emit("clamp", [cx.tensor(n.ins[0])], min=bound(1), max=bound(2))


@converts("Gelu")
def _gelu(cx, n):
    return cx.emit("gelu", [cx.tensor(n.ins[0])], approximate=n.attrs.get("approximate", "none"))


@converts("LeakyRelu")
def _leaky_relu(cx, n):
    x = cx.tensor(n.ins[0])
    pos = cx.emit("gt", [x, cx.b.scalar(0.0, x.type.dtype)])
    return cx.emit("where", [pos, x, cx.emit("mul", [x, cx.b.scalar(float(n.attrs.get("alpha", 0.01)), x.type.dtype)])])


def _hard_sigmoid(cx, x, alpha, beta):
    y = cx.emit("add", [cx.emit("mul", [x, cx.b.scalar(alpha, x.type.dtype)]), cx.b.scalar(beta, x.type.dtype)])
    return cx.emit("clamp", [y], min=0.0, max=1.0)


@converts("HardSigmoid")
def _hardsigmoid(cx, n):
    return _hard_sigmoid(cx, cx.tensor(n.ins[0]), float(n.attrs.get("alpha", 0.2)), float(n.attrs.get("beta", 0.5)))


@converts("HardSwish")
def _hardswish(cx, n):
    x = cx.tensor(n.ins[0])
    return cx.emit("mul", [x, _hard_sigmoid(cx, x, 1 / 6, 0.5)])


_scalar = cs.scalar


@converts("Floor", "Ceil", "Round")
def _floor_ceil_round(cx, n):
    fn = {"Floor": cs.floor, "Ceil": cs.ceil, "Round": cs.round_half_even}[n.op]
    return fn(cx, cx.tensor(n.ins[0]))


@converts("Mod")
def _mod(cx, n):
    """fmod=1: C's remainder; fmod=0: Python's (the divisor's sign)."""
    return cs.remainder(cx, cx.tensor(n.ins[0]), cx.tensor(n.ins[1]), c_style=bool(n.attrs.get("fmod", 0)))


@converts("Sign")
def _sign(cx, n):
    return cs.sign(cx, cx.tensor(n.ins[0]))


@converts("IsInf")
def _isinf(cx, n):
    x = cx.tensor(n.ins[0])
    return cs.isinf(cx, x, bool(n.attrs.get("detect_positive", 1)), bool(n.attrs.get("detect_negative", 1)))


@converts("Elu", "Celu", "Selu")
def _elu(cx, n):
    x = cx.tensor(n.ins[0])
    if n.op == "Selu":
        alpha, gamma = float(n.attrs.get("alpha", 1.6732632423543772)), float(n.attrs.get("gamma", 1.0507009873554805))
        return cs.elu(cx, x, alpha, scale=gamma)
    alpha = float(n.attrs.get("alpha", 1.0))
    return cs.elu(cx, x, alpha, input_scale=1 / alpha if n.op == "Celu" else 1.0)


@converts("ThresholdedRelu")
def _thresholded_relu(cx, n):
    x = cx.tensor(n.ins[0])
    above = cx.emit("gt", [x, _scalar(cx, x, float(n.attrs.get("alpha", 1.0)))])
    return cx.emit("where", [above, x, _scalar(cx, x, 0)])


@converts("Shrink")
def _shrink(cx, n):
    x = cx.tensor(n.ins[0])
    lambd, bias = float(n.attrs.get("lambd", 0.5)), float(n.attrs.get("bias", 0.0))
    low = cx.emit("where", [cx.emit("lt", [x, _scalar(cx, x, -lambd)]), cx.emit("add", [x, _scalar(cx, x, bias)]),
                            _scalar(cx, x, 0)])  # fmt: skip
    high = cx.emit("gt", [x, _scalar(cx, x, lambd)])
    return cx.emit("where", [high, cx.emit("sub", [x, _scalar(cx, x, bias)]), low])


@converts("PRelu")
def _prelu(cx, n):
    x, slope = cx.tensor(n.ins[0]), cx.tensor(n.ins[1])
    return cx.emit("where", [cx.emit("lt", [x, _scalar(cx, x, 0)]), cx.emit("mul", [x, slope]), x])


@converts("Softplus", "Softsign", "Mish")
def _soft(cx, n):
    x = cx.tensor(n.ins[0])
    if n.op == "Softsign":
        return cx.emit("div", [x, cx.emit("add", [_scalar(cx, x, 1), cx.emit("abs", [x])])], rounding_mode=None)
    sp = cs.softplus(cx, x)
    return sp if n.op == "Softplus" else cx.emit("mul", [x, cx.emit("tanh", [sp])])


@converts("Tan", "Sinh", "Cosh")
def _trig(cx, n):
    x = cx.tensor(n.ins[0])
    return cs.tan(cx, x) if n.op == "Tan" else cs.hyperbolic(cx, x, odd=n.op == "Sinh")


@converts("Mean")
def _mean(cx, n):
    out = _variadic(cx, OnnxNode(n.proto, n.ins, n.attrs, n.opset, op_type="Sum"))
    return cx.emit("div", [out, _scalar(cx, out, len(n.ins))], rounding_mode=None)


@converts("Xor")
def _xor(cx, n):
    return cs.bitwise_xor(cx, cx.tensor(n.ins[0]), cx.tensor(n.ins[1]))


# -- creation -----------------------------------------------------------------------------------


@converts("ConstantOfShape")
def _constant_of_shape(cx, n):
    shape = cx.dims(n.ins[0], "ConstantOfShape's shape")
    value = n.attrs.get("value", np.zeros(1, np.float32))
    v = value.reshape(-1)[0].item()
    return cx.emit("full", [], shape=shape, value=v, dtype=np_dtype_to_symfuse(value.dtype))


@converts("Range")
def _range(cx, n):
    if any(isinstance(x, np.ndarray) and x.dtype.kind == "f" for x in n.ins):
        raise Unsupported("Range with floating-point bounds")
    start, limit, delta = (cx.ints(x, f"Range's {w}")[0] for x, w in zip(n.ins, ("start", "limit", "delta")))
    if not isinstance(delta, int):
        raise Unsupported("Range with a symbolic step")
    dt = n.ins[0].dtype
    return cx.emit("arange", [], start=dim(start), end=dim(limit), step=delta, dtype=np_dtype_to_symfuse(dt))


# -- layout -------------------------------------------------------------------------------------


@converts("Reshape")
def _reshape(cx, n):
    x = cx.tensor(n.ins[0])
    shape = list(cx.ints(n.ins[1], "Reshape's shape"))
    for i, s in enumerate(shape):
        if isinstance(s, int) and s == 0:
            if n.attrs.get("allowzero", 0):
                raise Unsupported("Reshape to a size-0 dim")
            shape[i] = x.type.shape[i]
    return cx.emit("reshape", [x], shape=tuple(s if isinstance(s, int) and s == -1 else dim(s) for s in shape))


@converts("Flatten")
def _flatten(cx, n):
    x = cx.tensor(n.ins[0])
    s = list(x.type.shape)
    axis = n.attrs.get("axis", 1)
    axis = axis + len(s) if axis < 0 else axis  # -1 is the last dim, as everywhere in ONNX
    return cx.emit("reshape", [x], shape=(product(s[:axis]), product(s[axis:])))


@converts("Unsqueeze")
def _unsqueeze(cx, n):
    x = cx.tensor(n.ins[0])
    axes = _axes(cx, n, 1)
    rank = x.type.rank + len(axes)
    s = list(x.type.shape)
    for a in sorted(a % rank for a in axes):
        s.insert(a, dim(1))
    return cx.emit("reshape", [x], shape=tuple(s))


@converts("Squeeze")
def _squeeze(cx, n):
    x = cx.tensor(n.ins[0])
    s = list(x.type.shape)
    axes = _axes(cx, n, 1)
    if axes is None:
        if any(not d.is_Integer for d in s):
            raise Unsupported("Squeeze without axes on a tensor with dynamic dims")
        axes = [i for i, d in enumerate(s) if d == 1]
    axes = {a % len(s) for a in axes}
    ctx = ShapeContext(cx.store, "Squeeze", cx.name, cx.loc)
    for a in axes:
        ctx.eq(s[a], 1, f"Squeeze removes dim {a}, which must be 1")
    return cx.emit("reshape", [x], shape=tuple(d for i, d in enumerate(s) if i not in axes))


@converts("Transpose")
def _transpose(cx, n):
    x = cx.tensor(n.ins[0])
    perm = n.attrs.get("perm") or list(range(x.type.rank))[::-1]
    return cx.emit("permute", [x], dims=tuple(int(p) for p in perm))


@converts("Expand")
def _expand(cx, n):
    x = cx.tensor(n.ins[0])
    target = list(cx.dims(n.ins[1], "Expand's shape"))
    rank = max(len(target), x.type.rank)
    target = [dim(1)] * (rank - len(target)) + target
    src = [dim(1)] * (rank - x.type.rank) + list(x.type.shape)
    sizes = tuple(s if t == 1 else t for s, t in zip(src, target))  # ONNX broadcasts both ways
    if rank > x.type.rank:
        x = cx.emit("reshape", [x], shape=tuple(src))
    return cx.emit("expand", [x], sizes=sizes)


@converts("Pad")
def _pad(cx, n):
    """Padding (pads: every axis's begin, then every axis's end) by a constant, or in
    reflect, edge or wrap mode by the tensor's own elements."""
    mode = n.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    x = cx.tensor(n.ins[0])
    pads = cx.ints(n.ins[1], "Pad's pads")
    axes = [a % x.type.rank for a in (_axes(cx, n, 3) or range(x.type.rank))]
    if len(pads) != 2 * len(axes):
        raise Unsupported(f"Pad with {len(pads)} pads for {len(axes)} axes")
    if mode != "constant":
        by = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}
        if mode not in by:
            raise Unsupported(f"Pad in {mode} mode")
        sides = {k: (pads[i], pads[i + len(axes)]) for i, k in enumerate(axes)}
        return cs.pad_by_index(cx, x, sides, by[mode], crop_first=True)  # ONNX crops, then pads
    value = n.input(2)
    value = 0 if value is None or (isinstance(value, np.ndarray) and value.size == 0) else value
    if isinstance(value, Value):
        fill = value if value.type.dtype == x.type.dtype else cx.emit("cast", [value], dtype=x.type.dtype)
        fill = cx.emit("reshape", [fill], shape=())
    else:
        v = np.asarray(value).reshape(-1)[0].item() if isinstance(value, np.ndarray) else value
        fill = cx.b.scalar(float(v) if x.type.dtype.is_float else int(v), x.type.dtype, loc=cx.loc)
    sides = {k: (pads[i], pads[i + len(axes)]) for i, k in enumerate(axes)}
    return pad_constant(cx, x, sides, fill)


@converts("Tile")
def _tile(cx, n):
    """Each dim d repeated r times: viewed as (1, d), expanded to (r, d), merged to r * d."""
    x = cx.tensor(n.ins[0])
    reps = cx.dims(n.ins[1], "Tile's repeats")
    inner = [d for d in x.type.shape for d in (dim(1), d)]
    outer = [d for r, s in zip(reps, x.type.shape) for d in (r, s)]
    y = cx.emit("expand", [cx.emit("reshape", [x], shape=tuple(inner))], sizes=tuple(outer))
    return cx.emit("reshape", [y], shape=tuple(r * d for r, d in zip(reps, x.type.shape)))


@converts("DepthToSpace", "SpaceToDepth")
def _depth_space(cx, n):
    """Blocks of channels moved into space (or back) by a reshape, a permute and a reshape;
    the DCR mode has the block index first in the channels, CRD last."""
    x = cx.tensor(n.ins[0])
    b = int(n.attrs["blocksize"])
    N, C, H, W = x.type.shape
    if n.op == "SpaceToDepth":
        y = cx.emit("reshape", [x], shape=(N, C, H // b, dim(b), W // b, dim(b)))
        crd = n.attrs.get("mode", "DCR") == "CRD"
        y = cx.emit("permute", [y], dims=(0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4))
        return cx.emit("reshape", [y], shape=(N, C * b * b, H // b, W // b))
    c = C // (b * b)
    if n.attrs.get("mode", "DCR") == "DCR":
        y = cx.emit("reshape", [x], shape=(N, dim(b), dim(b), c, H, W))
        y = cx.emit("permute", [y], dims=(0, 3, 4, 1, 5, 2))
    else:
        y = cx.emit("reshape", [x], shape=(N, c, dim(b), dim(b), H, W))
        y = cx.emit("permute", [y], dims=(0, 1, 4, 2, 5, 3))
    return cx.emit("reshape", [y], shape=(N, c, H * b, W * b))


_REPEATS = {("asymmetric", "floor")} | {
    (c, r) for c in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric")
    for r in ("round_prefer_floor", "round_prefer_ceil")
}  # fmt: skip


@converts("Resize", "Upsample")
def _resize(cx, n):
    """Nearest resizing by whole factors: each element repeated s times along each resized
    dim (a view (.., d, 1, ..) expanded to (.., d, s, ..) and merged). For a whole factor
    that is what nearest means under `asymmetric` + `floor` and under the half-pixel modes
    with rounding (no source coordinate falls on a half); other modes pick other pixels."""
    x = cx.tensor(n.ins[0])
    mode = n.attrs.get("mode", "nearest")
    coords = n.attrs.get("coordinate_transformation_mode", "half_pixel" if n.op == "Resize" else "asymmetric")
    rounding = n.attrs.get("nearest_mode", "round_prefer_floor" if n.op == "Resize" else "floor")
    rank = x.type.rank
    axes = [a % rank for a in n.attrs.get("axes", range(rank))]
    scales = n.input(2) if n.op == "Resize" else n.input(1)
    sizes = n.input(3) if n.op == "Resize" else None
    factors = {}
    if scales is not None and cx.known(scales, f"{n.op}'s scales").size:
        for a, f in zip(axes, cx.known(scales, f"{n.op}'s scales").reshape(-1).tolist()):
            if float(f) != int(f) or f < 1:
                raise Unsupported(f"{n.op} by a scale of {f} (whole factors only)")
            factors[a] = int(f)
    elif sizes is not None:
        if n.attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise Unsupported(f"{n.op} with keep_aspect_ratio_policy={n.attrs['keep_aspect_ratio_policy']}")
        for a, size in zip(axes, cx.dims(sizes, f"{n.op}'s sizes")):
            q = exact_quotient(size, x.type.shape[a])
            if q is None or not q.is_Integer or q < 1:
                raise Unsupported(f"{n.op} from {x.type.shape[a]} to {size} along dim {a} (whole factors only)")
            factors[a] = int(q)
    else:
        raise Unsupported(f"{n.op} without scales or sizes")
    factors = {a: f for a, f in factors.items() if f != 1}
    if factors and mode != "nearest":
        raise Unsupported(f"{n.op} in {mode} mode (nearest by whole factors only)")
    if factors and (coords, rounding) not in _REPEATS:
        raise Unsupported(f"{n.op} with coordinate_transformation_mode={coords} and nearest_mode={rounding}")
    shape = list(x.type.shape)
    inner = [d for k, s in enumerate(shape) for d in ((s, dim(1)) if k in factors else (s,))]
    outer = [d for k, s in enumerate(shape) for d in ((s, dim(factors[k])) if k in factors else (s,))]
    if not factors:
        return x
    y = cx.emit("expand", [cx.emit("reshape", [x], shape=tuple(inner))], sizes=tuple(outer))
    return cx.emit("reshape", [y], shape=tuple(s * factors.get(k, 1) for k, s in enumerate(shape)))


@converts("Trilu")
def _trilu(cx, n):
    """The upper (or lower) triangle of the last two dims from diagonal k; zeros elsewhere."""
    x = cx.tensor(n.ins[0])
    r = x.type.rank
    k = int(cx.ints(n.input(1), "Trilu's k")[0]) if n.input(1) is not None else 0
    rows, cols = cs.position(cx, x.type.shape[-2], r - 2, r), cs.position(cx, x.type.shape[-1], r - 1, r)
    diag = cx.emit("sub", [cols, rows])
    keep = cx.emit("ge" if n.attrs.get("upper", 1) else "le", [diag, cx.b.scalar(k, DType.int64, loc=cx.loc)])
    return cx.emit("where", [keep, x, _scalar(cx, x, 0)])


@converts("OneHot")
def _one_hot(cx, n):
    """`values[1]` where the position along the new `axis` equals the index (a negative one
    counts from the end of `depth`; real indices are truncated), `values[0]` elsewhere."""
    idx = cx.tensor(n.ins[0])
    depth = int(cx.known(n.ins[1], "OneHot's depth").reshape(-1)[0])  # any numeric type
    values = cx.known(n.ins[2], "OneHot's values")
    idx = cx.emit("cast", [cs.trunc(cx, idx)], dtype=DType.int64)
    depth_v = cx.b.scalar(depth, DType.int64, loc=cx.loc)
    idx = cx.emit("where", [cx.emit("lt", [idx, cx.b.scalar(0, DType.int64, loc=cx.loc)]),
                            cx.emit("add", [idx, depth_v]), idx])  # fmt: skip
    hit = cs.one_hot(cx, idx, depth, n.attrs.get("axis", -1))
    off, on = (cx.tensor(np.array(values.reshape(-1)[i])) for i in (0, 1))
    return cx.emit("where", [hit, on, off])


@converts("Concat")
def _concat(cx, n):
    xs = [cx.tensor(x) for x in n.ins if not (isinstance(x, np.ndarray) and x.size == 0 and x.ndim == 1)]
    return xs[0] if len(xs) == 1 else cx.emit("cat", xs, dim=n.attrs["axis"])


@converts("Slice")
def _slice(cx, n):
    x = cx.tensor(n.ins[0])
    starts, ends, axes, steps = _slice_args(cx, n, x.type.rank)
    for s, e, a, st in zip(starts, ends, axes, steps):
        if not isinstance(st, int) or st < 1:
            raise Unsupported(f"Slice with step {st} (symfuse slices forwards)")
        x = cx.emit("slice", [x], dim=a, start=s, end=e, step=st)
    return x


@converts("Split")
def _split(cx, n):
    x = cx.tensor(n.ins[0])
    axis = n.attrs.get("axis", 0) % x.type.rank
    d = x.type.shape[axis]
    if n.input(1) is not None:
        sizes = list(cx.dims(n.input(1), "Split's sizes"))
    elif "split" in n.attrs:
        sizes = [dim(int(s)) for s in n.attrs["split"]]
    else:
        k = n.attrs.get("num_outputs", len(n.proto.output))
        size = ceildiv(d, k)
        sizes = [size] * (k - 1) + [d - size * (k - 1)]
    out, start = [], dim(0)
    for s in sizes:
        out.append(cx.emit("slice", [x], dim=axis, start=start, end=start + s, step=1))
        start = start + s
    return tuple(out)


@converts("Gather")
def _gather(cx, n):
    data, idx = n.ins
    axis = n.attrs.get("axis", 0)
    if isinstance(idx, np.ndarray) and idx.dtype != object:
        x = cx.tensor(data)
        axis %= x.type.rank
        size = x.type.shape[axis]
        if (idx < 0).any():
            if not size.is_Integer:
                raise Unsupported(f"Gather with negative indices along dynamic dim {axis}")
            idx = np.where(idx < 0, idx + int(size), idx)
        if idx.ndim == 0:
            return cx.emit("select", [x], dim=axis, index=int(idx))
        return cx.emit("index", [x, cx.tensor(idx.astype(np.int64))], dims=(axis,))
    x = cx.tensor(data)  # `index` counts a negative index from the end, as ONNX does
    return cx.emit("index", [x, cx.tensor(idx)], dims=(axis % x.type.rank,))


def _from_end(cx, idx: Value, size) -> Value:
    """Indices computed at run time, where ONNX counts a negative one from the end of `size`
    (out of range either way is still reported by the kernel reading it)."""
    zero = cx.b.scalar(0, idx.type.dtype, loc=cx.loc)
    n = cx.emit("full", [], shape=(), value=size if not size.is_Integer else int(size), dtype=idx.type.dtype)
    return cx.emit("where", [cx.emit("lt", [idx, zero]), cx.emit("add", [idx, n]), idx])


@converts("GatherElements")
def _gather_elements(cx, n):
    x = cx.tensor(n.ins[0])
    axis = n.attrs.get("axis", 0) % x.type.rank
    return cx.emit("gather", [x, _from_end(cx, cx.tensor(n.ins[1]), x.type.shape[axis])], dim=axis)


@converts("GatherND")
def _gather_nd(cx, n):
    if n.attrs.get("batch_dims", 0):
        raise Unsupported("GatherND with batch_dims")
    x, idx = cx.tensor(n.ins[0]), cx.tensor(n.ins[1])
    k = idx.type.shape[-1]
    if not k.is_Integer:
        raise Unsupported("GatherND whose index depth is dynamic")
    parts = [cx.emit("select", [idx], dim=-1, index=j) for j in range(int(k))]
    return cx.emit("index", [x, *parts], dims=tuple(range(int(k))))


# -- reductions -------------------------------------------------------------------------------


@converts(
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2", "ReduceL1", "ReduceLogSum",
    "ReduceLogSumExp",
)  # fmt: skip
def _reduce(cx, n):
    x = cx.tensor(n.ins[0])
    axes = _axes(cx, n, 1)
    if not axes:
        if n.attrs.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.type.rank))
    keep = bool(n.attrs.get("keepdims", 1))
    if n.op in ("ReduceSumSquare", "ReduceL2"):  # the sum of squares (under a square root for L2)
        x = cx.emit("mul", [x, x])
    elif n.op == "ReduceL1":
        x = cx.emit("abs", [x])
    if n.op == "ReduceLogSumExp":  # log(sum(exp(x - max))) + max: no overflow
        top = cx.emit("amax", [x], dims=tuple(axes), keepdim=True)
        y = cx.emit("log", [cx.emit("sum", [cx.emit("exp", [cx.emit("sub", [x, top])])], dims=tuple(axes),
                                    keepdim=True, dtype=None)])  # fmt: skip
        y = cx.emit("add", [y, top])
        return y if keep else cx.emit("reshape", [y], shape=_reduced_shape(x, axes))
    op = {"ReduceMean": "mean", "ReduceMax": "amax", "ReduceMin": "amin"}.get(n.op, "sum")
    extra = {"dtype": None} if op in ("mean", "sum") else {}
    y = cx.emit(op, [x], dims=tuple(axes), keepdim=keep, **extra)
    after = {"ReduceL2": "sqrt", "ReduceLogSum": "log"}.get(n.op)
    return cx.emit(after, [y]) if after else y


def _reduced_shape(x, axes) -> tuple:
    gone = {a % x.type.rank for a in axes}
    return tuple(d for k, d in enumerate(x.type.shape) if k not in gone)


@converts("ArgMax", "ArgMin")
def _argmax(cx, n):
    x = cx.tensor(n.ins[0])
    return arg_extreme(
        cx, x, n.attrs.get("axis", 0), bool(n.attrs.get("keepdims", 1)), n.op == "ArgMax",
        bool(n.attrs.get("select_last_index", 0)),
    )[1]  # fmt: skip


@converts("TopK")
def _top_k(cx, n):
    k = int(cx.known(n.ins[1], "TopK's K").reshape(-1)[0])
    try:
        return cs.top_k(cx, cx.tensor(n.ins[0]), k, n.attrs.get("axis", -1), bool(n.attrs.get("largest", 1)))
    except ValueError as e:
        raise Unsupported(str(e)) from None


@converts("Einsum")
def _einsum(cx, n):
    try:
        return cs.einsum(cx, n.attrs["equation"], [cx.tensor(x) for x in n.ins])
    except ValueError as e:
        raise Unsupported(str(e)) from None


@converts("Hardmax")
def _hardmax(cx, n):
    """1 at the first largest element along `axis`, 0 elsewhere."""
    x = cx.tensor(n.ins[0])
    axis = n.attrs.get("axis", -1) % x.type.rank
    at = arg_extreme(cx, x, axis, True, True)[1]
    index = cs.position(cx, x.type.shape[axis], axis, x.type.rank)
    return cx.emit("cast", [cx.emit("eq", [index, at])], dtype=x.type.dtype)


def _safe_softmax_pattern(cx, n) -> tuple[str, str] | None:
    """`Where(IsNaN(p), 0, p)` on the softmax's output `p`: what exporters write for torch's
    safe softmax (a row that attends to nothing gives zeros, not NaN)."""
    out = n.proto.output[0]
    users = cx.consumers.get(out, [])
    isnan = [u for u in users if u.op_type == "IsNaN"]
    where = [u for u in users if u.op_type == "Where"]
    if len(users) != 2 or len(isnan) != 1 or len(where) != 1:
        return None
    w = where[0]
    if w.input[0] != isnan[0].output[0] or w.input[2] != out or len(cx.consumers.get(isnan[0].output[0], [])) != 1:
        return None
    zero = cx.env.get(w.input[1])
    if not (
        isinstance(zero, np.ndarray) and zero.size == 1 and zero.dtype != object and float(zero.reshape(-1)[0]) == 0
    ):
        return None
    return isnan[0].output[0], w.output[0]


@converts("Softmax", "LogSoftmax")
def _softmax(cx, n):
    x = cx.tensor(n.ins[0])
    axis = n.attrs.get("axis", -1)
    if n.opset < 13 and x.type.rank > 1 and axis % x.type.rank != x.type.rank - 1:
        raise Unsupported("Softmax before opset 13 over a non-last axis (it flattens)")
    if n.op == "Softmax":
        pattern = _safe_softmax_pattern(cx, n)
        if pattern is not None:
            y = cx.emit("safe_softmax", [x], dim=axis)
            cx.env[pattern[0]] = _TAKEN
            cx.env[pattern[1]] = y
            return y
    return cx.emit("softmax" if n.op == "Softmax" else "log_softmax", [x], dim=axis)


@converts("LayerNormalization")
def _layer_norm(cx, n):
    """`layer_norm`; the mean and inverse standard deviation outputs, where read, by their
    own reductions (kept dims of size 1, as ONNX shapes them)."""
    x = cx.tensor(n.ins[0])
    axis = n.attrs.get("axis", -1) % x.type.rank
    w = cx.tensor(n.input(1)) if n.input(1) is not None else None
    bias = cx.tensor(n.input(2)) if n.input(2) is not None else None
    eps = float(n.attrs.get("epsilon", 1e-5))
    y = cx.emit("layer_norm", [x, w, bias], normalized_shape=tuple(x.type.shape[axis:]), eps=eps)
    if not (n.used(1) or n.used(2)):
        return y
    dims = tuple(range(axis, x.type.rank))
    mean = cx.emit("mean", [x], dims=dims, keepdim=True, dtype=None)
    dev = cx.emit("sub", [x, mean])
    var = cx.emit("mean", [cx.emit("mul", [dev, dev])], dims=dims, keepdim=True, dtype=None)
    return y, mean, cx.emit("rsqrt", [cx.emit("add", [var, _scalar(cx, var, eps)])])


@converts("InstanceNormalization", "GroupNormalization")
def _group_norm(cx, n):
    """Normalised over each group of channels (each channel for InstanceNormalization): a
    layer norm over [C/G, *spatial] after a reshape, then the per-channel scale and bias
    (GroupNormalization before opset 21 gives them per group: repeated to channels)."""
    x = cx.tensor(n.ins[0])
    s = list(x.type.shape)
    groups = int(n.attrs["num_groups"]) if n.op == "GroupNormalization" else None
    if groups is None:
        if not s[1].is_Integer:
            raise Unsupported("InstanceNormalization over a dynamic number of channels")
        groups = int(s[1])
    eps = float(n.attrs.get("epsilon", 1e-5))
    y = cx.emit("reshape", [x], shape=(s[0], dim(groups), -1))
    y = cx.emit("layer_norm", [y, None, None], normalized_shape=(y.type.shape[-1],), eps=eps)
    y = cx.emit("reshape", [y], shape=tuple(s))
    per_channel = (s[1],) + (dim(1),) * (len(s) - 2)
    for i, op in ((1, "mul"), (2, "add")):
        v = n.ins[i]
        if isinstance(v, np.ndarray) and v.size == groups and s[1] != groups:
            v = np.repeat(v, int(s[1]) // groups)
        y = cx.emit(op, [y, cx.emit("reshape", [cx.tensor(v)], shape=per_channel)])
    return y


@converts("RMSNormalization")
def _rms_norm(cx, n):
    x = cx.tensor(n.ins[0])
    axis = n.attrs.get("axis", -1) % x.type.rank
    eps = float(n.attrs.get("epsilon", 1e-5))
    ms = cx.emit("mean", [cx.emit("mul", [x, x])], dims=tuple(range(axis, x.type.rank)), keepdim=True, dtype=None)
    y = cx.emit("mul", [x, cx.emit("rsqrt", [cx.emit("add", [ms, _scalar(cx, ms, eps)])])])
    return cx.emit("mul", [y, cx.tensor(n.ins[1])])


@converts("LpNormalization")
def _lp_norm(cx, n):
    x = cx.tensor(n.ins[0])
    axis, p = n.attrs.get("axis", -1) % x.type.rank, int(n.attrs.get("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"LpNormalization with p={p} (1 and 2 are defined)")
    mag = cx.emit("abs", [x]) if p == 1 else cx.emit("mul", [x, x])
    norm = cx.emit("sum", [mag], dims=(axis,), keepdim=True, dtype=None)
    norm = norm if p == 1 else cx.emit("sqrt", [norm])
    zero = _scalar(cx, x, 0)  # a zero vector stays zero
    return cx.emit("where", [cx.emit("eq", [norm, zero]), zero, cx.emit("div", [x, norm], rounding_mode=None)])


@converts("CumSum")
def _cumsum(cx, n):
    """The running sum; `exclusive` leaves out the element itself (the sum minus it), `reverse`
    runs from the end (the total minus the exclusive sum from the start)."""
    axis = int(cx.ints(n.ins[1], "CumSum's axis")[0])
    x = cx.tensor(n.ins[0])
    run = cx.emit("cumsum", [x], dim=axis, dtype=x.type.dtype)  # ONNX keeps the type (torch widens ints)
    exclusive, reverse = n.attrs.get("exclusive", 0), n.attrs.get("reverse", 0)
    before = cx.emit("sub", [run, x]) if exclusive or reverse else run
    if not reverse:
        return before
    total = cx.emit("sum", [x], dims=(axis,), keepdim=True, dtype=x.type.dtype)
    after = cx.emit("sub", [total, before])  # from the element to the end
    return cx.emit("sub", [after, x]) if exclusive else after


@converts("BatchNormalization")
def _batch_norm(cx, n):
    if n.attrs.get("training_mode", 0) or n.used(1):
        raise Unsupported("BatchNormalization in training mode")
    x, w, b, mean, var = (cx.tensor(v) for v in n.ins[:5])
    return cx.emit("batch_norm", [x, w, b, mean, var], eps=float(n.attrs.get("epsilon", 1e-5)))


# -- pooling and convolution ------------------------------------------------------------------------


def _window_pads(cx, n, x, kernel, strides, dilations, ceil: bool = False) -> tuple[tuple, dict]:
    """The padding of a 2-D or 3-D window op: `(padding, sides)`, where `padding` is the op's own
    (the same on both sides of a dim, at most half the window for a pool) and `sides` the
    rest, `{dim: (before, after)}`, to pad explicitly first: uneven or large pads, `SAME`
    padding of a size the stride does not divide, and the extra end a `ceil_mode` window
    reads (the last one, when it starts inside the input or its begin padding)."""
    auto = n.attrs.get("auto_pad", "NOTSET")
    sizes = x.type.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for h, e, st in zip(sizes, eff, strides):
            need = (ceildiv(h, st) - 1) * st + e - h
            pads.append(need if need.is_Integer or st == 1 else dmax(need, dim(0)))
        pads = [cx.store.canon(dim(p)) for p in pads]
        half = [floordiv(p, 2) if auto == "SAME_UPPER" else p - floordiv(p, 2) for p in pads]
        begin, end = half, [p - h for p, h in zip(pads, half)]
    elif auto == "VALID":
        begin, end = [dim(0)] * len(sizes), [dim(0)] * len(sizes)
    else:
        pads = [dim(int(p)) for p in n.attrs.get("pads", [0] * 2 * len(sizes))]
        begin, end = pads[: len(sizes)], pads[len(sizes) :]
    if ceil:
        for i, (h, e, st) in enumerate(zip(sizes, eff, strides)):
            span = h + begin[i] + end[i] - e
            if not (dim(span).is_Integer or st == 1):
                raise Unsupported(f"{n.op} with ceil_mode=1 over a dynamic size and stride {st}")
            if st == 1:
                continue
            span = int(span)
            out = -(-span // st) + 1
            if (out - 1) * st >= int(h) + int(begin[i]):  # the last window would start in the end padding
                out -= 1
            end[i] = end[i] + max(0, (out - 1) * st + e - (int(h) + int(begin[i]) + int(end[i])))
    begin, end = [cx.store.canon(dim(b)) for b in begin], [cx.store.canon(dim(e)) for e in end]
    limit = [e // 2 if n.op != "Conv" else None for e in eff]
    if all(b == e and b.is_Integer and (lim is None or int(b) <= lim) for b, e, lim in zip(begin, end, limit)):
        return tuple(int(b) for b in begin), {}
    return (0,) * len(sizes), {2 + i: (b, e) for i, (b, e) in enumerate(zip(begin, end)) if not (b == 0 and e == 0)}


def _padded(cx, x, sides: dict, value: float):
    if not sides:
        return x
    sides = {k: tuple(int(p) if dim(p).is_Integer else p for p in lohi) for k, lohi in sides.items()}
    return pad_constant(cx, x, sides, cx.b.scalar(value, x.type.dtype, loc=cx.loc))


def _spatial(cx, n, x, what: str, most: int = 3) -> int:
    """The number of spatial dims of a window op's input (2 or up to `most`; 1-D ones arrive
    as 2-D, `_one_dimensional`)."""
    k = x.type.rank - 2
    if not 2 <= k <= most:
        raise Unsupported(f"{what} over {k} spatial dims (symfuse has the 1-D to {most}-D forms)")
    return k


def _one_dimensional(convert):
    """A 1-D window op as the 2-D one over a height of 1: the input `(N, C, L)` viewed as
    `(N, C, 1, L)`, a known weight `(O, I, k)` as `(O, I, 1, k)`, each window attribute given
    a leading 1 (pads a leading 0 on both sides), the output viewed back."""

    def convert_any(cx, n):
        x = cx.tensor(n.ins[0])
        if x.type.rank != 3:
            return convert(cx, n)
        attrs = dict(n.attrs)
        for key in ("kernel_shape", "strides", "dilations", "output_padding"):
            if key in attrs:
                attrs[key] = [0 if key == "output_padding" else 1, *attrs[key]]
        if "pads" in attrs:
            attrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
        s = list(x.type.shape)
        ins = [cx.emit("reshape", [x], shape=(s[0], s[1], dim(1), s[2])), *n.ins[1:]]
        if n.op in ("Conv", "ConvTranspose"):
            w = n.ins[1]
            ins[1] = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]) if isinstance(w, np.ndarray) else \
                cx.emit("reshape", [w], shape=(w.type.shape[0], w.type.shape[1], dim(1), w.type.shape[2]))  # fmt: skip
        outs = convert(cx, OnnxNode(n.proto, ins, attrs, n.opset))
        y = outs[0] if isinstance(outs, tuple) else outs
        o = list(y.type.shape)
        return cx.emit("reshape", [y], shape=(o[0], o[1], o[3]))

    return convert_any


@converts("Conv")
@_one_dimensional
def _conv(cx, n):
    x, w = cx.tensor(n.ins[0]), cx.tensor(n.ins[1])
    nd = _spatial(cx, n, x, "Conv")
    bias = cx.tensor(n.input(2)) if n.input(2) is not None else None
    kernel = [int(k) for k in n.attrs.get("kernel_shape", [int(d) for d in w.type.shape[2:]])]
    strides = tuple(int(s) for s in n.attrs.get("strides", [1] * nd))
    dil = tuple(int(d) for d in n.attrs.get("dilations", [1] * nd))
    pad, sides = _window_pads(cx, n, x, kernel, strides, dil)
    return cx.emit(
        f"conv{nd}d", [_padded(cx, x, sides, 0.0), w, bias], stride=strides, padding=pad, dilation=dil,
        groups=int(n.attrs.get("group", 1)),
    )  # fmt: skip


@converts("ConvTranspose")
@_one_dimensional
def _conv_transpose(cx, n):
    """`conv_transpose2d`. Pads come from `pads`, or from the output size (`output_shape`,
    or the input size times the stride under `auto_pad=SAME_*`): the total the output is
    short of, split as ONNX says (the larger half at the end for SAME_UPPER)."""
    x = cx.tensor(n.ins[0])
    _spatial(cx, n, x, "ConvTranspose", most=2)
    w = cx.known(n.ins[1], "ConvTranspose's weight")
    strides = tuple(int(v) for v in n.attrs.get("strides", [1, 1]))
    dil = tuple(int(v) for v in n.attrs.get("dilations", [1, 1]))
    extra = tuple(int(v) for v in n.attrs.get("output_padding", [0, 0]))
    auto = n.attrs.get("auto_pad", "NOTSET")
    sizes = x.type.shape[2:]
    if "output_shape" in n.attrs or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = [dim(int(v)) for v in n.attrs["output_shape"][-2:]] if "output_shape" in n.attrs else \
            [h * st for h, st in zip(sizes, strides)]  # fmt: skip
        pads = []
        for h, st, e, d, k, out in zip(sizes, strides, extra, dil, w.shape[2:], want):
            total = cx.store.canon(st * (h - 1) + e + (k - 1) * d + 1 - out)
            small = floordiv(total, 2)
            pads.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    elif auto == "VALID":
        pads = [(0, 0), (0, 0)]
    else:
        p = [int(v) for v in n.attrs.get("pads", [0, 0, 0, 0])]
        pads = [(p[0], p[2]), (p[1], p[3])]
    bias = cx.tensor(n.input(2)) if n.input(2) is not None else None
    weight = to_torch(w)
    return conv_transpose2d(cx, x, weight, bias, strides, pads, extra, dil, int(n.attrs.get("group", 1)))


@converts("MaxPool", "AveragePool")
@_one_dimensional
def _pool(cx, n):
    """A pool whose padding torch's cannot express (`_window_pads`) runs over the input padded
    explicitly: with -inf for MaxPool, with zeros for AveragePool, whose divisor is then the
    same pool over ones padded where the divisor counts (the pads with count_include_pad,
    never the ceil_mode end)."""
    x = cx.tensor(n.ins[0])
    nd = _spatial(cx, n, x, n.op)
    if n.used(1):
        raise Unsupported("MaxPool's indices output")
    k = tuple(int(v) for v in n.attrs["kernel_shape"])
    strides = tuple(int(s) for s in n.attrs.get("strides", [1] * nd))
    dil = tuple(int(d) for d in n.attrs.get("dilations", [1] * nd))
    pad, sides = _window_pads(cx, n, x, k, strides, dil, ceil=bool(n.attrs.get("ceil_mode", 0)))
    if n.op == "MaxPool":
        x = _padded(cx, x, sides, float("-inf") if x.type.dtype.is_float else int(torch.iinfo(x.type.dtype.torch).min))
        return cx.emit(f"max_pool{nd}d", [x], kernel_size=k, stride=strides, padding=pad, dilation=dil)
    if any(d != 1 for d in dil):
        raise Unsupported("AveragePool with dilations")
    include = bool(n.attrs.get("count_include_pad", 0))

    def pool(t):
        return cx.emit(
            f"avg_pool{nd}d", [t], kernel_size=k, stride=strides, padding=pad, count_include_pad=include,
            divisor_override=None,
        )  # fmt: skip

    if not sides:
        return pool(x)
    summed = pool(_padded(cx, x, sides, 0.0))
    ceil = bool(n.attrs.get("ceil_mode", 0))
    if include and not ceil:
        return summed  # every pad counts: the zeros' average is the average
    ones = cx.emit("full", [], shape=(dim(1), dim(1), *x.type.shape[2:]), value=1.0, dtype=x.type.dtype)
    if include:  # the pads count, the ceil_mode end does not
        if n.attrs.get("auto_pad", "NOTSET") != "NOTSET":
            raise Unsupported("AveragePool with auto_pad, ceil_mode and count_include_pad together")
        pads = n.attrs.get("pads", [0] * 2 * nd)
        b, e = [int(p) for p in pads[:nd]], [int(p) for p in pads[nd:]]
        ones = _padded(cx, ones, {2 + i: (b[i], e[i]) for i in range(nd) if b[i] or e[i]}, 1.0)
        sides = {d: (lo - b[d - 2], hi - e[d - 2]) for d, (lo, hi) in sides.items()}
    return cx.emit("div", [summed, pool(_padded(cx, ones, sides, 0.0))], rounding_mode=None)


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(cx, n):
    x = cx.tensor(n.ins[0])
    nd = _spatial(cx, n, x, n.op)
    dims = tuple(range(2, 2 + nd))
    if n.op == "GlobalAveragePool":
        if nd == 2:
            return cx.emit("adaptive_avg_pool2d", [x], output_size=(1, 1))
        return cx.emit("mean", [x], dims=dims, keepdim=True, dtype=None)
    return cx.emit("amax", [x], dims=dims, keepdim=True)


# -- compute-intensive ------------------------------------------------------------------------------


def _vec_matmul(cx, a: Value, b: Value) -> Value:
    """numpy's matmul on symfuse's (rank >= 2) one: a 1-D operand gets a unit dim and loses it."""
    squeeze = []
    if a.type.rank == 1:
        a = cx.emit("reshape", [a], shape=(dim(1), a.type.shape[0]))
        squeeze.append(-2)
    if b.type.rank == 1:
        b = cx.emit("reshape", [b], shape=(b.type.shape[0], dim(1)))
        squeeze.append(-1)
    y = cx.emit("matmul", [a, b])
    if squeeze:
        keep = [d for i, d in enumerate(y.type.shape) if i - y.type.rank not in squeeze]
        y = cx.emit("reshape", [y], shape=tuple(keep))
    return y


@converts("MatMul")
def _matmul(cx, n):
    return _vec_matmul(cx, cx.tensor(n.ins[0]), cx.tensor(n.ins[1]))


@converts("Gemm")
def _gemm(cx, n):
    a, b, c = n.input(0), n.input(1), n.input(2)
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    x = cx.tensor(a)
    if n.attrs.get("transA", 0):
        x = cx.emit("permute", [x], dims=(1, 0))
    if isinstance(b, np.ndarray) and b.dtype != object:  # a constant weight: nn.Linear's form
        w = b if n.attrs.get("transB", 0) else b.T
        w = np.ascontiguousarray(w * np.asarray(alpha, w.dtype) if alpha != 1.0 else w)
        bias = None
        if isinstance(c, np.ndarray) and c.dtype != object and c.size == w.shape[0] and c.ndim <= 2:
            bias, c = np.ascontiguousarray((c * np.asarray(beta, c.dtype) if beta != 1.0 else c).reshape(-1)), None
        y = cx.emit("linear", [x, cx.tensor(w), cx.tensor(bias) if bias is not None else None])
    else:
        y = cx.tensor(b)
        if n.attrs.get("transB", 0):
            y = cx.emit("permute", [y], dims=(1, 0))
        y = cx.emit("matmul", [x, y])
        if alpha != 1.0:
            y = cx.emit("mul", [y, cx.b.scalar(alpha, y.type.dtype)])
    if c is not None:
        cv = cx.tensor(c)
        if beta != 1.0:
            cv = cx.emit("mul", [cv, cx.b.scalar(beta, cv.type.dtype)])
        y = cx.emit("add", [y, cv])
    return y


# -- sequences ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sequence:
    """An ONNX sequence whose length is known at compile time: a loop-free graph builds it
    from tensors at known positions, so the import unrolls it into its items (`Value`s or
    known arrays). `items` is None for a sequence whose length alone is known (a split by
    sizes computed at run time)."""

    items: tuple | None
    length: int

    @staticmethod
    def of(items) -> Sequence:
        return Sequence(tuple(items), len(items))

    def known_items(self, what: str) -> list:
        if self.items is None:
            raise Unsupported(f"{what} of a sequence whose items' sizes are computed from input data")
        return list(self.items)


def _position(cx, n, i: int, length: int, default: int, end_ok: bool = False) -> int:
    """A sequence position input (counted from the back when negative), checked against the
    length the import knows."""
    v = n.input(i)
    if v is None:
        return default
    (pos,) = cx.ints(v, f"{n.op}'s position")
    if not isinstance(pos, int):
        raise Unsupported(f"{n.op} at a position computed from shapes ({pos})")
    hi = length if end_ok else length - 1
    if not -length <= pos <= hi:
        raise Unsupported(f"{n.op} at position {pos} of a sequence of {length} tensor(s)")
    return pos + length if pos < 0 else pos


def _sequence(v, n) -> Sequence:
    if not isinstance(v, Sequence):
        raise Unsupported(f"{n.op} expects a sequence as its first input")
    return v


SEQUENCE_OPS = frozenset(
    "SequenceEmpty SequenceConstruct SequenceInsert SequenceErase SequenceAt SequenceLength SplitToSequence "
    "ConcatFromSequence".split()
)  # converted here even on known values (onnx's reference evaluator would hand back lists)


@converts("SequenceEmpty")
def _sequence_empty(cx, n):
    return Sequence.of(())


@converts("SequenceConstruct")
def _sequence_construct(cx, n):
    return Sequence.of(n.ins)


@converts("SequenceInsert")
def _sequence_insert(cx, n):
    seq = _sequence(n.ins[0], n)
    items = seq.known_items(n.op)
    items.insert(_position(cx, n, 2, seq.length, seq.length, end_ok=True), n.ins[1])
    return Sequence.of(items)


@converts("SequenceErase")
def _sequence_erase(cx, n):
    seq = _sequence(n.ins[0], n)
    items = seq.known_items(n.op)
    del items[_position(cx, n, 1, seq.length, seq.length - 1)]
    return Sequence.of(items)


@converts("SequenceAt")
def _sequence_at(cx, n):
    seq = _sequence(n.ins[0], n)
    return seq.known_items(n.op)[_position(cx, n, 1, seq.length, 0)]


@converts("SequenceLength")
def _sequence_length(cx, n):
    return np.array(_sequence(n.ins[0], n).length, dtype=np.int64)


@converts("SplitToSequence")
def _split_to_sequence(cx, n):
    """Into the sizes `split` gives (a 1-D tensor), chunks of `split` (a scalar), or single
    slices (no `split`; `keepdims=0` drops the split dim), as many as the import can count."""
    x = cx.tensor(n.ins[0])
    axis = n.attrs.get("axis", 0) % x.type.rank
    d = x.type.shape[axis]
    split = n.input(1)
    if isinstance(split, Value):
        if split.type.rank == 1 and split.type.shape[0].is_Integer:
            return Sequence(None, int(split.type.shape[0]))
        raise Unsupported("SplitToSequence by a split computed from input data")
    if split is None or np.ndim(split) == 0:
        size = 1 if split is None else cx.ints(split, "SplitToSequence's split")[0]
        if not d.is_Integer:
            raise Unsupported(f"SplitToSequence of dim {axis} ({d}, dynamic) into chunks: their number is not known")
        sizes = [dim(size)] * (int(d) // size) + ([dim(int(d) % size)] if int(d) % size else [])
    else:
        sizes = list(cx.dims(split, "SplitToSequence's split"))
    out, start = [], dim(0)
    for size in sizes:
        part = cx.emit("slice", [x], dim=axis, start=start, end=start + size, step=1)
        if split is None and not n.attrs.get("keepdims", 1):
            part = cx.emit("reshape", [part], shape=x.type.shape[:axis] + x.type.shape[axis + 1 :])
        out.append(part)
        start = start + size
    return Sequence.of(out)


@converts("ConcatFromSequence")
def _concat_from_sequence(cx, n):
    seq = _sequence(n.ins[0], n)
    xs = [cx.tensor(v) for v in seq.known_items(n.op)]
    if not xs:
        raise Unsupported("ConcatFromSequence of an empty sequence")
    axis = int(n.attrs["axis"])
    if n.attrs.get("new_axis", 0):
        rank = xs[0].type.rank + 1
        axis %= rank
        xs = [cx.emit("reshape", [x], shape=x.type.shape[:axis] + (dim(1),) + x.type.shape[axis:]) for x in xs]
    return xs[0] if len(xs) == 1 else cx.emit("cat", xs, dim=axis)


@converts("LSTM")
def _lstm(cx, n):
    a = n.attrs
    if a.get("layout", 0) or a.get("input_forget", 0) or "clip" in a or "activations" in a:
        raise Unsupported("LSTM with layout=1, input_forget, clip or custom activations")
    direction = a.get("direction", "forward")
    if direction == "reverse":
        raise Unsupported("LSTM with direction=reverse")
    if n.input(4) is not None or n.input(7) is not None:
        raise Unsupported("LSTM with sequence_lens or peepholes")
    x = cx.tensor(n.ins[0])
    W = cx.known(n.ins[1], "LSTM's W")
    R = cx.known(n.ins[2], "LSTM's R")
    B = n.input(3)
    H = int(a["hidden_size"])
    gates = np.concatenate([np.arange(k * H, (k + 1) * H) for k in (0, 2, 3, 1)])  # ONNX iofc -> torch ifgo
    params = []
    for d in range(W.shape[0]):
        params += [cx.tensor(np.ascontiguousarray(W[d][gates])), cx.tensor(np.ascontiguousarray(R[d][gates]))]
        if B is not None:
            bias = cx.known(B, "LSTM's B")[d]
            params += [cx.tensor(np.ascontiguousarray(bias[:4 * H][gates])),
                       cx.tensor(np.ascontiguousarray(bias[4 * H:][gates]))]  # fmt: skip
    h0 = cx.tensor(n.input(5)) if n.input(5) is not None else None
    c0 = cx.tensor(n.input(6)) if n.input(6) is not None else None
    bi = direction == "bidirectional"
    y, h, c = cx.emit_multi(
        "lstm", [x, h0, c0, *params], num_layers=1, bidirectional=bi, batch_first=False,
        has_biases=B is not None, hidden_size=H,
    )  # fmt: skip
    T, Bn = x.type.shape[0], x.type.shape[1]
    D = 2 if bi else 1
    y = cx.emit("permute", [cx.emit("reshape", [y], shape=(T, Bn, dim(D), dim(H)))], dims=(0, 2, 1, 3))
    return y, h, c


__all__ = ["FOLD", "ONNX_OPS", "SEQUENCE_OPS", "OnnxNode", "Sequence"]
