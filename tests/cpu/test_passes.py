"""Every rewrite keeps semantics: the reference executor agrees before and after, at
several bindings, and the rewritten graph verifies."""

import math

import pytest
import torch

from symfuse.ir.dims import evaluate, sym
from symfuse.ir.dtypes import DType
from symfuse.ir.verify import verify
from symfuse.passes import decompose_attention
from symfuse.reference import ReferenceExecutor
from symfuse.shape.infer import GraphBuilder, reinfer

B, S = sym("B"), sym("S")


def attention_graph(mask: str, causal: bool):
    b = GraphBuilder("attn")
    b.store.declare("B")
    b.store.declare("S")
    q = b.input("q", (B, 3, S, 8), DType.float32)
    k = b.input("k", (B, 3, S, 8), DType.float32)
    v = b.input("v", (B, 3, S, 5), DType.float32)
    ins = [q, k, v, None]
    if mask == "bool":
        ins[3] = b.input("mask", (B, 1, S, S), DType.bool)
    elif mask == "float":
        ins[3] = b.input("mask", (1, 3, S, S), DType.float32)
    (out,) = b.add("sdpa", ins, {"is_causal": causal, "scale": None})
    return b.finish([out]), b.store


@pytest.mark.parametrize("mask,causal", [("none", False), ("bool", False), ("float", False), ("none", True)])
def test_decompose_attention_keeps_semantics(mask, causal):
    g, store = attention_graph(mask, causal)
    g2 = decompose_attention(g, store)
    verify(g2)
    assert reinfer(g2, store) == []
    assert "sdpa" not in {n.op for n in g2.nodes}
    scores = [n.out for n in g2.nodes if n.out.name.endswith("_scores")]
    assert [str(v.type) for v in scores] == ["f32[B, 3, S, S]"]
    before, after = ReferenceExecutor(g), ReferenceExecutor(g2)
    gen = torch.Generator().manual_seed(0)
    for binding in [dict(B=1, S=1), dict(B=2, S=7), dict(B=1, S=16)]:
        tensors = []
        for v in g.inputs:
            shape = [evaluate(d, binding) for d in v.type.shape]
            if v.type.dtype == DType.bool:
                t = torch.rand(shape, generator=gen) > 0.3
                t[..., 0] = True  # no fully masked row (torch gives NaN there)
            else:
                t = torch.randn(shape, generator=gen)
            tensors.append(t)
        (want,), (got,) = before.run(binding, tensors), after.run(binding, tensors)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (binding, (got - want).abs().max())


def test_mask_and_causal_together_is_refused():
    from symfuse.shape.store import ShapeError

    with pytest.raises(ShapeError, match="a mask or is_causal, not both"):
        attention_graph("bool", True)


def test_merge_parallel_linears_keeps_semantics():
    from symfuse.passes import merge_parallel_linears

    b = GraphBuilder("qkv")
    b.store.declare("B")
    b.store.declare("S")
    x = b.input("x", (B, S, 8), DType.float32)
    gen = torch.Generator().manual_seed(0)
    outs = []
    for i, n in enumerate((8, 8, 4)):
        w = b.constant(f"w{i}", torch.randn(n, 8, generator=gen))
        bias = b.constant(f"b{i}", torch.randn(n, generator=gen))
        outs.append(b.add("linear", [x, w, bias])[0])
    (other,) = b.add("linear", [outs[0], b.constant("w3", torch.randn(8, 8, generator=gen)), None])
    g = b.finish(outs + [other])
    g2 = merge_parallel_linears(g, b.store)
    verify(g2)
    assert reinfer(g2, b.store) == []
    linears = [n for n in g2.nodes if n.op == "linear"]
    assert [str(n.out.type) for n in linears] == ["f32[B, S, 20]", "f32[B, S, 8]"]  # merged, and the dependent one
    assert sorted(v.name for v in g2.constants) == ["b0_merged", "w0_merged", "w3"]  # originals pruned
    before, after = ReferenceExecutor(g), ReferenceExecutor(g2)
    for binding in [dict(B=1, S=1), dict(B=3, S=7)]:
        t = torch.randn(binding["B"], binding["S"], 8, generator=gen)
        for want, got in zip(before.run(binding, [t]), after.run(binding, [t])):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_common_subexpressions_are_computed_once():
    """The same op on the same inputs with the same attributes is one node (each layer of an
    exported T5 recomputes its position bias); other attributes and other inputs are not
    merged, nor a repeat the model returns (two results eager gives as two tensors)."""
    from symfuse.passes import merge_common_subexpressions

    b = GraphBuilder("cse")
    b.store.declare("S")
    x = b.input("x", (S, 8), DType.float32)
    y = b.input("y", (S, 8), DType.float32)
    (e1,) = b.add("exp", [x])
    (e2,) = b.add("exp", [x])  # the same: merged
    (e3,) = b.add("exp", [y])  # another input
    (s1,) = b.add("sum", [e1], {"dims": (1,), "keepdim": True, "dtype": None})
    (s2,) = b.add("sum", [e2], {"dims": (1,), "keepdim": True, "dtype": None})  # merged, once its input is
    (s3,) = b.add("sum", [e2], {"dims": (1,), "keepdim": False, "dtype": None})  # another attribute
    (a1,) = b.add("add", [e1, s1])
    (a2,) = b.add("add", [e2, s2])  # the same value, but returned as well as a1: kept
    (a3,) = b.add("add", [e2, s2])  # the same again, read inside only: merged
    (m,) = b.add("mul", [a3, a3])
    g = b.finish([a1, a2, e3, s3, m])
    g2 = merge_common_subexpressions(g, b.store)
    verify(g2)
    assert reinfer(g2, b.store) == []
    assert sorted(n.op for n in g2.nodes) == ["add", "add", "exp", "exp", "mul", "sum", "sum"]
    assert g2.outputs[0] is not g2.outputs[1]
    before, after = ReferenceExecutor(g), ReferenceExecutor(g2)
    gen = torch.Generator().manual_seed(0)
    for n in (1, 5, 16):
        ins = [torch.randn(n, 8, generator=gen), torch.randn(n, 8, generator=gen)]
        for want, got in zip(before.run(dict(S=n), ins), after.run(dict(S=n), ins)):
            assert want.shape == got.shape and torch.allclose(got, want, rtol=1e-6)


