"""ONNX import: each mapped op on a small hand-built graph against onnxruntime at several
shapes (compiled once), shape chains that stay symbolic, and the errors users see."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import symfuse
from symfuse.errors import UnsupportedOpsError

ort = pytest.importorskip("onnxruntime")

F, I64, BOOL = TP.FLOAT, TP.INT64, TP.BOOL
BINDINGS = [dict(N=1, S=1), dict(N=2, S=7), dict(N=3, S=16), dict(N=1, S=13)]


def model(nodes, inputs, outputs, inits=(), opset=18):
    """inputs/outputs: (name, elem type, shape with symbol names)."""
    g = oh.make_graph(
        nodes,
        "t",
        [oh.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [oh.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def feed_for(m, binding, rng):
    feed = {}
    for i in m.graph.input:
        tt = i.type.tensor_type
        shape = [binding[d.dim_param] if d.dim_param else d.dim_value for d in tt.shape.dim]
        if tt.elem_type == I64:
            feed[i.name] = rng.integers(0, 5, size=shape).astype(np.int64)
        elif tt.elem_type == BOOL:
            feed[i.name] = rng.random(shape) > 0.5
        else:
            feed[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feed


def check(m, bindings=BINDINGS, backend="reference", tol=1e-4):
    before = symfuse.compile_count()
    compiled = symfuse.compile(m, backend=backend)
    assert symfuse.compile_count() == before + 1
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b in bindings:
        feed = feed_for(m, b, rng)
        want = sess.run(None, feed)
        got = compiled(**{k: torch.from_numpy(v) for k, v in feed.items()})
        assert isinstance(got, tuple) and len(got) == len(want)
        for w, g in zip(want, got):
            g = g.numpy()
            assert g.shape == w.shape, (b, g.shape, w.shape)
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max(initial=0))))
            else:
                np.testing.assert_array_equal(g, w)
    assert symfuse.compile_count() == before + 1  # every shape ran on the one compiled program
    return compiled


X = ("x", F, ["N", "S"])
Y = ("y", F, ["N", "S"])


@pytest.mark.parametrize(
    "op", ["Abs", "Neg", "Exp", "Tanh", "Sigmoid", "Erf", "Sin", "Cos", "Relu", "Reciprocal", "Sqrt", "Log"]
)
def test_unary(op):
    nodes = [
        oh.make_node("Abs", ["x"], ["a"]),
        oh.make_node("Add", ["a", "one"], ["p"]),
        oh.make_node(op, ["p"], ["y"]),
    ]
    check(model(nodes, [X], [Y], {"one": np.float32(1.0)}))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum"])
def test_binary_float_with_broadcast(op):
    nodes = [oh.make_node("Abs", ["x"], ["a"]), oh.make_node(op, ["a", "b"], ["y"])]
    check(model(nodes, [X, ("b", F, ["S"])], [Y]))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_int(op):
    nodes = [oh.make_node(op, ["x", "three"], ["y"])]
    check(model(nodes, [("x", I64, ["N", "S"])], [("y", I64, ["N", "S"])], {"three": np.int64(-3)}))


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
def test_compare_and_where(op):
    nodes = [
        oh.make_node(op, ["x", "b"], ["c"]),
        oh.make_node("Not", ["c"], ["nc"]),
        oh.make_node("And", ["c", "nc"], ["z"]),
        oh.make_node("Or", ["z", "c"], ["c2"]),
        oh.make_node("Where", ["c2", "x", "zero"], ["y"]),
    ]
    check(model(nodes, [X, ("b", F, [1, "S"])], [Y], {"zero": np.float32(0.0)}))


def test_pow_scalar_clip_cast_identity_dropout():
    nodes = [
        oh.make_node("Pow", ["x", "two"], ["p"]),
        oh.make_node("Clip", ["p", "lo", "hi"], ["c"]),
        oh.make_node("Cast", ["c"], ["i"], to=I64),
        oh.make_node("Cast", ["i"], ["f"], to=F),
        oh.make_node("Identity", ["f"], ["d0"]),
        oh.make_node("Dropout", ["d0"], ["y"]),
    ]
    check(model(nodes, [X], [Y], {"two": np.float32(2.0), "lo": np.float32(0.5), "hi": np.float32(3.0)}))


@pytest.mark.parametrize(
    "node",
    [
        oh.make_node("LeakyRelu", ["x"], ["y"], alpha=0.1),
        oh.make_node("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4),
        oh.make_node("HardSwish", ["x"], ["y"]),
        oh.make_node("Gelu", ["x"], ["y"]),
        oh.make_node("Gelu", ["x"], ["y"], approximate="tanh"),
    ],
    ids=["leaky_relu", "hard_sigmoid", "hard_swish", "gelu", "gelu_tanh"],
)
def test_activations(node):
    check(model([node], [X], [Y], opset=20))


def test_isnan_where():
    nodes = [
        oh.make_node("Div", ["x", "x"], ["q"]),  # 0/0 where x == 0
        oh.make_node("IsNaN", ["q"], ["n"]),
        oh.make_node("Where", ["n", "zero", "q"], ["y"]),
    ]
    check(model(nodes, [X], [Y], {"zero": np.float32(0.0)}))


def test_shape_chain_reshape_stays_symbolic():
    """Shape -> Gather -> Mul -> Unsqueeze -> Concat -> Reshape: the target shape is the
    symbolic [N*S], never a tensor computed at run time."""
    nodes = [
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        oh.make_node("Gather", ["s", "i1"], ["k"], axis=0),
        oh.make_node("Mul", ["n", "k"], ["nk"]),
        oh.make_node("Unsqueeze", ["nk", "ax0"], ["nk1"]),
        oh.make_node("Concat", ["nk1", "four"], ["shape"], axis=0),
        oh.make_node("Reshape", ["x4", "shape"], ["y"]),
    ]
    inputs = [X, ("x4", F, ["N", "S", 4])]
    m = model(nodes, inputs, [("y", F, ["NS", 4])], {"i0": np.int64(0), "i1": np.int64(1), "ax0": np.array([0]),
                                                       "four": np.array([4])})  # fmt: skip
    c = check(m)
    ops = [n.op for n in c.graph.nodes]
    assert ops == ["reshape"], ops
    assert str(c.graph.outputs[0].type.shape[0]) == "N*S"


def test_reshape_zero_and_minus_one_flatten_transpose():
    nodes = [
        oh.make_node("Reshape", ["x", "shape"], ["r"]),  # [N, S, 2, 3] -> [N, S, 6] with 0 and -1
        oh.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        oh.make_node("Flatten", ["t"], ["y"], axis=1),
    ]
    m = model(nodes, [("x", F, ["N", "S", 2, 3])], [("y", F, ["N", "M"])], {"shape": np.array([0, 0, -1])})
    check(m)


def test_unsqueeze_squeeze_expand_concat():
    nodes = [
        oh.make_node("Unsqueeze", ["x", "axes"], ["u"]),  # [N, 1, S]
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Concat", ["s1", "s"], ["target"], axis=0),  # [3, N, S] (bidirectional broadcast)
        oh.make_node("Expand", ["u", "target3"], ["e"]),  # [N, 3, S]
        oh.make_node("Squeeze", ["u", "axes"], ["back"]),
        oh.make_node("Concat", ["e", "u"], ["y"], axis=1),
        oh.make_node("Identity", ["back"], ["z"]),
    ]
    inits = {"axes": np.array([1]), "s1": np.array([3]), "target3": np.array([1, 3, 1])}
    m = model(nodes, [X], [("y", F, ["N", 4, "S"]), ("z", F, ["N", "S"])], inits)
    check(m)


def test_slice_with_symbolic_ends_and_split():
    nodes = [
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Slice", ["s", "i1", "i2"], ["send"]),  # [S]
        oh.make_node("Slice", ["table", "z1", "send", "ax1"], ["rows"]),  # table[:, :S]
        oh.make_node("Add", ["x", "rows"], ["a"]),
        oh.make_node("Slice", ["a", "m2", "big", "ax1", "step"], ["tail"]),  # a[:, -2::2]... step 1
        oh.make_node("Split", ["table", "sizes"], ["p", "q"], axis=1),
    ]
    inits = {
        "table": np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32),
        "i1": np.array([1]), "i2": np.array([2]), "z1": np.array([0]), "ax1": np.array([1]),
        "m2": np.array([-2]), "big": np.array([2**63 - 1]), "step": np.array([1]), "sizes": np.array([24, 40]),
    }  # fmt: skip
    m = model(nodes, [X], [("tail", F, ["N", "T"]), ("p", F, [1, 24]), ("q", F, [1, 40])], inits)
    check(m)


def test_constant_pads_with_axes_negative_pads_and_a_value():
    nodes = [
        oh.make_node("Pad", ["x", "pads"], ["a"]),  # [1, 2] before, [0, 3] after on (N, S)
        oh.make_node("Pad", ["x", "pads1", "v", "ax1"], ["b"]),  # S: 2 before, 1 cut at the end, value 1.5
        oh.make_node("Pad", ["x", "pads0"], ["c"], mode="constant"),  # no padding at all
    ]
    inits = {"pads": np.array([1, 2, 0, 3]), "pads1": np.array([2, -1]), "v": np.array(1.5, np.float32),
             "ax1": np.array([1]), "pads0": np.array([0, 0, 0, 0])}  # fmt: skip
    outs = [("a", F, ["A", "B"]), ("b", F, ["N", "C"]), ("c", F, ["N", "S"])]
    check(model(nodes, [X], outs, inits), backend="cpu")


def test_gathers():
    nodes = [
        oh.make_node("Gather", ["emb", "ids"], ["e"], axis=0),  # an embedding lookup
        oh.make_node("Gather", ["e", "i1"], ["g1"], axis=2),  # a constant index: select
        oh.make_node("Gather", ["e", "idx"], ["g2"], axis=2),  # constant indices
        oh.make_node("Unsqueeze", ["ids", "last"], ["ids1"]),
        oh.make_node("GatherElements", ["e", "ids1"], ["ge"], axis=2),
        oh.make_node("GatherND", ["tab", "ids1"], ["gnd"]),
    ]
    inits = {
        "emb": np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32),
        "tab": np.random.default_rng(3).standard_normal((5, 3)).astype(np.float32),
        "i1": np.int64(-1), "idx": np.array([[0, 2], [5, 1]]), "last": np.array([-1]),
    }  # fmt: skip
    outs = [("g1", F, ["N", "S"]), ("g2", F, ["N", "S", 2, 2]), ("ge", F, ["N", "S", 1]), ("gnd", F, ["N", "S", 3])]
    check(model(nodes, [("ids", I64, ["N", "S"])], outs, inits))


@pytest.mark.parametrize(
    "op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2", "ReduceL1"]
)
@pytest.mark.parametrize("keep", [0, 1])
def test_reductions(op, keep):
    nodes = [oh.make_node(op, ["x", "axes"], ["y"], keepdims=keep)]
    out = ("y", F, ["N", 1] if keep else ["N"])
    check(model(nodes, [X], [out], {"axes": np.array([-1])}))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax(op, axis):
    check(model([oh.make_node(op, ["x"], ["y"], axis=axis)], [X], [Y]))


def test_safe_softmax_pattern_becomes_one_op():
    """Softmax -> IsNaN -> Where(0): exporters' form of torch's safe softmax; a fully masked
    row gives zeros."""
    nodes = [
        oh.make_node("Where", ["mask", "x", "ninf"], ["masked"]),
        oh.make_node("Softmax", ["masked"], ["p"], axis=-1),
        oh.make_node("IsNaN", ["p"], ["n"]),
        oh.make_node("Where", ["n", "zero", "p"], ["y"]),
    ]
    m = model(nodes, [X, ("mask", BOOL, ["N", "S"])], [Y], {"ninf": np.float32(-np.inf), "zero": np.float32(0)})
    c = check(m)
    assert [n.op for n in c.graph.nodes if n.op != "full"] == ["where", "safe_softmax"]


def test_layer_norm_cumsum_range_constant_of_shape():
    nodes = [
        oh.make_node("LayerNormalization", ["x", "w", "b"], ["ln"], axis=-1, epsilon=1e-5),
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Gather", ["s", "i1"], ["n"], axis=0),
        oh.make_node("Range", ["z", "n", "one"], ["r"]),  # arange(S)
        oh.make_node("Slice", ["s", "z1", "two"], ["s2"]),
        oh.make_node("ConstantOfShape", ["s2"], ["ones"], value=numpy_helper.from_array(np.array([1], np.int64))),
        oh.make_node("CumSum", ["ones", "ax"], ["cs"]),
        oh.make_node("Sub", ["cs", "r"], ["y"]),  # 1 everywhere
        oh.make_node("Identity", ["ln"], ["z2"]),
    ]
    inits = {"w": np.linspace(0.5, 2, 7, dtype=np.float32), "b": np.linspace(-1, 1, 7, dtype=np.float32),
             "i1": np.int64(1), "z": np.int64(0), "one": np.int64(1), "ax": np.int64(1), "z1": np.array([0]),
             "two": np.array([2])}  # fmt: skip
    m = model(nodes, [("x", F, ["N", "S", 7])], [("y", I64, ["N", "S"]), ("z2", F, ["N", "S", 7])], inits)
    check(m)


def test_matmul_gemm():
    rng = np.random.default_rng(4)
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["mm"]),  # [N, S, 4] @ [4, 5]
        oh.make_node("Add", ["mm", "bias"], ["lin"]),  # becomes a linear with its bias
        oh.make_node("MatMul", ["lin", "v"], ["vec"]),  # @ [5]: a 1-D right operand
        oh.make_node("Gemm", ["a", "gw", "gc"], ["g1"], transB=1, alpha=0.5, beta=2.0),
        oh.make_node("Gemm", ["a", "bt"], ["g2"], transA=0),
    ]
    inits = {"w": rng.standard_normal((4, 5)).astype(np.float32), "bias": rng.standard_normal(5).astype(np.float32),
             "v": rng.standard_normal(5).astype(np.float32), "gw": rng.standard_normal((6, 4)).astype(np.float32),
             "gc": rng.standard_normal(6).astype(np.float32)}  # fmt: skip
    inputs = [("x", F, ["N", "S", 4]), ("a", F, ["N", 4]), ("bt", F, [4, "S"])]
    outs = [("vec", F, ["N", "S"]), ("g1", F, ["N", 6]), ("g2", F, ["N", "S"])]
    c = check(model(nodes, inputs, outs, inits))
    assert sum(n.op == "linear" for n in c.graph.nodes) == 2


def test_conv_pools_batch_norm():
    rng = np.random.default_rng(5)
    C = 3
    nodes = [
        oh.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        oh.make_node("BatchNormalization", ["c", "s", "bb", "mean", "var"], ["bn"]),
        oh.make_node("Relu", ["bn"], ["r"]),
        oh.make_node("MaxPool", ["r"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("AveragePool", ["r"], ["ap"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
        oh.make_node("GlobalAveragePool", ["mp"], ["ga"]),
        oh.make_node("GlobalMaxPool", ["ap"], ["gm"]),
        oh.make_node("Add", ["ga", "gm"], ["y"]),
    ]
    f32 = np.float32
    inits = {"w": rng.standard_normal((4, C, 3, 3)).astype(f32), "cb": rng.standard_normal(4).astype(f32),
             "s": rng.random(4).astype(f32) + 0.5, "bb": rng.standard_normal(4).astype(f32),
             "mean": rng.standard_normal(4).astype(f32), "var": rng.random(4).astype(f32) + 0.5}  # fmt: skip
    m = model(nodes, [("x", F, ["N", C, "H", "H"])], [("y", F, ["N", 4, 1, 1])], inits)
    check(m, [dict(N=1, H=2), dict(N=2, H=7), dict(N=1, H=16)])


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm(direction):
    rng = np.random.default_rng(6)
    D, H, In = (2 if direction == "bidirectional" else 1), 5, 3
    inits = {"W": rng.standard_normal((D, 4 * H, In)).astype(np.float32) * 0.5,
             "R": rng.standard_normal((D, 4 * H, H)).astype(np.float32) * 0.5,
             "B": rng.standard_normal((D, 8 * H)).astype(np.float32) * 0.5}  # fmt: skip
    nodes = [oh.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=H, direction=direction)]
    outs = [("y", F, ["T", D, "N", H]), ("yh", F, [D, "N", H]), ("yc", F, [D, "N", H])]
    check(model(nodes, [("x", F, ["T", "N", In])], outs, inits), [dict(T=1, N=1), dict(T=5, N=2), dict(T=9, N=3)])


def test_cpu_backend_runs_an_imported_block():
    """A small attention block (the shape chains exporters write, a safe softmax) on the
    generated-code backend."""
    rng = np.random.default_rng(7)
    E, Hh = 8, 2
    nodes = [
        oh.make_node("MatMul", ["x", "wq"], ["q0"]),
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Slice", ["s", "z", "two"], ["ns"]),
        oh.make_node("Concat", ["ns", "heads"], ["hs"], axis=0),
        oh.make_node("Reshape", ["q0", "hs"], ["q1"]),
        oh.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),  # [N, H, S, E/H]
        oh.make_node("Transpose", ["q"], ["kt"], perm=[0, 1, 3, 2]),
        oh.make_node("MatMul", ["q", "kt"], ["sc"]),
        oh.make_node("Mul", ["sc", "scale"], ["scs"]),
        oh.make_node("Softmax", ["scs"], ["p"], axis=-1),
        oh.make_node("IsNaN", ["p"], ["nan"]),
        oh.make_node("Where", ["nan", "zero", "p"], ["pp"]),
        oh.make_node("MatMul", ["pp", "q"], ["ctx"]),
        oh.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
        oh.make_node("Reshape", ["ct", "back"], ["r"]),
        oh.make_node("LayerNormalization", ["r", "lw"], ["y"], axis=-1),
    ]
    inits = {"wq": rng.standard_normal((E, E)).astype(np.float32), "z": np.array([0]), "two": np.array([2]),
             "heads": np.array([Hh, E // Hh]), "scale": np.float32(0.5), "zero": np.float32(0.0),
             "back": np.array([0, 0, E]), "lw": np.ones(E, np.float32)}  # fmt: skip
    m = model(nodes, [("x", F, ["N", "S", E])], [("y", F, ["N", "S", E])], inits)
    check(m, backend="cpu")


# -- errors --------------------------------------------------------------------------------------


def test_unsupported_ops_listed_with_counts_and_nodes_before_compiling():
    nodes = [
        oh.make_node("NonZero", ["x"], ["a"], name="e1"),  # its output's shape depends on the data
        oh.make_node("Foo", ["a"], ["b"], domain="com.example", name="f1"),
        oh.make_node("Foo", ["b"], ["y"], domain="com.example", name="f2"),
    ]
    g = oh.make_graph(nodes, "t", [oh.make_tensor_value_info("x", F, ["N", "S"])],
                      [oh.make_tensor_value_info("y", F, ["N", "S"])])  # fmt: skip
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.example", 1)])
    before = symfuse.compile_count()
    with pytest.raises(UnsupportedOpsError) as e:
        symfuse.compile(m)
    text = str(e.value)
    assert "com.example.Foo: 2 node(s)" in text and "f1, f2" in text and "NonZero: 1 node(s)" in text
    assert symfuse.compile_count() == before


def test_data_dependent_shape_is_a_clear_error():
    nodes = [oh.make_node("Reshape", ["x", "shape"], ["y"])]
    m = model(nodes, [X, ("shape", I64, [2])], [Y])
    with pytest.raises(UnsupportedOpsError, match=r"Reshape's shape must be known .* from the values of 'shape'"):
        symfuse.compile(m)
    # through a chain of ops, for each op that takes a shape
    for op, extra in [("Expand", []), ("Tile", []), ("Reshape", [])]:
        nodes = [oh.make_node("Add", ["shape", "one"], ["s1"]), oh.make_node("Abs", ["s1"], ["s2"]),
                 oh.make_node(op, ["x", "s2", *extra], ["y"])]  # fmt: skip
        m = model(nodes, [X, ("shape", I64, [2])], [Y], {"one": np.int64(1)})
        with pytest.raises(UnsupportedOpsError, match=rf"{op}.* must be known .* from the values of 'shape'"):
            symfuse.compile(m)


def test_missing_file_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        symfuse.compile(str(tmp_path / "nope.onnx"))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a readable ONNX model|not valid"):
        symfuse.compile(str(bad))
    m = model([oh.make_node("Relu", ["x"], ["y"])], [X], [Y])
    with pytest.raises(ValueError, match="needs no example inputs"):
        symfuse.compile(m, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="dynamic names input 'z'"):
        symfuse.compile(m, dynamic={"z": {0: "B"}})


def test_older_opset_is_converted():
    """Opset 11 writes Unsqueeze's axes as an attribute; the version converter lifts it."""
    nodes = [oh.make_node("Unsqueeze", ["x"], ["u"], axes=[0]), oh.make_node("Relu", ["u"], ["y"])]
    m = model(nodes, [X], [("y", F, [1, "N", "S"])], opset=11)
    check(m)


