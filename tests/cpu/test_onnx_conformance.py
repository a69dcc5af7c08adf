"""onnx's own backend node tests (`onnx.backend.test`: each op's reference cases, from the
installed onnx) through symfuse's ONNX import and native code. A case whose ops symfuse
maps either matches the reference output or is refused with symfuse's clear error naming
what it does not support; never a wrong answer, a crash or a failed build. Every mapped op
passes at least one of its cases."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch

import symfuse
from symfuse.errors import UnsupportedOpsError
from symfuse.frontend.onnx_table import FOLD, ONNX_OPS, to_torch

onnx = pytest.importorskip("onnx")
node_cases = pytest.importorskip("onnx.backend.test.case.node")

# What symfuse refuses by design, with the clear error it gives (checked by its text).
REFUSED = (
    "is not supported by symfuse",  # element types: uint16-64, float8, int4, bfloat16 inputs, strings
    "must be known when the model is compiled",  # axes, shapes, pads given as run-time inputs
    "symfuse takes tensor inputs",  # sequences, optionals as graph inputs
    "must be in [1, inf]",  # empty tensors
)

# Mapped ops none of whose node cases symfuse runs, and why.
NO_CASE_RUNS = {
    "ReduceProd": "folded on values known at compile time only",
    "SequenceInsert": "its cases take a sequence as a graph input",
    "SplitToSequence": "its cases return a sequence, or split by sizes given as input data",
}


def _array(x):
    if isinstance(x, onnx.TensorProto):
        x = onnx.numpy_helper.to_array(x)
    return np.asarray(x)


def _cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy warns while making some cases' expected values
        cases = node_cases.collect_testcases(None)
    mapped = set(ONNX_OPS) | set(FOLD)
    return [c for c in cases if {n.op_type for n in c.model.graph.node} <= mapped and c.data_sets]


def _baked(model, inputs):
    """The model with every input after the first made an initializer of its test value:
    what a compiler's harness does with axes, shapes and pads the case feeds at run time."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    graph_inputs = list(m.graph.input)
    del m.graph.input[1:]
    for vi, x in zip(graph_inputs[1:], inputs[1:]):
        m.graph.initializer.append(onnx.numpy_helper.from_array(_array(x), vi.name))
    return m


def _run(case) -> str:
    """'pass', or the refusal's text; raises on a wrong answer or any other error."""
    model, baked = case.model, False
    try:
        compiled = symfuse.compile(model)
    except UnsupportedOpsError as e:
        if "must be known when the model is compiled" not in str(e) or len(case.data_sets) != 1:
            return str(e)
        model, baked = _baked(model, case.data_sets[0][0]), True
        try:
            compiled = symfuse.compile(model)
        except UnsupportedOpsError as e:
            return str(e)
    except (ValueError, TypeError) as e:
        if not any(r in str(e) for r in REFUSED):
            raise
        return str(e)
    for inputs, outputs in case.data_sets:
        tensors = []
        for x in inputs[:1] if baked else inputs:
            a = _array(x)
            if a.dtype == object:
                return "strings are not supported by symfuse"
            tensors.append(to_torch(a))
        try:
            got = compiled(*tensors)
        except ValueError as e:
            if not any(r in str(e) for r in REFUSED):
                raise
            return str(e)
        assert len(got) == len(outputs)
        for g, want in zip(got, outputs):
            want = _array(want)
            rtol, atol = max(case.rtol, 1e-4), case.atol
            if want.dtype.name == "bfloat16":
                # onnx's reference rounds every op's result to bfloat16, symfuse a fused chain
                # only at its end: two of its ulps, or four of the output's largest value
                assert g.dtype == torch.bfloat16, (case.name, g.dtype)
                want, g = want.astype(np.float32), g.float()
                rtol, atol = max(case.rtol, 8e-3), max(case.atol, 1.6e-2 * float(np.abs(want).max(initial=0)))
            g = g.numpy()
            assert g.shape == want.shape, (case.name, g.shape, want.shape)
            assert g.dtype == want.dtype, (case.name, g.dtype, want.dtype)
            if want.dtype.kind != "f":
                rtol, atol = 0, 0
            np.testing.assert_allclose(
                g.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=max(atol, rtol * 1e-1),
                equal_nan=True, err_msg=case.name,
            )  # fmt: skip
    return "pass"


def test_onnx_node_cases():
    results = {}
    failures = []
    for case in _cases():
        try:
            results[case.name] = (_run(case), {n.op_type for n in case.model.graph.node})
        except Exception as e:  # noqa: BLE001  (collected: every failing case is listed at once)
            failures.append(f"{case.name}: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
    assert not failures, f"{len(failures)} onnx node case(s) wrong or crashed:\n" + "\n".join(failures)
    passed = collections.Counter(op for how, ops in results.values() if how == "pass" for op in ops)
    tried = {op for _, ops in results.values() for op in ops}
    never = sorted(tried - set(passed) - set(NO_CASE_RUNS))
    assert not never, f"mapped ops that pass none of their onnx node cases: {never}"
    assert passed, "no onnx node case ran"


def test_onnx_model_collections():
    """The model collections the onnx package ships (PyTorch modules and operators as older
    and newer exporters wrote them, opsets 6 to 12, IR versions 3 and up, and hand-made
    models): no wrong answer and no crash; every model ONNX Runtime runs, symfuse runs too,
    but what it refuses by design, with its clear error: shapes given as input data (naming
    the input), strings, empty tensors."""
    by_design = ("from the values of", "StringNormalizer", "must be in [1, inf]")
    from tests.support.onnx_collection import cases, data_sets, run_onnxruntime, run_symfuse

    bad, missed = [], []
    for name, path in cases():
        sets = data_sets(path.rsplit("/", 1)[0])
        got = run_symfuse(path, sets)
        if got == "wrong" or got.startswith("error"):
            bad.append(f"{name}: {got}")
        elif got != "pass" and run_onnxruntime(path, sets) == "pass" and not any(r in got for r in by_design):
            missed.append(f"{name}: {got}")
    assert not bad, "wrong answers or crashes:\n" + "\n".join(bad)
    assert not missed, "models onnxruntime runs and symfuse refuses:\n" + "\n".join(missed)
