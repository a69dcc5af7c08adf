"""Lowering rules shared by the registry's ops, and the index arithmetic they need.

A rule is called as `rule(lw, node, *input_accessors, **attrs)` and returns the output's
accessor. Index maps are sympy expressions over the output's loop variables, so a
permute, a slice and a reshape collapse into one load (vertical composition).
"""

from __future__ import annotations

import functools
import math

import sympy
import torch

from symfuse.ir.dims import Dim, dim, exact_quotient, floordiv, mod, slice_bound
from symfuse.ir.dtypes import DType
from symfuse.te.ir import Call, Const, Index, Load, Reduce, axis, from_end, reduce_axis

# -- index helpers ---------------------------------------------------------------------


def broadcast_index(idx: tuple, in_shape: tuple[Dim, ...]) -> tuple:
    """The index into an operand broadcast to the output: right-aligned, 1-dims read 0."""
    tail = idx[len(idx) - len(in_shape) :] if in_shape else ()
    return tuple(sympy.Integer(0) if d == 1 else i for i, d in zip(tail, in_shape))


def linear_index(idx: tuple, shape: tuple[Dim, ...]) -> sympy.Expr:
    flat = sympy.Integer(0)
    for i, d in zip(idx, shape):
        flat = flat * d + i
    return flat


def delinearize(flat: sympy.Expr, shape: tuple[Dim, ...]) -> tuple:
    """Coordinates of a flat index; the outermost needs no mod (flat < numel)."""
    out, stride = [], sympy.Integer(1)
    for k in range(len(shape) - 1, -1, -1):
        d = shape[k]
        q = floordiv(flat, stride)
        out.append(sympy.Integer(0) if d == 1 else (q if k == 0 else mod(q, d)))
        stride = stride * d
    return tuple(reversed(out))


def reshape_index(idx: tuple, out_shape: tuple[Dim, ...], in_shape: tuple[Dim, ...]) -> tuple:
    """Map an output index of a reshape to its input index. Leading and trailing dims the
    two shapes share map one to one; only the block between is linearised."""
    lead = 0
    while lead < min(len(out_shape), len(in_shape)) and out_shape[lead] == in_shape[lead]:
        lead += 1
    trail = 0
    while (
        trail < min(len(out_shape), len(in_shape)) - lead
        and out_shape[len(out_shape) - 1 - trail] == in_shape[len(in_shape) - 1 - trail]
    ):
        trail += 1
    mid_out = out_shape[lead : len(out_shape) - trail]
    mid_in = in_shape[lead : len(in_shape) - trail]
    mid_idx = idx[lead : len(idx) - trail]
    out_nz = [(i, d) for i, d in zip(mid_idx, mid_out) if d != 1]
    if [d for _, d in out_nz] == [d for d in mid_in if d != 1]:  # only unit dims come or go
        it = iter(i for i, _ in out_nz)
        mapped = tuple(next(it) if d != 1 else sympy.Integer(0) for d in mid_in)
    else:
        groups = _reshape_groups(mid_out, mid_in)
        if groups is None:
            mapped = delinearize(linear_index(mid_idx, mid_out), mid_in)
        else:  # each group of dims merges or splits on its own: smaller floors and mods
            mapped = ()
            for (o0, o1), (i0, i1) in groups:
                mapped += delinearize(linear_index(mid_idx[o0:o1], mid_out[o0:o1]), mid_in[i0:i1])
    return tuple(idx[:lead]) + mapped + tuple(idx[len(idx) - trail :])


def _reshape_groups(out_shape: tuple[Dim, ...], in_shape: tuple[Dim, ...]):
    """Consecutive runs of output and input dims with equal products, in order
    (`[B*S, 768] <- [B, S, 12, 64]` is `([B*S], [B, S])`, `([768], [12, 64])`), or None
    when the products do not line up (then the reshape is one flat index)."""
    groups, o, i = [], 0, 0
    while o < len(out_shape) and i < len(in_shape):
        o1, i1, po, pi = o + 1, i + 1, out_shape[o], in_shape[i]
        while sympy.expand(po - pi) != 0:
            if exact_quotient(po, pi) is not None and i1 < len(in_shape):
                pi, i1 = pi * in_shape[i1], i1 + 1
            elif exact_quotient(pi, po) is not None and o1 < len(out_shape):
                po, o1 = po * out_shape[o1], o1 + 1
            else:
                return None
        groups.append(((o, o1), (i, i1)))
        o, i = o1, i1
    return groups if (o, i) == (len(out_shape), len(in_shape)) else None


