"""The CPU backend's generation: TE program -> fusion plan -> schedule -> C++ and host code.

`generate` runs every stage after the graph for one target and returns what a compiler then
builds (`Generated`); `build_generated` builds it and packs the weights, `make_program` puts
the result together with its switch points. Nothing here measures: the driver
(`compile.py`) and the calibration decide the switch points.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from symfuse.codegen.cpu.attention import emit_attention
from symfuse.codegen.cpu.build import build, kernel_caller
from symfuse.codegen.cpu.c import preamble
from symfuse.codegen.cpu.gemm import gemm_source, has_bf16_rows, pack_panels, tile_for
from symfuse.codegen.cpu.host import generate_host
from symfuse.codegen.cpu.kernel import KernelSource, emit_kernel
from symfuse.codegen.cpu.lstm import LSTM_SOURCE
from symfuse.codegen.cpu.paged import PAGED_SOURCE
from symfuse.codegen.host import opaque_functions
from symfuse.codegen.precision import PRECISIONS, cast_boundary, half_storage
from symfuse.codegen.stages import share
from symfuse.errors import CodegenError
from symfuse.fusion.plan import Plan, plan
from symfuse.ir.graph import Graph
from symfuse.options import Options
from symfuse.runtime.code import HostCode, Tile
from symfuse.runtime.native import link
from symfuse.runtime.program import Program
from symfuse.runtime.switches import Threshold
from symfuse.runtime.target import Target
from symfuse.schedule.attention import AttentionStep, find_step, merge_attention, native_steps
from symfuse.schedule.channels_last import channels_last
from symfuse.schedule.steps import NativeStep, Schedule
from symfuse.schedule.steps import build as build_schedule
from symfuse.shape.store import ShapeStore
from symfuse.te.analysis import analyse
from symfuse.te.lower import TEProgram, lower

log = logging.getLogger("symfuse")


@dataclass
class Generated:
    """Everything generated for one target before a compiler runs: the C++ and the host code."""

    te: TEProgram
    plan: Plan
    schedule: Schedule
    kernels: dict[str, KernelSource]
    gathers: list[str]  # what each checked gather reads, for the run-time error
    host: HostCode
    source: str
    tile: Tile
    symbols: list[str]  # the order of `sym[]`, the sizes every kernel reads
    # the translation units built into the library, at once (`build`): the row GEMM's and the
    # model's, or `source` alone; `source` is them in one (what dumps show, what cross-compiles)
    parts: tuple[str, ...]

    def step(self, name: str) -> NativeStep:
        return find_step(self.schedule, name)


def generate(
    graph: Graph,
    store: ShapeStore,
    target: Target,
    precision: str = "fp32",
    bf16_multiply: Threshold | None = None,
    row_chunk: Threshold | Callable[[], Threshold] | None = None,
) -> Generated:
    """Lower, plan, schedule and generate C++ for `target` (nothing is built or run);
    `precision="bf16"` stores every float32 buffer and constant in bfloat16, and its row kernel
    multiplies as `bf16_multiply` says (`vdpbf16ps` when None, `gemm.BF16_MULTIPLY`); the
    float32 row kernel walks its panels `row_chunk` steps of K at a time (`tile_for`'s when None;
    a function is called only for a program that has the float32 row kernel)."""
    prog = lower(graph)
    analysis = analyse(prog)
    fp = plan(prog, analysis, store)
    sched = channels_last(merge_attention(build_schedule(prog, analysis, fp)))
    storage = half_storage(sched, PRECISIONS[precision])
    symbols = list(store.symbols)
    natives = native_steps(sched)
    bf16 = precision == "bf16" and has_bf16_rows(target)
    multiply = bf16_multiply.value if bf16 and bf16_multiply else 0
    dp = bf16 and multiply == 0  # BF16_MULTIPLY[0], vdpbf16ps: the merged attention's GEMMs by it too
    kernels: dict[str, KernelSource] = {}
    gathers: list[str] = []
    for st in natives:
        try:
            if isinstance(st, AttentionStep):
                kernels[st.name] = emit_attention(st, sched.buffers, symbols, gathers, dp)
            else:
                kernels[st.name] = emit_kernel(st, sched.buffers, symbols, gathers)
        except CodegenError as e:
            if isinstance(st, AttentionStep) and st.library:  # torch's fused attention at every length
                sched.notes.append(f"{st.name} runs torch's fused attention at every length: {e}")
                continue
            if isinstance(st, AttentionStep):  # run its three steps as they were (no library shortcut)
                i = sched.steps.index(st)
                sched.steps[i : i + 1] = [st.scores, st.softmax, st.context]
                sched.notes.append(f"{st.name} is not merged: {e}")
                if st.library:  # its row kernel was left out: the library version would have covered it
                    natives.append(st.softmax)
                continue
            sched.notes.append(f"{st.name} runs its tensor expressions through torch: {e}")
    kernels = share(kernels, set(sched.buffers) | {it.name for it in prog.items})
    host = generate_host(sched, kernels, symbols, bf16_rows=bf16, bf16_amx=bf16 and multiply == 2)
    host.bf16_multiply = bf16_multiply if bf16 else None
    if callable(row_chunk):  # measured (once per machine) only where it is used
        row_chunk = row_chunk() if host.panels and not bf16 else None
    host.row_chunk = row_chunk
    if storage:
        host.source = cast_boundary(host.source, graph, storage)
        host.precision = precision
    tile = tile_for(target, row_chunk.value if row_chunk else 0)
    # the GEMM micro-kernel only where a step calls it: it is most of a small library's build time
    merged = any(isinstance(st, AttentionStep) and st.name in kernels for st in sched.steps)
    uses_gemm = bool(host.panels or merged)
    gemm = gemm_source(tile, bf16, multiply) if uses_gemm else ""
    own = "\n\n".join(k.source for k in kernels.values() if not k.function)
    run = "\n" + host.run.source if host.run else ""  # the whole call, where every step is the library's
    library = (LSTM_SOURCE if host.lstm else "") + (PAGED_SOURCE if host.paged else "")
    source = preamble(target) + gemm + library + "\n" + own + "\n" + run
    parts = (source,)
    if uses_gemm:  # the row GEMM (most of the build) apart: the same for every model of the target
        rows = gemm_part(target, tile, bf16, multiply)
        parts = (rows, preamble(target) + gemm_source(tile, bf16, multiply, rows_elsewhere=True) + library + "\n"
                 + own + "\n" + run)  # fmt: skip
    return Generated(prog, fp, sched, kernels, gathers, host, source, tile, symbols, parts)


def gemm_part(target: Target, tile: Tile, bf16: bool, multiply: int) -> str:
    """The translation unit of the row GEMM that a library of this target, tile and precision
    is built with: it depends on no model, so every model of the target shares its object
    file (and `prebuild` can compile it before a model is captured)."""
    return preamble(target) + gemm_source(tile, bf16, multiply)


@dataclass
class Built:
    """A generated program's library built, its weights packed: all it needs but switch points."""

    library: str
    cached: bool
    seconds: float  # in g++ (or reading the cache)
    consts: dict[str, torch.Tensor]
    panels: dict[str, torch.Tensor]  # the row kernel's packed weights, by namespace name
    caller: Callable | None  # runtime.call's kernel caller, or None (ctypes)
    pack_seconds: float = 0.0


def build_generated(gen: Generated, graph: Graph, target: Target, opts: Options) -> Built:
    """Build `gen`'s C++ for `target`, packing the row kernel's weights while g++ runs."""
    with ThreadPoolExecutor(1) as pool:
        building = pool.submit(build, gen.parts, target, opts)
        calling = pool.submit(kernel_caller, target, opts)  # then the kernel caller (once a process)
        t0 = time.perf_counter()
        consts = {v.name: tensor for v, tensor in graph.constants.items()}
        bf16 = gen.host.precision == "bf16"
        panels = {k: pack_panels(consts[v], gen.tile.panel, bf16) for k, v in gen.host.panels.items()}
        pack = time.perf_counter() - t0
        library, cached, secs = building.result()
        caller = calling.result()
    return Built(library, cached, secs, consts, panels, caller, pack)


def make_program(gen: Generated, built: Built, n_symbols: int, thresholds: dict[str, Threshold]) -> Program:
    """The runnable program of a built `gen` with these switch points."""
    functions = opaque_functions(gen.host.recipes, gen.step)
    host = gen.host
    consts, panels = built.consts, built.panels
    return link(host, built.library, n_symbols, consts, panels, gen.gathers, thresholds, functions, built.caller)
