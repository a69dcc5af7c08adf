"""`explain`: what symfuse knows about a compiled model, in words.

Shows the graph with symbolic shapes, the classes of equal dims and why each member
joined, the classes of equal element counts, the symbols' ranges and divisibility, the
checks made on every call, and how the program runs.
"""

from __future__ import annotations

import math
from collections import Counter

from symfuse.codegen.cpu.attention import late_normalisation
from symfuse.fusion.plan import plan
from symfuse.ir.dims import fmt
from symfuse.ir.graph import Graph, print_graph
from symfuse.options import split_kind
from symfuse.runtime.switches import ROWS
from symfuse.schedule.attention import AttentionStep
from symfuse.schedule.steps import GemmStep, NativeStep, OpaqueStep
from symfuse.shape.store import ShapeStore
from symfuse.te.analysis import analyse
from symfuse.te.ir import Opaque
from symfuse.te.lower import lower


def explain(
    graph: Graph,
    store: ShapeStore,
    *,
    backend: str,
    notes: list[str] = (),
    traced=(),
    with_graph: bool = True,
    with_te: bool = False,
    native=None,
) -> str:
    out = [f"symfuse: {graph.name}", f"  backend: {backend}"]
    out += [f"  note: {n}" for n in notes]
    ops = Counter(n.op for n in graph.nodes)
    out.append(f"  {len(graph.nodes)} ops ({', '.join(f'{k} x{v}' for k, v in ops.most_common())})")
    out.append(f"  {len(graph.constants)} constants, {sum(t.numel() for t in graph.constants.values()):,} elements")

    out.append("\nsymbols:")
    for name, info in store.symbols.items():
        hi = "inf" if math.isinf(info.hi) else int(info.hi)
        why = f"  <- {info.range_origin}" if info.range_origin else ""
        out.append(f"  {name} in [{info.lo}, {hi}] bound by {', '.join(info.bound_at) or '-'}{why}")

    out.append("\nequal dims (class representative: members, and why they joined):")
    classes = store.dim_classes()
    if not classes:
        out.append("  (none beyond identical expressions)")
    for rep, members, origins in classes:
        out.append(f"  {fmt(rep)}: {', '.join(fmt(m) for m in members)}")
        for m, o in zip(members[1:], origins):
            out.append(f"      {fmt(m)} == {fmt(rep)}  <- {o}")

    out.append("\nequal element counts (product class: values):")
    by_class: dict = {}
    for v in graph.values():
        if v in graph.constants:
            continue
        by_class.setdefault(store.numel_class(v.type.shape), []).append(v.name)
    for cls, names in sorted(by_class.items(), key=lambda kv: -len(kv[1])):
        if len(names) > 1 and not cls.is_Integer:
            shown = ", ".join("%" + n for n in names[:8]) + (f", ... ({len(names)} values)" if len(names) > 8 else "")
            out.append(f"  {fmt(cls)}: {shown}")

    checks = store.checks()
    out.append(f"\nchecked on every call ({len(checks)} facts beyond input ranks, dtypes and static dims):")
    for f in checks:
        out.append(f"  {f.text()}  <- {f.origin}")
    if traced:
        out.append(
            f"\ntraced under ({len(traced)} conditions on the input sizes the model's code branched on; "
            "checked on every call too):"
        )
        out += [f"  {c.expr}" for c in traced]
    out += _te_section(graph, store, with_te, native)
    if with_graph:
        out.append("\ngraph:")
        out.append(print_graph(graph, with_constants=False))
    return "\n".join(out)


