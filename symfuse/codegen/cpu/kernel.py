"""C++ for one native kernel: a loop or reduction group of TEs, fused over rows.

Every member of a kernel runs over the same rows (all dims but the last; the planner
guarantees it from the shape store). The kernel is one OpenMP-parallel loop over the
flattened rows; inside it each member, in program order, computes its row:
- a member read only inside the kernel stays in a thread-local row buffer (or a scalar,
  when its last dim is 1: a row statistic such as a layer norm's mean), so a residual add,
  its statistics and the normalisation make one pass over memory;
- a member read elsewhere, or returned, is stored to its buffer at its strides;
- a reduction over a member's row that reads it at the element its loop computes (a
  softmax's max over the scores, its sum over the exponentials) is accumulated in that
  loop, not in a pass of its own (`riders`).
Inner loops carry `#pragma omp simd` (vectorised with the target's flags; exp and erf are
polynomial approximations the vectoriser keeps in registers, c.py). Every size is a run-time symbol read
from `sym[]`; nothing depends on a symbol's value.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from symfuse.codegen.cpu.c import CTYPE, STORAGE, cidx, literal, team_entry
from symfuse.codegen.cpu.spell import LIBM, SPELLING, CallSite
from symfuse.errors import CodegenError
from symfuse.ir.dims import Dim, dim, fmt_shape
from symfuse.ir.dtypes import DType
from symfuse.schedule.channels_last import in_step_order
from symfuse.schedule.layout import address
from symfuse.schedule.loops import MemberLoop, plan_loops, row_split, stat_body
from symfuse.schedule.steps import Buffer, NativeStep
from symfuse.te.analysis import (
    gather_site,
    has_reduce,
    in_row,
    is_window,
    loads,
    reduced_elements,
    reductions,
    row_scalar,
)
from symfuse.te.ir import TE, Call, Const, Index, Load, Reduce, Scalar, fmt_short, substitute

_WIDE = {DType.bfloat16: DType.float32}  # what a stored type is computed in


@dataclass
class KernelSource:
    name: str
    source: str
    args: list[str]  # buffers, outputs first, in the order of the C signature
    n_outputs: int
    function: str = ""  # the C function that runs it, when another kernel's code is the same (`share`)


class _Emitter:
    def __init__(self, step: NativeStep, buffers: dict[str, Buffer], symbols: list[str], gathers: list[str]) -> None:
        self.step, self.buffers, self.gathers = step, buffers, gathers
        self.names = {sympy.Symbol(s, integer=True, positive=True): f"s_{s}" for s in symbols}
        self.symbols = symbols
        self.sizes = set(self.names)  # the shape symbols
        self.derived: dict[sympy.Expr, sympy.Symbol] = {}  # sizes computed from them, named once (`c`)
        self.lines: list[str] = []
        self.depth = 0
        self.fresh = 0
        self.local: dict[str, TE] = {}  # members kept inside the kernel, in a row buffer or a scalar
        self.inlined: dict[str, TE] = {}  # members computed at their one reader
        self.rows_in: dict[str, str] = {}  # tensors whose current row a C pointer holds (fused attention)
        self.rows_out: dict[str, str] = {}  # members whose row goes to a C pointer instead of a buffer
        self.folded: set[str] = set()  # members the caller computes another way (not emitted)
        self.row_scalars: set[str] = set()  # C names of one-value-per-row members (loop-invariant)
        # where a member's loop starts (line, depth), the loop variables inside it, and the
        # gathers already checked there: a gather index that does not vary along the loop
        # (an embedding's row) is checked once before it, not at every element
        self.hoist: tuple[int, int] | None = None
        self.inner: set[str] = set()
        self.hoisted: dict[tuple[str, str, bool], str] = {}
        self.riding: dict[Reduce, str] = {}  # reductions accumulated in an earlier member's loop: their C names
        self.vloops: list[list[tuple[str, str, str]]] = []  # open vector loops: their checked indices

    def c(self, e) -> str:
        """C for an index expression. A part of it computed from sizes alone (`(H//2 - 1)//2 + 1`,
        a pooled side) is named once at the top of the kernel (`d0`): the loops read a local
        instead of dividing at every element, and the code reads as the sizes it uses."""

        def hoist(x: sympy.Expr) -> sympy.Expr:
            if isinstance(x, (sympy.floor, sympy.ceiling, sympy.Mod)) and x.free_symbols <= self.sizes:
                if x not in self.derived:
                    self.derived[x] = sympy.Symbol(f"d{len(self.derived)}", integer=True)
                    self.names[self.derived[x]] = self.derived[x].name
                return self.derived[x]
            return x.func(*(hoist(a) for a in x.args)) if x.args else x

        return cidx(hoist(dim(e)), self.names)

    def line(self, s: str) -> None:
        self.lines.append("  " * self.depth + s)

    def var(self, base: str) -> str:
        self.fresh += 1
        return f"{base}{self.fresh}"

    def checked(self, code: str, extent: str, python: bool, what: str, vector: bool = True) -> str:
        """`code` as an index checked against [0, extent), or with `python` [-extent, extent)
        and counted from the end when negative; an out-of-range one is reported as `what`.
        Inside a vector loop the check has no branch (which would keep the loop scalar): the
        loop raises a max reduction of the bad indices, reported after it (`vector_loop`)."""
        check = "sf_index_from_end" if python else "sf_index"
        if vector and self.vloops:
            worst = self.var("worst")
            self.vloops[-1].append((worst, f"{'-' if python else ''}{extent}", self.site(what)))
            return f"{check}_v(int64_t({code}), {extent}, {worst})"
        return f"{check}(int64_t({code}), {extent}, {self.site(what)})"

    def vector_loop(self, pragma: str) -> None:
        """Open a vectorised loop: its pragma line, to which `end_vector_loop` adds the
        reduction of the checked indices inside it."""
        self.vloops.append([])
        self.line(f"{pragma} /*@vloop{len(self.vloops)}@*/")

    def end_vector_loop(self) -> None:
        """After the loop's closing brace: declare and reduce its checks' worst indices, and
        report one that is out of range."""
        checks = self.vloops.pop()
        marker = f" /*@vloop{len(self.vloops) + 1}@*/"
        at = max(i for i, line in enumerate(self.lines) if line.endswith(marker))
        pragma = self.lines[at][: -len(marker)]
        if checks:
            pragma += f" reduction(max:{', '.join(w for w, _, _ in checks)})"
            indent = pragma[: len(pragma) - len(pragma.lstrip())]
            self.lines[at:at] = [f"{indent}int64_t {w} = INT64_MIN;" for w, _, _ in checks]
            at += len(checks)
            for w, extent, site in checks:
                self.line(f"if ({w} != INT64_MIN) sf_index_bad({w}, {extent}, {site});")
        self.lines[at] = pragma

    def site(self, what: str) -> str:
        """The last two arguments of a checked operation (its site, the error slot) reported as `what`."""
        self.gathers.append(what)
        return f"{len(self.gathers) - 1}, sym + {len(self.symbols)}"

    # -- scalars ------------------------------------------------------------------------
    def expr(self, s: Scalar) -> tuple[str, DType]:
        if isinstance(s, Load):
            return self.load(s)
        if isinstance(s, Const):
            return literal(s.value, s.dtype), s.dtype
        if isinstance(s, Index):
            return f"{CTYPE[s.dtype]}({self.c(s.expr)})", s.dtype
        if isinstance(s, Reduce):
            return self.reduce(s), s.dtype
        if isinstance(s, Call):
            args = [self.expr(a) for a in s.args]
            return self.call(s, args), s.dtype
        raise CodegenError(f"cannot generate C for {s!r}")

    def load(self, ld: Load) -> tuple[str, DType]:
        if ld.tensor in self.step.inline and ld.tensor not in self.buffers:
            g = self.step.inline[ld.tensor]
            return self.expr(substitute(g.body, dict(zip(g.axes, ld.index))))
        if ld.tensor in self.inlined:
            m = self.inlined[ld.tensor]
            return self.expr(substitute(m.body, dict(zip(m.axes, ld.index))))
        if ld.tensor in self.rows_in or ld.tensor in self.rows_out:
            ax = self.step.members[-1].axes
            if not in_row(ld.index, ax, self.step.members[-1].shape):
                raise CodegenError(f"{ld.tensor} is read outside its row inside kernel {self.step.name}")
            if ld.tensor in self.rows_in:
                row, dt = self.rows_in[ld.tensor], self.buffers[ld.tensor].dtype
            else:  # a member's row, read back where it was just written
                row, dt = self.rows_out[ld.tensor], next(m.dtype for m in self.step.members if m.name == ld.tensor)
            return f"{row}[{self.c(ld.index[-1])}]", _WIDE.get(dt, dt)  # a row in float when stored in bf16
        if ld.tensor in self.local:
            m = self.local[ld.tensor]
            if not in_row(ld.index, m.axes, m.shape):
                raise CodegenError(f"{ld.tensor} is read outside its row inside kernel {self.step.name}")
            if row_scalar(m):
                self.row_scalars.add(f"v_{m.name}")
                return f"v_{m.name}", m.dtype
            return f"v_{m.name}[{self.c(ld.index[-1])}]", m.dtype
        buf = self.buffers[ld.tensor]
        index = []
        for k, i in enumerate(ld.index):
            if isinstance(i, sympy.Expr):
                index.append(i)
                continue
            # a gather: a data-dependent index, checked at run time
            value, python, what = gather_site(i, k, ld.tensor, buf.shape[k], self.step.name)
            free = _loop_vars(value)
            hoist = self.hoist is not None and free is not None and not free & self.inner
            open_loops, self.vloops = self.vloops, ([] if hoist else self.vloops)  # hoisted: runs before the loop
            code, _ = self.expr(value)
            self.vloops = open_loops
            extent = self.c(buf.shape[k])
            v = self.hoisted.get((code, extent, python)) if hoist else None
            if v is None:
                v = self.var("g")
                text = f"const int64_t {v} = {self.checked(code, extent, python, what, vector=not hoist)};"
                if hoist:  # once a row, before the member's loop
                    at, depth = self.hoist
                    self.lines.insert(at, "  " * depth + text)
                    self.hoist = (at + 1, depth)
                    self.hoisted[(code, extent, python)] = v
                else:
                    self.line(text)
            index.append(sympy.Symbol(v, integer=True))
        addr = address(tuple(index), buf.strides)
        value = f"{ld.tensor}[{self.c(addr)}]"
        if buf.dtype is DType.bfloat16:  # stored in half width, computed in float
            return f"sf_from_bf16({value})", DType.float32
        return (f"({value} != 0)" if buf.dtype is DType.bool else value), buf.dtype

    def accumulator(self, r: Reduce) -> tuple[str, str | None]:
        """Declare a reduction's accumulator, and for max and min of floats a NaN flag (a NaN
        is the extreme, as in torch); returns their names."""
        ct = CTYPE[r.dtype]
        acc = self.var("acc")
        init = {"sum": "0", "max": "-INFINITY" if r.dtype.is_float else f"std::numeric_limits<{ct}>::lowest()",
                "min": "INFINITY" if r.dtype.is_float else f"std::numeric_limits<{ct}>::max()"}[r.op]  # fmt: skip
        self.line(f"{ct} {acc} = {init};")
        nan = self.var("nan") if r.op != "sum" and r.dtype.is_float else None
        if nan:
            self.line(f"int {nan} = 0;")
        return acc, nan

    @staticmethod
    def clauses(r: Reduce, acc: str, nan: str | None) -> str:
        """The reduction clauses of a vectorised loop that accumulates `r`."""
        return f" reduction({'+' if r.op == 'sum' else r.op}:{acc})" + (f" reduction(|:{nan})" if nan else "")

    def accumulate(self, r: Reduce, code: str, acc: str, nan: str | None) -> None:
        """The lines that add one element's `code` to the accumulator."""
        if r.op == "sum":
            self.line(f"{acc} += {code};")
            return
        x = self.var("x")  # std::max's own test, spelt so that GCC vectorises the reduction (std::max it does not)
        self.line(f"const {CTYPE[r.dtype]} {x} = {code};")
        self.line(f"{acc} = {x} {'>' if r.op == 'max' else '<'} {acc} ? {x} : {acc};")
        if nan:
            self.line(f"{nan} |= {x} != {x};")

    def reduce(self, r: Reduce) -> str:
        if r in self.riding:  # accumulated in the loop of the member it reads
            return self.riding[r]
        acc, nan = self.accumulator(r)
        window = is_window(r)  # unrolled; the loop over outputs around it is the vectorised one
        simd, vector = None, False
        if not window and not has_reduce(r.body) and r.dtype is not DType.bool:
            simd = "#pragma omp simd" + self.clauses(r, acc, nan)
            # the loops collapse into one vectorised loop where the inner extents are constants;
            # over symbolic extents the collapsed loop would divide to recover each variable,
            # so only the innermost loop is vectorised
            vector = True
            if len(r.axes) > 1 and all(isinstance(e, (int, sympy.Integer)) for _, e in r.axes[1:]):
                self.vector_loop(f"{simd} collapse({len(r.axes)})")
                simd = None
        for k, (v, ext) in enumerate(r.axes):
            if window:
                self.line(f"#pragma GCC unroll {int(ext)}")
            elif simd and k == len(r.axes) - 1:
                self.vector_loop(simd)
            self.line(f"for (int64_t {v.name} = 0; {v.name} < {self.c(ext)}; ++{v.name}) {{")
            self.depth += 1
        outer, self.inner = self.inner, self.inner | {v.name for v, _ in r.axes}
        code, _ = self.expr(r.body)
        self.inner = outer
        self.accumulate(r, code, acc, nan)
        for _ in r.axes:
            self.depth -= 1
            self.line("}")
        if vector:
            self.end_vector_loop()
        if nan:
            self.line(f"if ({nan}) {acc} = NAN;")
        return acc

    def call(self, s: Call, args: list[tuple[str, DType]]) -> str:
        if s.fn == "from_end":  # a gathered index used as a value (an arange read at it): checked all the same
            what = gather_site(s, 0, None, s.args[1].expr, self.step.name)[2]
            return self.checked(args[0][0], args[1][0], True, what)
        spell = SPELLING.get(s.fn)
        site = CallSite(
            s.fn,
            s.dtype,
            args,
            dict(s.params),
            lambda what: self.site(f"{what} in {self.step.name}"),
            self.row_scalars,
            s.fn == "where" and _reads_memory(s.args[0]),
        )
        code = spell(site) if spell else None
        if code is None:
            raise CodegenError(f"no C for {s.fn} on {s.dtype}")
        return code

    # -- the kernel -----------------------------------------------------------------------
    def prepare(self, outs: list[str]) -> list[str]:
        """Take where each member lives from the step's loop plan; returns the buffers the kernel reads."""
        st = self.step
        for m in st.members:
            if m.dtype not in CTYPE:
                raise CodegenError(f"{m.name} has dtype {m.dtype}, which the CPU code generator does not support")
        plan = plan_loops(st, outs, self.rows_in, self.rows_out, self.folded, self.buffers, True, _calls_libm)
        self.plan = plan
        ins = list(plan.inputs)
        for n in ins + outs:
            if self.buffers[n].dtype not in STORAGE:
                raise CodegenError(f"{n} has dtype {self.buffers[n].dtype}, not supported by the CPU code generator")
        self.local, self.inlined = dict(plan.kept), dict(plan.inline)
        return ins

    def body(self, rows: tuple[Dim, ...] | None, depth: int) -> list[str]:
        """The code of one row (its loop variables from `row`, unless `rows` is None: then
        the caller defines them); fills `scratch_lines` with the row buffers to allocate."""
        start = len(self.lines)
        self.row_body(rows, depth)
        body = self.lines[start:]
        self.lines = self.lines[:start]
        return body

    def symbol_lines(self, code: list[str]) -> list[str]:
        text = "\n".join(code + self.scratch_lines)
        sizes = {s: n for s, n in self.names.items() if s in self.sizes}
        derived = [f"const int64_t {v.name} = {cidx(e, sizes)};" for e, v in self.derived.items() if v.name in text]
        text += "\n".join(derived)
        return [f"const int64_t s_{s} = sym[{k}];" for k, s in enumerate(self.symbols) if f"s_{s}" in text] + derived

    def emit(self) -> KernelSource:
        st = self.step
        outs = list(st.outputs)
        ins = self.prepare(outs)
        rows = st.rows
        body = self.body(rows, 2)
        self.depth = 0
        sig = [f"{STORAGE[self.buffers[n].dtype]}* __restrict__ {n}" for n in outs]
        sig += [f"const {STORAGE[self.buffers[n].dtype]}* __restrict__ {n}" for n in ins]
        sig += ["const int64_t* __restrict__ sym", "int64_t row_begin", "int64_t row_end"]
        header = [
            f"// {st.name} [{st.kind}]: {', '.join(m.name for m in st.members)}",
            f"//   rows {fmt_shape(rows)}; writes {', '.join(f'{n}{fmt_shape(self.buffers[n].shape)}' for n in outs)}",
        ]
        if st.order is not None:
            header.append(f"//   loops over its outputs' dims in the order {st.order}, the order they are stored in")
        header += [f"//   {m.name}{fmt_shape(m.shape)} = {fmt_short(m.body)}" for m in st.members]
        self.line("\n".join(header))
        self.line(f"static void {st.name}_team({', '.join(sig)}) {{")
        self.depth = 1
        # symbols are read by each thread: locals keep the loops vectorisable
        for s in self.symbol_lines(body):
            self.line(s)
        for s in self.scratch_lines:
            self.line(s)
        self.line("#pragma omp for schedule(static)")
        self.line("for (int64_t row = row_begin; row < row_end; ++row) {")
        self.lines += body
        self.line("}")
        self.depth = 0
        self.line("}")
        raw = {sym: f"sym[{self.symbols.index(sym.name)}]" for sym in self.sizes}
        # on its own, in parallel above 16384 elements touched (a row: each member's, times those
        # its reductions go over for each)
        work = " + ".join(cidx(m.shape[-1] * reduced_elements(m.body), raw) for m in st.members if m.shape) or "1"
        self.lines += team_entry(st.name, sig, f"(row_end - row_begin) * ({work}) > 16384")
        return KernelSource(st.name, "\n".join(self.lines), outs + ins, len(outs))

    def row_body(self, rows: tuple[Dim, ...] | None, depth: int) -> None:
        self.depth = depth
        self.scratch_lines = []
        self.hoisted, self.riding = {}, {}
        rem = "row"
        for ri in row_split(rows):
            if ri.zero:
                self.line(f"const int64_t i{ri.k} = 0;")
            elif ri.extent is None:
                self.line(f"const int64_t i{ri.k} = {rem};")
            else:
                c = self.c(ri.extent)
                self.line(f"const int64_t i{ri.k} = {rem} % {c};")
                self.line(f"const int64_t q{ri.k} = {rem} / {c};")
                rem = f"q{ri.k}"
        members = {m.name: m for m in self.step.members}
        for lp in self.plan.loops:
            self.member(members[lp.name], lp)

    def member(self, m: TE, lp: MemberLoop) -> None:
        ct = CTYPE[m.dtype]
        if lp.per_row:  # one value per row: straight-line code, a const local when kept
            body = stat_body(m)
            done = reductions(body) and all(r in self.riding for r in reductions(body))
            self.line(f"// {m.name}" + (" (accumulated above)" if done else ""))
            code = self.typed(body, m.dtype)
            if m.name in self.local:
                self.line(f"const {ct} v_{m.name} = {code};")
            else:
                index = tuple(m.axes[:-1]) + ((sympy.Integer(0),) if m.axes else ())
                addr = self.c(address(index, self.buffers[m.name].strides))
                self.line(f"{m.name}[{addr}] = {self.stored(m.name, code)};")
            return
        self.line(f"// {m.name}")
        last = m.axes[-1].name
        if m.name in self.local:
            self.scratch_lines.append(f"std::unique_ptr<{ct}[]> row_{m.name}(new {ct}[{self.c(m.shape[-1])}]);")
            self.scratch_lines.append(f"{ct}* __restrict__ v_{m.name} = row_{m.name}.get();")
        vector, riders = lp.vector, lp.riders
        accs = [(r, *self.accumulator(r)) for _, r in riders]
        self.hoist, self.inner = (len(self.lines), self.depth), {last}
        if vector:
            self.vector_loop("#pragma omp simd" + "".join(self.clauses(r, acc, nan) for r, acc, nan in accs))
        self.line(f"for (int64_t {last} = 0; {last} < {self.c(m.shape[-1])}; ++{last}) {{")
        self.depth += 1
        code = self.typed(m.body, m.dtype)
        if m.name in self.rows_out:
            self.line(f"{self.rows_out[m.name]}[{last}] = {code};")
        elif m.name in self.local:
            self.line(f"v_{m.name}[{last}] = {code};")
        else:
            addr = address(tuple(m.axes), self.buffers[m.name].strides)
            self.line(f"{m.name}[{self.c(addr)}] = {self.stored(m.name, code)};")
        for (stat, r), (_, acc, nan) in zip(riders, accs):
            self.line(f"// {stat}'s {r.op} over it")
            self.accumulate(r, self.expr(substitute(r.body, {r.axes[0][0]: m.axes[-1]}))[0], acc, nan)
        self.hoist, self.inner = None, set()
        self.depth -= 1
        self.line("}")
        if vector:
            self.end_vector_loop()
        for r, acc, nan in accs:
            if nan:
                self.line(f"if ({nan}) {acc} = NAN;")
            self.riding[r] = acc

    def stored(self, name: str, code: str) -> str:
        """`code` (of the member's type) as its buffer stores it."""
        return f"sf_to_bf16({code})" if self.buffers[name].dtype is DType.bfloat16 else code

    def typed(self, s: Scalar, dt: DType) -> str:
        code, got = self.expr(s)
        return code if got is dt else f"{CTYPE[dt]}({code})"


