"""Reduced-precision storage, shared by the CPU and GPU backends.

With `precision="bf16"` (or `"fp16"` on a GPU) every float32 buffer of the schedule, the
constants included, is stored in the half-width type; kernels load it into float32, compute
in float32 and round once when they store; library GEMMs and attention take the half-width
operands and accumulate in float32. Float inputs are rounded on entry and float outputs
widened back to float32 on return, so a caller sees the same dtypes as at fp32.
"""

from __future__ import annotations

import re

import torch

from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Graph
from symfuse.schedule.steps import Schedule

PRECISIONS = {"fp32": DType.float32, "fp16": DType.float16, "bf16": DType.bfloat16}


def half_storage(sched: Schedule, dtype: DType) -> dict[str, DType]:
    """Store every float32 buffer in `dtype` (fp16/bf16); returns what changed."""
    if dtype is DType.float32:
        return {}
    changed = {}
    for name, buf in sched.buffers.items():
        if buf.dtype is DType.float32:
            buf.dtype = dtype
            changed[name] = dtype
    return changed


def cast_boundary(source: str, graph: Graph, storage: dict[str, DType]) -> str:
    """Float inputs are cast to the storage precision on entry, float outputs back on every
    return (the one C++ call's and the steps')."""
    for i, v in enumerate(graph.inputs):
        if v.name in storage:
            torch_dt = storage[v.name].torch
            source = source.replace(
                f"t_{v.name} = inputs[{i}].contiguous()", f"t_{v.name} = inputs[{i}].to({torch_dt}).contiguous()"
            )
    lines = source.split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("return ["):
            for v in graph.outputs:
                if v.name in storage:
                    line = re.sub(rf"\bt_{v.name}\b(?!\.float)", f"t_{v.name}.float()", line)
            lines[i] = line
    return "\n".join(lines)


# bf16 instructions the CPU backend's GEMMs (oneDNN) multiply with; without them oneDNN
# widens bf16 to float32 inside its kernels, which makes bf16 no faster than fp32
BF16_INSTRUCTIONS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_missing(target, library_limits: tuple[tuple[str, str], ...]) -> str:
    """Why bf16 would not be faster than fp32 on `target` ('' when it would)."""
    if not any(e in target.extensions for e in BF16_INSTRUCTIONS):
        return (
            f"this CPU ({target.cpu}) has no bf16 multiply instructions ({' or '.join(BF16_INSTRUCTIONS)}) "
            f"that {target.isa} code may use"
        )
    limit = dict(library_limits).get("ONEDNN_MAX_CPU_ISA", "")
    if limit and "BF16" not in limit.upper() and "AMX" not in limit.upper() and limit.upper() != "ALL":
        return f"oneDNN is held to {limit} (ONEDNN_MAX_CPU_ISA), below its bf16 kernels"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "torch's oneDNN has no bf16 GEMMs on this CPU"
    return ""