def _te_section(graph: Graph, store: ShapeStore, with_program: bool, native) -> list[str]:

    prog = native.te if native else lower(graph)
    analysis = analyse(prog)
    out = ["\ntensor expressions (layout ops composed into loads):", "  " + analysis.summary()]
    opaque = Counter(t.op for t in prog.items if isinstance(t, Opaque))
    if opaque:
        out.append("  no TE lowering yet, run through torch: " + ", ".join(f"{k} x{v}" for k, v in opaque.items()))
    if with_program:
        out += ["  " + line for line in str(prog).splitlines()]
    fp = native.plan if native else plan(prog, analysis, store)
    kinds = Counter(k.kind for k in fp.kernels)
    status = "executed as below" if native else "not executed: the reference backend runs op by op"
    out.append(
        f"\nfusion plan ({len(fp.kernels)} kernels: "
        + ", ".join(f"{v} {k}" for k, v in kinds.items())
        + f"; {len(fp.inlined)} generators inlined; {status})"
    )
    out += [f"  {k}" for k in fp.kernels]
    refused = fp.refused()
    out.append(f"refused fusions ({len(refused)}):")
    out += [f"  {d.producer} -> {d.consumer}: {d.reason}" for d in refused]
    out += _blocks_section(graph, fp, native)
    if native is not None and hasattr(native, "explain_lines"):  # the GPU backend describes itself
        out += native.explain_lines()
    elif native:
        out += _steps_section(native)
    return out


def block_of(loc: str) -> str | None:
    """The repeated block a node belongs to, from its module path: `encoder.layer.3`."""
    path = loc.split(" ")[0] if loc else ""
    parts = path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return None


def _blocks_section(graph: Graph, fp, native) -> list[str]:
    """Kernels per repeated block (a transformer layer): what each one computes and how it runs."""

    nodes = {v.name: n for n in graph.nodes for v in n.outputs}
    steps = {s.name: s for s in native.schedule.steps} if native else {}
    merged_into = {
        p.name: s.name for s in steps.values() if isinstance(s, AttentionStep) for p in (s.scores, s.softmax, s.context)
    }
    steps.update({p.name: p for s in steps.values() if isinstance(s, AttentionStep) for p in (s.scores, s.softmax)})
    steps.update({s.context.name: s.context for s in list(steps.values()) if isinstance(s, AttentionStep)})
    blocks: dict[str, list] = {}
    for k in fp.kernels:
        found = {block_of(nodes[m].loc) for m in k.members if m in nodes} - {None}
        if len(found) == 1:
            blocks.setdefault(found.pop(), []).append(k)
    if not blocks:
        return []
    out = ["\nkernels per block (layout ops are folded into loads and have none):"]
    for name, ks in blocks.items():
        parts = []
        for k in ks:
            ops = [nodes[m].op for m in k.members if m in nodes]
            what = "+".join(dict.fromkeys(ops)) or k.members[0]
            st = steps.get(k.name)
            if isinstance(st, GemmStep) and st.postop:
                what += f" ({st.postop[0]} fused into the GEMM)"
            elif isinstance(st, GemmStep) and st.epilogue:
                what += " (epilogue over the GEMM's output)"
            parts.append(f"{k.kind} {what}")
        merged = {merged_into[k.name] for k in ks if k.name in merged_into}
        runs = f" (run as {len(ks) - 2 * len(merged)} steps: attention merged)" if merged else ""
        out.append(f"  {name}: {len(ks)} kernels{runs}: " + "; ".join(parts))
    return out