def test_dynamic_renames_and_bounds_dims_and_guard_names_them():
    m = model([oh.make_node("Relu", ["x"], ["y"])], [("x", F, ["batch", 4])], [("y", F, ["batch", 4])])
    c = symfuse.compile(m, dynamic={"x": {0: torch.export.Dim("B", min=1, max=8), 1: "C"}})
    assert c.symbols == ["B", "C"]
    assert c(torch.ones(8, 5))[0].shape == (8, 5)
    with pytest.raises(ValueError, match="B"):
        c(torch.ones(9, 4))


def test_docs_list_every_mapped_op():
    import pathlib
    import re

    from symfuse.frontend.onnx_table import FOLD, ONNX_OPS

    text = pathlib.Path(__file__).parents[2].joinpath("docs", "frontends.md").read_text()
    section = text.split("### Mapped ops", 1)[1].split("### Exports", 1)[0]
    listed = set(re.findall(r"\b[A-Z][A-Za-z0-9]+\b", section))
    missing = (set(ONNX_OPS) | set(FOLD)) - listed
    assert not missing, f"docs/frontends.md does not list {sorted(missing)}"


def test_symbolic_folding_of_shape_arithmetic():
    """Size, ReduceProd, Div, Mod, Max, Equal and Where on dims fold at import: the
    reshape target [N*S // 2, 2*(S % 1 + 1)] and the comparison's result are known."""
    nodes = [
        oh.make_node("Size", ["x"], ["n"]),  # N*S*2
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("ReduceProd", ["s"], ["p"], keepdims=0),  # N*S*2
        oh.make_node("Div", ["p", "two"], ["half"]),  # N*S
        oh.make_node("Mod", ["n", "two"], ["zero"]),  # 0
        oh.make_node("Add", ["zero", "two"], ["two2"]),
        oh.make_node("Max", ["two2", "one"], ["cols"]),  # 2
        oh.make_node("Equal", ["s", "minus1"], ["isneg"]),  # all false: dims are >= 1
        oh.make_node("Where", ["isneg", "one", "s"], ["s_again"]),
        oh.make_node("Unsqueeze", ["half", "ax0"], ["h1"]),
        oh.make_node("Unsqueeze", ["cols", "ax0"], ["c1"]),
        oh.make_node("Concat", ["h1", "c1"], ["target"], axis=0),
        oh.make_node("Reshape", ["x", "target"], ["y"]),
        oh.make_node("Expand", ["x", "s_again"], ["z"]),
        oh.make_node("BitwiseNot", ["ids"], ["nb"]),
        oh.make_node("BitwiseAnd", ["ids", "nb"], ["zb"]),
        oh.make_node("BitwiseOr", ["zb", "ids"], ["ob"]),
        oh.make_node("CastLike", ["ob", "x"], ["w"]),
    ]
    inits = {"two": np.int64(2), "one": np.int64(1), "minus1": np.array([-1, -1, -1]), "ax0": np.array([0])}
    inputs = [("x", F, ["N", "S", 2]), ("ids", I64, ["N", "S", 2])]
    outs = [("y", F, ["A", 2]), ("z", F, ["N", "S", 2]), ("w", F, ["N", "S", 2])]
    c = check(model(nodes, inputs, outs, inits))
    assert str(c.graph.outputs[0].type.shape[0]) == "N*S"


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("Floor", {}), ("Ceil", {}), ("Sign", {}), ("Elu", {"alpha": 0.7}), ("Celu", {"alpha": 1.3}), ("Selu", {}),
        ("Softplus", {}), ("Softsign", {}), ("Mish", {}), ("ThresholdedRelu", {"alpha": 0.4}),
        ("Shrink", {"lambd": 0.3, "bias": 0.1}), ("Tan", {}), ("Sinh", {}), ("Cosh", {}),
    ],
)  # fmt: skip
def test_unary_composites(op, attrs):
    """Ops written as several registry ops, compiled to native code, at each binding."""
    nodes = [oh.make_node("Mul", ["x", "three"], ["a"]), oh.make_node(op, ["a"], ["y"], **attrs)]
    check(model(nodes, [X], [Y], {"three": np.float32(3.0)}), backend="cpu")