# -- rules -------------------------------------------------------------------------------


def pointwise(fn: str):
    """An element-wise op: `fn` of the operands, each read through broadcasting."""

    def rule(lw, node, *ins, **attrs):
        shapes = [v.type.shape for v in node.inputs]
        dt = node.out.type.dtype
        params = tuple(attrs.items())

        def body(idx):
            return Call(fn, tuple(a(broadcast_index(idx, s)) for a, s in zip(ins, shapes)), dt, params)

        return body

    return rule


def cast_rule(lw, node, x, dtype):
    return lambda idx: Call("cast", (x(idx),), dtype)


def full_rule(lw, node, shape, value, dtype):
    """A constant; a symbolic value (a scalar made from a dim) is an index expression."""
    if isinstance(value, sympy.Expr):
        return lambda idx: Index(value, dtype)
    return lambda idx: Const(value, dtype)


def arange_rule(lw, node, start, end, step, dtype):
    return lambda idx: Index(dim(start) + step * idx[0], dtype)


def reshape_rule(lw, node, x, shape):
    out_shape, in_shape = node.out.type.shape, node.inputs[0].type.shape
    return lambda idx: x(reshape_index(idx, out_shape, in_shape))


def permute_rule(lw, node, x, dims):
    inverse = [0] * len(dims)
    for o, d in enumerate(dims):
        inverse[d % len(dims)] = o
    return lambda idx: x(tuple(idx[inverse[k]] for k in range(len(dims))))


def expand_rule(lw, node, x, sizes):
    return lambda idx: x(broadcast_index(idx, node.inputs[0].type.shape))


def slice_rule(lw, node, x, dim, start, end, step):
    k = dim % node.out.type.rank
    d = node.inputs[0].type.shape[k]
    lo = slice_bound(d, start)
    return lambda idx: x(idx[:k] + (lo + step * idx[k],) + idx[k + 1 :])


def select_rule(lw, node, x, dim, index):
    k = dim % node.inputs[0].type.rank
    d = node.inputs[0].type.shape[k]
    i = d + index if index < 0 else sympy.Integer(index)
    return lambda idx: x(idx[:k] + (i,) + idx[k:])


def cat_rule(lw, node, xs, dim):
    k = dim % node.out.type.rank
    dt = node.out.type.dtype
    parts = [(a, v.type.shape[k]) for a, v in zip(xs, node.inputs)]

    def body(idx):
        offsets, off = [], sympy.Integer(0)
        for _, n in parts:
            offsets.append(off)
            off = off + n

        def inside(i, o, n):
            """The part's own index, clamped into it: a select may evaluate the side it does
            not take, and that side must still read (and gather through) valid elements."""
            return sympy.Min(sympy.Max(i - o, 0), n - 1)

        # the last part first, then wrap earlier ones in where(i < end, ...)
        acc, n_last = parts[-1]
        expr = acc(idx[:k] + (inside(idx[k], offsets[-1], n_last),) + idx[k + 1 :])
        for (a, n), o in reversed(list(zip(parts[:-1], offsets[:-1]))):
            cond = Call("lt", (Index(idx[k], DType.int64), Index(o + n, DType.int64)), DType.bool)
            expr = Call("where", (cond, a(idx[:k] + (inside(idx[k], o, n),) + idx[k + 1 :]), expr), dt)
        return expr

    return body


def _gatherable(lw, v, x, dims):
    """`x` (the accessor of `v`) if a data-dependent index at `dims` passes through its index
    map as it is (a plain tensor, an expand, a permute); else `v` as a tensor of its own: a
    reshape or a slice would do arithmetic on the index."""
    probe = Load("?", ())
    try:
        x(tuple(probe if k in dims else axis(k) for k in range(v.type.rank)))
    except (TypeError, sympy.SympifyError):
        return lw.materialize(v)
    return x


def gather_rule(lw, node, x, index, dim):
    k = dim % node.out.type.rank
    x = _gatherable(lw, node.inputs[0], x, (k,))
    return lambda idx: x(idx[:k] + (index(idx),) + idx[k + 1 :])


