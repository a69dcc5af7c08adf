"""The public entry point: `symfuse.compile`, the driver from a model to its `CompiledModule`."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.utils._pytree as pytree

from symfuse.codegen.cpu.compile import compile_program, prebuild
from symfuse.codegen.gpu.compile import compile_gpu
from symfuse.frontend import Captured, capture, is_onnx
from symfuse.frontend.decoder import capture_decoder, generates
from symfuse.ir.verify import verify
from symfuse.options import Options
from symfuse.passes import PIPELINE
from symfuse.reference import ReferenceExecutor
from symfuse.runtime.decoder import Decoder
from symfuse.runtime.guard import GuardSpec
from symfuse.runtime.module import BACKENDS, CompiledModule, Signature
from symfuse.shape.guards import guard_spec
from symfuse.source import Compiled

log = logging.getLogger("symfuse")
_compile_count = 0


def compile_count() -> int:
    """How many times this process has compiled a model (each `symfuse.compile` call is one)."""
    return _compile_count


def compile_captured(
    captured: Captured, options: Options, native: Any = None, guard: GuardSpec | None = None
) -> CompiledModule:
    """The module of a captured graph, built by the backend `options` names (`native` and
    `guard`: built already, as a loaded artifact rebuilt for this CPU has them)."""
    if guard is None:
        device = torch.device(options.device).type
        guard = guard_spec(captured.declared, captured.store, device, tuple(captured.traced_under))
    backend = BACKENDS.get(options.backend)
    if backend is None:
        raise ValueError(f"unknown backend {options.backend!r}; symfuse has 'cpu', 'triton' and 'reference'")
    source = Compiled(captured)
    if native is None and options.backend == "cpu":
        native = compile_program(captured.graph, captured.store, options)
    elif native is None and options.backend == "triton":
        native = compile_gpu(captured.graph, captured.store, options)
    if native is not None:
        run = native.program
    else:
        reference = ReferenceExecutor(captured.graph)
        run = lambda tensors, binding: reference.run(binding, tensors)  # noqa: E731
    return CompiledModule(
        signature_of(captured), guard, list(captured.store.symbols), run, source, options, backend, native
    )


def signature_of(captured: Captured) -> Signature:
    names = tuple(captured.input_names)
    tensors = tuple(v.name for v in captured.declared)
    return Signature(captured.graph.name, names, tensors, dict(captured.fixed), captured.out_spec)


def _device_of(model: Any, example_inputs: Any) -> str:
    """The device a torch model lives on (its first parameter or buffer, else its first
    example tensor); "cpu" for ONNX models."""
    if isinstance(model, torch.nn.Module):
        for t in list(model.parameters()) + list(model.buffers()):
            return str(t.device)
    for x in pytree.tree_leaves(example_inputs):
        if isinstance(x, torch.Tensor):
            return str(x.device)
    return "cpu"


def _on_cpu(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of a device model to capture from (the model itself is left where it is)."""
    import copy

    return copy.deepcopy(model).cpu()


def _has_linear_weights(model: torch.nn.Module) -> bool:
    """Whether the module holds a matrix as large as a linear layer's (what the row GEMM runs)."""
    return any(p.dim() == 2 and p.numel() >= 4096 for p in model.parameters())


def compile(  # noqa: A001
    model: Any, example_inputs: Any = None, dynamic: Any = None, *, backend: str | None = None, **options
) -> CompiledModule | Decoder:
    """Compile `model` once for all bindings of its dynamic dims.

    A `transformers` causal LM (GPT-2, Llama, Mistral, Qwen2, ...) compiles to a `Decoder`:
    one decoding step over a key/value cache the runtime owns, for every batch, prompt and
    past length, with `.generate(...)`; no example inputs are needed (an example that sets
    `use_cache=False` compiles the model as a plain function of its inputs instead).

    model: a `torch.nn.Module` (captured with torch.export from `example_inputs`), or an
        ONNX model: a path to a `.onnx` file or an `onnx.ModelProto` (no example needed;
        its `dim_param`s are the symbols, and the module returns a tuple of its outputs).

    example_inputs: a tensor, a tuple of positional inputs, or a dict of keyword inputs.
        A dynamic dim with an example of size 1 is grown to 2 for capture (torch.export
        would fix it); size 0 is an error.
    dynamic: `{input name: {dim: name}}` (names may be `torch.export.Dim`s with ranges;
        the same name on two dims declares them equal), or a tuple of such dicts for
        positional inputs. When omitted, every dim of every tensor input is dynamic
        unless the model fixes it or its example size is 1 (which may be a broadcast;
        declare such a dim to make it dynamic); those dims are named `<input>_<dim>`.
    backend: "cpu" (default on a CPU: generated native code), "triton" (default on a GPU:
        Triton kernels and cuBLAS) or "reference" (each op through torch).
    device: where the program runs and its weights live ("cpu", "cuda", "cuda:1"); by default
        the model's own device (its parameters', else the example inputs'). A GPU model is
        captured from a CPU copy; inputs must then be on that device.
    precision: "fp32" (default) or "bf16"; on a GPU also "fp16". Half-precision weights and
        intermediates, float32 math and accumulation, float32 outputs. On a CPU without bf16
        multiply instructions (AVX512-BF16, AMX) bf16 runs as fp32 and `explain` says why.
    options: fields of `symfuse.options.Options` (cache_dir, dump_dir, cxx); the environment
        supplies SYMFUSE_CACHE_DIR, SYMFUSE_DUMP_DIR and CXX.
    """
    if "device" not in options or options["device"] is None:
        options["device"] = _device_of(model, example_inputs)
    opts = Options.from_env(backend=backend, **options)
    global _compile_count
    if opts.device != "cpu" and isinstance(model, torch.nn.Module):  # captured on the CPU, run on the device
        model, example_inputs = (
            _on_cpu(model),
            pytree.tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, example_inputs),
        )
    spec = None
    if isinstance(model, torch.nn.Module) and _has_linear_weights(model):
        prebuild(opts)  # the row GEMM compiles on another core while the model is captured
    if is_onnx(model):
        if example_inputs is not None:
            raise ValueError("an ONNX model needs no example inputs; pass `dynamic` to rename or bound its dims")
        try:
            from symfuse.frontend.onnx import capture_onnx  # (onnx is an extra: only this road needs it)
        except ImportError as e:
            raise ImportError(f"compiling an ONNX model needs the onnx package: pip install symfuse[onnx] ({e})") from e
        captured = capture_onnx(model, dynamic)
    elif isinstance(model, torch.nn.Module) and generates(model, example_inputs):
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(opts.precision, torch.float32)
        captured, spec = capture_decoder(model, half)
    elif isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise ValueError("compiling a torch module needs example inputs (a tensor, a tuple or a dict)")
        captured = capture(model, example_inputs, dynamic)
    else:
        raise TypeError(
            f"symfuse compiles a torch.nn.Module or an ONNX model (.onnx path or ModelProto), got {model!r}"
        )
    verify(captured.graph)
    for p in PIPELINE:
        captured.graph = p(captured.graph, captured.store)
        verify(captured.graph)
    _compile_count += 1
    log.info("symfuse: captured %s in %.2fs (%d ops)", captured.graph.name, captured.seconds, len(captured.graph.nodes))
    module = compile_captured(captured, opts)
    return Decoder(module, spec) if spec is not None else module