@pytest.mark.parametrize("fmod, elem", [(0, I64), (1, I64), (1, F)])  # fmod=0 is for integers only
def test_mod_both_signs(fmod, elem):
    nodes = [oh.make_node("Mod", ["x", "b"], ["y"], fmod=fmod)]
    divisors = [3, -3, 2, -5, 7, 3, -3, 4, 1, -2, 6, 5, -4, 3, 2, -7]
    inits = {"b": np.array(divisors, np.float32 if elem == F else np.int64)}
    m = model(nodes, [("x", elem, ["N", 16])], [("y", elem, ["N", 16])], inits)
    check(m, [dict(N=1), dict(N=3), dict(N=16)], backend="cpu")


def test_argmax_argmin_hardmax_isinf_prelu_xor_mean():
    nodes = [
        oh.make_node("Floor", ["x"], ["t"]),  # ties: the first index wins
        oh.make_node("ArgMax", ["t"], ["am"], axis=1, keepdims=0),
        oh.make_node("ArgMin", ["t"], ["an"], axis=0, keepdims=1, select_last_index=1),
        oh.make_node("Hardmax", ["t"], ["h"], axis=-1),
        oh.make_node("Div", ["x", "zero"], ["inf"]),
        oh.make_node("IsInf", ["inf"], ["ii"], detect_negative=0),
        oh.make_node("PRelu", ["x", "slope"], ["pr"]),
        oh.make_node("Greater", ["x", "zero"], ["g"]),
        oh.make_node("Less", ["x", "half"], ["l"]),
        oh.make_node("Xor", ["g", "l"], ["xo"]),
        oh.make_node("Mean", ["x", "pr", "h"], ["me"]),
    ]
    outs = [("am", I64, ["N"]), ("an", I64, [1, "S"]), ("h", F, ["N", "S"]), ("ii", BOOL, ["N", "S"]),
            ("pr", F, ["N", "S"]), ("xo", BOOL, ["N", "S"]), ("me", F, ["N", "S"])]  # fmt: skip
    inits = {"zero": np.float32(0.0), "half": np.float32(0.5), "slope": np.float32(0.25)}
    check(model(nodes, [X], outs, inits), backend="cpu")


