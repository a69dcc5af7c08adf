"""Reductions: sums and means over dims, softmax, layer norm, scans and pooling.

These are the one-relies-on-many ops of Souffle's analysis: each output element reads a
region of its input. Pooling windows over a dynamic image side give floor-division dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from symfuse.ir.dims import dim, floordiv
from symfuse.ir.dtypes import DType
from symfuse.ops.registry import Kind, defop, same_dtype, same_shape
from symfuse.te.rules import (
    adaptive_avg_pool2d_rule,
    avg_pool2d_rule,
    layer_norm_rule,
    max_pool2d_rule,
    reduce_rule,
    safe_softmax_rule,
    softmax_rule,
)


def _reduce_shape(ctx, x, dims, keepdim, **_):
    ks = {ctx.normalize_dim(d, x.rank) for d in dims} if dims else set(range(x.rank))
    if keepdim:
        return tuple(dim(1) if i in ks else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in ks)


def _sum_dtype(x, dims, keepdim, dtype):
    if dtype is not None:
        return dtype
    return DType.int64 if not x.dtype.is_float else x.dtype


def _mean_dtype(x, dims, keepdim, dtype):
    return dtype if dtype is not None else x.dtype


def _dims(dims):
    return list(dims) if dims else None


def _td(dtype):
    return dtype.torch if dtype is not None else None


defop(
    "sum",
    Kind.REDUCTION,
    ("x",),
    ("dims", "keepdim", "dtype"),
    shape=_reduce_shape,
    dtype=_sum_dtype,
    ref=lambda x, dims, keepdim, dtype: torch.sum(x, _dims(dims) or list(range(x.dim())), keepdim, dtype=_td(dtype)),
    lower=reduce_rule("sum"),
)
defop(
    "mean",
    Kind.REDUCTION,
    ("x",),
    ("dims", "keepdim", "dtype"),
    shape=_reduce_shape,
    dtype=_mean_dtype,
    ref=lambda x, dims, keepdim, dtype: torch.mean(x, _dims(dims) or list(range(x.dim())), keepdim, dtype=_td(dtype)),
    lower=reduce_rule("sum", mean=True),
)
for _name, _fn in {"amax": torch.amax, "amin": torch.amin}.items():
    defop(
        _name,
        Kind.REDUCTION,
        ("x",),
        ("dims", "keepdim"),
        shape=_reduce_shape,
        dtype=same_dtype(),
        ref=lambda x, dims, keepdim, _fn=_fn: _fn(x, _dims(dims) or list(range(x.dim())), keepdim),
        lower=reduce_rule(_name[1:]),
    )

_SOFTMAX = {
    "softmax": (torch.softmax, softmax_rule),
    "log_softmax": (torch.log_softmax, None),
    # a row of only -inf gives zeros, not NaN: attention's semantics for a fully masked query
    "safe_softmax": (torch.ops.aten._safe_softmax, safe_softmax_rule),
}
for _name, (_fn, _rule) in _SOFTMAX.items():
    defop(
        _name,
        Kind.REDUCTION,
        ("x",),
        ("dim",),
        shape=same_shape(),
        dtype=same_dtype(),
        ref=lambda x, dim, _fn=_fn: _fn(x, dim),
        lower=_rule,
    )
defop(
    "cumsum",
    Kind.REDUCTION,
    ("x",),
    ("dim", "dtype"),
    shape=same_shape(),
    dtype=lambda x, dim, dtype: dtype or (DType.int64 if not x.dtype.is_float else x.dtype),
    ref=lambda x, dim, dtype: torch.cumsum(x, dim, dtype=_td(dtype)),
    doc="inclusive prefix sum along dim",
)


def _layer_norm_shape(ctx, x, weight, bias, normalized_shape, eps):
    n = len(normalized_shape)
    if n > x.rank:
        raise ctx.error(f"layer norm over {n} dims of {x}")
    for d, s in zip(x.shape[x.rank - n :], normalized_shape):
        ctx.eq(d, s, "layer norm's normalized dims match its declared shape")
    for t in (weight, bias):
        if t is not None:
            for d, s in zip(t.shape, normalized_shape):
                ctx.eq(d, s, "layer norm's affine parameters match the normalized shape")
    return x.shape


defop(
    "layer_norm",
    Kind.REDUCTION,
    ("x", "weight?", "bias?"),
    ("normalized_shape", "eps"),
    shape=_layer_norm_shape,
    dtype=same_dtype(),
    ref=lambda x, weight, bias, normalized_shape, eps: F.layer_norm(x, list(normalized_shape), weight, bias, eps),
    lower=layer_norm_rule,
    constraints="the trailing dims equal normalized_shape, as do weight and bias",
)


def _pool_out(ctx, size, k, s, p, d):
    out = ctx.canon(floordiv(size + 2 * p - d * (k - 1) - 1, s) + 1)
    ctx.le(1, out, "the pooling/convolution window fits the input")
    return out


def _pool_shape(spatial: int):
    def shape(ctx, x, kernel_size, stride, padding, dilation=(1,) * spatial, **_):
        if x.rank not in (spatial + 1, spatial + 2):
            raise ctx.error(f"{spatial}-D pooling needs a {spatial + 1}-D or {spatial + 2}-D input, got {x}")
        stride = stride or kernel_size
        sides = tuple(
            _pool_out(ctx, x.shape[i - spatial], kernel_size[i], stride[i], padding[i], dilation[i])
            for i in range(spatial)
        )
        return x.shape[:-spatial] + sides

    return shape


_pool2d_shape = _pool_shape(2)


defop(
    "max_pool2d",
    Kind.REDUCTION,
    ("x",),
    ("kernel_size", "stride", "padding", "dilation"),
    shape=_pool2d_shape,
    dtype=same_dtype(),
    ref=lambda x, kernel_size, stride, padding, dilation: F.max_pool2d(
        x, kernel_size, stride or None, padding, dilation
    ),
    lower=max_pool2d_rule,
    constraints="each output side is at least 1",
)
defop(
    "avg_pool2d",
    Kind.REDUCTION,
    ("x",),
    ("kernel_size", "stride", "padding", "count_include_pad", "divisor_override"),
    shape=_pool2d_shape,
    dtype=same_dtype(),
    ref=lambda x, kernel_size, stride, padding, count_include_pad, divisor_override: F.avg_pool2d(
        x, kernel_size, stride or None, padding, False, count_include_pad, divisor_override
    ),
    lower=avg_pool2d_rule,
    constraints="each output side is at least 1",
)
defop(
    "max_pool3d",
    Kind.REDUCTION,
    ("x",),
    ("kernel_size", "stride", "padding", "dilation"),
    shape=_pool_shape(3),
    dtype=same_dtype(),
    ref=lambda x, kernel_size, stride, padding, dilation: F.max_pool3d(
        x, kernel_size, stride or None, padding, dilation
    ),
    constraints="each output side is at least 1",
    doc="volumetric max pooling: torch's kernel inside the program",
)
defop(
    "avg_pool3d",
    Kind.REDUCTION,
    ("x",),
    ("kernel_size", "stride", "padding", "count_include_pad", "divisor_override"),
    shape=_pool_shape(3),
    dtype=same_dtype(),
    ref=lambda x, kernel_size, stride, padding, count_include_pad, divisor_override: F.avg_pool3d(
        x, kernel_size, stride or None, padding, False, count_include_pad, divisor_override
    ),
    constraints="each output side is at least 1",
    doc="volumetric average pooling: torch's kernel inside the program",
)
defop(
    "adaptive_avg_pool2d",
    Kind.REDUCTION,
    ("x",),
    ("output_size",),
    shape=lambda ctx, x, output_size: x.shape[:-2] + tuple(dim(s) for s in output_size),
    dtype=same_dtype(),
    ref=lambda x, output_size: F.adaptive_avg_pool2d(x, output_size),
    lower=adaptive_avg_pool2d_rule,
)
