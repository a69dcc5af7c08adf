"""The GPU backend: the same TE program, fusion plan and schedule as the CPU backend, then
Triton kernels, library GEMMs (cuBLAS through torch) and host code that launches them.

Only code generation and the launch differ from `codegen/compile.py`: a native step becomes
a Triton kernel (`kernel.py`), a linear layer `torch.nn.functional.linear`, a batched
product `torch.matmul` on strided views, merged attention torch's fused attention (flash
attention on the GPU) or its three steps. With `precision="fp16"|"bf16"` every float32
buffer but the inputs and outputs is stored in half precision; kernels compute in float32
and GEMMs accumulate in float32.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import time
from dataclasses import dataclass, field

import torch

from symfuse.codegen.cache import cache_folder
from symfuse.codegen.gpu.kernel import PRELUDE, TritonSource, emit_triton
from symfuse.codegen.host import HostGenerator, opaque_functions
from symfuse.codegen.precision import PRECISIONS, cast_boundary, half_storage
from symfuse.codegen.stages import dump_stages, share
from symfuse.errors import CodegenError
from symfuse.fusion.plan import Plan, plan
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Graph
from symfuse.options import Options
from symfuse.runtime.code import HostCode
from symfuse.runtime.gpu import GpuProgram
from symfuse.schedule.attention import AttentionStep, find_step, merge_attention
from symfuse.schedule.layout import View
from symfuse.schedule.steps import GemmStep, NativeStep, Schedule
from symfuse.schedule.steps import build as build_schedule
from symfuse.shape.store import ShapeStore
from symfuse.te.analysis import analyse
from symfuse.te.lower import TEProgram, lower
from symfuse.te.scalar import POSTOPS


class _GpuHost(HostGenerator):
    """Host code for the GPU: Triton launches, torch's GEMMs, the same memory plan."""

    native_symbols = False  # Triton kernels take `sym` itself (a device tensor)

    def kernel_call(self, src: TritonSource, fn: str, rows: str) -> str:
        length = ", ".join(dict.fromkeys(self.py(e) for e in src.extents)) or "1"
        args = [("sym" if n == "sf_err" else self.ref(n)) for n in src.args] + [f"s_{s}" for s in src.symbols]
        return f"launch(k.{fn}, {rows}, max({length}, 1), {', '.join(args)})"

    def gemm(self, st: GemmStep) -> list[str]:
        out = []
        act = ""
        if st.postop:  # the activation's reference from the scalar vocabulary, after torch's GEMM
            attr, algo = st.postop
            name = next(f for f, p in POSTOPS.items() if p == attr)
            fn = f"op_act_{name}" + (f"_{algo}" if algo else "")
            self.code.recipes[fn] = ("op", name, {"approximate": algo or "none"} if name == "gelu" else {})
            act = f"t_{st.out} = {fn}[0](t_{st.out}, **{fn}[1](b))"
        if st.weight is not None:
            bias = self.ref(st.bias) if st.bias else "None"
            out.append(f"t_{st.out} = linear({self.view(st.a)}, {self.ref(st.weight)}, {bias}){self.reshaped(st)}")
        elif st.conv is not None:
            pad, stride, dil, groups = st.conv
            x, w = self.ref(st.a.buffer), self.ref(st.b.buffer)
            bias = self.ref(st.bias) if st.bias else "None"
            out.append(f"t_{st.out} = conv({x}, {w}, {bias}, {list(stride)}, {list(pad)}, {list(dil)}, {groups})")
        else:
            out += self.batched(st)
        if act:
            out.append(act)
        if st.conv is not None:
            out.append(f"t_{st.out} = t_{st.out}.contiguous()")
        if st.epilogue is not None:
            out += self.native(st.epilogue)
        return out

    def attention(self, st: AttentionStep) -> list[str]:
        """torch's fused attention (flash attention on the GPU) when the row kernel is exactly
        attention's scale, mask and safe softmax; else its three steps."""
        if st.library is None:
            out = []
            for part in (st.scores, st.softmax, st.context):
                out += self.gemm(part) if isinstance(part, GemmStep) else self.native(part)
            return out

        q, kt, v = st.scores.a, st.scores.b, st.context.b
        k = View(kt.buffer, kt.sizes[:-2] + kt.sizes[::-1][:2], kt.strides[:-2] + kt.strides[::-1][:2], kt.offset)
        mask = self.view(st.library.mask) if st.library.mask else "None"
        call = f"sdpa({self.view(q)}, {self.view(k)}, {self.view(v)}, attn_mask={mask}, scale={st.library.scale!r})"
        b = self.s.buffers[st.out]
        # flash attention already returns the [B, S, H, D] order the next GEMM reads: no copy then
        return [f"t_{st.out} = in_layout({call}, {self.tup(b.shape)}, {self.tup(b.strides)})"]


