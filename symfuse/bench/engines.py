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


def flat_outputs(out: Any) -> list:
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


class Engine:
    name = ""
    requires: tuple[str, ...] = ()

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

    def prepare(self, case, workdir):
        import symfuse

        self._symfuse = symfuse
        self.compiled = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
        self._base = symfuse.compile_count()
        return lambda inputs: flat_outputs(self.compiled(**inputs))

    def recompiles(self):
        return self._symfuse.compile_count() - self._base


class TorchCompile(Engine):
    name = "torch-compile"
    freezing = False

    def prepare(self, case, workdir):
        import torch._dynamo
        import torch._inductor.config

        torch._inductor.config.freezing = self.freezing
        self._counters = torch._dynamo.utils.counters
        fn = torch.compile(case.model, dynamic=True)

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


def export_onnx(case, path: str) -> list[str]:
    """Export with dynamic axes; returns the input names.

    The torch.export-based exporter comes first; where it fails (its decompositions break
    on some models, T5 among them) the TorchScript exporter is tried, with the same axes.
    """
    import sys

    from torch.export import Dim

    example = case.inputs(**case.example)
    tensors = {k: v for k, v in example.items() if isinstance(v, torch.Tensor)}
    dyn = {k: ({d: Dim.AUTO for d in case.dynamic.get(k, {})} if k in tensors else None) for k in example}
    try:
        prog = torch.onnx.export(case.model, (), kwargs=example, dynamic_shapes=dyn, dynamo=True, verbose=False)
        prog.save(path)
    except Exception as first:  # noqa: BLE001
        print(
            f"torch.export-based ONNX export failed ({type(first).__name__}); trying the TorchScript exporter",
            file=sys.stderr,
        )
        axes = {
            k: {d: s if isinstance(s, str) else s.__name__ for d, s in case.dynamic.get(k, {}).items()} for k in tensors
        }
        torch.onnx.export(
            case.model,
            (),
            path,
            kwargs=tensors,
            input_names=list(tensors),
            dynamic_axes=axes,
            dynamo=False,
            opset_version=17,
        )
    return list(tensors)


class OnnxRuntime(Engine):
    name = "onnxruntime"
    requires = ("onnxruntime", "onnxscript")

    def recompiles(self):
        return 0  # one session serves every shape of the dynamic axes

    def prepare(self, case, workdir):
        import onnxruntime as ort

        path = os.path.join(workdir, f"{case.name}.onnx")
        names = export_onnx(case, path)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

        def run(inputs):
            return sess.run(None, {k: inputs[k].numpy() for k in names})

        return run


class OpenVino(Engine):
    name = "openvino"
    requires = ("openvino", "onnxscript")

    def recompiles(self):
        return 0  # one compiled model serves every shape of the dynamic axes

    def prepare(self, case, workdir):
        import openvino as ov

        path = os.path.join(workdir, f"{case.name}.onnx")
        names = export_onnx(case, path)
        core = ov.Core()
        # fp32 throughout: on CPUs with bf16 OpenVINO would otherwise compute in bf16
        compiled = core.compile_model(
            core.read_model(path), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
        )
        request = compiled.create_infer_request()

        def run(inputs):
            res = request.infer({k: inputs[k].numpy() for k in names})
            return [res[o] for o in compiled.outputs]

        return run


ENGINES: dict[str, type[Engine]] = {
    e.name: e for e in (Symfuse, Eager, TorchCompile, TorchCompileFreezing, OnnxRuntime, OpenVino)
}
PEERS = [n for n in ENGINES if n != "symfuse"]