def test_canonical_linears_keeps_semantics():
    """GPT-2's Conv1D: matmul by a constant [K, N] plus a constant bias becomes one linear;
    a matmul whose output is also read elsewhere keeps its add."""
    from symfuse.passes import canonical_linears

    b = GraphBuilder("conv1d")
    b.store.declare("B")
    b.store.declare("S")
    x = b.input("x", (B, S, 8), DType.float32)
    gen = torch.Generator().manual_seed(0)
    (m,) = b.add("matmul", [x, b.constant("w", torch.randn(8, 6, generator=gen))])
    (y,) = b.add("add", [b.constant("bias", torch.randn(6, generator=gen)), m])
    (m2,) = b.add("matmul", [y, b.constant("w2", torch.randn(6, 4, generator=gen))])
    (y2,) = b.add("add", [m2, b.constant("bias2", torch.randn(4, generator=gen))])
    g = b.finish([y2, m2])
    g2 = canonical_linears(g, b.store)
    verify(g2)
    assert reinfer(g2, b.store) == []
    assert [n.op for n in g2.nodes] == ["linear", "linear", "add"]
    assert g2.nodes[0].inputs[2] is not None and g2.nodes[1].inputs[2] is None
    before, after = ReferenceExecutor(g), ReferenceExecutor(g2)
    for binding in [dict(B=1, S=1), dict(B=2, S=7), dict(B=1, S=16)]:
        t = torch.randn(binding["B"], binding["S"], 8, generator=gen)
        for want, got in zip(before.run(binding, [t]), after.run(binding, [t])):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fold_batch_norm_keeps_semantics():
    from symfuse.passes import fold_batch_norm

    b = GraphBuilder("convbn")
    b.store.declare("B")
    H = b.store.declare("H")
    x = b.input("x", (B, 3, H, H), DType.float32)
    gen = torch.Generator().manual_seed(0)
    c = lambda name, *shape: b.constant(name, torch.randn(*shape, generator=gen))  # noqa: E731
    attrs = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 1}
    (y,) = b.add("conv2d", [x, c("w", 4, 3, 3, 3), None], attrs)
    var = b.constant("var", torch.rand(4, generator=gen) + 0.5)
    (z,) = b.add("batch_norm", [y, c("g", 4), c("beta", 4), c("mean", 4), var], {"eps": 1e-5})
    g = b.finish([z])
    g2 = fold_batch_norm(g, b.store)
    verify(g2)
    assert [n.op for n in g2.nodes] == ["conv2d"] and g2.nodes[0].inputs[2] is not None
    before, after = ReferenceExecutor(g), ReferenceExecutor(g2)
    for binding in [dict(B=1, H=1), dict(B=2, H=7), dict(B=1, H=16)]:
        t = torch.randn(binding["B"], 3, binding["H"], binding["H"], generator=gen)
        (want,), (got,) = before.run(binding, [t]), after.run(binding, [t])
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def _agree(g, g2, store, make_inputs, bindings):
    verify(g2)
    assert reinfer(g2, store) == []
    before, after = ReferenceExecutor(g), ReferenceExecutor(g2)
    for binding in bindings:
        tensors = make_inputs(binding)
        for want, got in zip(before.run(binding, tensors), after.run(binding, tensors)):
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (binding, (got - want).abs().max())


