"""`torch.compile(model, backend="symfuse", dynamic=True)`: symfuse as a Dynamo backend.

Dynamo traces the model into FX graphs (splitting it at graph breaks, which stay its
business) and hands each graph to `backend` with example inputs. A graph's inputs are
the model's parameters, its tensors, and `SymInt`s for the sizes Dynamo made dynamic
(`s0`, `s1`, ...); each `SymInt` is the size of some tensor input's dim. symfuse compiles
the graph once with every such dim declared dynamic under Dynamo's own symbol name, so a
new sequence length or batch size runs the same compiled program; the SymInt arguments
are recomputed from the tensors inside the capture, so they are never baked in.

Parameters and buffers are frozen into the program as constants (an inference compiler's
usual contract, like Inductor's freezing): changing weights after the first call needs a
new `torch.compile`. A graph symfuse cannot lower runs as Dynamo gave it, after a warning
naming the ops.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import sympy
import torch

from symfuse.errors import UnsupportedOpsError

log = logging.getLogger("symfuse")
_graphs = 0
_fallbacks = 0


def stats() -> dict[str, int]:
    """Graphs this process handed to symfuse, and how many of them fell back to eager."""
    return {"graphs": _graphs, "fallbacks": _fallbacks}


def _example(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


class _GraphModule(torch.nn.Module):
    """The Dynamo graph with tensor-only inputs: parameters become buffers, and each SymInt
    argument is read off the tensor dim it came from."""

    def __init__(self, gm: torch.fx.GraphModule, plan: list[tuple[str, Any]], constants: list[torch.Tensor]) -> None:
        super().__init__()
        self.gm = gm
        self.plan = plan
        for i, t in enumerate(constants):
            self.register_buffer(f"c{i}", t.detach(), persistent=False)

    def run(self, tensors: tuple) -> Any:
        args = []
        for kind, what in self.plan:
            if kind == "const":
                args.append(getattr(self, f"c{what}"))
            elif kind == "tensor":
                args.append(tensors[what])
            else:
                t, d = what
                args.append(tensors[t].shape[d])
        return self.gm(*args)


def _with_named_inputs(module: _GraphModule, names: list[str]) -> torch.nn.Module:
    """A forward with one named parameter per tensor input (torch.export names the dims of
    each input by its parameter)."""
    src = f"def forward(self, {', '.join(names)}):\n    return self.run(({', '.join(names)},))\n"
    ns: dict = {}
    exec(src, ns)  # noqa: S102  (names are generated identifiers)
    cls = type("DynamoGraph", (_GraphModule,), {"forward": ns["forward"]})
    module.__class__ = cls
    return module


def _is_state(node: torch.fx.Node, ex: Any) -> bool:
    """Module state Dynamo passes as a graph input: parameters, buffers, and the float
    attributes (eps, scaling) it turns into 0-d tensors under dynamic=True; or a global."""
    if isinstance(ex, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = source.name if source is not None else ""
    name = name() if callable(name) else str(name)
    # inputs are the frame's arguments, indexed at most (L['x'], L['kwargs']['ids']);
    # an attribute on the way (L['self']._modules[...], L['args'][0].eps) or a global is state
    return isinstance(ex, torch.Tensor) and ("." in name or name.startswith("G["))


def _inline_scalars(gm: torch.fx.GraphModule, node: torch.fx.Node, value: torch.Tensor) -> None:
    """`state.item()` of a frozen 0-d tensor becomes its Python value in the graph."""
    if value.dim() != 0:
        return
    for user in list(node.users):
        if user.op == "call_method" and user.target == "item":
            user.replace_all_uses_with(value.item())  # type: ignore[arg-type]
            gm.graph.erase_node(user)


def _plan(gm: torch.fx.GraphModule, example_inputs: list, state: list[bool]):
    """How each placeholder is fed: a frozen constant, a tensor input, or a tensor's size."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    plan: list[tuple[str, Any]] = []
    constants: list[torch.Tensor] = []
    tensors: list[torch.Tensor] = []
    names: list[str] = []
    dynamic: dict[str, dict[int, str]] = {}
    symbol_at: dict[sympy.Symbol, tuple[int, int]] = {}
    for node, ex, is_state in zip(placeholders, example_inputs, state):
        if is_state:
            _inline_scalars(gm, node, ex)
            plan.append(("const", len(constants)))
            constants.append(ex)
        elif isinstance(ex, torch.Tensor):
            i = len(tensors)
            name = f"x{i}"
            fake = _example(node)
            dims = {}
            for d, s in enumerate(getattr(fake, "shape", ())):
                expr = s.node.expr if isinstance(s, torch.SymInt) else None
                if isinstance(expr, sympy.Symbol):
                    dims[d] = str(expr)
                    symbol_at.setdefault(expr, (i, d))
                elif expr is not None and not expr.is_Integer:
                    raise UnsupportedOpsError([("input", f"input dim {d} has size {expr}, not a plain symbol", "")])
            if dims:
                dynamic[name] = dims
            plan.append(("tensor", i))
            tensors.append(ex)
            names.append(name)
        elif isinstance(ex, (int, torch.SymInt)):
            plan.append(("size", node))
        else:
            raise UnsupportedOpsError([("input", f"a graph input of type {type(ex).__name__}", "")])
    for k, (kind, what) in enumerate(plan):
        if kind == "size":
            expr = _example(what)
            expr = expr.node.expr if isinstance(expr, torch.SymInt) else None
            if expr not in symbol_at:
                raise UnsupportedOpsError(
                    [("input", f"size argument {what.name} is not the size of a tensor input", "")]
                )
            plan[k] = ("size", symbol_at[expr])
    gm.recompile()
    return plan, constants, tensors, names, dynamic


def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The Dynamo backend: one symfuse program per graph, for every value of its symbols.

    The program is built at the graph's first call, outside Dynamo's tracing (symfuse's
    capture runs torch.export, which must not add guards to the frame Dynamo is compiling).
    """
    global _graphs
    _graphs += 1
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    is_state = [_is_state(n, ex) for n, ex in zip(placeholders, example_inputs)]  # (Dynamo drops the sources)
    built: dict[str, Any] = {}

    @torch._dynamo.disable
    def run(*args):
        if "call" not in built:
            built["call"] = _build(gm, list(args), is_state)
            run.symfuse = getattr(built["call"], "symfuse", None)
        return built["call"](*args)

    run.symfuse = None  # the CompiledModule, once built (for explain() and tests)
    return run


def _build(gm: torch.fx.GraphModule, args: list, is_state: list[bool]) -> Callable:
    import symfuse

    global _fallbacks
    try:
        plan, constants, tensors, names, dynamic = _plan(gm, args, is_state)
        module = _with_named_inputs(_GraphModule(gm, plan, constants), names)
        compiled = symfuse.compile(module, tuple(tensors), dynamic)
    except (UnsupportedOpsError, ValueError) as e:
        _fallbacks += 1
        message = f"symfuse: a graph of {len(gm.graph.nodes)} nodes runs without symfuse (as Dynamo traced it): {e}"
        warnings.warn(message, stacklevel=3)
        log.warning(message)
        return gm.forward
    positions = [k for k, (kind, _) in enumerate(plan) if kind == "tensor"]

    def call(*args):
        out = compiled(*(args[k] for k in positions))
        return out if isinstance(out, (tuple, list)) else (out,)

    call.symfuse = compiled
    return call


__all__ = ["backend", "stats"]
