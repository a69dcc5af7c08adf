"""Compositions both frontends write ops as: an op the registry does not have (Ceil, sign,
a remainder, transposed convolution, argmax) as several registry ops, and the padding and
reductions both need. Each takes the converter (`emit`, `b`) of either frontend and symfuse
values, so an op is written once for the torch and the ONNX import alike.
"""

from __future__ import annotations

import torch

from symfuse.ir.dims import dim, product
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Value


def scalar(cv, like: Value, v) -> Value:
    """`v` as a 0-d value of `like`'s dtype."""
    dt = like.type.dtype
    return cv.b.scalar(bool(v) if dt == DType.bool else float(v) if dt.is_float else int(v), dt, loc=cv.loc)


def floor(cv, x: Value) -> Value:
    return cv.emit("div", [x, scalar(cv, x, 1)], rounding_mode="floor") if x.type.dtype.is_float else x


def ceil(cv, x: Value) -> Value:
    return cv.emit("neg", [floor(cv, cv.emit("neg", [x]))]) if x.type.dtype.is_float else x


def trunc(cv, x: Value) -> Value:
    return cv.emit("div", [x, scalar(cv, x, 1)], rounding_mode="trunc") if x.type.dtype.is_float else x


def round_half_even(cv, x: Value) -> Value:
    """To the nearest integer, a half to the even one: floor(x), plus 1 above a half, and at
    a half plus floor(x) mod 2."""
    if not x.type.dtype.is_float:
        return x
    f = floor(cv, x)
    frac = cv.emit("sub", [x, f])
    half = scalar(cv, x, 0.5)
    odd = cv.emit("sub", [f, cv.emit("mul", [floor(cv, cv.emit("mul", [f, half])), scalar(cv, x, 2)])])
    at_half = cv.emit("where", [cv.emit("eq", [frac, half]), cv.emit("add", [f, odd]), f])
    return cv.emit("where", [cv.emit("gt", [frac, half]), cv.emit("add", [f, scalar(cv, x, 1)]), at_half])


def sign(cv, x: Value, nan_stays: bool = True) -> Value:
    """1, 0 or -1 in `x`'s dtype; a NaN stays NaN (ONNX, NumPy) or with `nan_stays` False
    gives 0 (torch: `(0 < x) - (x < 0)`)."""
    zero = scalar(cv, x, 0)
    pos, neg = (cv.emit("cast", [cv.emit(op, [x, zero])], dtype=x.type.dtype) for op in ("gt", "lt"))
    s = cv.emit("sub", [pos, neg])
    return cv.emit("where", [isnan(cv, x), x, s]) if x.type.dtype.is_float and nan_stays else s


def sign_to_zero(cv, x: Value) -> Value:
    return sign(cv, x, nan_stays=False)


def isnan(cv, x: Value) -> Value:
    return cv.emit("ne", [x, x])  # (false for integers; the kernel folds it)


def signbit(cv, x: Value) -> Value:
    """Whether the sign bit is set (-0.0 and a negative NaN too): copysign(1, x) < 0."""
    if not x.type.dtype.is_float:
        return cv.emit("lt", [x, scalar(cv, x, 0)])
    return cv.emit("lt", [cv.emit("copysign", [scalar(cv, x, 1), x]), scalar(cv, x, 0)])


def nan_ignoring_extreme(cv, a: Value, b: Value, op: str) -> Value:
    """fmax/fmin: the maximum (minimum) of the two, the other one where one side is NaN."""
    m = cv.emit(op, [a, b])
    if not m.type.dtype.is_float:
        return m
    return cv.emit("where", [isnan(cv, a), b, cv.emit("where", [isnan(cv, b), a, m])])


def xlogy(cv, x: Value, y: Value) -> Value:
    """x * log(y), 0 where x is 0 (even at y 0 or inf), NaN where y is NaN (torch's)."""
    if not x.type.dtype.is_float and not y.type.dtype.is_float:
        x = cv.emit("cast", [x], dtype=DType.float32)
    p = cv.emit("mul", [x, cv.emit("log", [y])])
    zero = scalar(cv, p, 0)
    at_zero = cv.emit("where", [cv.emit("eq", [x, zero]), zero, p])
    return cv.emit("where", [isnan(cv, y), cv.emit("add", [p, y]), at_zero])


