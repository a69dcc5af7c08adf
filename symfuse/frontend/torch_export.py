"""PyTorch capture: torch.export with dynamic dims, then ATen -> symfuse graph.

The model is exported once with every dynamic dim marked `Dim.AUTO`, decomposed to the
functional ATen IR with high-level
ops kept (`run_decompositions({})`; ops `ATEN` lacks through torch's core decompositions
where they have one), and converted node by node through `ATEN`. Shapes
are not taken from torch: every node's type comes from the registry's shape rules, with
the dims of the inputs as the only symbols, so all shape facts live in symfuse's store.
Parameters and buffers are frozen into the graph as constants.
"""

from __future__ import annotations

import ast
import inspect
import logging
import math
import operator
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import Dim
from torch.export.graph_signature import InputKind, OutputKind

from symfuse.errors import CaptureError, UnsupportedOpsError
from symfuse.frontend import lstm as _lstm  # noqa: F401  (registers symfuse::lstm)
from symfuse.frontend import paged as _paged  # noqa: F401  (registers symfuse::paged_attention)
from symfuse.frontend.aten_table import ATEN, Unsupported
from symfuse.frontend.dynamic import DimDecl, parse_dynamic
from symfuse.ir.dims import Dim as DimExpr
from symfuse.ir.dims import dim, dmax, dmin, floordiv, mod
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Graph, Value
from symfuse.runtime.guard import Check
from symfuse.shape.infer import GraphBuilder
from symfuse.shape.store import ShapeStore

SYM_OPS = {
    operator.add: lambda a, b: a + b,
    operator.sub: lambda a, b: a - b,
    operator.mul: lambda a, b: a * b,
    operator.floordiv: floordiv,
    operator.mod: mod,
    operator.neg: lambda a: -a,
    torch.sym_max: dmax,
    torch.sym_min: dmin,
}

log = logging.getLogger("symfuse")


@dataclass
class Captured:
    graph: Graph
    store: ShapeStore
    declared: list[Value]  # graph inputs with their dims as declared (before unification)
    input_names: list[str]  # every flat input, tensors and fixed values, in call order
    fixed: dict[str, Any]  # non-tensor inputs baked in at capture, by name
    out_spec: Any
    seconds: float
    notes: list[str] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)  # seconds of each part of `seconds`
    output_names: list[str] | None = None  # an imported model's named outputs (ONNX)
    traced_under: list[Check] = field(default_factory=list)  # torch.export's guards the run-time guard checks


def source_location(node: torch.fx.Node) -> str:
    path = ""
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path = list(stack.values())[-1][0]
    trace = node.meta.get("stack_trace") or ""
    frames = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    where = ""
    if frames:
        parts = frames[-1].split('"')
        line = frames[-1].split("line ")[-1].split(",")[0] if "line " in frames[-1] else "?"
        where = f"{os.path.basename(parts[1]) if len(parts) > 1 else '?'}:{line}"
    return " ".join(p for p in (path, where) if p)


class Converter:
    """Resolves FX arguments to symfuse values, dims and scalars while nodes convert."""

    def __init__(self, builder: GraphBuilder) -> None:
        self.b = builder
        self.env: dict[torch.fx.Node, Any] = {}
        self.target: Any = None
        self.name, self.loc = "", ""

    def emit(self, op: str, inputs, **attrs) -> Value:
        return self.b.add(op, inputs, attrs, loc=self.loc, name=self.name)[0]

    def emit_multi(self, op: str, inputs, **attrs) -> tuple[Value, ...]:
        return self.b.add(op, inputs, attrs, loc=self.loc, name=self.name)

    def tensor(self, arg: Any) -> Value:
        v = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(v, Value):
            raise Unsupported(f"expected a tensor argument, got {arg!r}")
        return v

    def opt(self, arg: Any) -> Value | None:
        return None if arg is None else self.tensor(arg)

    def scalar(self, arg: Any) -> Any:
        """A Python number, or a dim expression for a symbolic int."""
        if isinstance(arg, torch.fx.Node):
            v = self.env.get(arg)
            if isinstance(v, DimExpr):
                return v
            raise Unsupported(f"expected a scalar argument, got tensor {arg.name}")
        return arg

    def operand(self, arg: Any) -> Value:
        if isinstance(arg, torch.fx.Node) and isinstance(self.env.get(arg), Value):
            return self.env[arg]
        return self.b.scalar(self.scalar(arg), loc=self.loc)

    def dims(self, items) -> tuple:
        out = []
        for x in items:
            x = self.scalar(x)
            out.append(x if isinstance(x, int) and x == -1 else dim(x))
        return tuple(out)


