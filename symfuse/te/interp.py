"""A TE interpreter on torch tensors, so lowering is testable without a C++ compiler.

Each TE is evaluated over its whole iteration domain at once: every loop variable becomes
an `arange` along a dimension of its own (reduction variables after the output's), index
expressions are evaluated on those grids, loads are advanced indexing, and a `Reduce`
reduces over its variables' dimensions. Opaque items run their torch reference.
"""

from __future__ import annotations

import sympy
import torch

from symfuse import ops
from symfuse.ir.dims import evaluate
from symfuse.reference import attr_evaluator
from symfuse.te.ir import TE, Call, Const, Index, Load, Opaque, Reduce, Scalar
from symfuse.te.lower import TEProgram
from symfuse.te.scalar import FUNCTIONS

FN = {name: f.ref for name, f in FUNCTIONS.items()}
REDUCE = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}


class _Eval:
    """Evaluates scalars on a grid of `rank` dimensions, one per loop variable."""

    def __init__(self, env: dict[str, torch.Tensor], binding: dict[str, int], slots: dict) -> None:
        self.env, self.binding, self.slots, self.rank = env, binding, slots, len(slots)

    def full(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape([1] * (self.rank - t.dim()) + list(t.shape))

    def index(self, e) -> torch.Tensor:
        return self.full(torch.as_tensor(self._index(e)))

    def _index(self, e):
        if not isinstance(e, sympy.Expr):  # a data-dependent (gather) index
            return self.scalar(e).long()
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            if e not in self.slots:
                return self.binding[e.name]
            k, extent = self.slots[e]
            shape = [1] * self.rank
            shape[k] = extent
            return torch.arange(extent).view(shape)
        if e.is_Add or e.is_Mul:
            vals = [self._index(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = out + v if e.is_Add else out * v
            return out
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return torch.div(torch.as_tensor(self._index(num)), self._index(den), rounding_mode="floor")
        if isinstance(e, sympy.Mod):
            return torch.remainder(torch.as_tensor(self._index(e.args[0])), self._index(e.args[1]))
        if isinstance(e, (sympy.Min, sympy.Max)):
            vals = [torch.as_tensor(self._index(a)) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = torch.minimum(out, v) if isinstance(e, sympy.Min) else torch.maximum(out, v)
            return out
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return self._index(e.base) ** int(e.exp)
        raise NotImplementedError(f"index expression {e}")

    def scalar(self, s: Scalar) -> torch.Tensor:
        if isinstance(s, Load):
            t = self.env[s.tensor]
            if not s.index:
                return self.full(t)
            # both branches of a `where` are evaluated here (generated code selects lazily),
            # so the branch not taken may index out of range: clamp, its value is discarded
            idx = [self.index(i).clamp(0, n - 1) for i, n in zip(s.index, t.shape)]
            return t[torch.broadcast_tensors(*idx)]
        if isinstance(s, Const):
            return self.full(torch.tensor(s.value, dtype=s.dtype.torch))
        if isinstance(s, Index):
            return self.index(s.expr).to(s.dtype.torch)
        if isinstance(s, Call):
            args = [self.scalar(a) for a in s.args]
            if s.fn == "cast":
                return args[0].to(s.dtype.torch)
            return FN[s.fn](*args, **dict(s.params))
        if isinstance(s, Reduce):
            body = self.scalar(s.body)
            dims = [self.slots[a][0] for a, _ in s.axes]
            target = [self.slots_extent(k) if k in dims else body.shape[k] for k in range(self.rank)]
            return REDUCE[s.op](body.expand(target), dim=dims, keepdim=True)
        raise TypeError(f"not a scalar: {s!r}")

    def slots_extent(self, k: int) -> int:
        return next(n for kk, n in self.slots.values() if kk == k)


def _reduce_vars(s: Scalar, out: list) -> None:
    if isinstance(s, Reduce):
        out.extend(s.axes)
        _reduce_vars(s.body, out)
    elif isinstance(s, Call):
        for a in s.args:
            _reduce_vars(a, out)
    elif isinstance(s, Load):
        for i in s.index:
            if not isinstance(i, sympy.Expr):
                _reduce_vars(i, out)


def run_te(t: TE, env: dict[str, torch.Tensor], binding: dict[str, int]) -> torch.Tensor:
    shape = [evaluate(d, binding) for d in t.shape]
    raxes: list = []
    _reduce_vars(t.body, raxes)
    slots = {a: (k, n) for k, (a, n) in enumerate(zip(t.axes, shape))}
    for a, extent in raxes:
        slots.setdefault(a, (len(slots), evaluate(extent, binding)))
    v = _Eval(env, binding, slots).scalar(t.body)
    v = v.reshape(list(v.shape[: len(shape)]))  # reduced dims are 1 by now
    return v.expand(shape).to(t.dtype.torch).contiguous()


def run_program(prog: TEProgram, binding: dict[str, int], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    g = prog.graph
    env: dict[str, torch.Tensor] = {v.name: t for v, t in g.constants.items()}
    env.update({v.name: t for v, t in zip(g.inputs, inputs)})
    for item in prog.items:
        if isinstance(item, Opaque):
            n = prog.nodes[item.name]
            opdef = ops.get(n.op)
            args = opdef.pack([env[v.name] if v is not None else None for v in n.inputs])
            out = opdef.ref(*args, **attr_evaluator(dict(n.attrs))(binding))
            for v, t in zip(n.outputs, out if isinstance(out, tuple) else (out,)):
                env[v.name] = t
        else:
            env[item.name] = run_te(item, env, binding)
    return [env[name] for name in prog.outputs]
