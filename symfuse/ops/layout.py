"""Layout ops: reshape, permute, expand, slice, select, concat, and the gathers.

Each is an index map from output to input coordinates (the gathers read the map from an
index tensor). Their constraints are the ones BladeDISC collects: a reshape keeps the
element count, concat ties every other dim, expand keeps the dims it does not stretch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from symfuse.ir.dims import SLICE_END, Dim, ceildiv, dmax, dmin, exact_quotient, floordiv, product, slice_bound
from symfuse.ir.dims import dim as as_dim
from symfuse.ir.tri import Tri
from symfuse.ops.registry import Kind, defop, same_dtype
from symfuse.te.rules import (
    cat_rule,
    embedding_rule,
    expand_rule,
    gather_rule,
    index_rule,
    permute_rule,
    reshape_rule,
    select_rule,
    slice_rule,
)


def _pass_bounds(ctx, b, *rest, **attrs):
    return b


def _reshape_shape(ctx, x, shape):
    shape = [ctx.canon(d) for d in shape]
    holes = [i for i, d in enumerate(shape) if d == -1]
    if len(holes) > 1:
        raise ctx.error(f"reshape has more than one -1 in {list(shape)}")
    numel = ctx.canon(x.numel)
    if holes:
        known = product(d for d in shape if d != -1)
        q = exact_quotient(numel, known)
        if q is None:
            if known.is_Integer:
                ctx.divisible(numel, int(known), "reshape's -1 divides the element count")
            q = floordiv(numel, known)
        shape[holes[0]] = ctx.canon(q)
    ctx.numel_eq(x.shape, shape, "reshape keeps the element count")
    return tuple(shape)


defop(
    "reshape",
    Kind.INJECTIVE,
    ("x",),
    ("shape",),
    shape=_reshape_shape,
    dtype=same_dtype(),
    ref=lambda x, shape: x.reshape(shape),
    lower=reshape_rule,
    bounds=_pass_bounds,
    constraints="numel(out) == numel(x); a -1 is solved from the element count",
)


def _permute_shape(ctx, x, dims):
    if sorted(d % max(x.rank, 1) for d in dims) != list(range(x.rank)):
        raise ctx.error(f"{list(dims)} is not a permutation of {x.rank} dims")
    return tuple(x.shape[d] for d in dims)


defop(
    "permute",
    Kind.INJECTIVE,
    ("x",),
    ("dims",),
    shape=_permute_shape,
    dtype=same_dtype(),
    ref=lambda x, dims: x.permute(dims),
    lower=permute_rule,
    bounds=_pass_bounds,
)


def _expand_shape(ctx, x, sizes):
    offset = len(sizes) - x.rank
    if offset < 0:
        raise ctx.error(f"cannot expand {x} to {len(sizes)} dims")
    out: list[Dim] = []
    for i, s in enumerate(sizes):
        if i < offset:
            if s == -1:
                raise ctx.error("a new leading dim of expand cannot be -1")
            out.append(ctx.canon(s))
            continue
        d = x.shape[i - offset]
        if s == -1 or ctx.is_one(d) is not Tri.YES:
            out.append(d if s == -1 else ctx.eq(d, s, "expand keeps every dim that is not 1"))
        else:
            out.append(ctx.canon(s))
    return tuple(out)


defop(
    "expand",
    Kind.BROADCAST,
    ("x",),
    ("sizes",),
    shape=_expand_shape,
    dtype=same_dtype(),
    ref=lambda x, sizes: x.expand(sizes),
    lower=expand_rule,
    bounds=_pass_bounds,
    constraints="a dim that is not statically 1 equals its target size",
)


def _slice_shape(ctx, x, dim_, start, end, step):
    k = ctx.normalize_dim(dim_, x.rank)
    if step < 1:
        raise ctx.error(f"slice step must be positive, got {step}")
    d = x.shape[k]
    lo, hi = slice_bound(d, start), slice_bound(d, end)
    n = ctx.canon(dmax(0, ceildiv(hi - lo, step)))
    return x.shape[:k] + (n,) + x.shape[k + 1 :]


def _slice_ref(x, dim, start, end, step):
    return x[(slice(None),) * (dim % x.dim()) + (slice(start, None if end is None or end >= SLICE_END else end, step),)]


defop(
    "slice",
    Kind.INJECTIVE,
    ("x",),
    ("dim", "start", "end", "step"),
    shape=lambda ctx, x, dim, start, end, step: _slice_shape(ctx, x, dim, start, end, step),
    dtype=same_dtype(),
    ref=_slice_ref,
    lower=slice_rule,
    bounds=_pass_bounds,
    constraints="none: bounds clamp as in Python, giving min/max expressions",
)


def _select_shape(ctx, x, dim, index):
    k = ctx.normalize_dim(dim, x.rank)
    need = index + 1 if index >= 0 else -index
    ctx.le(need, x.shape[k], f"select index {index} is inside dim {k}")
    return x.shape[:k] + x.shape[k + 1 :]


defop(
    "select",
    Kind.INJECTIVE,
    ("x",),
    ("dim", "index"),
    shape=_select_shape,
    dtype=same_dtype(),
    ref=lambda x, dim, index: x.select(dim, index),
    lower=select_rule,
    bounds=_pass_bounds,
    constraints="the index is inside the dim",
)


def _cat_shape(ctx, xs, dim):
    xs = [t for t in xs if not (t.rank == 1 and t.shape[0] == 0)]
    rank = xs[0].rank
    if any(t.rank != rank for t in xs):
        raise ctx.error(f"concat of tensors of different ranks: {', '.join(str(t) for t in xs)}")
    k = ctx.normalize_dim(dim, rank)
    out = list(xs[0].shape)
    for t in xs[1:]:
        for i in range(rank):
            if i != k:
                out[i] = ctx.eq(out[i], t.shape[i], f"concat along dim {k} ties dim {i}")
    out[k] = ctx.canon(sum((t.shape[k] for t in xs), as_dim(0)))
    return tuple(out)


def _cat_bounds(ctx, bs, dim):
    if any(b is None for b in bs):
        return None
    lo, hi = bs[0]
    for b in bs[1:]:
        lo, hi = dmin(lo, b[0]), dmax(hi, b[1])
    return (lo, hi)


defop(
    "cat",
    Kind.INJECTIVE,
    ("xs*",),
    ("dim",),
    shape=_cat_shape,
    dtype=lambda xs, dim: xs[0].dtype,
    ref=lambda xs, dim: torch.cat(xs, dim),
    lower=cat_rule,
    bounds=_cat_bounds,
    constraints="every dim but the concat dim is equal across inputs",
)


def _gather_shape(ctx, x, index, dim):
    k = ctx.normalize_dim(dim, x.rank)
    if index.rank != x.rank:
        raise ctx.error(f"gather index rank {index.rank} differs from input rank {x.rank}")
    for i in range(x.rank):
        if i != k:
            ctx.le(index.shape[i], x.shape[i], f"gather index dim {i} fits the input")
    return index.shape


defop(
    "gather",
    Kind.INJECTIVE,
    ("x", "index"),
    ("dim",),
    shape=_gather_shape,
    dtype=same_dtype(),
    ref=lambda x, index, dim: torch.gather(x, dim, index),
    lower=gather_rule,
    bounds=_pass_bounds,
    constraints="index dims fit the input's, except along dim",
)


def _embedding_shape(ctx, weight, indices):
    if weight.rank != 2:
        raise ctx.error(f"embedding table must be 2-D, got {weight}")
    bounds = ctx.input_bounds[1] if len(ctx.input_bounds) > 1 else None
    if bounds is not None:
        ctx.le(bounds[1], weight.shape[0] - 1, "embedding indices are rows of the table")
    return indices.shape + (weight.shape[1],)


defop(
    "embedding",
    Kind.INJECTIVE,
    ("weight", "indices"),
    shape=_embedding_shape,
    dtype=same_dtype(),
    ref=lambda weight, indices: F.embedding(indices, weight),
    lower=embedding_rule,
    constraints="when the indices' largest value is known (an arange of S), it is below the table's rows",
)


def _index_shape(ctx, x, idx, dims):
    bshape = ctx.broadcast(*[t.shape for t in idx], rule="advanced indices broadcast")
    dims = [ctx.normalize_dim(d, x.rank) for d in dims]
    rest = [x.shape[i] for i in range(x.rank) if i not in dims]
    if dims == list(range(dims[0], dims[0] + len(dims))):
        return x.shape[: dims[0]] + bshape + x.shape[dims[-1] + 1 :]
    return bshape + tuple(rest)


def _index_ref(x, idx, dims):
    full = [None] * x.dim()
    for d, t in zip(dims, idx):
        full[d] = t
    while full and full[-1] is None:
        full.pop()
    return torch.ops.aten.index.Tensor(x, full)


defop(
    "index",
    Kind.INJECTIVE,
    ("x", "idx*"),
    ("dims",),
    shape=_index_shape,
    dtype=lambda x, idx, dims: x.dtype,
    ref=_index_ref,
    lower=index_rule,
    bounds=lambda ctx, b, bs, dims: b,
    constraints="the index tensors broadcast together",
    doc="advanced indexing: x[..., idx0, idx1, ...] with index tensors at `dims`",
)
