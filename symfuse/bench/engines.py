"""The engines a benchmark compares. Each one runs inside a worker process of its own.

An engine turns a model and example inputs into a callable taking the same keyword
inputs and returning a flat list of output tensors (or arrays). `requires` lists the
modules it needs; a missing one makes the engine "not installed", not a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from symfuse.models import export_onnx


def flat_outputs(out: Any) -> list:
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


class Engine:
    name = ""
    requires: tuple[str, ...] = ()
    note = ""  # what the report says of the engine as prepared (the precision it chose, ...)

    def prepare(self, case, workdir: str) -> Callable[[dict], list]:
        raise NotImplementedError

    def recompiles(self) -> int | None:
        """Compilations after the first, or None where the engine has no such notion."""
        return None


class Eager(Engine):
    name = "eager"

    def prepare(self, case, workdir):
        model = case.model

        def run(inputs):
            with torch.no_grad():
                return flat_outputs(model(**inputs))

        return run


class Symfuse(Engine):
    name = "symfuse"
    precision = "fp32"

    def options(self, workdir: str) -> dict:
        """`symfuse.compile`'s options beside the precision."""
        return {}

    def prepare(self, case, workdir):
        import symfuse

        self._symfuse = symfuse
        ex = case.inputs(**case.example)
        self.compiled = symfuse.compile(case.model, ex, case.dynamic, precision=self.precision, **self.options(workdir))
        self._base = symfuse.compile_count()
        return lambda inputs: flat_outputs(self.compiled(**inputs))

    def recompiles(self):
        return self._symfuse.compile_count() - self._base


class SymfuseFresh(Symfuse):
    """symfuse's first compile on a fresh machine: an empty kernel cache and machine folder
    (no target detected, no switch point measured), what a new container or CI job pays; its
    compile time beside `symfuse`'s, which finds them warm."""

    name = "symfuse-fresh"

    def options(self, workdir):
        return {
            "cache_dir": os.path.join(workdir, "fresh-kernels"),
            "machine_dir": os.path.join(workdir, "fresh-machine"),
        }


class SymfuseBf16(Symfuse):
    """symfuse with precision="bf16" (fp32 where the CPU has no bf16 instructions: see explain)."""

    name = "symfuse-bf16"
    precision = "bf16"


class SymfuseOnnx(Symfuse):
    """symfuse importing the model's ONNX export (`symfuse bench --from onnx`)."""

    name = "symfuse-onnx"
    requires = ("onnxscript",)

    def prepare(self, case, workdir):
        import symfuse

        path = os.path.join(workdir, f"{case.name}.onnx")
        names = export_onnx(case, path)
        self._symfuse = symfuse
        self.compiled = symfuse.compile(path)
        self._base = symfuse.compile_count()
        return lambda inputs: flat_outputs(self.compiled(**{k: inputs[k] for k in names}))


class TorchCompile(Engine):
    name = "torch-compile"
    freezing = False
    mode: str | None = None
    cpp_wrapper = False

    def prepare(self, case, workdir):
        import torch._dynamo
        import torch._inductor.config

        torch._inductor.config.freezing = self.freezing
        torch._inductor.config.cpp_wrapper = self.cpp_wrapper
        self._counters = torch._dynamo.utils.counters
        fn = torch.compile(case.model, dynamic=True, mode=self.mode)

        def run(inputs):
            with torch.no_grad():
                return flat_outputs(fn(**inputs))

        run(case.inputs(**case.example))  # compile now, so compile time is measured as such
        self._first = self._graphs()
        return run

    def _graphs(self) -> int:
        return int(self._counters["stats"]["unique_graphs"])

    def recompiles(self):
        return self._graphs() - self._first


class TorchCompileFreezing(TorchCompile):
    name = "torch-compile-freezing"
    freezing = True


class TorchCompileMaxAutotune(TorchCompile):
    """Inductor at its most: `mode="max-autotune"` (GEMM templates benchmarked against the
    library's), freezing and the C++ wrapper (`cpp_wrapper`: host code in C++, not Python)."""

    name = "torch-compile-max-autotune"
    freezing = True
    mode = "max-autotune"
    cpp_wrapper = True


class OnnxRuntime(Engine):
    name = "onnxruntime"
    requires = ("onnxruntime", "onnxscript")
    optimize = False

    def recompiles(self):
        return 0  # one session serves every shape of the dynamic axes

    def prepare(self, case, workdir):
        import onnxruntime as ort

        path = os.path.join(workdir, f"{case.name}.onnx")
        names = export_onnx(case, path)
        if self.optimize:
            path = transformer_optimized(case.name, path)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

        def run(inputs):
            return sess.run(None, {k: inputs[k].numpy() for k in names})

        return run


def transformer_optimized(name: str, path: str) -> str:
    """The ONNX file through ONNX Runtime's transformer optimizer (`onnxruntime.transformers.
    optimizer`: fused attention, SkipLayerNorm, BiasGelu, ...), as its docs tell BERT and GPT-2
    users to run it; a model it has no type for is optimised as BERT, its generic encoder."""
    from onnxruntime.transformers.optimizer import optimize_model

    kind = "gpt2" if "gpt" in name else "t5" if "t5" in name else "vit" if "vit" in name else "bert"
    out = path.replace(".onnx", "-optimized.onnx")
    optimize_model(path, model_type=kind, num_heads=0, hidden_size=0, opt_level=2).save_model_to_file(out)
    return out


class OnnxRuntimeOptimized(OnnxRuntime):
    """ONNX Runtime on the file its transformer optimizer wrote (`transformer_optimized`)."""

    name = "onnxruntime-optimized"
    optimize = True


class OpenVino(Engine):
    name = "openvino"
    requires = ("openvino", "onnxscript")
    precision = "f32"  # fp32 throughout: on CPUs with bf16 OpenVINO would otherwise compute in bf16

    def recompiles(self):
        return 0  # one compiled model serves every shape of the dynamic axes

    def prepare(self, case, workdir):
        import openvino as ov

        path = os.path.join(workdir, f"{case.name}.onnx")
        names = export_onnx(case, path)
        core = ov.Core()
        config = {"PERFORMANCE_HINT": "LATENCY"}
        if self.precision:
            config["INFERENCE_PRECISION_HINT"] = self.precision
        compiled = core.compile_model(core.read_model(path), "CPU", config)
        used = compiled.get_property("INFERENCE_PRECISION_HINT")
        self.note = f"computes in {used.to_string() if hasattr(used, 'to_string') else used}"
        request = compiled.create_infer_request()

        def run(inputs):
            res = request.infer({k: inputs[k].numpy() for k in names})
            return [res[o] for o in compiled.outputs]

        return run


class OpenVinoBf16(OpenVino):
    """OpenVINO computing in bf16 (`INFERENCE_PRECISION_HINT=bf16`), its default on CPUs with bf16."""

    name = "openvino-bf16"
    precision = "bf16"


class OpenVinoDefault(OpenVino):
    """OpenVINO as a user gets it: no precision hint, so bf16 on CPUs with bf16 or AMX
    instructions and f32 elsewhere (the report's engine notes say which it took)."""

    name = "openvino-default"
    precision = ""


ENGINES: dict[str, type[Engine]] = {
    e.name: e
    for e in (
        Symfuse, SymfuseFresh, SymfuseBf16, SymfuseOnnx, Eager, TorchCompile, TorchCompileFreezing,
        TorchCompileMaxAutotune, OnnxRuntime, OnnxRuntimeOptimized, OpenVino, OpenVinoDefault, OpenVinoBf16,
    )
}  # fmt: skip
PEERS = [n for n in ENGINES if not n.startswith("symfuse")]
