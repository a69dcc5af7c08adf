"""The run-time module: what `symfuse.compile` returns and `symfuse.load` gives back.

A `CompiledModule` is a program and what its calls need: the input signature, the guard that
binds every symbol from the inputs (a clear error on a bad input), the program that runs a
binding, and the builder of the model's output structure. The compiler makes one; an
artifact makes one again without the compiler. What only the compiler knows (the graph, its
shape facts, how to explain the program) comes through a `Source`, asked for on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils import _pytree as pytree

from symfuse.runtime.artifact import save
from symfuse.runtime.guard import GuardSpec, make_guard
from symfuse.runtime.outputs import OutputBuilder

# what runs a module, as `CompiledModule.backend` and `explain` say it, by `Options.backend`
BACKENDS = {
    "reference": "reference executor (each op runs through its PyTorch reference)",
    "cpu": "cpu (generated C++ kernels with OpenMP and SIMD, oneDNN and torch.matmul for GEMMs)",
    "triton": "triton (generated Triton kernels, cuBLAS through torch for GEMMs, CUDA graphs per binding)",
}


@dataclass(frozen=True)
class Signature:
    """How a compiled module is called and what it returns."""

    name: str  # the model's
    input_names: tuple[str, ...]  # forward's parameters, in order (tensors and fixed values)
    tensor_names: tuple[str, ...]  # the tensor inputs, in the order the program takes them
    fixed: dict[str, Any]  # non-tensor inputs, fixed at their compile-time value
    out_spec: pytree.TreeSpec  # the model's output structure


class Source(Protocol):
    """What a module came from, for `explain`, `profile` and the compile-time state."""

    def captured(self) -> Any: ...  # frontend's Captured: graph, shape facts, notes

    def explain(self, module: CompiledModule, with_graph: bool, with_te: bool) -> str: ...

    def reference(self, module: CompiledModule, binding: dict[str, int], tensors: list, on_node) -> list: ...


class CompiledModule:
    """A model compiled once for every binding of its symbolic dims.

    `backend`: what runs it (native code, Triton kernels, or the reference executor);
    `native`: the native program (`runtime.native.Backend`), None for the reference executor;
    `run(tensors, binding)`: one call."""

    def __init__(
        self,
        signature: Signature,
        guard_spec: GuardSpec,
        symbols: list[str],
        run: Callable[[list, dict], list],
        source: Source,
        options: Any,
        backend: str,
        native: Any = None,
    ) -> None:
        self.signature = signature
        self.guard_spec = guard_spec
        self.guard = make_guard(guard_spec)
        self.symbols = list(symbols)
        self.options = options
        self.backend = backend
        self.native = native
        self._run = run
        self._source = source
        self._outputs = OutputBuilder(signature.out_spec)
        self._captured = None

    # -- what the compiler knew: asked for on first use (a loaded artifact reads it then) ------
    @property
    def captured(self):
        if self._captured is None:
            self._captured = self._source.captured()
        return self._captured

    graph = property(lambda self: self.captured.graph)
    store = property(lambda self: self.captured.store)

    # -- calls ------------------------------------------------------------------------------
    def _inputs(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        names = self.signature.input_names
        if len(args) > len(names):
            raise ValueError(f"expected at most {len(names)} inputs ({', '.join(names)}), got {len(args)} positional")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise ValueError(f"unexpected input '{k}'; the compiled model takes {', '.join(names)}")
            if k in given:
                raise ValueError(f"input '{k}' given twice")
            given[k] = v
        for k, v in self.signature.fixed.items():
            if k in given and given[k] != v:
                raise ValueError(f"input '{k}' was {v!r} when the model was compiled and is fixed; got {given[k]!r}")
        missing = [k for k in self.signature.tensor_names if k not in given]
        if missing:
            raise ValueError(f"missing input(s) {', '.join(missing)}")
        return [given[k] for k in self.signature.tensor_names]

    def bind(self, *args, **kwargs) -> dict[str, int]:
        """Check inputs and return the value of every symbol, without running."""
        return self.guard(self._inputs(args, kwargs))

    def __call__(self, *args, **kwargs):
        tensors = self._inputs(args, kwargs)
        binding = self.guard(tensors)
        with torch.no_grad():
            outs = self._run(tensors, binding)
        return self._outputs(outs)

    def profile(self, on_node, *args, **kwargs):
        """Run once on the reference executor, calling `on_node(node, inputs, outputs, seconds)`
        after every op."""
        tensors = self._inputs(args, kwargs)
        binding = self.guard(tensors)
        with torch.no_grad():
            outs = self._source.reference(self, binding, tensors, on_node)
        return self._outputs(outs)

    def explain(self, *, with_graph: bool = True, with_te: bool = False) -> str:
        return self._source.explain(self, with_graph, with_te)

    # -- memory -----------------------------------------------------------------------------
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
        without the model's code (`symfuse.runtime.artifact`)."""
        if self.options.backend == "triton":
            raise NotImplementedError(
                "saving a GPU (triton) program is not supported yet: compile the model on the GPU machine, "
                "or save a CPU compilation (device='cpu')"
            )
        return save(self, path)

    def __repr__(self) -> str:
        return f"<symfuse.CompiledModule {self.signature.name} symbols={self.symbols} backend='{self.backend}'>"