def heaviside(cv, x: Value, values: Value) -> Value:
    """`values` where x is 0, else 1 for x > 0 and 0 below (and at NaN), in the promoted type."""
    step = cv.emit("where", [cv.emit("gt", [x, scalar(cv, x, 0)]), scalar(cv, x, 1), scalar(cv, x, 0)])
    return cv.emit("where", [cv.emit("eq", [x, scalar(cv, x, 0)]), values, step])


def remainder(cv, a: Value, b: Value, c_style: bool) -> Value:
    """`c_style`: C's fmod, with the dividend's sign; else Python's %, with the divisor's sign
    (the remainder moved by `b` where the signs differ), as torch computes both. Floats by
    `fmod` itself, which is exact (`a - b * trunc(a / b)` loses the remainder to rounding once
    the quotient is large: fmod(1000.3, 0.1) came out -2.7e-5, not 0.09997); integers by
    truncating division (`a` itself where the quotient is 0)."""
    if a.type.dtype.is_float or b.type.dtype.is_float:
        r = cv.emit("fmod", [a, b])
    else:
        q = cv.emit("div", [a, b], rounding_mode="trunc")
        r = cv.emit("where", [cv.emit("eq", [q, scalar(cv, q, 0)]), a, cv.emit("sub", [a, cv.emit("mul", [b, q])])])
    if c_style:
        return r
    zero = scalar(cv, r, 0)
    moved = cv.emit("logical_and", [
        cv.emit("ne", [r, zero]), cv.emit("ne", [cv.emit("lt", [r, zero]), cv.emit("lt", [b, scalar(cv, b, 0)])]),
    ])  # fmt: skip
    return cv.emit("where", [moved, cv.emit("add", [r, b]), r])


def floor_divide(cv, a: Value, b: Value) -> Value:
    """`a // b` as torch (and Python) computes it for floats: from the exact remainder,
    (a - fmod(a, b)) / b, one less where the remainder's sign differs from b's, rounded to
    the nearest whole number; `a / b` where b is 0. floor(a / b) differs where the quotient
    rounds up to a whole number: 1.0 // 0.1 is 9 (0.1 is a little over a tenth), floor(1.0 /
    0.1) is 10. Integers: the division's own floor rounding."""
    if not (a.type.dtype.is_float or b.type.dtype.is_float):
        return cv.emit("div", [a, b], rounding_mode="floor")
    mod = remainder(cv, a, b, c_style=True)
    quotient = cv.emit("div", [a, b], rounding_mode=None)
    zero, one = scalar(cv, quotient, 0), scalar(cv, quotient, 1)
    div = cv.emit("div", [cv.emit("sub", [a, mod]), b], rounding_mode=None)
    signs_differ = cv.emit("ne", [cv.emit("lt", [b, scalar(cv, b, 0)]), cv.emit("lt", [mod, scalar(cv, mod, 0)])])
    down = cv.emit("logical_and", [cv.emit("ne", [mod, scalar(cv, mod, 0)]), signs_differ])
    div = cv.emit("where", [down, cv.emit("sub", [div, one]), div])
    low = floor(cv, div)
    up = cv.emit("gt", [cv.emit("sub", [div, low]), scalar(cv, div, 0.5)])
    whole = cv.emit("where", [up, cv.emit("add", [low, one]), low])
    whole = cv.emit("where", [cv.emit("ne", [div, zero]), whole, cv.emit("copysign", [zero, quotient])])
    return cv.emit("where", [cv.emit("eq", [b, scalar(cv, b, 0)]), quotient, whole])


