"""Every registry op: shape and dtype rules agree with the torch reference at many bindings.

Each row builds a one-op graph over symbolic inputs through `GraphBuilder` and runs the
reference executor, which asserts that every result has exactly the shape and dtype the
op's type promises for that binding.
"""

import pytest
import sympy
import torch

from symfuse import ops
from symfuse.ir.dims import evaluate, sym
from symfuse.ir.dtypes import DType
from symfuse.reference import ReferenceExecutor
from symfuse.shape.infer import GraphBuilder

F32, I64, BOOL = DType.float32, DType.int64, DType.bool
BINDINGS = [dict(B=1, S=1), dict(B=2, S=7), dict(B=3, S=16), dict(B=1, S=13)]


def T(shape: str, dtype=F32, hi: int | None = None):
    """A symbolic input: 'B,S+4,8'. Integer inputs take values in [0, hi)."""
    dims = tuple(sympy.sympify(d, locals={"B": sym("B"), "S": sym("S")}) for d in shape.split(",")) if shape else ()
    return (dims, dtype, hi)


X = T("B,S,8")
LSTM_PARAMS = [T("24,4"), T("24,6"), T("24"), T("24")]

CASES = {
    **{
        op: ([X], {})
        for op in [
            "exp",
            "log",
            "sqrt",
            "rsqrt",
            "tanh",
            "sigmoid",
            "erf",
            "sin",
            "cos",
            "reciprocal",
            "silu",
            "abs",
            "neg",
            "relu",
            "acos",
            "asin",
            "atan",
            "acosh",
            "asinh",
            "atanh",
            "erfc",
        ]
    },
    "bitwise_not": ([T("B,S", I64, 9)], {}),
    "logical_not": ([T("B,S", BOOL)], {}),
    "gelu": ([X], {"approximate": "tanh"}),
    "pow_scalar": ([T("B,S", I64, 5)], {"exponent": 0.5}),
    "clamp": ([X], {"min": -0.5, "max": None}),
    "cast": ([X], {"dtype": DType.float16}),
    **{op: ([X, T("1,S,1")], {}) for op in ["add", "sub", "mul", "maximum", "minimum", "pow", "atan2", "copysign"]},
    "fmod": ([X, T("1,S,1")], {}),
    **{op: ([X, T("S,8")], {}) for op in ["eq", "ne", "lt", "le", "gt", "ge"]},
    **{op: ([T("B,S", BOOL), T("1,S", BOOL)], {}) for op in ["bitwise_and", "bitwise_or", "logical_and", "logical_or"]},
    "div": ([T("B,S", I64, 9), T("", I64, 3)], {"rounding_mode": None}),
    "where": ([T("B,S,1", BOOL), X, T("")], {}),
    "batch_norm": ([T("B,4,S,S"), T("4"), T("4"), T("4"), T("4")], {"eps": 1e-5}),
    "full": ([], {"shape": (sym("B"), 3), "value": 1.5, "dtype": F32}),
    "arange": ([], {"start": 1, "end": sym("S") + 3, "step": 2, "dtype": I64}),
    "reshape": ([X], {"shape": (sym("B"), sym("S"), 2, -1)}),
    "permute": ([X], {"dims": (2, 0, 1)}),
    "expand": ([T("1,S,1")], {"sizes": (sym("B"), -1, 4)}),
    "slice": ([X], {"dim": 1, "start": 1, "end": None, "step": 2}),
    "select": ([X], {"dim": 2, "index": -1}),
    "cat": ([X, T("B,S,3")], {"dim": -1}),
    "gather": ([X, T("B,S,2", I64, 8)], {"dim": 2}),
    "embedding": ([T("10,4"), T("B,S", I64, 10)], {}),
    "index": ([X, T("B,1", I64, 1), T("1,S", I64, 1)], {"dims": (0, 2)}),
    "sum": ([T("B,S,8", BOOL)], {"dims": (1,), "keepdim": False, "dtype": None}),
    "mean": ([X], {"dims": (-1,), "keepdim": True, "dtype": None}),
    "amax": ([X], {"dims": (0, 2), "keepdim": False}),
    "amin": ([X], {"dims": (), "keepdim": False}),
    "softmax": ([X], {"dim": -1}),
    "safe_softmax": ([X], {"dim": -1}),
    "log_softmax": ([X], {"dim": 1}),
    "cumsum": ([T("B,S", BOOL)], {"dim": 1, "dtype": None}),
    "layer_norm": ([X, T("8"), T("8")], {"normalized_shape": (8,), "eps": 1e-5}),
    "max_pool2d": (
        [T("B,3,S+4,2*S+3")],
        {"kernel_size": (2, 3), "stride": (2, 1), "padding": (1, 0), "dilation": (1, 2)},
    ),
    "avg_pool2d": (
        [T("B,3,S+1,S+2")],
        {
            "kernel_size": (2, 2),
            "stride": (2, 2),
            "padding": (0, 1),
            "count_include_pad": False,
            "divisor_override": None,
        },
    ),
    "max_pool3d": (
        [T("B,2,S+2,4,S+3")],
        {"kernel_size": (2, 2, 3), "stride": (1, 2, 1), "padding": (1, 0, 1), "dilation": (1, 1, 2)},
    ),
    "avg_pool3d": (
        [T("B,2,S+1,3,S+2")],
        {
            "kernel_size": (2, 2, 2),
            "stride": (2, 1, 2),
            "padding": (1, 0, 1),
            "count_include_pad": False,
            "divisor_override": None,
        },
    ),
    "adaptive_avg_pool2d": ([T("B,3,S+1,S+2")], {"output_size": (2, 3)}),
    "linear": ([X, T("5,8"), T("5")], {}),
    "matmul": ([X, T("8,5")], {}),
    "conv2d": (
        [T("B,3,S+2,S+2"), T("4,3,3,3"), T("4")],
        {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 1), "groups": 1},
    ),
    "conv3d": (
        [T("B,4,S+2,5,S+2"), T("6,2,3,2,3"), T("6")],
        {"stride": (2, 1, 1), "padding": (1, 0, 1), "dilation": (1, 2, 1), "groups": 2},
    ),
    "sdpa": ([T("B,2,S,4"), T("B,2,S,4"), T("B,2,S,6"), None], {"is_causal": True, "scale": None}),
    "paged_attention": (  # 6 blocks of 16 tokens, 3 a sequence: pasts of up to 39 tokens
        [T("B,4,S,8"), T("B,2,S,8"), T("B,2,S,8"), T("6,2,16,8"), T("6,2,16,8"), T("B,3", I64, 6), T("B", I64, 40)],
        {"scale": 0.35, "window": 0},
    ),
    "lstm": (
        [T("B,S,4"), None, None, *LSTM_PARAMS],
        dict(num_layers=1, bidirectional=False, batch_first=True, has_biases=True, hidden_size=6),
    ),
}


