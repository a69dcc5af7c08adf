"""The public entry point: `symfuse.compile` and the module it returns."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.utils._pytree as pytree

from symfuse.explain import explain as _explain
from symfuse.frontend import Captured, capture
from symfuse.frontend.onnx import capture_onnx, is_onnx
from symfuse.ir.verify import verify
from symfuse.options import Options
from symfuse.passes import PIPELINE
from symfuse.reference import ReferenceExecutor
from symfuse.runtime.guard import GuardSpec, make_guard
from symfuse.runtime.outputs import OutputBuilder
from symfuse.shape.guards import guard_spec

log = logging.getLogger("symfuse")
_compile_count = 0

REFERENCE_BACKEND = "reference executor (each op runs through its PyTorch reference)"
CPU_BACKEND = "cpu (generated C++ kernels with OpenMP and SIMD, oneDNN and torch.matmul for GEMMs)"
GPU_BACKEND = "triton (generated Triton kernels, cuBLAS through torch for GEMMs, CUDA graphs per binding)"


def compile_count() -> int:
    """How many times this process has compiled a model (each `symfuse.compile` call is one)."""
    return _compile_count


class CompiledModule:
    """A model compiled once for every binding of its symbolic dims."""

    def __init__(self, captured: Captured, options: Options, native=None, guard: GuardSpec | None = None) -> None:
        self.captured = captured
        self.graph = captured.graph
        self.store = captured.store
        self.options = options
        self.guard_spec = guard or guard_spec(
            captured.declared, captured.store, torch.device(options.device).type, tuple(captured.traced_under)
        )
        self.guard = make_guard(self.guard_spec)
        self._reference = ReferenceExecutor(captured.graph)
        self._tensor_names = [v.name for v in captured.declared]
        self._outputs = OutputBuilder(captured.out_spec)  # the model's output structure
        self.native = native
        if native is not None:  # loaded from an artifact
            self.backend = CPU_BACKEND
            self._run = native.program
        elif options.backend == "reference":
            self.backend = REFERENCE_BACKEND
            self._run = self._reference.run
        elif options.backend == "cpu":
            from symfuse.codegen.compile import compile_program

            self.native = compile_program(captured.graph, captured.store, options)
            self.backend = CPU_BACKEND
            self._run = self.native.program
        elif options.backend == "triton":
            from symfuse.codegen.gpu.compile import compile_gpu

            self.native = compile_gpu(captured.graph, captured.store, options)
            self.backend = GPU_BACKEND
            self._run = self.native.program
        else:
            raise ValueError(f"unknown backend {options.backend!r}; symfuse has 'cpu', 'triton' and 'reference'")

    @property
    def symbols(self) -> list[str]:
        return list(self.store.symbols)

    def _inputs(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        names = self.captured.input_names
        if len(args) > len(names):
            raise ValueError(f"expected at most {len(names)} inputs ({', '.join(names)}), got {len(args)} positional")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise ValueError(f"unexpected input '{k}'; the compiled model takes {', '.join(names)}")
            if k in given:
                raise ValueError(f"input '{k}' given twice")
            given[k] = v
        for k, v in self.captured.fixed.items():
            if k in given and given[k] != v:
                raise ValueError(f"input '{k}' was {v!r} when the model was compiled and is fixed; got {given[k]!r}")
        missing = [k for k in self._tensor_names if k not in given]
        if missing:
            raise ValueError(f"missing input(s) {', '.join(missing)}")
        return [given[k] for k in self._tensor_names]

    def bind(self, *args, **kwargs) -> dict[str, int]:
        """Check inputs and return the value of every symbol, without running."""
        return self.guard(self._inputs(args, kwargs))

    def __call__(self, *args, **kwargs):
        tensors = self._inputs(args, kwargs)
        binding = self.guard(tensors)
        with torch.no_grad():
            outs = self._run(tensors, binding) if self.native else self._run(binding, tensors)
        return self._outputs(outs)

    def profile(self, on_node, *args, **kwargs):
        """Run once on the reference executor, calling `on_node(node, inputs, outputs, seconds)`
        after every op."""
        tensors = self._inputs(args, kwargs)
        binding = self.guard(tensors)
        with torch.no_grad():
            outs = self._reference.run(binding, tensors, on_node=on_node)
        return self._outputs(outs)

    def explain(self, *, with_graph: bool = True, with_te: bool = False) -> str:
        return _explain(
            self.graph,
            self.store,
            backend=self.backend,
            notes=self.captured.notes,
            traced=self.guard_spec.traced,
            with_graph=with_graph,
            with_te=with_te,
            native=self.native,
        )

    def memory(self) -> dict[str, int | None]:
        """The native program's workspace (intermediates packed by lifetime, one per calling
        thread): `high_water` (largest a call needed), `held` (bytes kept now), `cap`."""
        p = self.native.program if self.native else None
        if p is None:
            return {"high_water": 0, "held": 0, "cap": None}
        return {"high_water": p.workspace_high_water, "held": p.workspace_bytes, "cap": p.workspace_cap}

    def release_workspace(self) -> int:
        """Free the workspaces kept between calls (after a burst of large inputs); returns bytes."""
        return self.native.program.release_workspace() if self.native else 0

    def cap_workspace(self, nbytes: int | None) -> None:
        """Keep at most `nbytes` of workspace per thread between calls (None: no cap); a call
        needing more allocates for itself and frees it when it ends."""
        if self.native:
            self.native.program.workspace_cap = nbytes
            if nbytes is not None:
                self.release_workspace()

    def save(self, path: str) -> str:
        """Write this module to the folder `path`; `symfuse.load(path)` runs it in any process,
        without the model's code (`symfuse.artifact`)."""
        from symfuse.artifact import save

        if self.options.backend == "triton":
            raise NotImplementedError(
                "saving a GPU (triton) program is not supported yet: compile the model on the GPU machine, "
                "or save a CPU compilation (device='cpu')"
            )
        return save(self, path)

    def __repr__(self) -> str:
        return f"<symfuse.CompiledModule {self.graph.name} symbols={self.symbols} backend='{self.backend}'>"


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


def compile(  # noqa: A001
    model: Any, example_inputs: Any = None, dynamic: Any = None, *, backend: str | None = None, **options
) -> CompiledModule:
    """Compile `model` once for all bindings of its dynamic dims.

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
    if is_onnx(model):
        if example_inputs is not None:
            raise ValueError("an ONNX model needs no example inputs; pass `dynamic` to rename or bound its dims")
        captured = capture_onnx(model, dynamic)
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
    return CompiledModule(captured, opts)
