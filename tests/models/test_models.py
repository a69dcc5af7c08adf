"""End to end on the built-in models: capture once, run many shapes, compare with eager.

Also asserts the shape facts the constraint store must find in BERT and GPT-2.
"""

import pytest
import torch

import symfuse
from symfuse.ir.dims import sym
from symfuse.ir.tri import Tri
from symfuse.models import load
from symfuse.shape.infer import reinfer
from tests.conftest import rel_err

pytestmark = pytest.mark.models

_cache: dict = {}


def compiled(name):
    if name not in _cache:
        case = load(name)
        before = symfuse.compile_count()
        c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
        assert symfuse.compile_count() == before + 1
        _cache[name] = (case, c)
    return _cache[name]


@pytest.mark.parametrize("name", ["bert-base", "gpt2", "vit-base", "t5-encoder-small", "resnet", "lstm"])
def test_compile_once_run_every_binding(name):
    case, c = compiled(name)
    assert reinfer(c.graph, c.store) == []
    values = {v for b in case.sweep for v in b.values()}
    assert 1 in values and any(v % 16 == 0 for v in values) and any(v in (2, 3, 5, 7, 13, 31, 97) for v in values)
    assert len(case.sweep) >= 8
    count = symfuse.compile_count()
    for binding in case.sweep:
        inputs = case.inputs(**binding)
        with torch.no_grad():
            ref = case.model(**inputs)
        err = rel_err(c(**inputs), ref)
        assert err < 1e-4, f"{name} at {binding}: relative error {err:.2e}"
    assert symfuse.compile_count() == count, "a new binding must never recompile"


def _values(c, op):
    return [n for n in c.graph.nodes if n.op == op]


def test_bert_hidden_states_share_one_shape_class():
    _, c = compiled("bert-base")
    st = c.store
    B, S = sym("B"), sym("S")
    hidden = [n.out for n in c.graph.nodes if n.op in ("layer_norm", "add") and n.out.type.rank == 3]
    hidden += [n.out for n in _values(c, "linear") if n.out.type.shape[-1] == 768 and n.out.type.rank == 3]
    assert len(hidden) >= 12 * 6  # per layer: 2 layer norms, 2 residual adds, 2 projections back to 768
    for v in hidden:
        assert st.same_shape(v.type, (B, S, 768)) is Tri.YES, f"%{v.name}: {v.type}"
        assert str(v.type) == "f32[B, S, 768]"


def test_bert_head_reshapes_keep_the_element_count():
    _, c = compiled("bert-base")
    heads = [n for n in _values(c, "reshape") if n.out.type.rank == 4 and n.out.type.dtype.is_float]
    assert len(heads) >= 12 * 3
    for n in heads:
        assert c.store.same_numel(n.inputs[0].type, n.out.type) is Tri.YES
        assert str(n.out.type) in ("f32[B, S, 12, 64]", "f32[B, 12, S, 64]")
    splits = [n for n in heads if str(n.out.type) == "f32[B, S, 12, 64]"]
    assert len(splits) == 12 * 3  # Q, K and V of every layer


def test_bert_attention_scores_use_one_symbol_for_both_sequence_dims():
    _, c = compiled("bert-base")
    scores = [n.out for n in _values(c, "matmul") if n.out.name.endswith("_scores")]
    assert len(scores) == 12
    for v in scores:
        b, h, q, k = v.type.shape
        assert (b, h, q, k) == (sym("B"), 12, sym("S"), sym("S"))
        assert c.store.dims_equal(q, k) is Tri.YES


def test_bert_sequence_is_bounded_by_the_position_table():
    case, c = compiled("bert-base")
    assert c.store.range(sym("S")) == (1, 512)
    with pytest.raises(ValueError, match=r"input 'input_ids' dim 1 is 513, but 'S' must be in \[1, 512\]"):
        c(**case.inputs(B=1, S=513))


def test_gpt2_causal_mask_is_tied_to_the_sequence():
    case, c = compiled("gpt2")
    S = sym("S")
    masks = [n.inputs[0] for n in _values(c, "where") if n.out.name.endswith("_masked")]
    assert len(masks) == 12 and len(set(masks)) == 1  # one causal mask, shared by all layers
    assert str(masks[0].type) == "bool[B, 1, S, S]"
    mask_slices = [n for n in _values(c, "slice") if n.out.type.dtype.name == "int64"]
    assert mask_slices, "the mask is built from slices of position ranges"
    for n in mask_slices:
        assert all(d in (1, S, sym("B")) for d in n.out.type.shape), str(n.out.type)
    assert c.store.range(S) == (1, 1024)  # position embeddings have 1024 rows
    with pytest.raises(ValueError, match=r"'S' must be in \[1, 1024\]"):
        c(**case.inputs(B=1, S=1025))


def test_bert_base_fusion_plan_per_layer():
    from tests.support.fusion_checks import assert_bert_execution, assert_bert_layers, assert_explain_per_layer

    _, c = compiled("bert-base")
    assert_bert_layers(c, 12)
    assert_bert_execution(c, 12)
    assert_explain_per_layer(c.explain(with_graph=False), 12)


@pytest.mark.parametrize("name", ["bert-base", "gpt2", "t5-encoder-small", "vit-base", "resnet", "lstm"])
def test_bf16_agrees_with_fp32_eager(name):
    """precision="bf16": every output row within cosine 0.999 of fp32 eager over the model's whole
    sweep, compiled once; on a CPU without bf16 instructions it runs fp32 and says so."""
    from symfuse.bench.engines import flat_outputs
    from tests.cpu.test_bf16 import BF16_HERE, cosine_rows

    case = load(name)
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, precision="bf16")
    assert c.native.precision == ("bf16" if BF16_HERE else "fp32")
    count = symfuse.compile_count()
    for binding in case.sweep:
        inputs = case.inputs(**binding)
        with torch.no_grad():
            want, got = flat_outputs(case.model(**inputs)), flat_outputs(c(**inputs))
        assert len(got) == len(want) and any(w.is_floating_point() for w in want)
        for w, o in zip(want, got):
            if w.is_floating_point():
                assert o.dtype == w.dtype and cosine_rows(o, w) > 0.999, f"{name} at {binding}"
    assert symfuse.compile_count() == count
