"""Fusion plans decided from shape relations: BERT's per-layer kernels, and the log."""

import torch

import symfuse
from symfuse.fusion.plan import plan
from symfuse.models import load
from symfuse.te.analysis import analyse, loads_through
from symfuse.te.lower import lower
from tests.conftest import rel_err
from tests.support.fusion_checks import assert_bert_execution, assert_bert_layers, kernels_per_layer


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


def test_t5s_position_bias_is_computed_once_and_every_attention_merges(tmp_path):
    """An exported T5 encoder recomputes its position bias (buckets through a logarithm, a
    gather from the bias table, the padding mask) in every layer: the copies are merged into
    one value, which a kernel of its own computes once before the first layer's scores; every
    layer's attention stays one merged kernel that reads it."""
    from symfuse.models import t5_encoder
    from symfuse.schedule.attention import AttentionStep
    from symfuse.schedule.steps import NativeStep

    case = t5_encoder(layers=3, hidden=64, heads=2, ffn=128, name="t5-tiny")
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, cache_dir=str(tmp_path))
    sched = c.native.schedule
    table = next(v.name for v in c.graph.constants if "relative_attention_bias" in v.name)
    readers = [
        s
        for s in sched.steps
        if isinstance(s, NativeStep)
        and table in {ld.tensor for m in s.members for ld in loads_through(m.body, s.inline)}
    ]
    assert [s.name.endswith("_apart") for s in readers] == [True]
    attention = [s for s in sched.steps if isinstance(s, AttentionStep)]
    assert len(attention) == 3 and all(s.name in c.native.kernels for s in attention)
    count = symfuse.compile_count()
    for b, s in [(1, 1), (2, 7), (1, 16), (2, 33)]:
        inputs = case.inputs(B=b, S=s)
        with torch.no_grad():
            assert rel_err(c(**inputs), case.model(**inputs)) < 1e-4, (b, s)
    assert symfuse.compile_count() == count
