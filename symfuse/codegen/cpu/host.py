"""The CPU backend's host code: C++ kernels through ctypes or the kernel caller, the row GEMM
or oneDNN per call from the rows, the merged attention or the library per call from the keys,
and the whole call as one C++ function (`sf_run`) where every step is the library's own."""

from __future__ import annotations

import sympy

from symfuse.codegen.cpu.gemm import activation_code
from symfuse.codegen.cpu.kernel import KernelSource
from symfuse.codegen.cpu.run import native_run
from symfuse.codegen.host import HostGenerator
from symfuse.ir.dtypes import DType
from symfuse.options import library_kind, split_kind, threshold_name
from symfuse.runtime.code import HostCode
from symfuse.runtime.switches import ANY_HEAD, ROWS
from symfuse.schedule.attention import AttentionStep
from symfuse.schedule.channels_last import NHWC
from symfuse.schedule.layout import View, as_matrix, row_major
from symfuse.schedule.steps import GemmStep, Schedule


class CpuHost(HostGenerator):
    def plan_whole_call(self, outputs: list[str]) -> None:
        self.run_outputs = outputs  # sf_run's outputs
        self.code.run, self.code.run_missing = native_run(self, outputs)

    def kernel_call(self, src: KernelSource, fn: str, rows: str) -> str:
        ptrs = ", ".join(self.ptr(n) for n in src.args)
        return f"k.{fn}({ptrs}, sym_p, 0, {rows})"

    def gemm(self, st: GemmStep) -> list[str]:
        out = []
        if st.weight is not None:
            w = f"w_{st.weight}"
            self.code.packed[w] = st.weight
            bias = self.ref(st.bias) if st.bias else "None"
            attr, algo = st.postop or ("none", "")
            library = f"@lib{{{st.out}}} = linear({self.view(st.a)}, W[{w!r}], {bias}, {attr!r}, [], {algo!r})"
            library += self.reshaped(st)
            mat = as_matrix(st.a)
            dtype = self.s.buffers[st.a.buffer].dtype
            rows_fn = {DType.float32: "sf_linear_rows", DType.bfloat16: "sf_linear_rows_bf16"}.get(dtype)
            if mat is None or rows_fn is None or (dtype is DType.bfloat16 and not self.bf16_rows):
                out.append(library)
            else:  # two versions, picked per call from the row count
                rows, lda = mat
                n, k = (int(d) for d in self.s.buffers[st.weight].shape)
                p = f"p_{st.weight}"
                self.code.panels[p] = st.weight
                a = f"{self.ptr(st.a.buffer)} + {self.py(st.a.offset)} * {dtype.torch.itemsize}"
                b = self.ptr(st.bias) if st.bias else "None"
                act = activation_code(st.postop)
                kind = "linear_rows" if dtype is DType.float32 else "linear_rows_bf16"
                th = self.threshold(st.name, kind, (k, n))
                # oneDNN above the switch point, or in a band above it and the row kernel again
                # above the band up to the largest size measured (calibrate.py)
                band = threshold_name(library_kind(kind), (k, n))
                self.code.thresholds[band] = (library_kind(kind), (k, n))
                own = f"{self.py(rows)} <= {th} or {band} < {self.py(rows)} <= {ROWS[-1]}"
                self.versions.append(f"({own})")
                out.append(f"if {own}:")
                out.append("    " + self.alloc(st.out))
                # its threads split the panels, or above a switch point the rows first
                split = threshold_name(split_kind(kind), (k, n))
                self.code.thresholds[split] = (split_kind(kind), (k, n))
                call = f"(k.{rows_fn} if {self.py(rows)} <= {split} else k.{rows_fn}_split)"
                out.append(
                    f"    {call}({a}, {self.py(lda)}, a{p}, {b}, {self.ptr(st.out)}, "
                    f"{n}, {self.py(rows)}, {n}, {k}, {act})"
                )
                out.append("else:")
                out.append("    " + library)
        elif st.conv is not None:
            attr, algo = st.postop or ("none", "")
            pad, stride, dil, groups = st.conv
            x = self.ref(st.a.buffer)
            if st.b.buffer in self.const:  # channels-last (oneDNN's NHWC path), in oneDNN's layout from the first call
                self.code.conv_weights = tuple(sorted({*self.code.conv_weights, st.b.buffer}))
                w = f"conv_weight({st.b.buffer!r}, {x}, {list(pad)}, {list(stride)}, {list(dil)}, {groups})"
            else:  # a computed weight, as it is
                w = self.ref(st.b.buffer)
            bias = self.ref(st.bias) if st.bias else "None"
            call = f"conv({x}, {w}, {bias}, {list(pad)}, {list(stride)}, {list(dil)}, {groups}, {attr!r}, [], {algo!r})"
            b = self.s.buffers[st.out]
            nhwc = len(b.shape) == 4 and tuple(b.strides) == row_major(b.shape, NHWC)
            layout = "memory_format=torch.channels_last" if nhwc else ""
            out.append(f"t_{st.out} = {call}.contiguous({layout})")
        else:
            out += self.batched(st)
        if st.epilogue is not None:
            out += self.native(st.epilogue)
        return out

    def attention(self, st: AttentionStep) -> list[str]:
        """Two versions, picked per call from the number of keys: the merged kernel where it
        wins; above, torch's fused attention when the row kernel is exactly its scale, mask
        and safe softmax, else the three steps (library batched GEMMs around the row kernel)."""
        if st.name not in self.kernels:  # no merged kernel for it (bf16): the library at every length
            out, pad = [], ""
        else:
            keys = self.py(st.scores.b.sizes[-1])
            d = st.scores.a.sizes[-1]
            head = (int(d),) if d.is_Integer else (ANY_HEAD,)
            kind = "attention_keys_library" if st.library else "attention_keys"
            if self.s.buffers[st.scores.a.buffer].dtype is DType.bfloat16:  # measured apart: other kernels
                kind += "_bf16"
            th = self.threshold(st.name, kind, head)
            self.versions.append(f"{keys} <= {th}")
            out, pad = [f"if {keys} <= {th}:"], "    "
            out += [pad + line for line in self.native(st)]
            out.append("else:")
        if st.library is not None:  # torch's fused attention, straight into the output's layout
            q, kt, v = st.scores.a, st.scores.b, st.context.b
            k = View(kt.buffer, kt.sizes[:-2] + kt.sizes[::-1][:2], kt.strides[:-2] + kt.strides[::-1][:2], kt.offset)
            mask = self.view(st.library.mask) if st.library.mask else "None"
            call = f"sdpa({self.view(q)}, {self.view(k)}, {self.view(v)}, attn_mask={mask}, scale={st.library.scale!r})"
            b = self.s.buffers[st.out]
            whole = self.view(View(st.out, b.shape, b.strides, sympy.Integer(0)))
            return out + [pad + self.alloc(st.out), f"{pad}{whole}.copy_({call})"]
        for part in (st.scores, st.softmax, st.context):
            out += ["    " + line for line in (self.gemm(part) if isinstance(part, GemmStep) else self.native(part))]
        return out

    def tables(self) -> str:
        """What `sf_run` reads besides a call's own addresses, made once: the constants' addresses
        and the switch points (`Program.set_threshold` writes them there too)."""
        run = self.code.run
        if run is None:
            return ""
        return (
            f"run_constants = Int64s({', '.join(f'a{c}' for c in run.constants)})\n"
            f"run_threshold_names = ({''.join(f'{t!r}, ' for t in run.thresholds)})\n"
            f"run_thresholds = Int64s({', '.join(run.thresholds)})\n"
            "aca, ath = addressof(run_constants), addressof(run_thresholds)\n\n\n"
        )

    def whole_call(self) -> list[str]:
        """The call in C++ (`sf_run`), at bindings where every step runs the library's own version:
        the outputs allocated here, every step there (codegen/cpu/run.py)."""
        if self.code.run is None:
            return []
        versions = " and ".join(["whole", *dict.fromkeys(self.versions)])
        out = [f"    if {versions}:  # every step in the library's own kernels: one C++ call"]
        pad = "        "
        for n in self.run_outputs:
            b = self.s.buffers[n]
            out.append(f"{pad}t_{n} = empty_strided({self.tup(b.shape)}, {self.tup(b.strides)}, dtype={b.dtype.torch})")
        ptrs = [f"t_{n}.data_ptr()" for n in self.inputs + self.run_outputs]
        ws = "wsp" if self.memory.slot_sizes else "0"
        out.append(f"{pad}k.sf_run(sym_p, {ws}, ath, aca, {', '.join(ptrs)})")
        out.append(f"{pad}check(sym)")
        out.append(f"{pad}return [" + ", ".join(self.ref(n) for n in self.s.outputs) + "]")
        return out


def generate_host(
    sched: Schedule,
    kernels: dict[str, KernelSource],
    symbols: list[str],
    bf16_rows: bool = False,
    bf16_amx: bool = False,
) -> HostCode:
    return CpuHost(sched, kernels, symbols, bf16_rows, bf16_amx).generate()
