"""A whole call in C++: `sf_run`, the host code's work at a binding where every step runs in
the library's own kernels, in one parallel region.

The Python host code (codegen/host.py) computes a binding's sizes, picks each step's version and
calls the kernels one at a time, each opening a parallel region of its own: at small shapes
the Python and the fork and join of each call are a visible share of the call (`python
bench/overhead.py`). Where every
step's version at the binding is this library's (the row GEMM rather than oneDNN, the merged
attention rather than torch's), the host code allocates the outputs and calls `sf_run` once
instead. It computes the workspace's offsets and each step's rows from the symbols and runs
every step in one parallel region: each kernel's `_team` function shares its loop among the
region's threads and ends with its barrier (BladeDISC's compiled host program; Souffle's one
kernel per subprogram, with barriers in place of grid syncs). The host code checks the versions
before the call, so `sf_run` has one version of each step and nothing to fall back from.
"""

from __future__ import annotations

import sympy

from symfuse.codegen.cpu.c import cidx
from symfuse.codegen.cpu.gemm import activation_code
from symfuse.codegen.host import HostGenerator
from symfuse.ir.dtypes import DType
from symfuse.options import split_kind, threshold_name
from symfuse.runtime.call import MAX_ARGS
from symfuse.runtime.code import RunCode
from symfuse.schedule.attention import AttentionStep
from symfuse.schedule.layout import as_matrix
from symfuse.schedule.steps import GemmStep, NativeStep

_ADDR = """\
// an address the host holds as an integer, passed as whichever pointer a kernel takes
struct sf_addr {
  int64_t a;
  template <class T> operator T*() const { return reinterpret_cast<T*>(a); }
};
"""


class NotNative(Exception):
    """A step with no version in the library (a library GEMM, an op run by torch)."""


class _Run:
    def __init__(self, h: HostGenerator, outputs: list[str]) -> None:
        self.h, self.outputs = h, outputs
        self.code = RunCode("", [])

    def c(self, e) -> str:
        return cidx(sympy.sympify(e), self.h.names)

    def const(self, name: str) -> str:
        if name not in self.code.constants:
            self.code.constants.append(name)
        return f"ca[{self.code.constants.index(name)}]"

    def threshold(self, name: str) -> str:
        if name not in self.code.thresholds:
            self.code.thresholds.append(name)
        return f"th[{self.code.thresholds.index(name)}]"

    def addr(self, buf: str) -> str:
        h = self.h
        if buf in h.const:
            return self.const(f"c_{buf}")
        if buf in h.inputs:
            return f"in{h.inputs.index(buf)}"
        if buf in self.outputs:
            return f"out{self.outputs.index(buf)}"
        if buf in h.memory.slot_of:
            return f"ws + z{h.memory.slot_of[buf]}"
        raise NotNative(f"{buf} is not in the workspace")

    def native(self, st: NativeStep) -> list[str]:
        src = self.h.kernels.get(st.name)
        if src is None:
            raise NotNative(f"{st.name} runs through torch")
        args = [f"sf_addr{{{self.addr(n)}}}" for n in src.args]
        rows = self.c(sympy.Mul(*st.rows)) if st.rows else "1"
        return [f"{src.function or st.name}_team({', '.join(args)}, sym, 0, {rows});"]

    def gemm(self, st: GemmStep) -> list[str]:
        h = self.h
        mat = as_matrix(st.a) if st.weight is not None else None
        dtype = h.s.buffers[st.a.buffer].dtype
        bf16 = dtype is DType.bfloat16 and h.bf16_rows
        if mat is None or not (dtype is DType.float32 or bf16):
            raise NotNative(f"{st.name} is a library's GEMM at every size")
        if bf16 and h.bf16_amx:
            raise NotNative(f"{st.name}'s bf16 row kernel multiplies by AMX tiles, in a region of its own")
        rows, lda = mat
        n, k = (int(d) for d in h.s.buffers[st.weight].shape)
        m = self.c(rows)
        offset = f" + {self.c(st.a.offset)} * {dtype.torch.itemsize}" if st.a.offset != 0 else ""
        a = f"sf_addr{{{self.addr(st.a.buffer)}{offset}}}"
        bias = f"sf_addr{{{self.addr(st.bias)}}}" if st.bias else "nullptr"
        kind = "linear_rows_bf16" if bf16 else "linear_rows"
        split = self.threshold(threshold_name(split_kind(kind), (k, n)))
        out = [
            f"sf_rows_gemm{'_bf16' if bf16 else ''}_team({a}, {self.c(lda)}, "
            f"sf_addr{{{self.const(f'p_{st.weight}')}}}, {bias}, "
            f"sf_addr{{{self.addr(st.out)}}}, {n}, {m}, {n}, {k}, {activation_code(st.postop)}, {m} > {split});",
            "#pragma omp barrier",
        ]
        return out + (self.native(st.epilogue) if st.epilogue is not None else [])

    def generate(self) -> RunCode:
        h = self.h
        body: list[str] = []
        for st in h.s.steps:
            if isinstance(st, AttentionStep):
                if st.name not in h.kernels:
                    raise NotNative(f"{st.name} runs torch's attention")
                lines = self.native(st)
            elif isinstance(st, NativeStep):
                lines = self.native(st)
            elif isinstance(st, GemmStep):
                lines = self.gemm(st)
            else:
                raise NotNative(f"{st.name} runs through torch")
            body += [f"// {st.name}", *lines]
        params = [f"in{i}" for i in range(len(h.inputs))] + [f"out{j}" for j in range(len(self.outputs))]
        if 4 + len(params) > MAX_ARGS:
            raise NotNative(f"{len(params)} inputs and outputs (one call takes at most {MAX_ARGS - 4})")
        text = "\n".join(body)
        slots = h.memory.slot_bytes()  # the offsets of the workspace's slots, as the host code computes them
        sizes = ["const int64_t z0 = 0;"] if slots else []
        for k, size in enumerate(slots[:-1]):
            sizes.append(f"const int64_t z{k + 1} = z{k} + {self.c(size)};")
        text_all = text + "\n".join(sizes)
        symbols = [f"const int64_t s_{s} = sym[{i}];" for i, s in enumerate(h.symbols) if f"s_{s}" in text_all]
        sig = ["int64_t* sym", "int64_t ws", "const int64_t* th", "const int64_t* ca"]
        sig += [f"int64_t {p}" for p in params]
        src = [
            _ADDR,
            "// one call at a binding where every step runs in this library (the host code checks that,",
            "// and allocates the outputs): the workspace's offsets and each step's rows from the symbols,",
            "// then the steps in one parallel region, each step's work shared among its threads and",
            "// ended by a barrier",
            f'extern "C" void sf_run({", ".join(sig)}) {{',
            *("  " + line for line in symbols + sizes),
            "  #pragma omp parallel",
            "  {",
            *("    " + line for line in body),
            "  }",
            "}",
        ]
        self.code.source = "\n".join(src) + "\n"
        self.code.params = params
        return self.code


def native_run(h: HostGenerator, outputs: list[str]) -> tuple[RunCode | None, str]:
    """`sf_run` for the host `h` (its steps generated and its memory planned), the buffers
    `outputs` allocated by the host code and passed in; None and why where some step has no
    version in the library at any binding."""
    try:
        return _Run(h, outputs).generate(), ""
    except NotNative as e:
        return None, str(e)