def elu(cv, x: Value, alpha: float, scale: float = 1.0, input_scale: float = 1.0) -> Value:
    """scale * (x where x > 0, else alpha * (exp(x * input_scale) - 1)): ELU, CELU (input
    scale 1 / alpha) and SELU (a scale)."""
    inner = x if input_scale == 1.0 else cv.emit("mul", [x, scalar(cv, x, input_scale)])
    neg = cv.emit("mul", [cv.emit("sub", [cv.emit("exp", [inner]), scalar(cv, x, 1)]), scalar(cv, x, alpha)])
    y = cv.emit("where", [cv.emit("gt", [x, scalar(cv, x, 0)]), x, neg])
    return y if scale == 1.0 else cv.emit("mul", [y, scalar(cv, x, scale)])


def softplus(cv, x: Value) -> Value:
    """log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)): no overflow."""
    small = cv.emit("exp", [cv.emit("neg", [cv.emit("abs", [x])])])
    return cv.emit("add", [cv.emit("relu", [x]), cv.emit("log", [cv.emit("add", [scalar(cv, x, 1), small])])])


def tan(cv, x: Value) -> Value:
    return cv.emit("div", [cv.emit("sin", [x]), cv.emit("cos", [x])], rounding_mode=None)


def hyperbolic(cv, x: Value, odd: bool) -> Value:
    """sinh (`odd`) or cosh: (exp(x) -+ exp(-x)) / 2."""
    up, down = cv.emit("exp", [x]), cv.emit("exp", [cv.emit("neg", [x])])
    return cv.emit("mul", [cv.emit("sub" if odd else "add", [up, down]), scalar(cv, x, 0.5)])


def isinf(cv, x: Value, positive: bool = True, negative: bool = True) -> Value:
    if not x.type.dtype.is_float:
        return isnan(cv, x)  # an integer is never infinite (nor NaN): false everywhere
    pos = cv.emit("eq", [x, scalar(cv, x, float("inf"))])
    neg = cv.emit("eq", [x, scalar(cv, x, float("-inf"))])
    if positive and negative:
        return cv.emit("logical_or", [pos, neg])
    if not (positive or negative):
        return cv.emit("logical_and", [pos, neg])  # never both
    return pos if positive else neg


def truth(cv, x: Value) -> Value:
    """`x` as bool (nonzero), as logical ops read their operands."""
    return x if x.type.dtype == DType.bool else cv.emit("ne", [x, scalar(cv, x, 0)])


def bitwise_xor(cv, a: Value, b: Value) -> Value:
    if a.type.dtype == DType.bool and b.type.dtype == DType.bool:
        return cv.emit("ne", [a, b])
    both = cv.emit("bitwise_and", [a, b])
    return cv.emit("bitwise_and", [cv.emit("bitwise_or", [a, b]), cv.emit("bitwise_not", [both])])


def position(cv, size, axis: int, rank: int) -> Value:
    """0 .. size-1 along `axis` of a rank-`rank` int64 tensor whose other dims are 1 (it
    broadcasts against a tensor with that dim)."""
    index = cv.emit("arange", [], start=dim(0), end=dim(size), step=1, dtype=DType.int64)
    return cv.emit("reshape", [index], shape=tuple(dim(size) if k == axis else dim(1) for k in range(rank)))


def one_hot(cv, index: Value, depth: int, axis: int = -1) -> Value:
    """Whether each position along a new `axis` of size `depth` equals the index (bool)."""
    rank = index.type.rank + 1
    axis %= rank
    shape = list(index.type.shape)
    shape.insert(axis, dim(1))
    at = cv.emit("reshape", [index], shape=tuple(shape))
    if at.type.dtype != DType.int64:
        at = cv.emit("cast", [at], dtype=DType.int64)
    return cv.emit("eq", [at, position(cv, depth, axis, rank)])


