"""Fusion plans decided from shape relations: BERT's per-layer kernels, and the log."""

import torch

import symfuse
from symfuse.fusion.plan import plan
from symfuse.models import load
from symfuse.te.analysis import analyse, loads_through
from symfuse.te.lower import lower
from tests.conftest import rel_err
from tests.fusion_checks import assert_bert_execution, assert_bert_layers, kernels_per_layer


def test_bert_small_layer_kernels_and_refusal_log():
    case = load("bert-small")
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
    assert_bert_layers(c, 4)
    assert_bert_execution(c, 4)
    fp, _, _ = kernels_per_layer(c)
    reasons = {d.reason for d in fp.refused()}
    assert "a library GEMM takes its operands from memory (no prologue fusion)" in reasons
    assert "its value flows into a reduction: it joins that kernel instead" in reasons
    assert "GEMM epilogue" in {d.reason for d in fp.log if d.fused}
    text = c.explain(with_graph=False)
    assert "fusion plan (" in text and "refused fusions (" in text


class Positions(torch.nn.Module):
    """Positions as an arange plus an offset, as transformers builds them, used as gather
    indices and compared into a causal mask: element-wise TEs that read only generators."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 8)

    def forward(self, x):
        pos = torch.arange(x.shape[1]) + 3
        causal = pos[None, :] <= pos[:, None]
        masked = torch.where(causal, x[:, None, :], 0.0)
        return self.emb(pos) + x[..., None], masked.sum(-1), pos * 2


def test_generators_of_generators_are_computed_where_they_are_read():
    """`arange + 3` and the causal compare over it get no kernel of their own (they were one
    kernel each, their values stored and read back); `pos * 2`, an output, still has one."""
    torch.manual_seed(0)
    m = Positions().eval()
    x = torch.randn(2, 9)
    c = symfuse.compile(m, (x,), {"x": {0: "B", 1: "S"}})
    prog = lower(c.graph)
    fp = plan(prog, analyse(prog), c.store)
    ops = {v.name: n.op for n in c.graph.nodes for v in n.outputs}
    inlined = {ops.get(t) for t in fp.inlined}
    assert {"arange", "add", "le"} <= inlined, fp.inlined
    items = {t.name: t for t in prog.items}
    inline = {t: items[t] for t in fp.inlined}
    for k in fp.kernels:  # no kernel computes from positions alone
        assert any(any(True for _ in loads_through(items[t].body, inline)) for t in k.members), str(k)
    count = symfuse.compile_count()
    for b, s in [(1, 1), (2, 7), (3, 16), (1, 31)]:
        xs = torch.randn(b, s)
        assert rel_err(c(xs), m(xs)) < 1e-5, (b, s)
    assert symfuse.compile_count() == count
