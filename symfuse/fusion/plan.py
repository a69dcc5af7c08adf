"""Partitioning a TE program into kernels.

Decisions use only the dependence analysis and the shape store's relations, never a
value of a symbolic dim. Legality (`legal`) and profitability (`profitable`) are separate,
and every pair that is considered and refused is logged with its reason.

Policy, in order:
1. Generators (element-wise TEs that load nothing but generators: constants, aranges, an
   arange plus an offset) are inlined into their readers, except one that calls a
   transcendental function and is read by a tensor of more dims (it would be recomputed
   for each of them): that one is a kernel of its own.
2. GEMM epilogues: a compute-intensive TE absorbs element-wise consumers of the same
   shape that read it one-to-one (bias is already in the GEMM's TE; GELU joins here),
   unless the consumer's value flows into a reduction over the same rows, where it
   belongs (step 3); a pooling window reads rows around its own, so it takes nothing.
3. Loop, input and stitch fusion: memory-intensive TEs join when one reads the other
   one-to-one or over a region of the same rows (all dims but the last equal in the
   store); so a residual add, a layer norm's statistics and its normalisation become one
   kernel, and so do a softmax's scale, mask, max, sum and division.
No merge may create a cycle between kernels; opaque ops stay alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from symfuse.ir.tri import Tri
from symfuse.shape.store import ShapeStore
from symfuse.te.analysis import GATHER, MANY, ONE, Analysis, has_reduce, in_row, loads, same_element
from symfuse.te.ir import TE, Call, Load, Opaque
from symfuse.te.lower import TEProgram


@dataclass
class Kernel:
    name: str
    members: list[str]
    kind: str  # gemm | gemm+epilogue | reduction | loop | opaque

    def __str__(self) -> str:
        return f"{self.name} [{self.kind}]: {', '.join(self.members)}"


@dataclass
class Decision:
    producer: str
    consumer: str
    fused: bool
    reason: str


@dataclass
class Plan:
    kernels: list[Kernel] = field(default_factory=list)
    inlined: list[str] = field(default_factory=list)
    log: list[Decision] = field(default_factory=list)

    def refused(self) -> list[Decision]:
        return [d for d in self.log if not d.fused]


class _Planner:
    def __init__(self, prog: TEProgram, a: Analysis, store: ShapeStore) -> None:
        self.prog, self.a, self.store = prog, a, store
        self.items = {t.name: t for t in prog.items}
        self.order = {t.name: i for i, t in enumerate(prog.items)}
        self.group = {t.name: t.name for t in prog.items}
        self.consumers: dict[str, list[str]] = {}
        self.producers: dict[str, list[str]] = {}
        for (p, c), _ in a.edges.items():
            if p in self.items:
                self.consumers.setdefault(p, []).append(c)
                self.producers.setdefault(c, []).append(p)
        self.plan = Plan()
        self._generators: dict[str, bool] = {}

    # -- groups -------------------------------------------------------------------------
    def find(self, t: str) -> str:
        while self.group[t] != t:
            t = self.group[t]
        return t

    def union(self, a: str, b: str) -> None:
        ga, gb = self.find(a), self.find(b)
        if ga != gb:
            self.group[gb] = ga

    def creates_cycle(self, a: str, b: str) -> bool:
        """Would merging the groups of a and b make some path leave and re-enter them?"""
        ga, gb = self.find(a), self.find(b)
        inside = {ga, gb}
        start = [
            c
            for m in self.items
            if self.find(m) in inside
            for c in self.consumers.get(m, [])
            if self.find(c) not in inside
        ]
        seen, stack = set(), start
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            if self.find(t) in inside:
                return True
            stack.extend(self.consumers.get(t, []))
        return False

    def gemm_reads_group(self, a: str, b: str) -> bool:
        """Would the merged group of a and b hold a GEMM together with something the GEMM
        reads, directly or through other TEs? A GEMM's kernel runs the library call first
        and its epilogue after, so its inputs must be finished before the kernel starts."""
        inside = {self.find(a), self.find(b)}
        members = {m for m in self.items if self.find(m) in inside}
        for g in (m for m in members if self.gemm(m)):
            seen, stack = set(), list(self.producers.get(g, []))
            while stack:
                t = stack.pop()
                if t in seen:
                    continue
                seen.add(t)
                if t in members:
                    return True
                stack.extend(self.producers.get(t, []))
        return False

    # -- properties -----------------------------------------------------------------------
    def is_te(self, t: str) -> bool:
        return isinstance(self.items.get(t), TE)

    def generator(self, t: str) -> bool:
        """Does t load nothing but other generators (a constant, an arange, an arange plus a
        constant offset), element-wise? Then it is computed where it is read, unless that would
        repeat a transcendental function for every element of a larger tensor (T5's position
        buckets, a logarithm over [S, S], read for every batch row and head): then it is
        computed once, in a kernel of its own."""
        if t not in self._generators:
            self._generators[t] = (
                self.is_te(t)
                and not has_reduce(self.items[t].body)
                and all(self.generator(ld.tensor) for ld, _ in loads(self.items[t].body))
                and not (self.costly(t) and self.broadcast(t))
            )
        return self._generators[t]

    def costly(self, t: str) -> bool:
        """Does t, or a generator it is made of, call a transcendental function?"""
        body = self.items[t].body
        return _calls(body, COSTLY) or any(
            self.is_te(ld.tensor) and self.costly(ld.tensor) for ld, _ in loads(body)
        )  # fmt: skip

    def broadcast(self, t: str) -> bool:
        """Does a reader of t have more dims than t (reading each element many times)?"""
        return any(
            self.is_te(c) and len(self.items[c].shape) > len(self.items[t].shape) for c in self.consumers.get(t, [])
        )

    def gemm(self, t: str) -> bool:
        return self.a.kind.get(t) == "compute-intensive"

    def rows_match(self, p: str, c: str) -> Tri:
        sp, sc = self.items[p].shape, self.items[c].shape
        if len(sp) != len(sc):
            return Tri.NO
        return self.store.same_shape(sp[:-1], sc[:-1]) if sp else Tri.YES

    def elementwise_reader(self, p: str, c: str) -> bool:
        """Does c read p element for element: the same shape, or every read at c's own
        offset in p (a reshape between them)?"""
        pt, ct = self.items[p], self.items[c]
        if self.store.same_shape(pt.shape, ct.shape) is Tri.YES:
            return True
        return all(same_element(ld, pt.shape, ct) for ld, _ in loads(ct.body) if ld.tensor == p)

    def reads_own_rows(self, p: str, c: str) -> bool:
        ct = self.items[c]
        return all(in_row(ld.index, ct.axes, ct.shape) for ld, _ in loads(ct.body) if ld.tensor == p)

    def feeds_reduction(self, t: str, seen=None) -> bool:
        """Does t's value flow, through one-to-one element-wise TEs, into a reduction that
        could take it into its kernel (one over the same rows: a layer norm, not a pooling
        window, which reads rows around its own)?"""
        seen = seen or set()
        for c in self.consumers.get(t, []):
            if c in seen or not self.is_te(c) or self.gemm(c):
                continue
            seen.add(c)
            if (self.a.edges.get((t, c)) == MANY and self.legal(t, c)[0]) or self.feeds_reduction(c, seen):
                return True
        return False

    # -- legality and profit ------------------------------------------------------------------
    def legal(self, p: str, c: str) -> tuple[bool, str]:
        rel = self.a.edges.get((p, c))
        if not self.is_te(p) or not self.is_te(c):
            return False, "an opaque op runs through torch on its own"
        if rel == GATHER:
            return False, "the consumer reads it through a data-dependent index"
        if self.gemm(c):
            return False, "a library GEMM takes its operands from memory (no prologue fusion)"
        if self.gemm_reads_group(p, c):
            return False, "the GEMM of one kernel reads the other kernel's values: they must be done before it runs"
        if self.gemm(p):
            if rel != ONE or not self.elementwise_reader(p, c):
                return False, "a GEMM epilogue must read the result element for element (same shape, or a reshape)"
            if has_reduce(self.items[c].body):
                return False, "a reduction is not an epilogue"
            if self.creates_cycle(p, c):
                return False, "fusing would create a cycle between kernels"
            return True, "GEMM epilogue"
        if self.rows_match(p, c) is not Tri.YES:
            return False, "the two do not run over the same rows (shape relation unknown or different)"
        if not self.reads_own_rows(p, c):
            return False, "the consumer reads the producer outside its own row"
        if self.creates_cycle(p, c):
            return False, "fusing would create a cycle between kernels"
        return True, "same rows: " + ("stitch/input fusion" if rel == MANY else "loop fusion")

    def profitable(self, p: str, c: str) -> tuple[bool, str]:
        if self.gemm(p) and self.feeds_reduction(c):
            return False, "its value flows into a reduction: it joins that kernel instead"
        return True, "saves a round trip through memory"

    def consider(self, p: str, c: str) -> None:
        if self.find(p) == self.find(c):
            return
        ok, why = self.legal(p, c)
        if ok:
            good, why2 = self.profitable(p, c)
            ok, why = good, (why if good else why2)
        self.plan.log.append(Decision(p, c, ok, why))
        if ok:
            self.union(c, p)

    def run(self) -> Plan:
        self.plan.inlined = [t for t in self.items if self.generator(t)]
        inlined = set(self.plan.inlined)
        edges = [(p, c) for (p, c) in self.a.edges if p in self.items and p not in inlined]
        edges.sort(key=lambda e: self.order[e[1]])
        for p, c in edges:  # GEMM epilogues first
            if self.gemm(p):
                self.consider(p, c)
        for p, c in edges:
            if not self.gemm(p):
                self.consider(p, c)
        groups: dict[str, list[str]] = {}
        for t in self.items:
            if t not in inlined:
                groups.setdefault(self.find(t), []).append(t)
        for i, ms in enumerate(self.topological(list(groups.values()))):
            kind = self._kind(ms)
            anchor = next((m for m in ms if self.gemm(m)), ms[-1])
            self.plan.kernels.append(Kernel(f"k{i}_{anchor}", ms, kind))
        return self.plan

    def topological(self, groups: list[list[str]]) -> list[list[str]]:
        """Kernels in an order that runs every producer first (merging can move a member
        ahead of its group's first member), ties broken by program order."""
        of = {m: i for i, ms in enumerate(groups) for m in ms}
        deps = [set() for _ in groups]
        for (p, c), _ in self.a.edges.items():
            if p in of and c in of and of[p] != of[c]:
                deps[of[c]].add(of[p])
        done: set[int] = set()
        out = []
        ready = sorted(range(len(groups)), key=lambda i: self.order[groups[i][0]])
        while ready:
            i = next(i for i in ready if deps[i] <= done)
            ready.remove(i)
            done.add(i)
            out.append(groups[i])
        return out

    def _kind(self, ms: list[str]) -> str:
        if isinstance(self.items[ms[0]], Opaque):
            return "opaque"
        if any(self.gemm(m) for m in ms):
            return "gemm+epilogue" if len(ms) > 1 else "gemm"
        return "reduction" if any(has_reduce(self.items[m].body) for m in ms) else "loop"


# element-wise functions far dearer than an add or a compare
COSTLY = frozenset({"exp", "log", "pow", "tanh", "erf", "sin", "cos", "sigmoid", "gelu", "log1p", "expm1", "atan2"})


def _calls(s, fns: frozenset) -> bool:
    if isinstance(s, Call):
        return s.fn in fns or any(_calls(a, fns) for a in s.args)
    if isinstance(s, Load):
        return any(not isinstance(i, sympy.Expr) and _calls(i, fns) for i in s.index)
    return False


def plan(prog: TEProgram, analysis: Analysis, store: ShapeStore) -> Plan:
    return _Planner(prog, analysis, store).run()
