"""A native program as the runtime holds it: the built library, its host code, its tensors.

`link` puts a built kernel library, the host code generated with it and the tensors it reads
together into a `Program`; `Backend` is that program with what it came from (target, switch
points, host code). The compiler makes one after building; an artifact makes one when it is
loaded, without the compiler. The stages before the C++ (TEs, plan, schedule) are made again
only when `explain` asks for them, through `regenerate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from symfuse.options import library_kind
from symfuse.runtime.code import HostCode, Tile
from symfuse.runtime.program import ConvWeights, OneDNNWeights, Program
from symfuse.runtime.switches import ROWS, Threshold
from symfuse.runtime.target import Target


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
    generated: Any = None  # codegen's `Generated`: TEs, plan, schedule, kernel sources
    regenerate: Callable[[], Any] | None = None  # makes `generated` when it is first asked for
    artifact: str = ""  # the folder it was loaded from, if it was
    precision_note: str = ""  # why the precision asked for is not the one that runs, if it is not

    @property
    def gen(self) -> Any:
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


def stored(t: torch.Tensor, precision: str) -> torch.Tensor:
    """A float32 constant as a program of `precision` stores it."""
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    return t.to(dtype) if t.dtype == torch.float32 and dtype is not torch.float32 else t


def link(
    host: HostCode,
    library: str,
    n_symbols: int,
    consts: dict[str, torch.Tensor],
    panels: dict[str, torch.Tensor],
    gathers: list[str],
    thresholds: dict[str, Threshold],
    functions: dict[str, tuple],
    caller: Callable | None = None,
) -> Program:
    """Put a built library, its host code and the tensors it reads together: constants by value
    name, the row kernel's packed panels; oneDNN's copies are made at first use. `functions`:
    the host's torch-run functions by namespace name (`codegen.host.opaque_functions`)."""
    tensors = {k: stored(consts[v], host.precision).contiguous() for k, v in host.constants.items()}
    tensors.update(panels)
    tensors["conv_weight"] = ConvWeights({v: stored(consts[v], host.precision) for v in host.conv_weights})
    tensors["W"] = OneDNNWeights({k: stored(consts[v], host.precision) for k, v in host.packed.items()})

    def describe(i: int) -> str:
        return gathers[i] if 0 <= i < len(gathers) else f"gather #{i}"

    values = {name: th.value for name, th in thresholds.items()}
    run = 4 + len(host.run.params) if host.run else 0
    return Program(host.source, library, host.kernels, n_symbols, tensors, functions, describe, values, caller, run)