def index_rule(lw, node, x, idx, dims):
    """Advanced indexing `x[..., i0, i1, ...]`: the index tensors, broadcast together, pick
    the elements of the indexed dims (a negative index counts from the end, as in Python).
    Their broadcast dims stand where the indexed dims stood when those are adjacent, else
    first (NumPy's rule); the other dims pass through."""
    x_shape = node.inputs[0].type.shape
    ks = [d % len(x_shape) for d in dims]
    x = _gatherable(lw, node.inputs[0], x, ks)
    shapes = [v.type.shape for v in node.inputs[1:]]
    nb = max(len(s) for s in shapes)
    first = ks[0] if ks == list(range(ks[0], ks[0] + len(ks))) else 0

    def body(out):
        b, rest = out[first : first + nb], iter(out[:first] + out[first + nb :])
        by_dim = {k: from_end(a(broadcast_index(b, s)), x_shape[k]) for k, a, s in zip(ks, idx, shapes)}
        return x(tuple(by_dim[k] if k in by_dim else next(rest) for k in range(len(x_shape))))

    return body


def embedding_rule(lw, node, weight, indices):
    weight = _gatherable(lw, node.inputs[0], weight, (0,))
    return lambda idx: weight((indices(idx[:-1]), idx[-1]))


def _reduced(node, dims):
    x = node.inputs[0].type
    return sorted({d % x.rank for d in dims} if dims and x.rank else set(range(x.rank)))


def reduce_rule(op: str, mean: bool = False):
    def rule(lw, node, x, dims, keepdim, dtype=None):
        in_shape = node.inputs[0].type.shape
        ks = _reduced(node, dims)
        dt = node.out.type.dtype
        name = node.out.name
        if not ks:  # a 0-d tensor reduced: each of these reductions over one element is that element
            return lambda idx: Call("cast", (x(idx),), dt)

        def body(idx):
            raxes = tuple((reduce_axis(name, j), in_shape[j]) for j in ks)
            it, full = iter(raxes), []
            out_it = iter(idx)
            for j in range(len(in_shape)):
                if j in ks:
                    full.append(next(it)[0])
                    if keepdim:
                        next(out_it)
                else:
                    full.append(next(out_it))
            r = Reduce(op, Call("cast", (x(tuple(full)),), dt), raxes, dt)
            if mean:
                count = math.prod(in_shape[j] for j in ks)
                return Call("div", (r, Index(count, DType.int64)), dt)
            return r

        return body

    return rule


def softmax_rule(lw, node, x, dim, safe: bool = False):
    shape, dt = node.out.type.shape, node.out.type.dtype
    k = dim % len(shape)
    name = node.out.name
    row = shape[:k] + (sympy.Integer(1),) + shape[k + 1 :]

    def along(idx, j):
        return idx[:k] + (j,) + idx[k + 1 :]

    r = reduce_axis(name, 0)
    top = lw.te(f"{name}_max", row, dt, lambda idx: Reduce("max", x(along(idx, r)), ((r, shape[k]),), dt), aux=True)
    zero = sympy.Integer(0)

    def shifted_exp(idx):
        return Call("exp", (Call("sub", (x(idx), top(along(idx, zero))), dt),), dt)

    e = lw.te(f"{name}_exp", shape, dt, shifted_exp, aux=True)  # computed once, read by the sum and the division
    total = lw.te(f"{name}_sum", row, dt, lambda idx: Reduce("sum", e(along(idx, r)), ((r, shape[k]),), dt), aux=True)
    if not safe:
        return lambda idx: Call("div", (e(idx), total(along(idx, zero))), dt)

    def guarded(idx):  # a row whose maximum is -inf has no finite entry: zeros
        empty = Call("eq", (top(along(idx, zero)), Const(-math.inf, dt)), DType.bool)
        return Call("where", (empty, Const(0.0, dt), Call("div", (e(idx), total(along(idx, zero))), dt)), dt)

    return guarded


def safe_softmax_rule(lw, node, x, dim):
    return softmax_rule(lw, node, x, dim, safe=True)


