"""The CPU backend: TE program -> fusion plan -> schedule -> C++ and host code -> a Program.

`compile_program` is the one place the stages after the graph meet; it times each one,
writes every stage to the dump folder when asked, and returns the runnable program with a
report that `explain` shows.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from symfuse.codegen.cpu.attention import emit_attention
from symfuse.codegen.cpu.build import build, kernel_caller
from symfuse.codegen.cpu.c import CodegenError, preamble
from symfuse.codegen.cpu.calibrate import ROWS, Calibration, Threshold, weight_traffic
from symfuse.codegen.cpu.gemm import BF16_MULTIPLY, Tile, gemm_source, has_bf16_rows, pack_panels, tile_for
from symfuse.codegen.cpu.kernel import KernelSource, emit_kernel
from symfuse.codegen.cpu.lstm import LSTM_SOURCE
from symfuse.codegen.cpu.target import Target, detect
from symfuse.codegen.host import HostCode, generate_host, opaque_functions
from symfuse.codegen.precision import PRECISIONS, cast_boundary, cpu_bf16_missing, half_storage, stored
from symfuse.fusion.plan import Plan, plan
from symfuse.ir.graph import Graph, print_graph
from symfuse.options import Options, library_kind
from symfuse.runtime.program import ConvWeights, OneDNNWeights, Program
from symfuse.schedule.attention import AttentionStep, find_step, merge_attention, native_steps
from symfuse.schedule.channels_last import channels_last
from symfuse.schedule.steps import NativeStep, Schedule
from symfuse.schedule.steps import build as build_schedule
from symfuse.shape.store import ShapeStore
from symfuse.te.analysis import analyse
from symfuse.te.lower import TEProgram, lower

log = logging.getLogger("symfuse")


@dataclass
class Backend:
    """A runnable program and what it came from. A program loaded from an artifact makes the
    stages before it (TEs, plan, schedule, kernel sources) again only when asked (`explain`)."""

    program: Program
    target: Target
    thresholds: dict[str, Threshold]  # namespace name -> its value and where it came from
    host: HostCode
    gathers: list[str]
    tile: Tile
    cached: bool
    seconds: dict[str, float] = field(default_factory=dict)
    generated: Generated | None = None
    regenerate: Callable[[], Generated] | None = None
    artifact: str = ""  # the folder it was loaded from, if it was
    precision_note: str = ""  # why the precision asked for is not the one that runs, if it is not

    @property
    def gen(self) -> Generated:
        if self.generated is None:
            self.generated = self.regenerate()
        return self.generated

    precision = property(lambda self: self.host.precision)
    te = property(lambda self: self.gen.te)
    plan = property(lambda self: self.gen.plan)
    schedule = property(lambda self: self.gen.schedule)
    kernels = property(lambda self: self.gen.kernels)

    @property
    def host_thresholds(self) -> dict[str, str]:  # step -> the threshold it reads
        return self.host.step_thresholds

    @property
    def attention_steps(self) -> list[AttentionStep]:
        return [st for st in self.schedule.steps if isinstance(st, AttentionStep)]

    def limit(self, step) -> int | None:
        """Up to which size (rows or keys) `step` runs symfuse's own version, or None if it has one."""
        name = self.host_thresholds.get(step.name)
        return self.thresholds[name].value if name else None

    def band(self, step) -> int | None:
        """For a linear step with two versions: up to which rows oneDNN runs above `limit`
        before the row kernel runs again (up to `ROWS[-1]`); None for other steps."""
        name = self.host_thresholds.get(step.name, "")
        th = self.thresholds.get(library_kind(name))
        return th.value if name.startswith("th_linear_rows") and th is not None else None

    def runs_own(self, step, size: int) -> bool:
        """Whether `step` runs symfuse's own version at `size` (rows of a linear layer, keys of
        attention), as the host code picks it."""
        limit, band = self.limit(step), self.band(step)
        if limit is None:
            return False
        return size <= limit or (band is not None and band < size <= ROWS[-1])


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
    gemm = gemm_source(tile, bf16, multiply) if host.panels or merged else ""
    own = "\n\n".join(k.source for k in kernels.values() if not k.function)
    run = "\n" + host.run.source if host.run else ""  # the whole call, where every step is the library's
    source = preamble(target) + gemm + (LSTM_SOURCE if host.lstm else "") + "\n" + own + "\n" + run
    return Generated(prog, fp, sched, kernels, gathers, host, source, tile, symbols)


