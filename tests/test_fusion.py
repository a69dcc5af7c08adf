"""Fusion plans decided from shape relations: BERT's per-layer kernels, and the log."""

import symfuse
from symfuse.models import load
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