def test_reduce_log_sum_exp_and_log_sum():
    nodes = [
        oh.make_node("Mul", ["x", "big"], ["b"]),  # exp of it alone overflows
        oh.make_node("ReduceLogSumExp", ["b", "axes"], ["lse"], keepdims=0),
        oh.make_node("Abs", ["x"], ["a"]),
        oh.make_node("ReduceLogSum", ["a", "axes"], ["ls"], keepdims=1),
    ]
    outs = [("lse", F, ["N"]), ("ls", F, ["N", 1])]
    check(model(nodes, [X], outs, {"big": np.float32(200.0), "axes": np.array([1], np.int64)}), backend="cpu")


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("MaxPool", {"pads": [2, 2, 2, 2]}),  # larger than half the window: torch's pool refuses it
        ("MaxPool", {"pads": [0, 1, 2, 0]}),  # uneven
        ("MaxPool", {"ceil_mode": 1, "strides": [2, 2]}),
        ("MaxPool", {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ("AveragePool", {"pads": [2, 1, 2, 0], "count_include_pad": 0}),
        ("AveragePool", {"pads": [2, 1, 2, 0], "count_include_pad": 1}),
        ("AveragePool", {"ceil_mode": 1, "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        ("AveragePool", {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
        ("AveragePool", {"auto_pad": "SAME_UPPER", "strides": [2, 2], "count_include_pad": 1}),
        ("Conv", {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ("Conv", {"pads": [0, 2, 1, 0]}),
    ],
)
def test_window_padding_torch_cannot_express(op, attrs):
    """Padding explicitly first: uneven, over half the window, SAME with a stride, ceil_mode."""
    h, w = 11, 8
    ins = [("x", F, [1, 2, h, w])]
    inits = {}
    if op == "Conv":
        inits["w"] = np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32)
        node = oh.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], **attrs)
    else:
        node = oh.make_node(op, ["x"], ["y"], kernel_shape=[3, 3], **attrs)
    x = oh.make_tensor_value_info("x", F, [1, 2, h, w])
    g = oh.make_graph([node], "t", [x], [oh.make_tensor_value_info("y", F, None)],
                      [numpy_helper.from_array(v, k) for k, v in inits.items()])  # fmt: skip
    inferred = onnx.shape_inference.infer_shapes(oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)]))
    shape = [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]
    m = model([node], ins, [("y", F, shape)], inits)
    check(m, [{}], backend="cpu")


