"""Shared assertions on BERT's fusion plan (used by the unit and the model tiers)."""

import re
from collections import defaultdict

from symfuse.fusion.plan import plan
from symfuse.te.analysis import analyse
from symfuse.te.lower import lower


def kernels_per_layer(compiled):
    prog = lower(compiled.graph)
    fp = plan(prog, analyse(prog), compiled.store)
    nodes = {v.name: n for n in compiled.graph.nodes for v in n.outputs}

    def layer(member: str) -> int | None:
        base = member if member in nodes else re.sub(r"_(max|sum|mean|var)$", "", member)
        m = re.search(r"encoder\.layer\.(\d+)\.", nodes[base].loc) if base in nodes else None
        return int(m.group(1)) if m else None

    per: dict[int, list] = defaultdict(list)
    for k in fp.kernels:
        layers = {layer(m) for m in k.members} - {None}
        assert len(layers) <= 1, f"{k} spans layers {layers}"
        if layers:
            per[layers.pop()].append(k)
    return fp, nodes, per


def assert_bert_layers(compiled, n_layers: int) -> None:
    fp, nodes, per = kernels_per_layer(compiled)
    assert sorted(per) == list(range(n_layers))
    layout = {"reshape", "permute", "expand", "slice", "select"}
    for i, ks in per.items():
        assert len(ks) == 9, f"layer {i}: {[str(k) for k in ks]}"
        norms = [k for k in ks if any(nodes.get(m) is not None and nodes[m].op == "layer_norm" for m in k.members)]
        assert len(norms) == 2 and all(k.kind == "reduction" for k in norms)
        for k in norms:  # residual add + statistics + normalisation: one kernel
            assert [nodes[m].op for m in k.members if m in nodes] == ["add", "layer_norm"]
            assert {m.rsplit("_", 1)[1] for m in k.members if m not in nodes} == {"mean", "var"}
        (soft,) = [k for k in ks if any(m.endswith("_probs") for m in k.members)]
        assert [m.rsplit("_", 1)[1] for m in soft.members] == ["scaled", "masked", "max", "exp", "sum", "probs"]
        (ffn,) = [k for k in ks if k.kind == "gemm+epilogue"]
        assert [nodes[m].op for m in ffn.members] == ["linear", "gelu"]  # bias is inside the linear's TE
        # Q, K and V merged horizontally into one GEMM; then scores, context, output, FFN down
        assert sum(k.kind == "gemm" for k in ks) == 5
        qkv = ks[0]
        assert (
            qkv.kind == "gemm"
            and nodes[qkv.members[0]].inputs[1].type.shape[0] == 3 * nodes[qkv.members[0]].inputs[0].type.shape[-1]
        )
        assert not any(nodes.get(m) is not None and nodes[m].op in layout for k in ks for m in k.members)


def assert_bert_execution(compiled, n_layers: int) -> None:
    """The plan runs as planned: each fused kernel in generated C++, GELU fused into the FFN
    GEMM, no copies for layouts, no step left to torch; per layer the scores GEMM, the
    softmax and the context GEMM merged into one attention step."""
    from symfuse.schedule.attention import AttentionStep
    from symfuse.schedule.steps import GemmStep, NativeStep, OpaqueStep

    be = compiled.native
    assert be is not None, "compiled on the CPU backend"
    _, nodes, per = kernels_per_layer(compiled)
    steps = {s.name: s for s in be.schedule.steps}
    parts = {
        p.name: s for s in steps.values() if isinstance(s, AttentionStep) for p in (s.scores, s.softmax, s.context)
    }
    assert len(steps) == len(be.plan.kernels) - 2 * n_layers, "three kernels a layer merged into one, no copies"
    assert not any(s.kind == "copy" for s in steps.values() if isinstance(s, NativeStep))
    assert not [s.name for s in steps.values() if isinstance(s, OpaqueStep)]
    for i, ks in per.items():
        assert len(ks) == 9
        attention = {parts[k.name].name for k in ks if k.name in parts}
        assert len(attention) == 1 and sum(k.name in parts for k in ks) == 3, f"layer {i}"
        (att,) = attention
        assert att in be.kernels, "the merged attention kernel is generated C++"
        assert steps[att].library is not None, "BERT's row kernel is attention's own form: the library may run it"
        for k in ks:
            st = steps.get(k.name) or parts[k.name]
            if k.kind in ("reduction", "loop"):
                assert st.name in be.kernels, f"layer {i}: {k} has no C++"
            elif k.name not in parts:
                assert isinstance(steps[k.name], GemmStep), f"layer {i}: {k}"
        (ffn,) = [steps[k.name] for k in ks if k.kind == "gemm+epilogue"]
        assert ffn.postop == ("gelu", "none") and ffn.epilogue is None
        assert sum(isinstance(steps.get(k.name), NativeStep) for k in ks) == 2  # the two layer norms


def assert_explain_per_layer(text: str, n_layers: int) -> None:
    """`explain`'s per-layer summary of a BERT: 9 kernels, layer norms and softmax one kernel
    each, GELU fused into the FFN GEMM, no kernel for a layout op."""
    layers = [line for line in text.splitlines() if line.startswith("  encoder.layer.")]
    assert len(layers) == n_layers
    for line in layers:
        assert ": 9 kernels (run as 7 steps: attention merged): " in line, line
        assert line.count("reduction add+layer_norm") == 2 and line.count("reduction mul+where+safe_softmax") == 1
        assert line.count("gemm+epilogue linear+gelu (gelu fused into the GEMM)") == 1
        assert line.count("gemm linear") == 3 and line.count("gemm matmul") == 2
        assert not any(op in line for op in ("reshape", "permute", "transpose", "expand", "slice", "select"))