def pad_constant(cv, x, sides: dict, fill):
    """`x` padded with the scalar value `fill` by `sides` ({dim: (before, after)}): a filled
    block concatenated on each padded side; a negative pad slices instead, and a symbolic
    pad is a size, never negative. Both frontends' constant padding."""
    for k, (lo, hi) in sorted(sides.items()):
        if isinstance(lo, int) and lo < 0:
            x, lo = cv.emit("slice", [x], dim=k, start=-lo, end=None, step=1), 0
        if isinstance(hi, int) and hi < 0:
            x, hi = cv.emit("slice", [x], dim=k, start=0, end=x.type.shape[k] + hi, step=1), 0
        blocks = []
        for p in (lo, hi):
            shape = list(x.type.shape)
            shape[k] = dim(p)
            blocks.append(None if cv.b.store.canon(shape[k]) == 0 else cv.emit("expand", [fill], sizes=tuple(shape)))
        if blocks != [None, None]:
            x = cv.emit("cat", [v for v in (blocks[0], x, blocks[1]) if v is not None], dim=k)
    return x


PAD_MODES = ("reflect", "replicate", "circular")


def pad_by_index(cv, x, sides: dict, mode: str, crop_first: bool):
    """`x` padded with its own elements by `sides` ({dim: (before, after)}, whole numbers):
    "reflect" mirrors about the edge (the edge not repeated), "replicate" repeats the edge,
    "circular" wraps around. Along each padded dim a gather of computed positions: output
    position o reads element o - before folded into [0, n). A negative pad crops; where
    `crop_first`, the fold is into the cropped side (ONNX's reflect, edge and wrap, and
    torch's circular), otherwise into the whole side (torch's reflect and replicate read
    past a crop: replicate cropping 4 and padding 1 of a side of 4 repeats its last element)."""
    for k, (lo, hi) in sorted(sides.items()):
        if crop_first and lo < 0:
            x, lo = cv.emit("slice", [x], dim=k, start=-lo, end=None, step=1), 0
        if crop_first and hi < 0:
            x, hi = cv.emit("slice", [x], dim=k, start=0, end=x.type.shape[k] + hi, step=1), 0
        if lo == hi == 0:
            continue
        n = x.type.shape[k]
        i = cv.emit("arange", [], start=dim(-lo), end=n + hi, step=1, dtype=DType.int64)
        zero, last = cv.b.scalar(0, loc=cv.loc), cv.b.scalar(n - 1, loc=cv.loc)
        if mode == "replicate":
            j = cv.emit("minimum", [cv.emit("maximum", [i, zero]), last])
        elif mode == "reflect":  # |i| folds the low side; last - |last - i| the high side
            j = cv.emit("sub", [last, cv.emit("abs", [cv.emit("sub", [last, cv.emit("abs", [i])])])])
        else:
            j = remainder(cv, i, cv.b.scalar(n, loc=cv.loc), c_style=False)
        x = cv.emit("index", [x, j], dims=(k,))
    return x


def arg_extreme(cv, x, axis: int | None, keepdim: bool, largest: bool, last: bool = False):
    """`(values, indices)` of the largest (or smallest) element along `axis` (None: of the
    flattened tensor): the extreme by one reduction, then the first (`last`: the last) index
    where it is met, or where `x` is NaN (as torch, a NaN counts as the extreme), by a second
    reduction over `where(hit, index, size)`. Both frontends' argmax and argmin."""
    if axis is None:
        rank = x.type.rank
        flat = cv.emit("reshape", [x], shape=(product(x.type.shape),))
        values, at = arg_extreme(cv, flat, 0, False, largest, last)
        if keepdim:
            values, at = (cv.emit("reshape", [t], shape=(dim(1),) * rank) for t in (values, at))
        return values, at
    axis %= max(x.type.rank, 1)
    size = x.type.shape[axis]
    ext = cv.emit("amax" if largest else "amin", [x], dims=(axis,), keepdim=True)
    hit = cv.emit("logical_or", [cv.emit("eq", [x, ext]), cv.emit("ne", [x, x])])
    index = position(cv, size, axis, x.type.rank)
    past = int(size) if size.is_Integer else size
    miss = cv.emit("full", [], shape=(), value=-1 if last else past, dtype=DType.int64)
    at = cv.emit("amax" if last else "amin", [cv.emit("where", [hit, index, miss])], dims=(axis,), keepdim=keepdim)
    return (ext if keepdim else cv.emit("reshape", [ext], shape=at.type.shape)), at