def test_normalisations_and_their_statistics():
    """InstanceNormalization, GroupNormalization, RMSNormalization, LpNormalization, and
    LayerNormalization's mean and inverse deviation outputs, over dynamic dims."""
    rng = np.random.default_rng(2)
    c = 6
    nodes = [
        oh.make_node("Reshape", ["x", "shape4"], ["x4"]),  # (N, 6, S, 2)
        oh.make_node("InstanceNormalization", ["x4", "sc", "bi"], ["inorm"], epsilon=1e-3),
        oh.make_node("GroupNormalization", ["x4", "sc", "bi"], ["gnorm"], num_groups=3, epsilon=1e-4),
        oh.make_node("RMSNormalization", ["x", "scale12"], ["rms"], axis=-1),
        oh.make_node("LpNormalization", ["x"], ["l2"], axis=0, p=2),
        oh.make_node("LpNormalization", ["x"], ["l1"], axis=-1, p=1),
        oh.make_node("LayerNormalization", ["x", "scale12", "bias12"], ["ln", "mean", "inv"], axis=-1),
    ]
    x4 = ["N", c, "S", 2]
    outs = [("inorm", F, x4), ("gnorm", F, x4), ("rms", F, ["N", "S", 12]), ("l2", F, ["N", "S", 12]),
            ("l1", F, ["N", "S", 12]), ("ln", F, ["N", "S", 12]), ("mean", F, ["N", "S", 1]),
            ("inv", F, ["N", "S", 1])]  # fmt: skip
    inits = {
        "shape4": np.array([0, c, -1, 2], np.int64),
        "sc": rng.standard_normal(c).astype(np.float32),
        "bi": rng.standard_normal(c).astype(np.float32),
        "scale12": rng.standard_normal(12).astype(np.float32),
        "bias12": rng.standard_normal(12).astype(np.float32),
    }
    m = model(nodes, [("x", F, ["N", "S", 12])], outs, inits, opset=23)
    check(m, [dict(N=1, S=1), dict(N=2, S=7), dict(N=3, S=16)], backend="cpu")


