"""Run-time input checking and symbol binding, as generated Python.

The compiler hands over a `GuardSpec` of plain data: each input's dtype and dims (an int
for a static dim, a symbol name for a dynamic one), the symbols' ranges, and every shape
fact that is an assumption rather than a certainty, as a Python expression over the
symbols. `make_guard` turns it into one straight-line function, compiled once, that checks
the inputs and returns the binding of every symbol. A broken rule raises `ValueError`
naming the input, the dim, the values and the rule, never anything deeper.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: torch.dtype
    dims: tuple[int | str, ...]


@dataclass(frozen=True)
class Check:
    expr: str  # Python boolean over symbol names
    rule: str  # the fact in words, with where it came from
    shows: tuple[tuple[str, str], ...]  # (label, Python expression) printed on failure
    symbols: tuple[str, ...]  # the symbols the check reads


@dataclass(frozen=True)
class GuardSpec:
    inputs: tuple[InputSpec, ...]
    ranges: tuple[tuple[str, int, float, str], ...]  # symbol, lo, hi, why
    checks: tuple[Check, ...]
    sites: dict[str, str]  # symbol -> "input 'x' dim 1"
    device: str = "cpu"
    traced: tuple[Check, ...] = ()  # conditions the capture traced the model under (its guards)


def _describe(sites: dict[str, str], values: dict[str, int]) -> str:
    return ", ".join(f"{s} = {v} ({sites.get(s, '?')})" for s, v in values.items())


def make_guard(spec: GuardSpec) -> Callable[[list], dict[str, int]]:
    """Compile `spec` into `guard(inputs) -> {symbol: value}`."""
    local = {s: f"s_{i}" for i, s in enumerate(spec.sites)}
    n = len(spec.inputs)
    names = ", ".join(i.name for i in spec.inputs)
    lines = [
        "def guard(inputs):",
        f"    if len(inputs) != {n}:",
        f'        raise ValueError(f"expected {n} inputs ({names}), got {{len(inputs)}}")',
    ]
    bound: set[str] = set()
    for k, inp in enumerate(spec.inputs):
        x = f"x{k}"
        q = f"input '{inp.name}'"
        lines += [
            f"    {x} = inputs[{k}]",
            f"    if not isinstance({x}, Tensor):",
            f'        raise ValueError(f"{q} must be a torch.Tensor, got {{type({x}).__name__}}")',
            f"    if {x}.dim() != {len(inp.dims)}:",
            f'        raise ValueError(f"{q} must have rank {len(inp.dims)}, got shape {{tuple({x}.shape)}}")',
            f"    if {x}.dtype != dtypes[{k}]:",
            f'        raise ValueError(f"{q} must have dtype {inp.dtype}, got {{{x}.dtype}}")',
            f"    if {x}.device.type != {spec.device!r}:",
            f'        raise ValueError(f"{q} must be on device {spec.device}, got {{{x}.device}}")',
        ]
        for d, want in enumerate(inp.dims):
            got = f"{x}.shape[{d}]"
            if isinstance(want, int):
                why = (  # the usual case: compiled from a batch of one without `dynamic`
                    "; a dim whose example is 1 stays static unless `dynamic` declares it" if want == 1 else ""
                )
                lines += [
                    f"    if {got} != {want}:",
                    f'        raise ValueError(f"{q} dim {d} must be {want}, '
                    f'got {{{got}}} (shape {{tuple({x}.shape)}}{why})")',
                ]
            elif want not in bound:
                bound.add(want)
                lines.append(f"    {local[want]} = {got}")
            else:
                lines += [
                    f"    if {got} != {local[want]}:",
                    f"        raise ValueError(f\"{q} dim {d} is {{{got}}}, but it is '{want}', "
                    f"which is {{{local[want]}}} "
                    f'from {spec.sites[want]}")',
                ]
    for s, lo, hi, why in spec.ranges:
        if s not in local:
            continue
        cond = f"{lo} <= {local[s]}" + (f" <= {int(hi)}" if math.isfinite(hi) else "")
        rng = f"[{lo}, {int(hi) if math.isfinite(hi) else 'inf'}]"
        lines += [
            f"    if not ({cond}):",
            f"        raise ValueError(f\"{spec.sites[s]} is {{{local[s]}}}, but '{s}' must be in {rng}"
            + (f" (rule: {_esc(why)})" if why else "")
            + '")',
        ]
    checks = spec.traced + spec.checks  # (a path the trace did not take is the first thing to name)
    for i, c in enumerate(checks):
        lines += [f"    if not ({_rename(c.expr, local)}):", f"        fail({i}, {_values(c, local)})"]
    lines.append("    return {" + ", ".join(f"{s!r}: {v}" for s, v in local.items()) + "}")
    src = "\n".join(lines)

    def fail(i: int, values: dict) -> None:
        c = checks[i]
        shown = ", ".join(f"{label} = {values[label]}" for label, _ in c.shows)
        syms = {s: values[s] for s in spec.sites if s in values}
        here = f"; here {shown}" if shown else ""
        raise ValueError(f"input shapes break a rule of the model: {c.rule}{here}; where {_describe(spec.sites, syms)}")

    env = {"Tensor": torch.Tensor, "dtypes": [i.dtype for i in spec.inputs], "fail": fail, "min": min, "max": max}
    exec(compile(src, "<symfuse guard>", "exec"), env)  # noqa: S102
    guard = env["guard"]
    guard.source = src
    return guard


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', "'").replace("{", "{{").replace("}", "}}")


def _rename(expr: str, local: dict[str, str]) -> str:
    return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: local.get(m.group(0), m.group(0)), expr)


def _values(c: Check, local: dict[str, str]) -> str:
    items = {label: _rename(e, local) for label, e in c.shows}
    items.update({s: local[s] for s in c.symbols if s in local})
    return "{" + ", ".join(f"{k!r}: {v}" for k, v in items.items()) + "}"