_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
# the emitters' names derived from a value's: register, pointer, row buffer, loop, temporary
_LOCAL = re.compile(r"^(?:v|p|row|r\d+|t\d+)_")
_COMMENT = re.compile(r"^\s*(//|# ).*$", re.M)  # C++ and Python comments


def share(kernels: dict[str, KernelSource], names: set[str]) -> dict[str, KernelSource]:
    """Kernels whose C++ is the same up to the names of the graph's values (each layer of a
    transformer repeats its layer norm, its attention, its GELU) share one function: the
    later ones call the first, so the compiler sees each distinct kernel once."""
    first: dict[str, str] = {}
    out = {}
    for name, k in kernels.items():
        seen: dict[str, str] = {}

        def placeholder(m: re.Match, seen=seen, own=name) -> str:
            word = m.group(0)
            if word not in (own, f"{own}_team") and word not in names and _LOCAL.sub("", word) not in names:
                return word
            return seen.setdefault(word, f"@{len(seen)}")

        canonical = _IDENT.sub(placeholder, _COMMENT.sub("", k.source))
        if canonical in first:
            out[name] = replace(k, function=first[canonical])
        else:
            first[canonical] = name
            out[name] = k
    return out


def compile_program(
    graph: Graph, store: ShapeStore, opts: Options, target: Target | None = None, force_precision: bool = False
) -> Backend:
    """Build `graph` for `target` (default: this machine's). `opts.precision="bf16"` runs fp32
    on a CPU whose bf16 would not be faster, saying why, unless `force_precision` (tests: bf16
    storage and kernels on any CPU, library GEMMs permitting)."""
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    if target is None:
        target = detect(opts.cxx, opts.isa, opts.machine_cache)
    t["target"] = time.perf_counter() - t0
    precision, note = opts.precision, ""
    if precision == "bf16" and not force_precision:
        why = cpu_bf16_missing(target, opts.library_limits)
        if why:
            precision, note = "fp32", f"precision bf16 was asked for, but {why}: running fp32"
            log.warning("symfuse: %s", note)
    multiply = None
    if precision == "bf16" and has_bf16_rows(target):  # measured once per machine
        t0 = time.perf_counter()
        multiply = Calibration(target, opts).get("bf16_multiply", ())
        if multiply.value not in BF16_MULTIPLY:
            ways = ", ".join(f"{k} ({v})" for k, v in BF16_MULTIPLY.items())
            raise ValueError(f"threshold bf16_multiply={multiply.value} is not a way to multiply; use one of {ways}")
        t["bf16 row kernel's multiply"] = time.perf_counter() - t0

    def chunk() -> Threshold:
        t0 = time.perf_counter()
        found = Calibration(target, opts).get("row_chunk", ())  # measured once per machine
        if found.value < 1:
            raise ValueError(f"threshold row_chunk={found.value}: a chunk takes at least one step of K")
        t["row kernel's chunk"] = time.perf_counter() - t0
        return found

    t0 = time.perf_counter()
    gen = generate(graph, store, target, precision, multiply, chunk)
    host = gen.host
    t["lower, plan, schedule, generate C++ and host code"] = time.perf_counter() - t0 - t.get("row kernel's chunk", 0)
    with ThreadPoolExecutor(1) as pool:  # g++ runs while the weights are packed
        building = pool.submit(build, gen.source, target, opts)
        calling = pool.submit(kernel_caller, target, opts)  # then the kernel caller (once a process)
        t0 = time.perf_counter()
        consts = {v.name: tensor for v, tensor in graph.constants.items()}
        bf16 = host.precision == "bf16"
        panels = {k: pack_panels(consts[v], gen.tile.panel, bf16) for k, v in host.panels.items()}
        t["pack weights (while g++ runs)"] = time.perf_counter() - t0
        library, cached, secs = building.result()
        caller = calling.result()
    t["build (cache hit)" if cached else "build (g++)"] = secs
    t0 = time.perf_counter()  # (switch points are measured with nothing else running)
    linear_bytes = sum(p.numel() * p.element_size() for p in panels.values())
    thresholds = switch_points(host.thresholds, target, opts, linear_bytes)
    t["switch points"] = time.perf_counter() - t0
    program = link(host, library, len(store.symbols), consts, panels, gen.gathers, thresholds, gen.step, caller)
    if opts.dump_dir:
        dump_stages(opts.dump_dir, graph, gen.te, gen.plan, ("4_kernels.cpp", gen.source), host.source)
    return Backend(program, target, thresholds, host, gen.gathers, gen.tile, cached, t, gen, precision_note=note)


