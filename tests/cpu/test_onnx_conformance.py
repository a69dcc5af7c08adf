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
    "has no shape",  # sequences, optionals
    "must be in [1, inf]",  # empty tensors
)

# Mapped ops none of whose node cases symfuse runs, and why.
NO_CASE_RUNS = {
    "ReduceProd": "folded on values known at compile time only",
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