def test_hoist_scales_moves_scalar_factors_past_the_matmul():
    """ONNX's attention: (q * c) @ (k^T * c) becomes (q @ k^T) * c^2; a scaled operand that
    is read elsewhere too keeps its multiply."""
    from symfuse.passes.algebra import hoist_scales

    b = GraphBuilder("scaled")
    b.store.declare("B")
    b.store.declare("S")
    q = b.input("q", (B, S, 8), DType.float32)
    k = b.input("k", (B, 8, S), DType.float32)
    c = b.scalar(0.5, DType.float32)
    (qs,) = b.add("mul", [q, c])
    (ks,) = b.add("mul", [c, k])
    (s,) = b.add("matmul", [qs, ks])
    (q2,) = b.add("mul", [q, b.scalar(3.0, DType.float32)])
    (s2,) = b.add("matmul", [q2, k])
    g = b.finish([s, s2, q2])
    g2 = hoist_scales(g, b.store)
    ops = [n.op for n in g2.nodes if n.op != "full"]
    assert ops == ["matmul", "mul", "mul", "matmul"], ops  # q2 is an output: its mul stays
    gen = torch.Generator().manual_seed(1)

    def make(bd):
        return [torch.randn(bd["B"], bd["S"], 8, generator=gen), torch.randn(bd["B"], 8, bd["S"], generator=gen)]

    _agree(g, g2, b.store, make, [dict(B=1, S=1), dict(B=2, S=7), dict(B=1, S=16)])


def test_fold_layout_chains_makes_one_permute():
    """[B, H, S, D] -> [B*H, S, D] -> [B*H, D, S] -> [B, H, D, S] is permute (0, 1, 3, 2); a
    reshape that splits dims differently is left alone."""
    from symfuse.passes.algebra import fold_layout_chains

    b = GraphBuilder("chain")
    b.store.declare("B")
    b.store.declare("S")
    x = b.input("x", (B, 3, S, 4), DType.float32)
    (r,) = b.add("reshape", [x], {"shape": (B * 3, S, 4)})
    (p,) = b.add("permute", [r], {"dims": (0, 2, 1)})
    (y,) = b.add("reshape", [p], {"shape": (B, 3, 4, S)})
    (r2,) = b.add("reshape", [x], {"shape": (B * 3, S, 4)})
    (p2,) = b.add("permute", [r2], {"dims": (0, 2, 1)})
    (z,) = b.add("reshape", [p2], {"shape": (B, 6, 2, S)})  # splits 4 into 2 x 2 across H: not a permute
    g = b.finish([y, z])
    g2 = fold_layout_chains(g, b.store)
    assert [n.op for n in g2.nodes] == ["permute", "reshape", "permute", "reshape"]
    assert g2.nodes[0].attrs["dims"] == (0, 1, 3, 2)
    gen = torch.Generator().manual_seed(2)
    _agree(g, g2, b.store, lambda bd: [torch.randn(bd["B"], 3, bd["S"], 4, generator=gen)],
           [dict(B=1, S=1), dict(B=2, S=7), dict(B=3, S=16)])  # fmt: skip


class _GeluNew(torch.nn.Module):
    """GPT-2's MLP: a GEMM on [B*S, K] viewed as [B, S, N], then gelu_new written out; and
    the same chain with another constant (0.044 in place of 0.044715), which is not GELU."""

    def __init__(self, c=0.044715):
        super().__init__()
        self.w, self.b, self.c = torch.nn.Parameter(torch.randn(8, 24) * 0.3), torch.nn.Parameter(torch.randn(24)), c

    def forward(self, x):
        h = torch.addmm(self.b, x.view(-1, 8), self.w).view(x.shape[0], x.shape[1], 24)
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + self.c * torch.pow(h, 3.0))))


@pytest.mark.parametrize("c", [0.044715, 0.044])
def test_gelu_new_written_out_is_one_gelu_fused_into_its_gemm(c, tmp_path):
    """The written-out tanh GELU becomes gelu(approximate="tanh"), which the GEMM before it
    applies as its epilogue although a reshape stands between them; a chain with another
    constant is left as it is. Both agree with eager at every shape."""
    import symfuse
    from symfuse.schedule.steps import GemmStep

    model = _GeluNew(c).eval()
    x = torch.randn(2, 5, 8)
    dyn = {"x": {0: torch.export.Dim("B"), 1: torch.export.Dim("S")}}
    m = symfuse.compile(model, (x,), dyn, cache_dir=str(tmp_path))
    ops = [n.op for n in m.graph.nodes]
    (gemm,) = [s for s in m.native.schedule.steps if isinstance(s, GemmStep)]
    if c == 0.044715:
        assert "tanh" not in ops and ops.count("gelu") == 1
        assert gemm.postop == ("gelu", "tanh"), "GELU is the GEMM's epilogue"
    else:
        assert "tanh" in ops and "gelu" not in ops and gemm.postop is None
    gen = torch.Generator().manual_seed(3)
    for shape in [(1, 1), (2, 7), (3, 16), (1, 13)]:
        x = torch.randn(*shape, 8, generator=gen) * 3
        with torch.no_grad():
            want = model(x)
        assert (m(x) - want).abs().max() <= 1e-4 * want.abs().max(), shape