def _tensor(shape, dtype: DType, hi, g):
    if dtype == DType.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_float:
        return torch.randint(0, hi or 10, shape, generator=g, dtype=dtype.torch)
    return torch.randn(shape, generator=g, dtype=dtype.torch)


def test_every_registered_op_has_a_case():
    assert sorted(ops.REGISTRY) == sorted(CASES)


def one_op_graph(op: str):
    """The graph of one op of CASES over symbolic inputs, a maker of random inputs, and the
    graph's shape store."""
    specs, attrs = CASES[op]
    b = GraphBuilder(op)
    b.store.declare("B")
    b.store.declare("S")
    ins = [b.input(f"x{i}", s[0], s[1]) if s is not None else None for i, s in enumerate(specs)]
    g = b.finish(list(b.add(op, ins, attrs)))

    def inputs(binding, gen):
        return [_tensor([evaluate(d, binding) for d in s[0]], s[1], s[2], gen) for s in specs if s is not None]

    return g, inputs, b.store


@pytest.mark.parametrize("op", sorted(CASES))
def test_op_rules_match_reference(op):
    g, inputs, _ = one_op_graph(op)
    run = ReferenceExecutor(g)
    gen = torch.Generator().manual_seed(1)
    for binding in BINDINGS:
        results = run.run(binding, inputs(binding, gen))  # asserts shape and dtype of every result
        assert len(results) == len(g.outputs)


def test_reshape_with_inexact_hole_records_divisibility():
    b = GraphBuilder("r")
    N = b.store.declare("N")
    x = b.input("x", (N,), F32)
    (y,) = b.add("reshape", [x], {"shape": (-1, 16)})
    assert str(y.type) == "f32[N//16, 16]"
    assert [f.text() for f in b.store.checks()] == ["N % 16 == 0", "N == (element count) 16*(N//16)"]


def test_broadcast_of_two_dynamic_dims_ties_them():
    b = GraphBuilder("bc")
    S, T_ = b.store.declare("S"), b.store.declare("T")
    x, y = b.input("x", (S, 4), F32), b.input("y", (T_, 1), F32)
    (z,) = b.add("add", [x, y])
    assert str(z.type) == "f32[S, 4]"
    assert b.store.canon(T_) == S