def _parameters(model) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []


def _positional(params: list[inspect.Parameter]) -> list[str]:
    """The names of the parameters an input given by position binds to, before `*args`."""
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _flat_inputs(model, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Every input by name: a positional one by its parameter's, those `*args` takes as
    `<args>_<i>` (`xs_0`, `xs_1` for `forward(self, *xs)`), `arg<i>` where forward has no
    signature to read."""
    params = _parameters(model)
    positional = _positional(params)
    rest = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "arg")
    names = {}
    for i, a in enumerate(args):
        names[positional[i] if i < len(positional) else f"{rest}_{i - len(positional)}" if params else f"arg{i}"] = a
    names.update(kwargs)
    for k, v in names.items():
        if isinstance(v, (list, tuple, dict)):
            raise ValueError(f"input '{k}' is a {type(v).__name__}; symfuse takes tensors and plain values as inputs")
    return names


class _Positional(torch.nn.Module):
    """`model` taking every input positionally, the last ones passed on as keywords: what is
    exported when an input goes to forward's `**kwargs`, for which torch.export cannot take
    dynamic shapes (pytorch/pytorch#150022)."""

    def __init__(self, model: torch.nn.Module, n_args: int, keywords: list[str]) -> None:
        super().__init__()
        self.model, self.n_args, self.keywords = model, n_args, keywords

    def forward(self, *inputs):
        return self.model(*inputs[: self.n_args], **dict(zip(self.keywords, inputs[self.n_args :])))


def _for_export(model, inputs: dict[str, Any], n_args: int, specs: dict[str, Any]):
    """(module, args, kwargs, dynamic_shapes) for torch.export: the per-input `specs` keyed
    by forward's parameters, the inputs `*args` takes as a tuple under its name; a tuple in
    input order where forward has no signature to read; every input positional to
    `_Positional(model)` when one goes to `**kwargs`."""
    names = list(inputs)
    args, kwargs = tuple(inputs[k] for k in names[:n_args]), {k: inputs[k] for k in names[n_args:]}
    params = _parameters(model)
    if not params:
        return model, args, kwargs, tuple(specs[n] for n in names)
    positional = _positional(params)
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    var_args = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), None)
    if any(k not in keywords for k in kwargs):  # a keyword that forward's **kwargs takes
        wrapped = _Positional(model, n_args, list(kwargs))
        return wrapped, tuple(inputs.values()), {}, {"inputs": tuple(specs.values())}
    shapes: dict[str, Any] = {}
    for i, n in enumerate(names):
        if i >= n_args:
            shapes[n] = specs[n]
        elif i < len(positional):
            shapes[positional[i]] = specs[n]
        else:
            shapes[var_args] = (*shapes.get(var_args, ()), specs[n])
    return model, args, kwargs, shapes


def _unshare(inputs: dict[str, Any]) -> list[str]:
    """torch.export captures two inputs given the same memory in the example as one (the
    second placeholder read for both), which would compute wrong answers once they differ:
    each input after the first on the same memory is captured from a copy of it."""
    owners: dict[int, str] = {}
    notes = []
    for name, v in inputs.items():
        if not isinstance(v, torch.Tensor) or v.numel() == 0:
            continue
        where = v.untyped_storage().data_ptr()
        if where in owners:
            inputs[name] = v.clone()
            notes.append(
                f"inputs '{owners[where]}' and '{name}' shared memory in the example; '{name}' was captured "
                "from a copy, so that the two stay separate inputs"
            )
        else:
            owners[where] = name
    return notes


def _grow_size_one(inputs: dict[str, Any], decls: dict[str, dict[int, DimDecl]]) -> list[str]:
    """torch.export fixes a dim whose example size is 1, so a dim declared dynamic with an
    example of 1 is grown to 2 by repeating the example along it, on every input that has
    that dim (a batch of two copies; a sequence of its token twice): a valid input for the
    model wherever one of size 1 was. Returns what was done, for `explain`."""
    ones = {
        decl.name
        for name, dims in decls.items()
        for d, decl in dims.items()
        if not decl.auto and isinstance(inputs[name], torch.Tensor) and inputs[name].shape[d] == 1
        and decl.lo <= 2 <= decl.hi
    }  # fmt: skip
    notes = []
    for name, dims in decls.items():
        for d, decl in dims.items():
            if decl.name in ones and inputs[name].shape[d] == 1:
                inputs[name] = torch.cat([inputs[name]] * 2, dim=d)
                notes.append(
                    f"input '{name}' dim {d} ('{decl.name}') had an example of size 1, which torch.export would "
                    "fix: captured with the example repeated to size 2 along it"
                )
    return notes