def link(
    host: HostCode,
    library: str,
    n_symbols: int,
    consts: dict[str, torch.Tensor],
    panels: dict[str, torch.Tensor],
    gathers: list[str],
    thresholds: dict[str, Threshold],
    step: Callable[[str], NativeStep],
    caller: Callable | None = None,
) -> Program:
    """Put a built library, its host code and the tensors it reads together: constants by value
    name, the row kernel's packed panels; oneDNN's copies are made at first use."""
    tensors = {k: stored(consts[v], host.precision).contiguous() for k, v in host.constants.items()}
    tensors.update(panels)
    tensors["conv_weight"] = ConvWeights({v: stored(consts[v], host.precision) for v in host.conv_weights})
    tensors["W"] = OneDNNWeights({k: stored(consts[v], host.precision) for k, v in host.packed.items()})

    def describe(i: int) -> str:
        return gathers[i] if 0 <= i < len(gathers) else f"gather #{i}"

    functions = opaque_functions(host.recipes, step)
    values = {name: th.value for name, th in thresholds.items()}
    run = 4 + len(host.run.params) if host.run else 0
    return Program(host.source, library, host.kernels, n_symbols, tensors, functions, describe, values, caller, run)


def switch_points(wanted: dict[str, tuple[str, tuple[int, ...]]], target: Target, opts: Options, linear_bytes: int):
    """The value of every threshold the host code reads: set by hand, cached, or measured now.
    Linear layers are measured with as many bytes of weights passing through the caches
    between two calls as the model's linear weights take, streaming from memory where they
    do not fit in the L3 cache (`calibrate.weight_traffic`)."""
    if not wanted:
        return {}
    traffic = weight_traffic(linear_bytes, target)
    cal = Calibration(target, opts)
    return {name: cal.get(kind, shape, traffic) for name, (kind, shape) in wanted.items()}


def dump_stages(folder: str, graph: Graph, prog: TEProgram, fp: Plan, kernels: tuple[str, str], host: str) -> None:
    """Write every stage to `folder`: graph, TEs, fusion plan, kernels (file name, source), host."""
    os.makedirs(folder, exist_ok=True)
    files = {
        "1_graph.txt": print_graph(graph, with_constants=False),
        "2_tensor_expressions.txt": str(prog),
        "3_fusion_plan.txt": "\n".join(str(k) for k in fp.kernels)
        + "\n\nrefused:\n"
        + "\n".join(f"{d.producer} -> {d.consumer}: {d.reason}" for d in fp.refused()),
        kernels[0]: kernels[1],
        "5_host.py": host,
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text + ("\n" if not text.endswith("\n") else ""))
    log.info("symfuse: wrote every stage to %s", folder)