TOP_K_LIMIT = 64


def top_k(cv, x: Value, k: int, axis: int, largest: bool) -> tuple[Value, Value]:
    """`(values, indices)` of the k largest (smallest) elements along `axis`, in order, the
    lower index first among equal ones: k rounds of `arg_extreme`'s two reductions, each
    over the elements not taken yet. A NaN is taken first (torch takes it first for the
    largest, last for the smallest). k rounds over the whole axis: for the small k of
    classification and routing, refused above `TOP_K_LIMIT`."""
    axis %= x.type.rank
    size = x.type.shape[axis]
    if k > TOP_K_LIMIT:
        raise ValueError(f"top-k with k = {k} (symfuse takes k <= {TOP_K_LIMIT}: k rounds of two reductions)")
    if size.is_Integer and k > int(size):
        raise ValueError(f"top-k with k = {k} along a dim of size {size}")
    dt = x.type.dtype
    if dt.is_float:
        worst = float("-inf") if largest else float("inf")
    else:
        worst = torch.iinfo(dt.torch).min if largest else torch.iinfo(dt.torch).max
    fill = scalar(cv, x, worst)
    index = position(cv, size, axis, x.type.rank)
    past = cv.emit("full", [], shape=(), value=int(size) if size.is_Integer else size, dtype=DType.int64)
    taken, values, indices = None, [], []
    for _ in range(k):
        cur = x if taken is None else cv.emit("where", [taken, fill, x])
        ext = cv.emit("amax" if largest else "amin", [cur], dims=(axis,), keepdim=True)
        hit = cv.emit("logical_or", [cv.emit("eq", [cur, ext]), cv.emit("ne", [cur, cur])])
        if taken is not None:
            hit = cv.emit("logical_and", [hit, cv.emit("logical_not", [taken])])
        at = cv.emit("amin", [cv.emit("where", [hit, index, past])], dims=(axis,), keepdim=True)
        chosen = cv.emit("eq", [index, at])
        taken = chosen if taken is None else cv.emit("logical_or", [taken, chosen])
        values.append(ext)
        indices.append(at)
    if k == 1:
        return values[0], indices[0]
    return cv.emit("cat", values, dim=axis), cv.emit("cat", indices, dim=axis)


