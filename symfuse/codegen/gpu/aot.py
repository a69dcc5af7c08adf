"""Ahead-of-time compilation of the generated Triton kernels for a GPU architecture, with no
GPU or driver present: `triton.compile` lowers each kernel to PTX and a cubin for the
target. CI runs it on every kernel of its test models, so a kernel the GPU compiler would
reject fails on a CPU-only machine. Run it in a process without TRITON_INTERPRET."""

from __future__ import annotations

import time
from dataclasses import dataclass

from symfuse.codegen.gpu.compile import GpuGenerated, load_module, write_module
from symfuse.ir.dtypes import DType
from symfuse.options import Options

SIGNATURE = {
    DType.float32: "*fp32",
    DType.float16: "*fp16",
    DType.bfloat16: "*bf16",
    DType.float64: "*fp64",
    DType.int64: "*i64",
    DType.int32: "*i32",
    DType.int16: "*i16",
    DType.int8: "*i8",
    DType.uint8: "*u8",
    DType.bool: "*i1",
}
VERSIONS = ((64, 16), (1, 1024))  # (BLOCK_R, BLOCK): the shortest and the longest row bucket


@dataclass
class Compiled:
    kernel: str
    block_r: int
    block: int
    seconds: float
    shared: int  # bytes of shared memory
    ptx_lines: int


def compile_ahead(gen: GpuGenerated, arch: int = 90, opts: Options | None = None) -> list[Compiled]:
    """Compile every distinct kernel of `gen` in its shortest- and longest-row versions for
    `sm_{arch}`; raises what Triton raises for a kernel that does not compile."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = load_module(write_module(gen.source, opts or Options.from_env()))
    target = GPUTarget("cuda", arch, 32)
    out = []
    for name, src in gen.kernels.items():
        if src.function:
            continue
        fn = getattr(module, name)
        sig = {}
        for arg in fn.arg_names:
            if arg in ("BLOCK_R", "BLOCK"):
                sig[arg] = "constexpr"
            elif arg == "sf_err":
                sig[arg] = "*i64"
            elif arg.startswith("p_"):
                sig[arg] = SIGNATURE[gen.schedule.buffers[arg[2:]].dtype]
            else:
                sig[arg] = "i32"
        for block_r, block in VERSIONS:
            t0 = time.perf_counter()
            k = triton.compile(ASTSource(fn, sig, {"BLOCK_R": block_r, "BLOCK": block}), target=target)
            out.append(
                Compiled(name, block_r, block, time.perf_counter() - t0, k.metadata.shared, k.asm["ptx"].count("\n"))
            )
    return out