def layer_norm_rule(lw, node, x, weight, bias, normalized_shape, eps):
    shape, dt = node.out.type.shape, node.out.type.dtype
    n = len(normalized_shape)
    name = node.out.name
    lead = len(shape) - n
    row = shape[:lead] + (sympy.Integer(1),) * n
    count = Index(math.prod(shape[lead:]), DType.int64)
    rs = tuple((reduce_axis(name, j), shape[lead + j]) for j in range(n))

    def over(idx):
        return idx[:lead] + tuple(a for a, _ in rs)

    zeros = (sympy.Integer(0),) * n

    def first(idx):  # the row's first element: the shift of a shifted-data mean
        return x(idx[:lead] + zeros)

    # mean = x0 + sum(x - x0) / n, as Welford's update does it: a constant row's mean is
    # exact (so it normalises to exactly the bias, as in torch), and a large offset does
    # not cancel digits away
    mean = lw.te(
        f"{name}_mean", row, dt,
        lambda idx: Call("add", (first(idx), Call("div", (
            Reduce("sum", Call("sub", (x(over(idx)), first(idx)), dt), rs, dt), count), dt)), dt),
        aux=True,
    )  # fmt: skip

    def centered(idx):
        return Call("sub", (x(idx), mean(idx[:lead] + zeros)), dt)

    var = lw.te(
        f"{name}_var", row, dt,
        lambda idx: Call("div", (Reduce("sum", Call("mul", (centered(over(idx)),) * 2, dt), rs, dt), count), dt),
        aux=True,
    )  # fmt: skip

    def body(idx):
        inv = Call("rsqrt", (Call("add", (var(idx[:lead] + zeros), Const(eps, dt)), dt),), dt)
        y = Call("mul", (centered(idx), inv), dt)
        if weight is not None:
            y = Call("mul", (y, weight(idx[lead:])), dt)
        if bias is not None:
            y = Call("add", (y, bias(idx[lead:])), dt)
        return y

    return body


def linear_rule(lw, node, x, weight, bias):
    """A contraction over K plus the bias; a library GEMM adds the bias tensor whole, so a
    composed one (a model input reshaped, say) is materialised first."""
    if bias is not None:
        bias = lw.materialize(node.inputs[2])
    k_extent = node.inputs[1].type.shape[1]
    dt = node.out.type.dtype
    r = reduce_axis(node.out.name, 0)

    def body(idx):
        acc = Reduce("sum", Call("mul", (x(idx[:-1] + (r,)), weight((idx[-1], r))), dt), ((r, k_extent),), dt)
        return Call("add", (acc, bias((idx[-1],))), dt) if bias is not None else acc

    return body


def matmul_rule(lw, node, a, b):
    sa, sb = node.inputs[0].type.shape, node.inputs[1].type.shape
    dt = node.out.type.dtype
    r = reduce_axis(node.out.name, 0)

    def body(idx):
        batch = idx[:-2]
        ia = broadcast_index(batch + (idx[-2], r), sa)
        ib = broadcast_index(batch + (r, idx[-1]), sb)
        return Reduce("sum", Call("mul", (a(ia), b(ib)), dt), ((r, sa[-1]),), dt)

    return body


def batch_norm_rule(lw, node, x, weight, bias, mean, var, eps):
    dt = node.out.type.dtype

    def body(idx):
        c = (idx[1],)
        inv = Call("rsqrt", (Call("add", (var(c), Const(eps, dt)), dt),), dt)
        y = Call("mul", (Call("sub", (x(idx), mean(c)), dt), inv), dt)
        if weight is not None:
            y = Call("mul", (y, weight(c)), dt)
        return Call("add", (y, bias(c)), dt) if bias is not None else y

    return body


def _all(conds: list[Call]) -> Call:
    """The conjunction of `conds`, left to right."""
    return functools.reduce(lambda a, b: Call("logical_and", (a, b), DType.bool), conds)


def _inside(positions, sides) -> Call:
    """Whether every position lies in [0, its side): a window's read inside the input, not in
    its padding (a convolution's and a pooling's)."""
    zero = sympy.Integer(0)
    return _all([Call(f, (Index(i, DType.int64), Index(b, DType.int64)), DType.bool)
                 for i, side in zip(positions, sides) for f, b in (("ge", zero), ("lt", side))])  # fmt: skip


def conv2d_rule(lw, node, x, weight, bias, stride, padding, dilation, groups):
    """A contraction over input channels and the window; padding reads as 0. The library
    convolution reads its input and weight whole, so a composed layout of either (a weight
    reshaped from a model input, say) is materialised first."""
    x = lw.materialize(node.inputs[0])
    weight = lw.materialize(node.inputs[1])
    _, _, h, w = node.inputs[0].type.shape
    out_c, group_c, kh, kw = (int(d) for d in node.inputs[1].type.shape)
    dt = node.out.type.dtype
    name = node.out.name
    rc, rh, rw = (reduce_axis(name, i) for i in range(3))
    per_group = out_c // groups

    def body(idx):
        n, o, oh, ow = idx
        c = (floordiv(o, per_group) * group_c if groups > 1 else 0) + rc
        ih = oh * stride[0] + rh * dilation[0] - padding[0]
        iw = ow * stride[1] + rw * dilation[1] - padding[1]
        v = x((n, c, ih, iw))
        if padding[0] or padding[1]:
            v = Call("where", (_inside((ih, iw), (h, w)), v, Const(0.0, dt)), dt)
        extents = ((rc, group_c), (rh, kh), (rw, kw))
        acc = Reduce("sum", Call("mul", (v, weight((o, rc, rh, rw))), dt), extents, dt)
        return Call("add", (acc, bias((o,))), dt) if bias is not None else acc

    return body