def capture(model: torch.nn.Module, example_inputs: Any, dynamic: Any = None) -> Captured:
    t0 = time.perf_counter()
    model = _lstm.as_root(model)
    if isinstance(example_inputs, dict):
        args, kwargs = (), dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    elif isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    else:
        raise TypeError("example_inputs must be a tensor, a tuple of inputs or a dict of keyword inputs")
    inputs = _flat_inputs(model, args, kwargs)
    decls = parse_dynamic(dynamic, inputs)
    changed = _unshare(inputs) + _grow_size_one(inputs, decls)  # what capture did to the example, for explain
    for name, dims in decls.items():
        for d, decl in dims.items():
            size = inputs[name].shape[d]
            if not decl.auto and size < 2:
                raise ValueError(
                    f"input '{name}' dim {d} is declared dynamic ('{decl.name}') but its example size is {size}; "
                    + (
                        "give a non-empty example (symfuse grows an example of 1 to 2 for torch.export)"
                        if size == 0
                        else f"torch.export fixes a size of 1, and 2 is outside the declared range of '{decl.name}'"
                    )
                )
            if not decl.lo <= size <= decl.hi:
                raise ValueError(
                    f"input '{name}' dim {d}: example size {size} is outside the declared range of '{decl.name}'"
                )
    # Dim.AUTO never fails the export: dims the model fixes come back static, and the
    # conversion below turns a declared-dynamic dim that came back static into a clear error.
    specs = {
        k: ({d: Dim.AUTO for d in decls.get(k, {})} if isinstance(v, torch.Tensor) else None) for k, v in inputs.items()
    }
    exported, args, kwargs, dynamic_shapes = _for_export(model, inputs, len(args), specs)
    notes = list(changed)
    if model.training:
        notes.append("the model was in training mode; it was captured in eval mode")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), _lstm.lstms_as_custom_op(model), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t1 = time.perf_counter()
            try:
                ep = torch.export.export(exported, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
            except Exception as e:  # noqa: BLE001 (torch's tracer raises many kinds; each is explained)
                raise _explained(e) from e
            guards = list(getattr(ep, "_guards_code", None) or [])  # (the conditions the trace holds under)
            t2 = time.perf_counter()
            # export's own IR converts as it is for most models; tracing it again into the
            # inference IR (run_decompositions) took 4 of BERT-base's 6 s of capture, so only
            # a graph with ops the table lacks pays for it
            try:
                ep.graph_module.graph.eliminate_dead_code()  # (the inference IR would have dropped them)
                captured = _convert(ep, inputs, decls, model)
            except UnsupportedOpsError as e:
                ops = sorted({op for op, _, _ in e.problems})
                log.info("symfuse: export's IR has %s; tracing it into the inference IR", ", ".join(ops))
                ep = _decomposed(ep)
                captured = None
    finally:
        model.train(was_training)
    if captured is None:
        captured = _convert(ep, inputs, decls, model)
    captured.traced_under = _traced_under(guards, exported, args, kwargs, inputs, captured.declared)
    captured.seconds = time.perf_counter() - t0
    captured.stages = {
        "torch.export": t2 - t1,
        "conversion to symfuse's graph (and decompositions where needed)": time.perf_counter() - t2 + (t1 - t0),
    }
    captured.notes += notes
    return captured


def _unmapped(target) -> bool:
    known = (operator.getitem, torch.ops.aten.sym_size.int)
    return target not in ATEN and target not in SYM_OPS and target not in known


def _decomposed(ep):
    """The inference IR (`run_decompositions({})`); then each op the table still lacks that
    torch's decompositions turn into ops it has (core ATen's first: mish, rms_norm, einsum,
    bilinear upsampling, ...), decomposed. An op whose decomposition leaves something
    unmapped stays as the model wrote it, so the error names it rather than torch's parts."""
    from torch._decomp import decomposition_table as everything  # (overloads core leaves out: upsampling's .vec)

    try:
        first = ep.run_decompositions({})
    except Exception as e:  # noqa: BLE001
        raise _explained(e) from e
    core = torch.export.default_decompositions()

    def unmapped(e) -> set:
        return {n.target for n in e.graph.nodes if n.op == "call_function" and _unmapped(n.target)}

    def decomposition(op):
        return core[op] if op in core else everything.get(op)

    def complete(ops: set):
        """(table, program) decomposing `ops` and whatever their parts need in turn, if none of
        it stays unmapped; else None."""
        table = {op: decomposition(op) for op in ops}
        for _ in range(6):
            if any(f is None for f in table.values()):
                return None
            try:
                done = first.run_decompositions(table)
            except Exception:  # noqa: BLE001 (a decomposition torch cannot trace here: the op is reported by name)
                return None
            left = unmapped(done) - (missing - ops)
            if not left:
                return table, done
            table.update({o: decomposition(o) for o in left})
        return None

    missing = unmapped(first)
    if not missing:
        return first
    whole = complete(missing)  # (the usual case: every op decomposes, in one trace per round)
    if whole is not None:
        log.info("symfuse: decomposing %s", ", ".join(sorted(map(str, whole[0]))))
        return whole[1]
    table: dict = {}
    for op in sorted(missing, key=str):  # each on its own: keep those that decompose fully
        mine = complete({op})
        if mine is not None:
            table.update(mine[0])
    if not table:
        return first
    log.info("symfuse: decomposing %s", ", ".join(sorted(map(str, table))))
    return first.run_decompositions(table)


_SIZE = re.compile(r"L((?:\[[^\[\]]+\])+)\.size\(\)\[(\d+)\]")


def _traced_under(codes: list[str], exported, args, kwargs, inputs: dict[str, Any], declared) -> list[Check]:
    """torch.export's guards on the input sizes (Python over `L[<argument>].size()[d]`) as
    run-time checks over symfuse's symbols. They hold where the model's code took the path
    it was traced on (`if width % 4 == 0`): elsewhere the graph is another program's, and a
    call there must be refused, not run. Guards that only keep a size away from 1 (`x != 1`,
    `x > 1`: torch's size-1 specialisation of strides and broadcasts) are not checked: the
    graph computes the same there, and checking them would refuse batches or images of size 1."""
    try:
        bound = inspect.signature(exported.forward).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return []
    name_of = {id(v): k for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    dims = {v.name: v.type.shape for v in declared}
    example = {
        e.name: int(inputs[v.name].shape[d]) for v in declared for d, e in enumerate(v.type.shape) if e.is_Symbol
    }

    def size(m: re.Match) -> str:
        try:
            t = eval("L" + m.group(1), {"__builtins__": {}}, {"L": bound})  # noqa: S307 - a subscript path
        except Exception:  # noqa: BLE001
            raise LookupError from None
        name = name_of.get(id(t))
        if name not in dims or int(m.group(2)) >= len(dims[name]):
            raise LookupError
        e = dims[name][int(m.group(2))]
        return e.name if e.is_Symbol else str(int(e))

    out, seen = [], set()
    for code in codes:
        try:
            expr = _SIZE.sub(size, code)
            tree = ast.parse(expr, mode="eval")
        except (LookupError, SyntaxError):
            continue
        if "L[" in expr or _keeps_from_one(tree.body) or expr in seen:
            continue
        syms = tuple(sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in example}))
        try:
            if not syms or not eval(expr, {"__builtins__": {"min": min, "max": max}}, dict(example)):  # noqa: S307
                continue
        except Exception:  # noqa: BLE001 - a guard this conversion cannot evaluate is left out
            continue
        seen.add(expr)
        out.append(
            Check(
                expr,
                f"{expr} (the model's code branches on it and was traced where it holds; sizes where it does not need "
                "a compile from an example of them)",
                (),
                syms,
            )
        )
    return out