def test_layout_ops_tile_depth_space_trilu_one_hot_round_cumsum():
    nodes = [
        oh.make_node("Tile", ["x", "reps"], ["tiled"]),
        oh.make_node("Reshape", ["x", "shape4"], ["x4"]),  # (N, 8, S, 2)
        oh.make_node("DepthToSpace", ["x4"], ["d2s"], blocksize=2, mode="DCR"),
        oh.make_node("DepthToSpace", ["x4"], ["d2s_crd"], blocksize=2, mode="CRD"),
        oh.make_node("SpaceToDepth", ["d2s"], ["s2d"], blocksize=2),
        oh.make_node("Trilu", ["x", "k"], ["upper"], upper=1),
        oh.make_node("Trilu", ["x"], ["lower"], upper=0),
        oh.make_node("Mul", ["x", "three"], ["x3"]),
        oh.make_node("Round", ["x3"], ["rounded"]),
        oh.make_node("Cast", ["rounded"], ["ids"], to=I64),
        oh.make_node("OneHot", ["ids", "depth", "values"], ["hot"], axis=1),
        oh.make_node("CumSum", ["x", "axis1"], ["rev"], reverse=1),
        oh.make_node("CumSum", ["x", "axis1"], ["excl"], exclusive=1),
        oh.make_node("CumSum", ["x", "axis1"], ["both"], exclusive=1, reverse=1),
    ]
    outs = [("tiled", F, ["T0", "T1", 32]), ("d2s", F, ["N", 2, "H", 4]), ("d2s_crd", F, ["N", 2, "H", 4]),
            ("s2d", F, ["N", 8, "S", 2]), ("upper", F, ["N", "S", 16]), ("lower", F, ["N", "S", 16]),
            ("rounded", F, ["N", "S", 16]), ("hot", F, ["N", 7, "S", 16]), ("rev", F, ["N", "S", 16]),
            ("excl", F, ["N", "S", 16]), ("both", F, ["N", "S", 16])]  # fmt: skip
    inits = {
        "reps": np.array([2, 1, 2], np.int64), "shape4": np.array([0, 8, -1, 2], np.int64),
        "k": np.array(1, np.int64), "three": np.float32(2.5), "depth": np.array(7, np.int64),
        "values": np.array([-1.0, 2.0], np.float32), "axis1": np.array(1, np.int64),
    }  # fmt: skip
    m = model(nodes, [("x", F, ["N", "S", 16])], outs, inits)
    check(m, [dict(N=1, S=1), dict(N=2, S=7), dict(N=3, S=16)], backend="cpu")


