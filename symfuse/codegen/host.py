"""Host code: one generated Python function that runs a schedule.

It binds every size from the symbols, allocates each buffer at its strides, calls the
native kernels (ctypes), the library GEMMs and the torch references of opaque ops in
order, frees each buffer after its last use, and returns the outputs. Everything that does
not depend on a call (weights reordered for oneDNN, kernel handles, attribute evaluators)
is prepared once and reached through the function's namespace. The source is readable and
is written to the dump folder with the C++.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import sympy

from symfuse import ops
from symfuse.ir.dims import to_python
from symfuse.ir.dtypes import DType
from symfuse.options import threshold_name
from symfuse.reference import attr_evaluator
from symfuse.runtime.code import HostCode
from symfuse.schedule.attention import AttentionStep
from symfuse.schedule.layout import View
from symfuse.schedule.memory import MemoryPlan, aligned, plan_memory
from symfuse.schedule.steps import GemmStep, NativeStep, OpaqueStep, Schedule
from symfuse.te.analysis import loads
from symfuse.te.interp import run_te


class HostGenerator:
    """The host code of a schedule, for one backend: a subclass spells each kind of step
    (`native`, `gemm`, `attention`); the base binds sizes, plans memory and writes the
    functions."""

    native_symbols = True  # kernels read the symbols through `sym_p`, the address of `sym`

    def __init__(
        self,
        sched: Schedule,
        kernels: dict,  # step name -> its kernel source (the backend's own type)
        symbols: list[str],
        bf16_rows: bool = False,
        bf16_amx: bool = False,
    ) -> None:
        self.s, self.kernels, self.symbols = sched, kernels, symbols
        self.bf16_rows = bf16_rows  # the library has sf_linear_rows_bf16
        self.bf16_amx = bf16_amx  # which multiplies by AMX tiles where the OS grants them
        self.names = {sympy.Symbol(n, integer=True, positive=True): f"s_{n}" for n in symbols}
        self.code = HostCode("")
        self.lines: list[str] = []
        g = sched.graph
        self.const = {v.name for v in g.constants}
        self.inputs = [v.name for v in g.inputs]
        self.versions: list[str] = []  # the conditions under which each step runs the library's own version

    def py(self, e) -> str:
        return to_python(e, self.names)

    def tup(self, dims) -> str:
        return "(" + "".join(self.py(d) + ", " for d in dims) + ")"

    def ref(self, name: str) -> str:
        if name in self.const:
            self.code.constants[f"c_{name}"] = name
            return f"c_{name}"
        return f"t_{name}"

    def ptr(self, name: str) -> str:
        """A buffer's address, for a kernel; `@ptr{name}` until the memory plan says whether the
        buffer is a tensor or only a place in the workspace (`_address_only`)."""
        if name in self.const:  # its address, taken once when the program is put together
            return f"a{self.ref(name)}"
        if name in self.inputs:
            return f"{self.ref(name)}.data_ptr()"
        return f"@ptr{{{name}}}"

    def alloc(self, name: str) -> str:
        return f"@alloc {name}"  # resolved once the memory plan is known

    def resolve(self, line: str, mem: MemoryPlan, places: set[str]) -> str:
        """A line with its buffers made concrete: a tensor `t_x`, or for a buffer in `places`
        (`_address_only`) its address `a_x`, the tensor it lies in `b_x` (the workspace, or a
        library's result: `@lib{x} = ...`) and its element offset `o_x` there."""
        lib = re.match(r"(\s*)@lib\{(\w+)\} = (.*)$", line)
        if lib:
            indent, name, rest = lib.groups()
            if name in places:
                return f"{indent}b_{name} = {_MARK.sub(lambda m: self._concrete(m, places), rest)}; " \
                       f"a_{name}, o_{name} = b_{name}.data_ptr(), 0"  # fmt: skip
            line = f"{indent}t_{name} = {rest}"
        if line.strip().startswith("@alloc "):
            indent = line[: len(line) - len(line.lstrip())]
            name = line.split()[1]
            b = self.s.buffers[name]
            shape, strides = self.tup(b.shape), self.tup(b.strides)
            if name not in mem.slot_of:
                return f"{indent}t_{name} = empty_strided({shape}, {strides}, dtype={b.dtype.torch})"
            item, z = b.dtype.torch.itemsize, f"z{mem.slot_of[name]}"
            if name in places:
                return f"{indent}a_{name}, o_{name}, b_{name} = wsp + {z}, {z} // {item}, ws_{b.dtype.name}"
            return f"{indent}t_{name} = as_strided(ws_{b.dtype.name}, {shape}, {strides}, {z} // {item})"
        return _MARK.sub(lambda m: self._concrete(m, places), line)

    @staticmethod
    def _concrete(m: re.Match, places: set[str]) -> str:
        what, name = m.group(1), m.group(2)
        if name in places:
            return {"ptr": f"a_{name}", "buf": f"b_{name}", "off": f"o_{name} + "}[what]
        return {"ptr": f"t_{name}.data_ptr()", "buf": f"t_{name}", "off": ""}[what]

    def threshold(self, step: str, kind: str, shape: tuple[int, ...]) -> str:
        name = threshold_name(kind, shape)
        self.code.thresholds[name] = (kind, shape)
        self.code.step_thresholds[step] = name
        return name

    def view(self, v: View) -> str:
        x = v.buffer
        if x in self.const or x in self.inputs:
            return f"view({self.ref(x)}, {self.tup(v.sizes)}, {self.tup(v.strides)}, {self.py(v.offset)})"
        return f"view(@buf{{{x}}}, {self.tup(v.sizes)}, {self.tup(v.strides)}, @off{{{x}}}{self.py(v.offset)})"

    def torch_run(self, st: NativeStep) -> list[str]:
        """A step with no kernel: its TEs run through the torch TE interpreter."""
        fn = f"te_{st.name}"
        self.code.recipes[fn] = ("te", st.name)
        ins = sorted(
            {ld.tensor for m in st.members for ld, _ in loads(m.body)} - {m.name for m in st.members} - set(st.inline)
        )
        out = [self.alloc(n) for n in st.outputs]
        env = ", ".join(f"{n!r}: {self.ref(n)}" for n in ins + st.outputs)
        out.append(f"{fn}[0]({{{env}}}, b)")
        return out

    def native(self, st: NativeStep) -> list[str]:
        """A kernel's call (its TEs through torch where it has no kernel)."""
        src = self.kernels.get(st.name)
        if src is None:
            return self.torch_run(st)
        fn = src.function or st.name
        self.code.kernels[fn] = len(src.args)
        out = [self.alloc(n) for n in src.args[: src.n_outputs]]
        rows = self.py(sympy.Mul(*st.rows)) if st.rows else "1"
        return out + [self.kernel_call(src, fn, rows)]

    def kernel_call(self, src, fn: str, rows: str) -> str:
        """The line that runs kernel `fn` (its source `src`) over `rows` rows."""
        raise NotImplementedError

    def gemm(self, st: GemmStep) -> list[str]:
        raise NotImplementedError

    def attention(self, st: AttentionStep) -> list[str]:
        raise NotImplementedError

    def whole_call(self) -> list[str]:
        """Lines that run the whole call at once where the backend can (CPU: `sf_run`); none here."""
        return []

    def tables(self) -> str:
        """Host-module lines made once, before the functions (CPU: what `sf_run` reads)."""
        return ""

    def plan_whole_call(self, outputs: list[str]) -> None:
        """Decide, once steps and memory are known, whether a call can run whole (CPU)."""

    def reshaped(self, st: GemmStep) -> str:
        """`.view(...)` that gives a linear's result its output's shape, when its epilogue read
        it through a reshape ([B*S, N] as [B, S, N]); else nothing."""
        shape = self.s.buffers[st.out].shape
        return "" if tuple(shape[:-1]) == tuple(st.a.sizes[:-1]) else f".view({self.tup(shape)})"

    def batched(self, st: GemmStep) -> list[str]:
        """A batched product on strided views of its operands' buffers (torch.matmul)."""
        out = [self.alloc(st.out), f"matmul({self.view(st.a)}, {self.view(st.b)}, out=t_{st.out})"]
        if st.bias:
            out.append(f"t_{st.out} += {self.ref(st.bias)}")
        return out

    def opaque(self, st: OpaqueStep) -> list[str]:
        n = st.node
        if n.op == "paged_attention":  # each backend's namespace has `paged` (its kernels; runtime/kv*.py)
            self.code.paged = True
            args = ", ".join(self.ref(v.name) for v in n.inputs)
            scale, window = float(n.attrs["scale"]), int(n.attrs["window"])
            return [f"t_{n.outputs[0].name} = paged({args}, {scale!r}, {window})"]
        opdef = ops.get(n.op)
        fn = f"op_{st.name}"
        self.code.recipes[fn] = ("op", n.op, dict(n.attrs))
        args = [self.ref(v.name) if v is not None else "None" for v in n.inputs]
        if opdef.variadic:
            packed = opdef.pack(args)
            args = [f"[{', '.join(a)}]" if isinstance(a, list) else a for a in packed]
        outs = ", ".join(f"t_{v.name}" for v in n.outputs)
        call = f"{fn}[0]"
        if n.op == "lstm" and n.inputs[0].type.dtype is DType.float32:  # the library's recurrence
            self.code.lstm = True
            call, args = "lstm", ["k.sf_lstm", *args]
        lines = [f"{outs} = {call}({', '.join(args)}, **{fn}[1](b))"]
        lines += [f"t_{v.name} = t_{v.name}.contiguous()" for v in n.outputs]
        return lines

    def generate(self) -> HostCode:
        s = self.s
        body: list[list[str]] = []
        reads: list[set[str]] = []
        for st in s.steps:
            if isinstance(st, AttentionStep):
                lines = self.attention(st)
            elif isinstance(st, NativeStep):
                lines = self.native(st)
            elif isinstance(st, GemmStep):
                lines = self.gemm(st)
            else:
                lines = self.opaque(st)
            body.append([f"# {st.name}"] + lines)
            reads.append({name for line in lines for name in _named(line)})
        last: dict[str, int] = {}
        for i, r in enumerate(reads):
            for name in r:
                last[name] = i
        keep = set(s.outputs) | set(self.inputs)
        defs = [[ln.split()[1] for ln in lines if ln.strip().startswith("@alloc ")] for lines in body]
        defs = [[n for n in d if n not in keep] for d in defs]
        nbytes = {
            n: aligned(sympy.Mul(*self.s.buffers[n].shape) * self.s.buffers[n].dtype.torch.itemsize)
            for d in defs
            for n in d
        }
        mem = plan_memory(defs, reads, nbytes)
        self.memory = mem
        self.places = _address_only(body, set(mem.slot_of))
        self.libraries = {
            m.group(2) for lines in body for line in lines for m in _MARK.finditer(line) if m.group(1) == "lib"
        }
        made = {ln.split()[1] for lines in body for ln in lines if ln.strip().startswith("@alloc ")}
        self.plan_whole_call([n for n in dict.fromkeys(s.outputs) if n in made])
        body = [[self.resolve(ln, mem, self.places) for ln in lines] for lines in body]
        self.code.source = self.tables() + self.function("run", body, last, keep, timed=False)
        self.code.source += "\n\n" + self.function("run_timed", body, last, keep, timed=True)
        return self.code

    def function(self, name: str, body: list[list[str]], last: dict, keep: set, timed: bool) -> str:
        """`run(inputs, b)` (with `whole=False`, step by step where `sf_run` would take the call);
        `run_timed(inputs, b, tick)`, step by step, also calls `tick(step, seconds)` with the time
        spent in each step's kernel and library calls."""
        s = self.s
        args = ", tick" if timed else ", whole=True" if self.code.run is not None else ""
        out = [f"def {name}(inputs, b{args}):"]
        out += [f"    s_{n} = b[{n!r}]" for n in self.symbols]
        # the symbols, then this call's error slot (bad index, extent, site; see sf_index)
        out.append(f"    sym = Sym({', '.join([f's_{n}' for n in self.symbols] + ['-1', '0', '-1'])})")
        if self.native_symbols:
            out.append("    sym_p = addressof(sym)  # what the kernels read the symbols and error slot through")
        mem = self.memory
        if mem.slot_sizes:  # slot offsets in the workspace for this binding
            out.append("    z0 = 0")
            for k, size in enumerate(mem.slot_bytes()):
                out.append(f"    z{k + 1} = z{k} + {self.py(size)}")
            out.append(f"    ws = workspace(z{len(mem.slot_sizes)})")
            out.append("    wsp = ws.data_ptr()")
            dtypes = sorted({s.buffers[n].dtype.name for n in mem.slot_of})
            out += [f"    ws_{d} = ws.view(torch.{d})" for d in dtypes]
        out += [f"    t_{n} = inputs[{i}].contiguous()" for i, n in enumerate(self.inputs)]
        if not timed:
            out += self.whole_call()
        for i, lines in enumerate(body):
            if timed:  # time the compute calls alone: what is left of a call is overhead
                calls = [j for j, line in enumerate(lines) if _is_compute(line)]
                lines = list(lines)
                lines.insert(calls[-1] + 1, f"tick({s.steps[i].name!r}, now() - t0)")
                lines.insert(calls[0], "t0 = now()")
            out += ["    " + line for line in lines]
            # a buffer made and used up inside one step may exist in one branch only: no del
            local = {ln.split(" = ")[0].strip()[2:] for ln in body[i] if ln.startswith(" ") and " = " in ln}
            dead = sorted(n for n, j in last.items() if j == i and n not in keep and n not in local)
            tensors = [n for n in dead if n not in self.places]
            if tensors:
                out.append("    del " + ", ".join(f"t_{n}" for n in tensors))
            held = [n for n in dead if n in self.places and n in self.libraries]  # a library's result, maybe
            if held:
                out.append("    " + " = ".join(f"b_{n}" for n in held) + " = None")
        out.append("    check(sym)")
        out.append("    return [" + ", ".join(self.ref(n) for n in s.outputs) + "]")
        return "\n".join(out) + "\n"


_MARK = re.compile(r"@(ptr|buf|off|lib)\{(\w+)\}")
_TENSOR = re.compile(r"(?<![\w'\"])t_(\w+)")  # a buffer's tensor `t_x`; not a name in quotes ('t_x': a value named t_x)


def _marked(line: str) -> list[str]:
    return [m.group(2) for m in _MARK.finditer(line)]


def _named(line: str) -> list[str]:
    """The buffers a host line names: as tensors `t_x`, through marks (`@ptr{x}`), or allocated
    (`@alloc x`); a bare or marked name may itself begin with `t_`."""
    if line.strip().startswith("@alloc "):
        return [line.split()[1]]
    return _TENSOR.findall(_MARK.sub("", line)) + _marked(line)


def _address_only(body: list[list[str]], in_workspace: set[str]) -> set[str]:
    """The workspace buffers every line reaches only through `@ptr`/`@buf`/`@off` (a kernel's
    pointer, a strided view of the workspace for a library call): they need no tensor of their
    own, only an address (making a tensor per buffer per call, then freeing it, is host time
    each call pays: `python bench/overhead.py`)."""
    tensors = {name for lines in body for line in lines if not line.strip().startswith("@alloc ")
               for name in _TENSOR.findall(_MARK.sub("", line))}  # fmt: skip
    return in_workspace - tensors


def opaque_functions(recipes: dict[str, tuple], step: Callable[[str], NativeStep]) -> dict[str, tuple]:
    """The host's torch-run functions from their recipes: namespace name -> (function, attribute
    evaluator); `step(name)` finds a schedule step by name."""
    out = {}
    for name, recipe in recipes.items():
        if recipe[0] == "op":
            out[name] = (ops.get(recipe[1]).ref, attr_evaluator(recipe[2]))
        else:
            out[name] = (torch_kernel(step(recipe[1])), None)
    return out


def torch_kernel(st: NativeStep):
    """Run a kernel's TEs through the TE interpreter, writing its outputs into their buffers."""

    def run(env: dict, b: dict) -> None:
        env = dict(env)
        if st.order is not None:  # its members' dims run in that order (channels_last.py)
            env.update({n: env[n].permute(st.order) for n in st.outputs})
        for name, g in st.inline.items():
            env.setdefault(name, run_te(g, env, b))
        for m in st.members:
            value = run_te(m, env, b)
            if m.name in st.outputs:
                env[m.name].copy_(value)
            else:
                env[m.name] = value

    return run


def _is_compute(line: str) -> bool:
    """A line that calls a kernel, a library GEMM or torch (not an allocation or a view)."""
    line = line.strip()
    if line.startswith("# ") or line.startswith("@alloc"):
        return False
    starts = ("k.", "te_", "matmul(", "launch(", "if ", "else:")
    if ".copy_(sdpa(" in line:
        return True
    calls = (" = linear(", " = conv(", " = op_", " = lstm(", " = paged(", " = in_layout(sdpa(", "+=")
    return line.startswith(starts) or any(c in line for c in calls)
