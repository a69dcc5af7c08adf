"""Which input dims are dynamic, and what they are called.

`dynamic` maps an input name to `{dim index: spec}` where spec is a symbol name (`"seq"`),
a `torch.export.Dim` (its name, min and max are used) or None (static). For positional
inputs a tuple of such dicts, in argument order, is accepted too. The same name on two
dims declares them equal. When `dynamic` is omitted every dim of every tensor input is
dynamic, except the dims the model fixes (channels, hidden sizes), which become static;
such automatic dims are named `<input>_<dim>`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class DimDecl:
    name: str
    lo: int = 1
    hi: float = math.inf
    auto: bool = False  # not declared by the user: static if the model fixes it


def _decl(spec: Any, input_name: str, d: int) -> DimDecl | None:
    if spec is None:
        return None
    if isinstance(spec, str):
        if not spec.isidentifier():
            raise ValueError(f"dynamic dim name {spec!r} for input '{input_name}' dim {d} must be an identifier")
        return DimDecl(spec)
    if isinstance(spec, torch.export.Dim) or type(spec).__name__ in ("Dim", "_Dim", "_DerivedDim"):
        lo = getattr(spec, "min", 1) or 1
        hi = getattr(spec, "max", math.inf)
        hi = math.inf if hi is None or hi >= 2**62 else hi
        return DimDecl(spec.__name__, max(1, lo), hi)
    raise TypeError(
        f"dynamic dim spec for input '{input_name}' dim {d} must be a name, a torch Dim or None, got {spec!r}"
    )


def parse_dynamic(dynamic: Any, inputs: Mapping[str, Any]) -> dict[str, dict[int, DimDecl]]:
    """Normalise the user's `dynamic` argument to {input: {dim: DimDecl}}."""
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    if dynamic is None:
        return {k: {d: DimDecl(f"{k}_{d}", auto=True) for d in range(t.dim())} for k, t in tensors.items()}
    if isinstance(dynamic, (tuple, list)):
        if len(dynamic) > len(inputs):
            raise ValueError(f"dynamic has {len(dynamic)} entries but the model takes {len(inputs)} inputs")
        dynamic = dict(zip(inputs, dynamic))
    if not isinstance(dynamic, Mapping):
        raise TypeError("dynamic must be a dict {input name: {dim: name}}, a tuple of such dicts, or None")
    out: dict[str, dict[int, DimDecl]] = {}
    for name, dims in dynamic.items():
        if name not in inputs:
            raise ValueError(f"dynamic names input '{name}', but the inputs are {', '.join(inputs)}")
        if dims is None:
            continue
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"dynamic names input '{name}', which is not a tensor")
        if not isinstance(dims, Mapping):
            raise TypeError(f"dynamic['{name}'] must be a dict {{dim index: name}}")
        out[name] = {}
        for d, spec in dims.items():
            if not isinstance(d, int) or not -t.dim() <= d < t.dim():
                raise ValueError(f"dynamic['{name}'] names dim {d}, but input '{name}' has rank {t.dim()}")
            decl = _decl(spec, name, d % t.dim())
            if decl is not None:
                out[name][d % t.dim()] = decl
    return out
