"""Running a compiled GPU program: Triton launches, torch's GEMMs, CUDA graphs.

Like `program.py` it imports nothing from the compiler: it gets the host function's source,
the Triton kernels and the prepared tensors. `launch` picks a kernel's version per call
(BLOCK, the chunk of a row, from the row length; BLOCK_R rows per program so a program
always covers about 1024 elements). On a CUDA device a binding seen twice is captured into
a CUDA graph and replayed from then on: the host's Python and every launch's overhead go,
which at small shapes is most of the time. Graphs are kept for the most recent bindings
only (least recently used dropped), so memory stays bounded.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F

from symfuse.runtime.program import HostProgram, Workspaces, _view, slot_error

ELEMENTS_PER_PROGRAM = 1024


def block_sizes(length: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK) for rows of `length` elements: BLOCK a power of two from 16 to 1024."""
    block = min(max(16, 1 << max(0, int(length) - 1).bit_length()), ELEMENTS_PER_PROGRAM)
    return max(1, ELEMENTS_PER_PROGRAM // block), block


def launch(kernel, rows: int, length: int, *args) -> None:
    if rows <= 0:
        return
    block_r, block = block_sizes(length)
    kernel[((rows + block_r - 1) // block_r,)](*args, rows, BLOCK_R=block_r, BLOCK=block)


def _in_layout(x: torch.Tensor, shape: tuple, strides: tuple) -> torch.Tensor:
    """`x` itself where it already has the buffer's strides (dims of size 1 aside), else a copy
    at those strides."""
    if all(n == 1 or a == b for n, a, b in zip(shape, x.stride(), strides)):
        return x
    return torch.empty_strided(shape, strides, dtype=x.dtype, device=x.device).copy_(x)


def _conv(x, w, bias, stride, padding, dilation, groups):
    return F.conv2d(x, w, bias, stride, padding, dilation, groups)


class GpuProgram(HostProgram):
    def __init__(
        self,
        source: str,
        kernels: dict[str, object],
        tensors: dict[str, torch.Tensor],
        functions: dict[str, object],
        describe: Callable[[int], str],
        device: torch.device,
        max_graphs: int = 16,
    ) -> None:
        self.source = source
        self.device = device
        self.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "Triton interpreter"
        self.workspaces = Workspaces(device)
        self._kernels = kernels
        self.max_graphs = max_graphs
        self.graphs_enabled = device.type == "cuda" and max_graphs > 0
        self._graphs: OrderedDict[tuple, tuple] = OrderedDict()  # binding -> (graph, static inputs, outputs, err)
        self._seen: OrderedDict[tuple, bool] = OrderedDict()  # bindings called once, without a graph yet
        self._graph_lock = threading.Lock()
        self._last_err = threading.local()

        class Kernels:
            pass

        ks = Kernels()
        for name, k in kernels.items():
            setattr(ks, name, k)

        def new_error_slot(*_symbols) -> torch.Tensor:
            """This call's error slot on the device: (index, extent, site) of a bad gather index."""
            err = torch.full((3,), -1, dtype=torch.int64, device=device)
            self._last_err.value = err
            return err

        def check(err: torch.Tensor | None) -> None:
            if err is None:  # no kernel gathers
                return
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return  # checked after each replay
            index, extent, site = err.tolist()
            if site >= 0:
                raise slot_error(index, extent, describe(site))

        def now() -> float:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter()

        from symfuse.runtime.kv_triton import paged_attention_gpu  # (imports triton)

        ns = {
            "workspace": self.workspaces.get,
            "Sym": new_error_slot,
            "paged": paged_attention_gpu,
            "k": ks,
            "check": check,
            "launch": launch,
            "empty_strided": lambda shape, strides, dtype: torch.empty_strided(
                shape, strides, dtype=dtype, device=device
            ),
            "as_strided": torch.as_strided,
            "view": _view,
            "linear": F.linear,
            "matmul": torch.matmul,
            "conv": _conv,
            "in_layout": _in_layout,
            "sdpa": F.scaled_dot_product_attention,
            "torch": torch,
            "now": now,
            **tensors,
            **functions,
        }
        exec(compile(source, "<symfuse host>", "exec"), ns)  # noqa: S102
        self._ns = ns
        self._check = check
        self.kernels = ks
        self._run = ns["run"]
        self._run_timed = ns["run_timed"]

    def versions(self) -> int:
        """Triton kernel versions compiled so far (a kernel and a BLOCK choice each)."""
        total = 0
        for k in self._kernels.values():
            for cache in getattr(k, "device_caches", {}).values():
                total += len(cache[0])
        return total

    def graph_shapes(self) -> list[str]:
        return [", ".join(f"{s}={v}" for s, v in key) for key in self._graphs]

    def __call__(self, inputs: list[torch.Tensor], binding: dict[str, int]) -> list[torch.Tensor]:
        with torch.no_grad():
            if not self.graphs_enabled:
                return self._run(inputs, binding)
            return self._graphed(inputs, binding)

    def _graphed(self, inputs: list[torch.Tensor], binding: dict[str, int]) -> list[torch.Tensor]:
        key = tuple(binding.items())
        with self._graph_lock:
            entry = self._graphs.get(key)
            first = entry is None and self._seen.pop(key, False) is False
            if first:  # remembered for its second call; bindings seen once are bounded too
                self._seen[key] = True
                while len(self._seen) > 4 * self.max_graphs:
                    self._seen.popitem(last=False)
        if entry is None and (first or torch.cuda.is_current_stream_capturing()):
            return self._run(inputs, binding)  # the first call also compiles what it needs; no lock held
        with self._graph_lock:
            entry = self._graphs.get(key)  # (another thread may have captured it meanwhile)
            if entry is None:
                entry = self._graphs[key] = self._capture(inputs, binding)
                while len(self._graphs) > self.max_graphs:
                    self._graphs.popitem(last=False)
            self._graphs.move_to_end(key)
            graph, static, outs, err = entry
            for s, x in zip(static, inputs):
                s.copy_(x)
            graph.replay()
            result = [o.clone() for o in outs]
            if err is not None:
                self._check(err)
            return result

    def _capture(self, inputs: list[torch.Tensor], binding: dict[str, int]) -> tuple:
        static = [x.clone() for x in inputs]
        self._last_err.value = None
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._run(static, binding)  # warm up off the main stream, as capture wants
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        self.workspaces.keep = False  # the workspace of a captured call belongs to its graph
        try:
            with torch.cuda.graph(graph):
                self._last_err.value = None
                outs = self._run(static, binding)
                err = self._last_err.value
        finally:
            self.workspaces.keep = True
        return graph, static, outs, err