def einsum(cv, equation: str, operands: list[Value]) -> Value:
    """numpy's einsum as permutes, reshapes, sums and batched matrix products: the operands
    folded left to right, each pair multiplied over the labels they share (a label still
    needed later, or in the output, is a batch dim; one needed nowhere else is contracted),
    a label only one operand has and nothing later needs summed out first. `...` stands for
    the leading dims each operand has beyond its labels (broadcast as numpy does); a label
    repeated within one operand (a diagonal) is refused."""
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum '{equation}' names {len(terms)} operands, got {len(operands)}")
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    ell = max((x.type.rank - len(t.replace("...", "")) for t, x in zip(terms, operands) if "..." in t), default=0)
    ell_labels = "".join(free[:ell])
    labelled = []
    for t, x in zip(terms, operands):
        if "..." in t:
            n = x.type.rank - len(t.replace("...", ""))
            t = t.replace("...", ell_labels[ell - n :])
        if len(t) != x.type.rank:
            raise ValueError(f"einsum '{equation}': operand of rank {x.type.rank} has labels '{t}'")
        if len(set(t)) != len(t):
            raise ValueError(f"einsum '{equation}' takes a diagonal (a label repeated in one operand)")
        labelled.append((t, x))
    if "->" in eq:
        out = rhs.replace("...", ell_labels)
    else:  # implicit: the broadcast dims, then each label that appears once, in order
        counts = {c: lhs.count(c) for c in lhs if c.isalpha()}
        out = ell_labels + "".join(sorted(c for c, n in counts.items() if n == 1))
    sizes = {}
    for t, x in labelled:
        for c, d in zip(t, x.type.shape):
            if c not in sizes or sizes[c] == 1:
                sizes[c] = d

    def sum_out(t, x, keep):
        gone = [i for i, c in enumerate(t) if c not in keep]
        if not gone:
            return t, x
        return "".join(c for c in t if c in keep), cv.emit("sum", [x], dims=tuple(gone), keepdim=False, dtype=None)

    def arrange(t, x, order):
        perm = tuple(t.index(c) for c in order)
        if perm != tuple(range(len(t))):
            x = cv.emit("permute", [x], dims=perm)
        full = tuple(sizes[c] for c in order)
        if tuple(x.type.shape) != full:  # a broadcast dim of size 1
            x = cv.emit("expand", [x], sizes=full)
        return x

    t, acc = labelled[0]
    for j in range(1, len(labelled) + 1):
        later = set(out) | {c for u, _ in labelled[j + 1 :] for c in u}
        if j == len(labelled):
            t, acc = sum_out(t, acc, set(out))
            break
        u, y = labelled[j]
        t, acc = sum_out(t, acc, later | set(u))
        u, y = sum_out(u, y, later | set(t))
        batch = [c for c in t if c in u and c in later]
        contract = [c for c in t if c in u and c not in later]
        left, right = [c for c in t if c not in u], [c for c in u if c not in t]
        a = arrange(t, acc, batch + left + contract)
        b = arrange(u, y, batch + contract + right)
        size = [product(sizes[c] for c in group) for group in (batch, left, contract, right)]
        a = cv.emit("reshape", [a], shape=(size[0], size[1], size[2]))
        b = cv.emit("reshape", [b], shape=(size[0], size[2], size[3]))
        acc = cv.emit("matmul", [a, b])
        t = "".join(batch + left + right)
        acc = cv.emit("reshape", [acc], shape=tuple(sizes[c] for c in t))
    return arrange(t, acc, list(out))


def conv_transpose2d(cv, x, weight: torch.Tensor, bias, stride, padding, output_padding, dilation, groups: int):
    """A transposed 2-D convolution as the convolution it is the gradient of: zeros inserted
    between the input's elements (stride - 1 of them), the input padded by
    `dilation * (kernel - 1) - padding` (`padding`: each dim's begin and end; `output_padding`
    added at the end; a negative pad
    crops), and a stride-1 convolution with the weight's channel axes swapped per group and
    its window flipped (done once, on the constant). It multiplies the inserted zeros too:
    stride^2 times the products the transposed form needs. Both frontends' ConvTranspose."""
    cin, cout_g, kh, kw = weight.shape
    w = weight.reshape(groups, cin // groups, cout_g, kh, kw).transpose(1, 2)
    w = w.reshape(groups * cout_g, cin // groups, kh, kw).flip(2, 3).contiguous()
    for k, st in ((2, stride[0]), (3, stride[1])):
        if st == 1:
            continue
        s = list(x.type.shape)
        gap = cv.emit("expand", [cv.b.scalar(0.0, x.type.dtype)], sizes=tuple(s[: k + 1] + [dim(st - 1)] + s[k + 1 :]))
        one = cv.emit("reshape", [x], shape=tuple(s[: k + 1] + [dim(1)] + s[k + 1 :]))
        spread = cv.emit("cat", [one, gap], dim=k + 1)
        s[k] = s[k] * st
        x = cv.emit("reshape", [spread], shape=tuple(s))
        x = cv.emit("slice", [x], dim=k, start=0, end=s[k] - (st - 1), step=1)
    sides = {}  # padding: each dim's (begin, end)
    for k, (kern, d, (begin, end), extra) in enumerate(zip((kh, kw), dilation, padding, output_padding)):
        sides[2 + k] = (d * (kern - 1) - begin, d * (kern - 1) - end + extra)
    x = pad_constant(cv, x, sides, cv.b.scalar(0.0, x.type.dtype))
    return cv.emit(
        "conv2d", [x, cv.b.constant(f"{cv.name}_weight", w), bias], stride=(1, 1), padding=(0, 0),
        dilation=tuple(dilation), groups=groups,
    )  # fmt: skip