def _window(x, in_shape, idx, taps, stride, padding, dilation, fill, dt):
    """The element of a pooling window at reduction variables `taps` (one per spatial dim,
    the last len(taps) dims) for output position `idx`; `fill` where the window reaches into
    the padding. The read index is clamped into the input, since an emitter may evaluate the
    side of a select it does not take."""
    n = len(taps)
    lead, out = idx[:-n], idx[-n:]
    pos = [o * s + t * d - p for o, t, s, p, d in zip(out, taps, stride, padding, dilation)]
    sides = in_shape[-n:]
    if not any(padding):
        return x(tuple(lead) + tuple(pos))
    clamped = tuple(sympy.Min(sympy.Max(i, 0), side - 1) for i, side in zip(pos, sides))
    return Call("where", (_inside(pos, sides), x(tuple(lead) + clamped), Const(fill, dt)), dt)


def max_pool2d_rule(lw, node, x, kernel_size, stride, padding, dilation):
    """The window's maximum (a NaN in it is the maximum, as in torch); padding never wins."""
    in_shape, dt, name = node.inputs[0].type.shape, node.out.type.dtype, node.out.name
    stride = stride or kernel_size
    taps = tuple(reduce_axis(name, i) for i in range(2))
    lowest = -math.inf if dt.is_float else (False if dt is DType.bool else torch.iinfo(dt.torch).min)

    def body(idx):
        v = _window(x, in_shape, idx, taps, stride, padding, dilation, lowest, dt)
        return Reduce("max", v, tuple(zip(taps, kernel_size)), dt)

    return body


def avg_pool2d_rule(lw, node, x, kernel_size, stride, padding, count_include_pad, divisor_override):
    """The window's sum over its size: `divisor_override`, else the whole window with
    `count_include_pad` (without ceil_mode a window never passes the padding), else the
    elements inside the input."""
    in_shape, dt, name = node.inputs[0].type.shape, node.out.type.dtype, node.out.name
    stride = stride or kernel_size
    taps = tuple(reduce_axis(name, i) for i in range(2))

    def body(idx):
        v = _window(x, in_shape, idx, taps, stride, padding, (1, 1), 0.0, dt)
        total = Reduce("sum", Call("cast", (v,), dt), tuple(zip(taps, kernel_size)), dt)
        if divisor_override:
            count = sympy.Integer(divisor_override)
        elif count_include_pad or not any(padding):
            count = sympy.Integer(kernel_size[0] * kernel_size[1])
        else:
            count = sympy.Integer(1)
            for o, k, s, p, side in zip(idx[-2:], kernel_size, stride, padding, in_shape[-2:]):
                start = o * s - p
                count = count * (sympy.Min(start + k, side) - sympy.Max(start, 0))
        return Call("div", (total, Index(count, DType.int64)), dt)

    return body


def adaptive_avg_pool2d_rule(lw, node, x, output_size):
    """Output position i of a side n averages the input's [floor(i n / out), ceil((i + 1) n /
    out)); the windows' lengths differ, so the reduction runs over the longest and masks the
    rest (a side pooled to 1 is a plain mean over it)."""
    in_shape, dt, name = node.inputs[0].type.shape, node.out.type.dtype, node.out.name
    taps = tuple(reduce_axis(name, i) for i in range(2))

    def body(idx):
        lead, pos, extents, count, conds = idx[:-2], [], [], sympy.Integer(1), []
        for o, t, out, side in zip(idx[-2:], taps, output_size, in_shape[-2:]):
            if out == 1:
                pos.append(t)
                extents.append((t, side))
                count = count * side
                continue
            start, end = floordiv(o * side, out), floordiv((o + 1) * side + out - 1, out)
            pos.append(sympy.Min(start + t, side - 1))
            extents.append((t, floordiv(side + out - 1, out) + 1))  # the longest window
            count = count * (end - start)
            conds.append(Call("lt", (Index(start + t, DType.int64), Index(end, DType.int64)), DType.bool))
        v = Call("cast", (x(tuple(lead) + tuple(pos)),), dt)
        if conds:
            v = Call("where", (_all(conds), v, Const(0.0, dt)), dt)
        return Call("div", (Reduce("sum", v, tuple(extents), dt), Index(count, DType.int64)), dt)

    return body
