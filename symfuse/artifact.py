"""`symfuse.load`: a saved artifact (`runtime/artifact.py`) made a module again.

Where the saved kernels run on this CPU, the module is linked from the saved library, host
code and tensors, importing nothing of the compiler: the graph is read only when asked for
(`explain`, `.graph`). Where they do not (another ISA or architecture, or another ISA asked
for), the kernels are built for this CPU from the saved graph, which needs a C++ compiler;
without one the error says what was saved and what this machine lacks. Switch points
measured on another machine are measured again, once, for this one.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace

from symfuse.options import Options
from symfuse.runtime.artifact import ArtifactError, Saved, decode_spec, read
from symfuse.runtime.code import Tile
from symfuse.runtime.decoder import Decoder, read_spec
from symfuse.runtime.module import BACKENDS, CompiledModule, Signature
from symfuse.runtime.native import Backend, link
from symfuse.runtime.switches import Threshold, by_hand
from symfuse.runtime.target import cpu_runs, machine_id
from symfuse.source import Saved as SavedSource

log = logging.getLogger("symfuse")


def load(path: str, **options) -> CompiledModule | Decoder:
    """The module saved in folder `path` (a `Decoder` where a compiled causal LM was saved);
    `options` as for `symfuse.compile` (cxx, isa, cache_dir, machine_dir, thresholds)."""
    module = _module(path, **options)
    spec = read_spec(path)
    return Decoder(module, spec) if spec is not None else module


def _module(path: str, **options) -> CompiledModule:
    opts = Options.from_env(**options)
    if opts.backend != "cpu":
        raise ArtifactError(f"an artifact runs on the cpu backend, not {opts.backend!r}")
    saved = read(path)
    sig = saved.state["signature"]
    signature = Signature(**{**sig, "out_spec": decode_spec(sig["out_spec"])})
    source = SavedSource(functools.partial(_captured, saved, signature))
    target = saved.target
    ok, lacks = cpu_runs(target)
    if not ok or (opts.isa and opts.isa != target.isa):  # build for this CPU (or the ISA asked for)
        return _rebuilt(saved, source, opts, lacks)
    t0 = time.perf_counter()
    host = saved.state["host"]
    thresholds = saved.thresholds
    if thresholds and target.machine != machine_id():  # measured on another CPU: measure for this one
        thresholds = _measured_here(saved, thresholds, opts)
    elif opts.thresholds:  # set by hand now
        manual = dict(opts.thresholds)
        thresholds = {k: by_hand(v.kind, v.shape, manual) or v for k, v in thresholds.items()}
    seconds = dict(saved.seconds)
    seconds["switch points"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    regenerate = functools.cache(functools.partial(_regenerate, source, target, host))
    functions = _functions(host, regenerate) if host.recipes else {}
    program = link(
        host,
        f"{path}/kernels.so",
        len(saved.state["symbols"]),
        saved.weights,
        saved.packed,
        saved.state["gathers"],
        thresholds,
        functions,
        saved.caller(),
    )
    seconds["link (load the library, host code)"] = time.perf_counter() - t0
    native = Backend(
        program, target, thresholds, host, saved.state["gathers"], Tile(**saved.state["tile"]), True, seconds, None,
        regenerate, path,
    )  # fmt: skip
    return CompiledModule(
        signature, saved.state["guard"], saved.state["symbols"], program, source, opts, BACKENDS["cpu"], native
    )


def _captured(saved: Saved, signature: Signature):
    """The capture the artifact was compiled from, read back from its graph.pkl."""
    from symfuse.frontend.torch_export import Captured

    s = saved.compiler_state()
    names = list(signature.input_names)
    return Captured(s["graph"], s["store"], s["declared"], names, signature.fixed, signature.out_spec, 0.0, s["notes"])


def _rebuilt(saved: Saved, source: SavedSource, opts: Options, lacks: str) -> CompiledModule:
    """The saved graph compiled for this CPU: its saved kernels do not run here."""
    from symfuse.api import compile_captured
    from symfuse.codegen.cpu.compile import compile_program
    from symfuse.codegen.cpu.target import detect

    target = saved.target
    try:
        here = detect(opts.cxx, opts.isa if opts.isa != target.isa else "", opts.machine_cache)
    except Exception as e:  # noqa: BLE001 - no compiler: say what was saved and what this machine is
        raise ArtifactError(
            f"the artifact's kernels were built for {target.isa} ({target.arch}, {' '.join(target.flags)}) on "
            f"{target.cpu}; this machine {lacks or 'asks for another ISA'}, so they must be rebuilt here, which "
            f"needs a C++ compiler: {e}"
        ) from None
    log.info("symfuse: %s was built for %s on %s; building its kernels for %s here", saved.path, target.isa,
             target.cpu, here.isa)  # fmt: skip
    captured = source.captured()
    precision = saved.state["host"].precision
    native = compile_program(captured.graph, captured.store, replace(opts, precision=precision), target=here)
    native.seconds, native.artifact = {**saved.seconds, **native.seconds}, saved.path
    return compile_captured(captured, opts, native=native, guard=saved.state["guard"])


def _measured_here(saved: Saved, thresholds: dict[str, Threshold], opts: Options) -> dict[str, Threshold]:
    """Switch points for this machine, the saved ones measured on another CPU."""
    from symfuse.codegen.cpu.compile import switch_points
    from symfuse.codegen.cpu.target import detect

    target = saved.target
    try:
        here = detect(opts.cxx, target.isa, opts.machine_cache)
        return switch_points(saved.state["host"].thresholds, here, opts, saved.packed)
    except Exception as e:  # noqa: BLE001 - no compiler to measure with: keep the saved values, say so
        log.warning("symfuse: keeping the switch points measured on %s (%s)", target.cpu, e)
        return {
            k: Threshold(v.kind, v.shape, v.value, f"measured on {target.cpu}, where the artifact was saved")
            for k, v in thresholds.items()
        }


def _functions(host, regenerate) -> dict[str, tuple]:
    """The torch-run functions of a program whose host code has some (ops with no lowering):
    these need the compiler's op registry, and the schedule of the kernels run by torch."""
    from symfuse.codegen.host import opaque_functions

    return opaque_functions(host.recipes, lambda name: regenerate().step(name))


def _regenerate(source: SavedSource, target, host):
    from symfuse.codegen.cpu.generate import generate

    c = source.captured()
    return generate(c.graph, c.store, target, host.precision, host.bf16_multiply, host.row_chunk)
