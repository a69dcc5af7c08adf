"""The CPU backend: TE program -> fusion plan -> schedule -> C++ and host code -> a Program.

`compile_program` is the one place the stages after the graph meet; it times each one,
writes every stage to the dump folder when asked, and returns the runnable program with a
report that `explain` shows.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from symfuse.codegen.cpu.attention import emit_attention
from symfuse.codegen.cpu.build import build
from symfuse.codegen.cpu.c import PREAMBLE, CodegenError
from symfuse.codegen.cpu.gemm import SOURCE as GEMM_SOURCE
from symfuse.codegen.cpu.gemm import pack_panels
from symfuse.codegen.cpu.kernel import KernelSource, emit_kernel
from symfuse.codegen.host import generate_host
from symfuse.fusion.plan import Plan, plan
from symfuse.ir.graph import Graph, print_graph
from symfuse.options import Options
from symfuse.runtime.program import Program, reorder_weight
from symfuse.schedule.attention import AttentionStep, merge_attention
from symfuse.schedule.steps import GemmStep, NativeStep, Schedule
from symfuse.schedule.steps import build as build_schedule
from symfuse.shape.store import ShapeStore
from symfuse.te.analysis import analyse
from symfuse.te.lower import TEProgram, lower

log = logging.getLogger("symfuse")


@dataclass
class Backend:
    program: Program
    te: TEProgram
    plan: Plan
    schedule: Schedule
    kernels: dict[str, KernelSource]
    cached: bool
    seconds: dict[str, float] = field(default_factory=dict)


def native_steps(sched: Schedule) -> list:
    out = []
    for st in sched.steps:
        if isinstance(st, AttentionStep):  # the merged kernel; its row kernel too where the three steps may run
            out += [st] if st.library else [st, st.softmax]
        elif isinstance(st, NativeStep):
            out.append(st)
        elif isinstance(st, GemmStep) and st.epilogue is not None:
            out.append(st.epilogue)
    return out


def compile_program(graph: Graph, store: ShapeStore, opts: Options) -> Backend:
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    prog = lower(graph)
    analysis = analyse(prog)
    fp = plan(prog, analysis, store)
    sched = merge_attention(build_schedule(prog, analysis, fp))
    t["lower, analyse, plan, schedule"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    symbols = list(store.symbols)
    natives = native_steps(sched)
    kernels: dict[str, KernelSource] = {}
    gathers: list[str] = []
    for st in natives:
        try:
            if isinstance(st, AttentionStep):
                kernels[st.name] = emit_attention(st, sched.buffers, symbols, gathers)
            else:
                kernels[st.name] = emit_kernel(st, sched.buffers, symbols, gathers)
        except CodegenError as e:
            if isinstance(st, AttentionStep):  # run its three steps as they were (no library shortcut)
                i = sched.steps.index(st)
                sched.steps[i : i + 1] = [st.scores, st.softmax, st.context]
                sched.notes.append(f"{st.name} is not merged: {e}")
                if st.library:  # its row kernel was left out: the library version would have covered it
                    natives.append(st.softmax)
                continue
            sched.notes.append(f"{st.name} runs its tensor expressions through torch: {e}")
    host = generate_host(sched, kernels, symbols)
    # the GEMM micro-kernel only where a step calls it: it is most of a small library's build time
    gemm = GEMM_SOURCE if host.panels or any(isinstance(st, AttentionStep) for st in sched.steps) else ""
    source = PREAMBLE + gemm + "\n" + "\n\n".join(k.source for k in kernels.values()) + "\n"
    t["generate C++ and host code"] = time.perf_counter() - t0
    library, cached, secs = build(source, opts)
    t["build (cache hit)" if cached else "build (g++)"] = secs
    t0 = time.perf_counter()
    consts = {v.name: tensor for v, tensor in graph.constants.items()}
    tensors = {k: consts[v].contiguous() for k, v in host.constants.items()}
    tensors.update({k: reorder_weight(consts[v]) for k, v in host.packed.items()})
    tensors.update({k: pack_panels(consts[v]) for k, v in host.panels.items()})

    def describe(i: int) -> str:
        return gathers[i] if 0 <= i < len(gathers) else f"gather #{i}"

    program = Program(host.source, library, host.kernels, len(symbols), tensors, dict(host.opaque), describe)
    t["load"] = time.perf_counter() - t0
    if opts.dump_dir:
        _dump(opts.dump_dir, graph, prog, fp, sched, source, host.source)
    return Backend(program, prog, fp, sched, kernels, cached, t)


def _dump(folder: str, graph: Graph, prog: TEProgram, fp: Plan, sched: Schedule, cpp: str, host: str) -> None:
    os.makedirs(folder, exist_ok=True)
    files = {
        "1_graph.txt": print_graph(graph, with_constants=False),
        "2_tensor_expressions.txt": str(prog),
        "3_fusion_plan.txt": "\n".join(str(k) for k in fp.kernels)
        + "\n\nrefused:\n"
        + "\n".join(f"{d.producer} -> {d.consumer}: {d.reason}" for d in fp.refused()),
        "4_kernels.cpp": cpp,
        "5_host.py": host,
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text + ("\n" if not text.endswith("\n") else ""))
    log.info("symfuse: wrote every stage to %s", folder)