def _loop_vars(s: Scalar) -> set[str] | None:
    """The names a scalar's value depends on through its indices (loop variables, sizes), or
    None when it holds a reduction (its value is made by lines of its own)."""
    if isinstance(s, Reduce):
        return None
    if isinstance(s, Index):
        return {x.name for x in s.expr.free_symbols}
    parts = s.index if isinstance(s, Load) else s.args if isinstance(s, Call) else ()
    out: set[str] = set()
    for p in parts:
        inner = {x.name for x in p.free_symbols} if isinstance(p, sympy.Expr) else _loop_vars(p)
        if inner is None:
            return None
        out |= inner
    return out


def _calls_libm(s: Scalar) -> bool:
    """Does `s` call a libm function (scalar on targets without a vector math library)?"""
    if isinstance(s, Call):
        own = s.fn == "sqrt" or (s.fn in ("exp", "erf") and s.dtype is DType.float32)  # an instruction, or c.py's
        libm = s.fn in LIBM
        return (libm and not own) or any(_calls_libm(a) for a in s.args)
    if isinstance(s, Load):
        return any(not isinstance(i, sympy.Expr) and _calls_libm(i) for i in s.index)
    return isinstance(s, Reduce) and _calls_libm(s.body)


def _reads_memory(s: Scalar) -> bool:
    return any(True for _ in loads(s))


def emit_kernel(step: NativeStep, buffers: dict[str, Buffer], symbols: list[str], gathers: list[str]) -> KernelSource:
    """C++ for `step`; every gather it performs is described in `gathers` (its index there
    is what the kernel reports when an index is out of range)."""
    if step.order is not None:  # its outputs indexed in its loop order
        buffers = {**buffers, **{n: in_step_order(buffers[n], step.order) for n in step.outputs}}
    return _Emitter(step, buffers, symbols, gathers).emit()


__all__ = ["KernelSource", "emit_kernel"]
