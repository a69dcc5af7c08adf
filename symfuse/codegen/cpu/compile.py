"""The CPU backend's driver: a graph in, a runnable `Backend` out.

`compile_program` detects the target, decides the precision, generates and builds the code,
takes every switch point (set by hand, cached, or measured now by `calibrate.py`), times each
stage for `explain` and writes every stage to the dump folder when asked.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

from symfuse.codegen.cpu.build import build_object, kernel_caller
from symfuse.codegen.cpu.calibrate import Calibration
from symfuse.codegen.cpu.gemm import has_bf16_rows, tile_for
from symfuse.codegen.cpu.generate import build_generated, gemm_part, generate, make_program
from symfuse.codegen.cpu.target import detect
from symfuse.codegen.precision import cpu_bf16_missing
from symfuse.codegen.stages import dump_stages
from symfuse.ir.graph import Graph
from symfuse.options import Options
from symfuse.runtime.native import Backend
from symfuse.runtime.switches import BF16_MULTIPLY, Threshold, weight_traffic
from symfuse.runtime.target import Target
from symfuse.shape.store import ShapeStore

log = logging.getLogger("symfuse")


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
    built = build_generated(gen, graph, target, opts)
    t["pack weights (while g++ runs)"] = built.pack_seconds
    t["build (cache hit)" if built.cached else "build (g++)"] = built.seconds
    t0 = time.perf_counter()  # (switch points are measured with nothing else running)
    thresholds = switch_points(host.thresholds, target, opts, built.panels)
    t["switch points"] = time.perf_counter() - t0
    program = make_program(gen, built, len(store.symbols), thresholds)
    if opts.dump_dir:
        dump_stages(opts.dump_dir, graph, gen.te, gen.plan, ("4_kernels.cpp", gen.source), host.source)
    return Backend(program, target, thresholds, host, gen.gathers, gen.tile, built.cached, t, gen, precision_note=note)


def prebuild(opts: Options) -> threading.Thread | None:
    """Start compiling, on another core, what this machine's libraries are built with whatever
    the model: the row GEMM's translation unit (`generate.gemm_part`, the most of a build) and
    the kernel caller. `symfuse.compile` calls it before it captures a model with linear layers,
    so g++ runs while torch.export traces; the build finds them cached, or waits for them. It
    measures nothing (with `switch_points="measure"` it does not start: the measurements want
    the cores), and leaves any failure for the build to report."""
    if opts.backend != "cpu" or opts.switch_points != "model" or opts.sanitize:
        return None

    def work() -> None:
        try:
            target = detect(opts.cxx, opts.isa, opts.machine_cache)
            cal = Calibration(target, opts)
            bf16 = opts.precision == "bf16" and has_bf16_rows(target)
            bf16 = bf16 and not cpu_bf16_missing(target, opts.library_limits)
            multiply = cal.get("bf16_multiply", ()).value if bf16 else 0
            tile = tile_for(target, 0 if bf16 else cal.get("row_chunk", ()).value)
            build_object(gemm_part(target, tile, bf16, multiply), target, opts)
            kernel_caller(target, opts)
        except Exception as e:  # noqa: BLE001  (the build itself says what is wrong)
            log.debug("symfuse: prebuilding the row GEMM failed: %s", e)

    thread = threading.Thread(target=work, name="symfuse-prebuild", daemon=True)
    thread.start()
    return thread


def switch_points(
    wanted: dict[str, tuple[str, tuple[int, ...]]], target: Target, opts: Options, panels: dict[str, torch.Tensor]
):
    """The value of every threshold the host code reads: set by hand, cached, or measured now.
    Linear layers are measured with as many bytes of weights passing through the caches
    between two calls as the model's packed linear weights (`panels`) take, streaming from
    memory where they do not fit in the L3 cache (`switches.weight_traffic`)."""
    if not wanted:
        return {}
    traffic = weight_traffic(sum(p.numel() * p.element_size() for p in panels.values()), target)
    cal = Calibration(target, opts)
    return {name: cal.get(kind, shape, traffic) for name, (kind, shape) in wanted.items()}
