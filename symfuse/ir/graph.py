"""The graph IR: SSA values with tensor types, produced by op nodes.

A `Graph` holds named inputs (the model's tensor arguments), constants (frozen
parameters and buffers), nodes in topological order and outputs. Nodes are identified
by object identity; a node's attributes are plain Python data (ints, floats, bools,
strings, dtypes, dimension expressions and tuples of them). The printer's text is stable
and meant to be diffed in tests.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from symfuse.ir.dims import fmt
from symfuse.ir.dtypes import DType
from symfuse.ir.types import TensorType

# Value names are the identifiers of buffers in generated code (C++ kernels, Triton and
# Python host code), so a name those languages or the generated code's own locals use is
# taken with a `t_` in front: a model's input `i0`, `x1` or `sym`, an ONNX output `and`.
_CPP_WORDS = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
    compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
    default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
    int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
    reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
    this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
    while xor xor_eq int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t std INFINITY NAN
    main restrict
""".split()
)
_GENERATED_LOCALS = frozenset(
    """
    sym row row_begin row_end err site bh cc col dd j kh kmax kp kq kt ldq ldsc mr of p pb pr qb qf qh r sc vh vv
    D2 NB SK q_in k_in v_in tl triton math torch pid
""".split()
)
# <cmath>'s functions the kernels call unqualified (`log` for float64, `logf` for float32)
_C_MATH = frozenset(
    name + suffix
    for name in """
    exp log sqrt tanh erf erfc sin cos tan floor ceil trunc round pow fabs fmod fmax fmin acos asin atan atan2
    acosh asinh atanh copysign isnan isinf
""".split()
    for suffix in ("", "f")
)
_GENERATED_FORMS = re.compile(r"(?:i|g|x|q|acc|qb)\d+$|(?:v|row|s|sf|SF|r\d+|k\d+|sc|pr)_|.*_buf$")


def reserved_name(name: str) -> bool:
    """Whether `name` may not name a value: a keyword of C++ or Python, or an identifier
    the generated kernels and host code declare themselves."""
    return (
        name in _CPP_WORDS
        or name in _C_MATH
        or name in _GENERATED_LOCALS
        or keyword.iskeyword(name)
        or keyword.issoftkeyword(name)
        or bool(_GENERATED_FORMS.match(name))
    )


def identifier(name: str) -> str:
    """`name` as an identifier generated code may declare: characters other than ASCII
    letters, digits and `_` become `_`, and a name starting with a digit or reserved
    (`reserved_name`) gets a `t_` in front. ONNX names tensors `0`, `input.1`, `x:0`,
    `onnx::Gemm_3`; two names that map to one identifier are told apart by the builder."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", name) or "v"
    return f"t_{s}" if s[0].isdigit() or reserved_name(s) else s


@dataclass(frozen=True, eq=False)
class Value:
    name: str
    type: TensorType

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(frozen=True, eq=False)
class Node:
    op: str
    inputs: tuple[Value | None, ...]
    attrs: Mapping[str, Any]
    outputs: tuple[Value, ...]
    loc: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))

    def __reduce__(self):  # (a mapping proxy does not pickle; a saved artifact holds the graph)
        return (Node, (self.op, self.inputs, dict(self.attrs), self.outputs, self.loc))

    @property
    def out(self) -> Value:
        (v,) = self.outputs
        return v


@dataclass
class Graph:
    name: str
    inputs: list[Value] = field(default_factory=list)
    constants: dict[Value, torch.Tensor] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)

    def producers(self) -> dict[Value, Node]:
        return {v: n for n in self.nodes for v in n.outputs}

    def users(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    out.setdefault(v, []).append(n)
        return out

    def values(self) -> Iterable[Value]:
        yield from self.inputs
        yield from self.constants
        for n in self.nodes:
            yield from n.outputs

    def __str__(self) -> str:
        return print_graph(self)


def fmt_attr(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(fmt_attr(x) for x in v) + "]"
    if isinstance(v, DType):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if hasattr(v, "free_symbols"):
        return fmt(v)
    return repr(v) if isinstance(v, str) else str(v)


def print_node(n: Node) -> str:
    outs = ", ".join(f"%{v.name}: {v.type}" for v in n.outputs)
    args = [("%" + v.name) if v is not None else "none" for v in n.inputs]
    args += [f"{k}={fmt_attr(v)}" for k, v in n.attrs.items()]
    line = f"  {outs} = {n.op}({', '.join(args)})"
    return f"{line}  # {n.loc}" if n.loc else line


def print_graph(g: Graph, *, with_constants: bool = True) -> str:
    lines = [f"graph {g.name}(" + ", ".join(f"%{v.name}: {v.type}" for v in g.inputs) + ") {"]
    if with_constants:
        lines += [f"  const %{v.name}: {v.type}" for v in g.constants]
    lines += [print_node(n) for n in g.nodes]
    lines.append("  return " + ", ".join("%" + v.name for v in g.outputs))
    lines.append("}")
    return "\n".join(lines)