@pytest.mark.parametrize("op", ["Conv", "MaxPool", "AveragePool"])
def test_one_dimensional_windows(op):
    """Conv and pools over (N, C, L) as the 2-D ops over a height of 1, L dynamic."""
    rng = np.random.default_rng(3)
    attrs = {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}
    inits = {}
    if op == "Conv":
        inits = {"w": rng.standard_normal((5, 4, 3)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
        node = oh.make_node("Conv", ["x", "w", "b"], ["y"], dilations=[2], **attrs)
    else:
        node = oh.make_node(op, ["x"], ["y"], **attrs)
    out_c = 5 if op == "Conv" else 4
    m = model([node], [("x", F, ["N", 4, "L"])], [("y", F, ["N", out_c, "M"])], inits)
    check(m, [dict(N=1, L=7), dict(N=2, L=16), dict(N=3, L=31)], backend="cpu")


@pytest.mark.parametrize(
    "coords, rounding", [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("pytorch_half_pixel", None)]
)
def test_resize_nearest_by_whole_factors(coords, rounding):
    """By scales and by sizes computed from the input's shape (dynamic H and W)."""
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coords}
    if rounding:
        attrs["nearest_mode"] = rounding
    nodes = [
        oh.make_node("Resize", ["x", "", "scales"], ["by_scales"], **attrs),
        oh.make_node("Shape", ["x"], ["shape"]),
        oh.make_node("Mul", ["shape", "factors"], ["sizes"]),
        oh.make_node("Resize", ["x", "", "", "sizes"], ["by_sizes"], **attrs),
    ]
    inits = {"scales": np.array([1, 1, 2, 3], np.float32), "factors": np.array([1, 1, 3, 1], np.int64)}
    outs = [("by_scales", F, ["N", 2, "H2", "W3"]), ("by_sizes", F, ["N", 2, "H3", "W"])]
    m = model(nodes, [("x", F, ["N", 2, "H", "W"])], outs, inits)
    check(m, [dict(N=1, H=1, W=1), dict(N=2, H=5, W=7), dict(N=1, H=16, W=3)], backend="cpu")


def test_resize_that_is_not_a_repeat_is_refused_by_name():
    nodes = [oh.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")]
    m = model(nodes, [("x", F, [1, 2, 4, 4])], [("y", F, [1, 2, 8, 8])], {"scales": np.array([1, 1, 2, 2], np.float32)})
    with pytest.raises(UnsupportedOpsError, match="Resize in linear mode"):
        symfuse.compile(m)


def test_conv_transpose_with_pads_output_padding_and_output_shape():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        oh.make_node("ConvTranspose", ["x", "w"], ["a"], strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 0]),
        oh.make_node("ConvTranspose", ["x", "w", "b"], ["c"], strides=[3, 2], output_shape=[16, 12], group=2),
        oh.make_node("ConvTranspose", ["x", "w"], ["s"], strides=[2, 2], auto_pad="SAME_UPPER"),
    ]
    m0 = oh.make_model(oh.make_graph(nodes, "t", [oh.make_tensor_value_info("x", F, [2, 4, 5, 6])],
                                     [oh.make_tensor_value_info(o, F, None) for o in "acs"],
                                     [numpy_helper.from_array(w, "w"),
                                      numpy_helper.from_array(np.ones(6, np.float32), "b")]),
                       opset_imports=[oh.make_opsetid("", 18)])  # fmt: skip
    inits = {"w": w, "b": np.arange(6, dtype=np.float32)}
    shapes = onnx.shape_inference.infer_shapes(m0).graph.output
    outs = [(o.name, F, [d.dim_value for d in o.type.tensor_type.shape.dim]) for o in shapes]
    check(model(nodes, [("x", F, [2, 4, 5, 6])], outs, inits), [{}], backend="cpu")


def test_top_k_and_einsum():
    """TopK (k rounds of two reductions; the lower index first among equal values, as ONNX
    says) and Einsum (permutes, sums and batched products) over dynamic dims."""
    nodes = [
        oh.make_node("Floor", ["x"], ["t"]),  # ties
        oh.make_node("TopK", ["t", "k3"], ["v", "i"], axis=-1),
        oh.make_node("TopK", ["x", "k2"], ["vs", "is"], axis=1, largest=0),
        oh.make_node("Einsum", ["x", "y"], ["bmm"], equation="bij,bkj->bik"),
        oh.make_node("Einsum", ["x"], ["rowsum"], equation="bij->bj"),
        oh.make_node("Einsum", ["x", "x"], ["dot"], equation="...j,...j"),
        oh.make_node("Einsum", ["x", "w", "y"], ["chain"], equation="bij,jk,bmk->bim"),
    ]
    ins = [("x", F, ["N", "S", 6]), ("y", F, ["N", "T", 6])]
    outs = [("v", F, ["N", "S", 3]), ("i", I64, ["N", "S", 3]), ("vs", F, ["N", 2, 6]), ("is", I64, ["N", 2, 6]),
            ("bmm", F, ["N", "S", "T"]), ("rowsum", F, ["N", 6]), ("dot", F, ["N", "S"]),
            ("chain", F, ["N", "S", "T"])]  # fmt: skip
    inits = {"k3": np.array([3], np.int64), "k2": np.array([2], np.int64),
             "w": np.random.default_rng(5).standard_normal((6, 6)).astype(np.float32)}  # fmt: skip
    m = model(nodes, ins, outs, inits)
    check(m, [dict(N=1, S=2, T=1), dict(N=2, S=7, T=5), dict(N=3, S=16, T=3)], backend="cpu")


