"""TE lowering: every lowered op and whole models agree with the reference executor."""

import pytest
import torch

from symfuse import ops
from symfuse.reference import ReferenceExecutor
from symfuse.shape.infer import GraphBuilder
from symfuse.te.interp import run_program
from symfuse.te.ir import TE, Opaque
from symfuse.te.lower import lower
from tests.unit.test_ops import BINDINGS, one_op_graph

LOWERED = sorted(name for name, op in ops.REGISTRY.items() if op.lower is not None)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        return torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
    return torch.equal(a, b)


@pytest.mark.parametrize("op", LOWERED)
def test_lowered_op_matches_reference(op):
    g, inputs, _ = one_op_graph(op)
    prog = lower(g)
    assert not any(isinstance(t, Opaque) for t in prog.items)
    ref = ReferenceExecutor(g)
    gen = torch.Generator().manual_seed(3)
    for binding in BINDINGS:
        tensors = inputs(binding, gen)
        if op in ("log", "sqrt", "rsqrt", "pow"):  # keep the reference finite
            tensors = [t.abs() + 0.5 if t.dtype.is_floating_point else t for t in tensors]
        (want,), (got,) = ref.run(binding, tensors), run_program(prog, binding, tensors)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert _close(got, want), f"{op} at {binding}: {(got.double() - want.double()).abs().max()}"


def test_layout_ops_compose_into_loads():
    """reshape -> permute -> slice -> relu is one TE whose load carries the whole index map."""
    from symfuse.ir.dims import sym
    from symfuse.ir.dtypes import DType

    b = GraphBuilder("compose")
    B, S = b.store.declare("B"), b.store.declare("S")
    x = b.input("x", (B, S, 8), DType.float32)
    (r,) = b.add("reshape", [x], {"shape": (B, S, 2, 4)})
    (p,) = b.add("permute", [r], {"dims": (0, 2, 1, 3)})
    (s,) = b.add("slice", [p], {"dim": 3, "start": 1, "end": None, "step": 2})
    (y,) = b.add("relu", [s])
    prog = lower(b.finish([y]))
    (te,) = prog.items
    assert isinstance(te, TE)
    assert (
        str(prog).splitlines()[0]
        == "relu[i0, i1, i2, i3] = relu(x[i0, i2, 4*i1 + 2*i3 + 1])   for i0 < B, i1 < 2, i2 < S, i3 < 2"
    )
    assert sym("S") in te.shape[2].free_symbols


@pytest.mark.parametrize("name", ["bert-small", "resnet"])
def test_models_through_te_interpreter(name):
    import symfuse
    from symfuse.models import load

    case = load(name)
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
    prog = lower(c.graph)
    opaque = {t.op for t in prog.items if isinstance(t, Opaque)}
    assert not opaque  # every op of both models has a TE, pools included
    for binding in case.sweep[:3]:
        inputs = case.inputs(**binding)
        tensors = c._inputs((), inputs)
        bound = c.guard(tensors)
        want = ReferenceExecutor(c.graph).run(bound, tensors)
        got = run_program(prog, bound, tensors)
        for a, w in zip(got, want):
            assert torch.allclose(a, w, rtol=1e-4, atol=1e-4), (binding, (a - w).abs().max())


def test_analysis_classifies_bert():
    import symfuse
    from symfuse.models import load
    from symfuse.te.analysis import GATHER, MANY, ONE, analyse

    case = load("bert-small")
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
    prog = lower(c.graph)
    a = analyse(prog)
    linears = [n.out.name for n in c.graph.nodes if n.op == "linear"]
    assert all(a.kind[name] == "compute-intensive" for name in linears)
    matmuls = [n for n in c.graph.nodes if n.op == "matmul"]  # two per attention layer
    assert sum(k == "compute-intensive" for k in a.kind.values()) == len(linears) + len(matmuls)
    ln = next(n.out.name for n in c.graph.nodes if n.op == "layer_norm")
    assert a.kind[ln] == "memory-intensive"
    assert a.edges[(f"{ln}_mean", ln)] == ONE  # the row statistic is read element by element
    (producer,) = [p for p, q in a.edges if q == f"{ln}_mean"]
    assert a.edges[(producer, f"{ln}_mean")] == MANY  # the statistic needs the whole row
    # the embedding lookup is inlined into the add that reads it, as a gather
    word = {q: r for (p, q), r in a.edges.items() if p == "p_embeddings_word_embeddings_weight"}
    assert list(word.values()) == [GATHER]
    # the merged Q/K/V projection and the residual add both read the normalised rows
    op_of = {v.name: n.op for n in c.graph.nodes for v in n.outputs}
    assert sorted(op_of[r] for r in a.readers[ln]) == ["add", "linear"]