def _steps_section(native) -> list[str]:

    steps = native.schedule.steps
    tile = native.tile
    chunk = getattr(getattr(native, "host", None), "row_chunk", None)  # CPU programs only
    out = [
        f"\ntarget: {native.target.describe()}",
        f"  GEMM micro-kernel tile: {tile.rows} rows x {tile.vectors} vectors ({tile.panel}-column weight panels)"
        + (f"; {chunk.describe()}" if chunk else ""),
        "precision: "
        + (
            "bf16 (weights and intermediates stored in bfloat16, float32 math in symfuse's kernels, bf16 GEMMs "
            "and attention with float32 accumulation in oneDNN and torch; float32 inputs and outputs)"
            if native.precision == "bf16"
            else "fp32"
        ),
    ]
    if native.precision_note:
        out.append(f"  {native.precision_note}")
    multiply = getattr(getattr(native, "host", None), "bf16_multiply", None)  # CPU programs only
    if native.precision == "bf16" and multiply is not None:
        out.append(f"  {multiply.describe()}")
    if native.thresholds:
        out.append("version switch points (the host picks a version per call from the size):")
        out += [f"  {th.describe()}" for th in sorted(native.thresholds.values(), key=lambda t: (t.kind, t.shape))]
    host = getattr(native, "host", None)
    if getattr(host, "run", None) is not None:
        out.append(
            "host code: one C++ call (sf_run) runs the whole call, every step in one parallel region, at "
            "bindings where every step runs symfuse's own version; else Python calls the steps one by one"
        )
    elif getattr(host, "run_missing", ""):
        out.append(f"host code: Python calls the steps one by one (no single C++ call: {host.run_missing})")
    prog = getattr(native, "program", None)
    if prog is not None:
        cap = "no cap" if prog.workspace_cap is None else f"cap {prog.workspace_cap:,} bytes per thread"
        out.append(
            f"workspace: high-water {prog.workspace_high_water:,} bytes so far, {prog.workspace_bytes:,} held "
            f"({cap}; CompiledModule.release_workspace() frees it, cap_workspace(n) bounds it)"
        )
    out.append(f"\nexecution ({len(steps)} steps; every size a run-time symbol):")

    fallbacks = []
    for st in steps:
        if isinstance(st, AttentionStep) and st.name not in native.kernels:
            out.append(
                f"  {st.name}: torch's fused attention ({st.scores.name} + {st.softmax.name} + {st.context.name}) "
                "at every length"
            )
        elif isinstance(st, AttentionStep):
            above = (
                f"torch's fused attention (scale {st.library.scale:g}, "
                + ("mask" if st.library.mask else "no mask")
                + ", safe softmax)"
                if st.library
                else "the three steps (torch.matmul, C++, torch.matmul)"
            )
            late = getattr(native, "host", None) is not None and late_normalisation(st.softmax, st.context.a.buffer)
            out.append(
                f"  {st.name}: merged attention ({st.scores.name} + {st.softmax.name} + {st.context.name}) as one "
                f"native kernel up to {native.limit(st)} keys"
                + (
                    " (probabilities normalised late: each output row times its value after the second GEMM)"
                    if late
                    else ""
                )
                + f"; above, {above}"
            )
        elif isinstance(st, NativeStep) and st.name not in native.kernels:
            out.append(f"  {st.name}: tensor expressions through torch (no C++ for them) [{st.kind}]")
            fallbacks.append(f"kernel {st.name}")
        elif isinstance(st, NativeStep):
            out.append(f"  {st.name}: native C++ [{st.kind}] writes {', '.join(st.outputs)}")
        elif isinstance(st, GemmStep):
            if st.conv is not None:
                lib = "oneDNN convolution"
            elif st.weight and st.name in native.host_thresholds:
                rows = native.thresholds[native.host_thresholds[st.name]]
                kind = split_kind(rows.kind)
                split = [t.value for t in native.thresholds.values() if t.kind == kind and t.shape == rows.shape]
                lib = f"linear: symfuse's row kernel up to {native.limit(st)} rows, oneDNN above"
                band = native.band(st)
                if band is not None and band < ROWS[-1]:
                    lib += f" up to {band} rows, the row kernel again from {band + 1} to {ROWS[-1]}, oneDNN above"
                lib += " (weights prepared once)"
                if split:
                    lib += f"; its threads on the weights' panels up to {split[0]} rows, on the rows above"
            elif st.weight:
                lib = "linear: oneDNN (weights prepared once)"
            else:
                lib = "torch.matmul on strided views"
            if st.postop:
                lib += f"; {st.postop[0]} fused (" + (
                    "oneDNN post-op)" if st.conv else "oneDNN post-op, or on the row kernel's tile)"
                )
            epi = f"; epilogue {st.epilogue.name} (native C++ over the GEMM's output)" if st.epilogue else ""
            out.append(f"  {st.name}: {lib}{epi}")
        elif isinstance(st, OpaqueStep):
            out.append(f"  {st.name}: torch reference of {st.node.op} (no TE lowering)  [{st.node.loc}]")
            fallbacks.append(st.node.op)
    out += [f"  note: {n}" for n in native.schedule.notes]
    if fallbacks:
        out.append(f"run through torch inside the compiled program: {', '.join(sorted(set(fallbacks)))}")
    what = f"load time ({native.artifact})" if native.artifact else "compile time"
    out.append(f"{what}: " + ", ".join(f"{k} {v:.2f}s" for k, v in native.seconds.items()))
    return out