def test_hostile_names_become_identifiers_and_errors_keep_the_originals():
    """Exporters name tensors `0`, `input.1`, `x:0`, `onnx::Gemm_3`; names may be C++ or
    Python words, differ only in case or punctuation, or match what the generated code
    declares itself. The generated code gets unique identifiers; users and errors see the
    model's names."""
    names = ["0", "a.b", "a_b", "x:0", "class", "int", "X", "x", "onnx::Gemm_3", "sym", "ünï"]
    nodes, prev = [], None
    for i, n in enumerate(names):
        nodes.append(oh.make_node("Add", [n, prev or "input.1"], [f"{n}/out"], name=n))
        nodes.append(oh.make_node("Mul", [f"{n}/out", "w.0"], [f"1{i}" if i % 2 else f"row_{i}"]))
        prev = nodes[-1].output[0]
    nodes.append(oh.make_node("Relu", [prev], ["1"]))
    inputs = [("input.1", F, ["batch size", "class"])] + [(n, F, ["batch size", "class"]) for n in names]
    outputs = [("1", F, ["batch size", "class"]), (prev, F, ["batch size", "class"])]
    m = model(nodes, inputs, outputs, {"w.0": np.float32(0.5)})
    compiled = check(m, [{"batch size": 1, "class": 3}, {"batch size": 4, "class": 16}, {"batch size": 2, "class": 7}],
                     backend="cpu")  # fmt: skip
    feed = {n: torch.randn(2, 3) for n in ["input.1", *names]}
    feed["x:0"] = torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"'x:0'"):
        compiled(**feed)
    assert "x:0" in compiled.explain()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_three_dimensional_windows(backend):
    """Conv, MaxPool, AveragePool and the global pools over depth, height and width, with
    uneven pads, strides and dilations, at several volumes."""
    rng = np.random.default_rng(3)
    nodes = [
        oh.make_node(
            "Conv", ["x", "w", "b"], ["c"], strides=[1, 2, 1], pads=[1, 0, 1, 1, 0, 2], dilations=[1, 1, 2], group=2
        ),  # fmt: skip
        oh.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2, 2], strides=[1, 1, 2], pads=[1, 0, 0, 0, 1, 1]),
        oh.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 1, 2], pads=[0, 0, 1, 1, 0, 0]),
        oh.make_node("GlobalAveragePool", ["a"], ["g"]),
        oh.make_node("GlobalMaxPool", ["a"], ["h"]),
    ]
    inits = {"w": rng.standard_normal((6, 2, 3, 2, 3)).astype(np.float32),
             "b": rng.standard_normal(6).astype(np.float32)}  # fmt: skip
    x = ("x", F, ["N", 4, "D", "H", "W"])
    outs = [("a", F, ["N", 6, "D2", "H2", "W2"]), ("g", F, ["N", 6, 1, 1, 1]), ("h", F, ["N", 6, 1, 1, 1])]
    m = model(nodes, [x], outs, inits)
    check(m, [dict(N=1, D=3, H=4, W=5), dict(N=2, D=7, H=9, W=16), dict(N=1, D=16, H=5, W=13)], backend=backend)


def test_sequences_unroll():
    """Sequence ops over a sequence whose length the import knows: built, edited, indexed
    and concatenated at known positions, split into known sizes along a dynamic dim."""
    nodes = [
        oh.make_node("SequenceConstruct", ["x", "y"], ["s1"]),
        oh.make_node("SequenceInsert", ["s1", "x", "minus1"], ["s2"]),  # x, x, y
        oh.make_node("SequenceErase", ["s2", "zero"], ["s3"]),  # x, y
        oh.make_node("SequenceInsert", ["s3", "y"], ["s4"]),  # x, y, y
        oh.make_node("SequenceAt", ["s4", "minus1"], ["last"]),
        oh.make_node("ConcatFromSequence", ["s4"], ["cat"], axis=1),
        oh.make_node("ConcatFromSequence", ["s4"], ["stack"], axis=-1, new_axis=1),
        oh.make_node("SequenceLength", ["s4"], ["len"]),
        oh.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
        oh.make_node("SequenceAt", ["parts", "one"], ["second"]),
        oh.make_node("SplitToSequence", ["z"], ["rows"], axis=0, keepdims=0),
        oh.make_node("ConcatFromSequence", ["rows"], ["rowcat"], axis=0),
    ]
    inits = {"minus1": np.int64(-1), "zero": np.int64(0), "one": np.int64(1), "sizes": np.array([1, 2, 3])}
    outs = [("last", F, ["N", 6]), ("cat", F, ["N", 18]), ("stack", F, ["N", 6, 3]), ("len", I64, []),
            ("second", F, ["N", 2]), ("rowcat", F, [12])]  # fmt: skip
    m = model(nodes, [("x", F, ["N", 6]), ("y", F, ["N", 6]), ("z", F, [3, 4])], outs, inits)
    check(m, [dict(N=1), dict(N=5), dict(N=16)], backend="cpu")


def test_sequence_refusals_are_clear():
    nodes = [oh.make_node("SplitToSequence", ["x"], ["s"], axis=1), oh.make_node("SequenceAt", ["s", "zero"], ["y"])]
    m = model(nodes, [X], [("y", F, ["N", 1])], {"zero": np.int64(0)})
    with pytest.raises(UnsupportedOpsError, match=r"SplitToSequence of dim 1 \(S, dynamic\)"):
        symfuse.compile(m)
    nodes = [oh.make_node("SequenceConstruct", ["x"], ["s"]), oh.make_node("SequenceAt", ["s", "five"], ["y"])]
    m = model(nodes, [X], [Y], {"five": np.int64(5)})
    with pytest.raises(UnsupportedOpsError, match=r"SequenceAt at position 5 of a sequence of 1 tensor"):
        symfuse.compile(m)


def test_ir_version_3_initializers_and_opset_6_channel_slopes():
    """Exporters of IR version 3 left initializers out of the graph inputs, and opset 6's
    PRelu applied a 1-D slope along the channels: both as ONNX Runtime reads them."""
    rng = np.random.default_rng(1)
    slope = rng.standard_normal(3).astype(np.float32)
    g = oh.make_graph(
        [oh.make_node("Add", ["x", "bias"], ["t"]), oh.make_node("PRelu", ["t", "slope"], ["y"])], "old",
        [oh.make_tensor_value_info("x", F, [2, 3, 4, 5])], [oh.make_tensor_value_info("y", F, [2, 3, 4, 5])],
        [numpy_helper.from_array(np.float32(0.5).reshape(1), "bias"), numpy_helper.from_array(slope, "slope")],
    )  # fmt: skip
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 6)])
    m.ir_version = 3
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    got = symfuse.compile(m)(torch.from_numpy(x))[0].numpy()
    t = x + 0.5
    np.testing.assert_allclose(got, np.where(t > 0, t, t * slope.reshape(3, 1, 1)), rtol=1e-6)