@dataclass
class GpuGenerated:
    te: TEProgram
    plan: Plan
    schedule: Schedule
    kernels: dict[str, TritonSource]
    gathers: list[str]
    host: HostCode
    source: str  # the Triton module
    symbols: list[str]
    storage: dict[str, DType] = field(default_factory=dict)  # float32 buffers stored in half precision


def generate_gpu(graph: Graph, store: ShapeStore, precision: str = "fp32") -> GpuGenerated:
    """Lower, plan, schedule and generate Triton and host code (nothing is compiled or run)."""
    prog = lower(graph)
    analysis = analyse(prog)
    fp = plan(prog, analysis, store)
    sched = merge_attention(build_schedule(prog, analysis, fp))
    symbols = list(store.symbols)
    storage = half_storage(sched, PRECISIONS[precision])
    kernels: dict[str, TritonSource] = {}
    gathers: list[str] = []
    steps = []
    for st in sched.steps:
        if isinstance(st, AttentionStep):
            steps += [st.softmax] if st.library is None else []
        elif isinstance(st, NativeStep):
            steps.append(st)
        elif isinstance(st, GemmStep) and st.epilogue is not None:
            steps.append(st.epilogue)
    for st in steps:
        try:
            kernels[st.name] = emit_triton(st, sched.buffers, symbols, gathers)
        except CodegenError as e:
            sched.notes.append(f"{st.name} runs its tensor expressions through torch: {e}")
    kernels = share(kernels, set(sched.buffers) | {it.name for it in prog.items})
    host = _GpuHost(sched, kernels, symbols).generate()
    if not gathers:  # no error slot to fill or check: no device allocation, no sync per call
        host.source = re.sub(r"sym = Sym\(.*\)", "sym = None", host.source)
    if storage:
        host.source = cast_boundary(host.source, graph, storage)
    source = PRELUDE + "\n\n" + "\n\n".join(k.source for k in kernels.values() if not k.function) + "\n"
    return GpuGenerated(prog, fp, sched, kernels, gathers, host, source, symbols, storage)