def _keeps_from_one(e: ast.expr) -> bool:
    """`a != b`, `x > 1`, `1 < x`, `x >= 2`, `2 <= x`: torch's guards against size-1 special cases."""
    if not isinstance(e, ast.Compare) or len(e.ops) != 1:
        return False
    op, left, right = e.ops[0], e.left, e.comparators[0]

    def const(x, v):
        return isinstance(x, ast.Constant) and x.value == v

    return (
        isinstance(op, ast.NotEq)
        or (isinstance(op, ast.Gt) and const(right, 1))
        or (isinstance(op, ast.Lt) and const(left, 1))
        or (isinstance(op, ast.GtE) and const(right, 2))
        or (isinstance(op, ast.LtE) and const(left, 2))
    )


# torch's tracer errors that mean a shape or a branch depends on tensor values
_DATA_DEPENDENT = (
    "DataDependentOutputException", "GuardOnDataDependentSymNode", "PendingUnbackedSymbolNotFound",
    "DynamicOutputShapeException",
)  # fmt: skip


def _explained(e: Exception) -> Exception:
    """torch.export's failure in symfuse's terms: an output type it cannot flatten (with what
    to do about the usual one: a transformers key/value cache, returned when `use_cache` is
    on), or any other tracing error as a CaptureError that says what kind it is."""
    m = re.search(r"Found <class '([\w.]+)'> in output", str(e))
    if m is None:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        kind = type(e).__name__
        if kind in _DATA_DEPENDENT:
            why = (
                "the model's control flow or an output's size depends on tensor values (.item(), torch.equal, "
                "nonzero, unique, a Python `if` on a tensor); symfuse compiles programs whose sizes follow the "
                "input sizes alone"
            )
        elif kind == "UnsupportedOperatorException":
            why = "an op has no shape rule for tracing with symbolic sizes"
        else:
            why = "see the cause below"
        return CaptureError(f"torch.export could not trace the model with its dims dynamic ({why}): {kind}: {first}")
    cls = m.group(1)
    hint = (
        "it is the key/value cache a transformers model returns with use_cache on: give `use_cache=False` "
        "among the example inputs (or set model.config.use_cache = False) and compile again; to generate text, "
        "compile the causal LM (a ...ForCausalLM) with no example: symfuse.compile(model) gives a Decoder that "
        "owns its cache (docs/generation.md)"
        if "cache" in cls.lower()
        else "return tensors (or tuples, lists and dicts of them) from forward"
    )
    return TypeError(f"the model's output holds a {cls}, which symfuse cannot return as tensors; {hint}")