@dataclass
class GpuBackend:
    """A compiled GPU program and what it came from (for `explain`)."""

    program: GpuProgram
    device: str
    precision: str
    gen: GpuGenerated
    module_path: str
    seconds: dict[str, float] = field(default_factory=dict)

    te = property(lambda self: self.gen.te)
    plan = property(lambda self: self.gen.plan)
    schedule = property(lambda self: self.gen.schedule)
    kernels = property(lambda self: self.gen.kernels)

    def explain_lines(self) -> list[str]:
        steps = self.schedule.steps
        p = self.program
        out = [
            f"\ndevice: {self.device} ({p.device_name}); precision {self.precision}"
            + (
                " (float32 inputs and outputs, half-precision storage, float32 math)"
                if self.precision != "fp32"
                else ""
            ),
            f"triton kernels: {len(self.kernels)} steps, {len({k.function or k.name for k in self.kernels.values()})} "
            f"distinct (module {self.module_path}); versions compiled so far: {p.versions()}",
            "  each kernel: BLOCK_R rows x BLOCK columns per program; BLOCK picked per call from the row length "
            "(power of two, 16 to 1024), longer rows walked in chunks",
        ]
        launches = 0
        out.append(f"\nexecution ({len(steps)} steps; every size a run-time symbol):")
        for st in steps:
            if isinstance(st, AttentionStep):
                if st.library:
                    launches += 1
                    what = "torch's fused attention (flash where the GPU has it; copied only if its layout differs)"
                else:
                    launches += 2 + (st.softmax.name in self.kernels)
                    what = "the three steps (torch.matmul, Triton, torch.matmul)"
                out.append(f"  {st.name}: attention ({st.scores.name} + {st.softmax.name} + {st.context.name}): {what}")
            elif isinstance(st, NativeStep):
                how = "Triton" if st.name in self.kernels else "tensor expressions through torch (no Triton for them)"
                launches += 1
                out.append(f"  {st.name}: {how} [{st.kind}] writes {', '.join(st.outputs)}")
            elif isinstance(st, GemmStep):
                lib = (
                    "cuBLAS linear"
                    if st.weight
                    else ("cuDNN convolution" if st.conv else "cuBLAS matmul (strided views)")
                )
                launches += 1 + (st.epilogue is not None) + (st.postop is not None)
                if st.postop:
                    lib += f", then {st.postop[0]}"
                epi = f"; epilogue {st.epilogue.name} (Triton over the GEMM's output)" if st.epilogue else ""
                out.append(f"  {st.name}: {lib}{epi}")
            else:
                launches += 1
                out.append(f"  {st.name}: torch reference of {st.node.op} (no TE lowering)")
        out.append(f"launches per call: {launches} (before CUDA graphs)")
        if p.graphs_enabled:
            shapes = p.graph_shapes()
            out.append(
                f"CUDA graphs: one per binding seen twice, at most {p.max_graphs} kept (least recently used dropped); "
                f"captured now: {', '.join(shapes) if shapes else 'none'}"
            )
        out += [f"  note: {n}" for n in self.schedule.notes]
        out.append("compile time: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items()))
        return out


def write_module(source: str, opts: Options) -> str:
    """The Triton module as a file (Triton reads a kernel's source from its file), by content hash."""
    folder = os.path.join(cache_folder(opts.kernel_cache), "triton")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    path = os.path.join(folder, f"sf_{digest}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    return path


def load_module(path: str):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_gpu(graph: Graph, store: ShapeStore, opts: Options) -> GpuBackend:
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    gen = generate_gpu(graph, store, opts.precision)
    t["lower, plan, schedule, generate Triton and host code"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    path = write_module(gen.source, opts)
    module = load_module(path)
    t["load the Triton module"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    device = torch.device(opts.device)
    host = gen.host
    consts = {v.name: tensor for v, tensor in graph.constants.items()}
    tensors = {}
    for k, v in host.constants.items():
        dt = gen.storage.get(v)
        tensors[k] = consts[v].to(device=device, dtype=dt.torch if dt else None).contiguous()
    t["weights to the device"] = time.perf_counter() - t0

    def describe(i: int) -> str:
        return gen.gathers[i] if 0 <= i < len(gen.gathers) else f"gather #{i}"

    functions = opaque_functions(host.recipes, lambda name: find_step(gen.schedule, name))
    kernels = {name: getattr(module, name) for name in host.kernels}
    program = GpuProgram(host.source, kernels, tensors, functions, describe, device, opts.cuda_graphs)
    if opts.dump_dir:
        dump_stages(opts.dump_dir, graph, gen.te, gen.plan, ("4_kernels_triton.py", gen.source), host.source)
    return GpuBackend(program, str(device), opts.precision, gen, path, t)