def _convert(ep, inputs: dict[str, Any], decls: dict[str, dict[int, DimDecl]], model) -> Captured:
    name = type(model).__name__
    store = ShapeStore()
    b = GraphBuilder(name, store)
    cv = Converter(b)
    sig = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    user_names = list(inputs)
    user_i = 0
    fixed: dict[str, Any] = {}
    auto_names: dict[str, str] = {}
    tensor_consts = {**ep.state_dict, **ep.constants}
    for node, spec in zip(placeholders, sig.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            iname = user_names[user_i]
            user_i += 1
            example = inputs[iname]
            if not isinstance(example, torch.Tensor):
                fixed[iname] = example
                continue
            shape = []
            for d, s in enumerate(node.meta["val"].shape):
                decl = decls.get(iname, {}).get(d)
                if isinstance(s, torch.SymInt) and s.node.expr.is_number:
                    s = int(s.node.expr)  # (a dim export specialised can come back as a constant SymInt)
                if isinstance(s, int):
                    if decl is not None and not decl.auto:
                        raise ValueError(
                            f"input '{iname}' dim {d} is declared dynamic ('{decl.name}') but the model only works "
                            f"with size {s} there (torch.export specialised it: the model's code branches on this "
                            "size, e.g. on its parity, so one program cannot serve every size)"
                        )
                    shape.append(dim(s))
                    continue
                key = str(s.node.expr)
                sym_name = (
                    decl.name if decl is not None and not decl.auto else auto_names.setdefault(key, f"{iname}_{d}")
                )
                lo, hi = (decl.lo, decl.hi) if decl is not None else (1, math.inf)
                shape.append(store.declare(sym_name, lo=lo, hi=hi, bound_at=f"input '{iname}' dim {d}"))
            cv.env[node] = b.input(iname, shape, DType.of(example.dtype))
        else:
            t = tensor_consts.get(spec.target)
            if t is None:
                raise ValueError(f"cannot find the value of {spec.kind.name.lower()} {spec.target}")
            cv.env[node] = b.constant(node.name, t.detach())

    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    missing = []
    for n in calls:
        if _unmapped(n.target):
            missing.append((str(n.target), "no symfuse op for it", source_location(n)))
    if missing:
        raise UnsupportedOpsError(missing)

    for n in calls:
        cv.target, cv.name, cv.loc = n.target, n.name, source_location(n)
        try:
            cv.env[n] = _as_torch_types(cv, _convert_node(cv, n), n.meta.get("val"))
        except Unsupported as e:
            raise UnsupportedOpsError([(str(n.target), str(e), cv.loc)]) from None

    outs = []
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    for arg, spec in zip(out_node.args[0], sig.output_specs):
        if spec.kind != OutputKind.USER_OUTPUT:
            raise UnsupportedOpsError([("output", f"the model mutates {spec.target} in place", "")])
        v = cv.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(v, Value):
            raise UnsupportedOpsError([("output", f"output {arg!r} is not a tensor", "")])
        outs.append(v)
    for iname, dims in decls.items():
        for d, decl in dims.items():
            fixed_to = store.canon(store.symbols[decl.name].symbol) if decl.name in store.symbols else None
            if not decl.auto and fixed_to is not None and fixed_to.is_Integer:
                why = next(
                    (
                        str(f.origin)
                        for f in store.facts
                        if f.kind == "eq" and decl.name in map(str, f.lhs.free_symbols | f.rhs.free_symbols)
                    ),
                    "",
                )
                raise ValueError(
                    f"input '{iname}' dim {d} is declared dynamic ('{decl.name}') but the model only works with size "
                    f"{fixed_to} there" + (f" (rule: {why})" if why else "")
                )
    declared = list(b.graph.inputs)
    graph = b.finish(outs)
    return Captured(graph, store, declared, user_names, fixed, ep.call_spec.out_spec, 0.0)


def _convert_node(cv: Converter, n: torch.fx.Node) -> Any:
    if n.target is torch.ops.aten.sym_size.int:
        return cv.b.store.canon(cv.tensor(n.args[0]).type.shape[n.args[1]])
    if n.target in SYM_OPS:
        return SYM_OPS[n.target](*(dim(cv.scalar(a)) for a in n.args))
    if n.target is operator.getitem:
        got = cv.env[n.args[0]][n.args[1]]
        if got is None:
            raise Unsupported(
                f"output {n.args[1]} of {n.args[0].target} is not computed by symfuse (indices, statistics)"
            )
        return got
    args = _bind(n)
    x = args.get("self")
    if "dim" in args and isinstance(x, torch.fx.Node) and isinstance(cv.env.get(x), Value) and cv.env[x].type.rank == 0:
        return _on_scalar(cv, n, args, x)
    return ATEN[n.target](cv, args)


def _as_torch_types(cv: Converter, out: Any, want: Any) -> Any:
    """Each tensor result in the dtype torch gives it (the node's traced value): where a
    composition computes a value exactly in another type, a cast (a bool tensor clamped by
    integers, or squared, is int64 in torch)."""
    if isinstance(out, Value) and isinstance(want, torch.Tensor) and out.type.rank == want.dim():
        try:
            dt = DType.of(want.dtype)
        except TypeError:
            return out
        return out if dt == out.type.dtype else cv.emit("cast", [out], dtype=dt)
    if isinstance(out, tuple) and isinstance(want, (tuple, list)) and len(out) == len(want):
        return tuple(_as_torch_types(cv, v, w) for v, w in zip(out, want))
    return out


def _on_scalar(cv: Converter, n: torch.fx.Node, args: dict[str, Any], x: torch.fx.Node) -> Any:
    """An op along a dim of a 0-d tensor (torch takes dim 0 or -1 there: `x.sum(0)`,
    `x.max(-1)`, `x.softmax(0)`): the op on the 1-element tensor, each result that torch
    makes 0-d viewed back as 0-d."""
    scalar = cv.env[x]
    cv.env[x] = cv.emit("reshape", [scalar], shape=(dim(1),))
    try:
        out = ATEN[n.target](cv, args)
    finally:
        cv.env[x] = scalar
    want = n.meta.get("val")

    def back(v: Any, w: Any) -> Any:
        if isinstance(v, Value) and isinstance(w, torch.Tensor) and w.dim() == 0 and v.type.rank == 1:
            return cv.emit("reshape", [v], shape=())
        return v

    if isinstance(out, tuple) and isinstance(want, (tuple, list)):
        return tuple(back(v, w) for v, w in zip(out, want))
    return back(out, want)


def _bind(n: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, with defaults filled in."""
    schema = n.target._schema
    out: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(n.args):
            out[arg.name] = n.args[i]
        elif arg.name in n.kwargs:
            out[arg.name] = n.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


__all__ = ["Captured", "capture"]
