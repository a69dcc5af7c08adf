"""Random programs for differential fuzzing: chains of torch ops over inputs with symbolic
dims `B` and `S` (and static ones), built so every op is valid at every binding.

A program is plain data (`Program`: inputs, op steps, outputs) and becomes a torch module
(`ProgramModule`), so it is captured by symfuse's own frontend and its eager result is
torch's. Ops are chosen where fusion and layout choices are non-trivial: element-wise
chains with broadcasts, reductions over any axis, softmax and layer norm, permutes,
reshapes that merge or split dims, slices, concatenation, linear layers and batched
matmuls, embedding lookups.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

Dim = str | int  # "B", "S" or a static size
SYMBOLS = ("B", "S")
STATIC = (1, 3, 4, 8, 17)

UNARY = {
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "neg": torch.neg, "abs": torch.abs,
    "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu, "erf": torch.erf, "sin": torch.sin,
    "cos": torch.cos, "exp": lambda x: torch.exp(torch.clamp(x, max=8.0)),
    "sqrt": lambda x: torch.sqrt(torch.abs(x)), "log": lambda x: torch.log(torch.abs(x) + 1.0),
    "recip": lambda x: 1.0 / (torch.abs(x) + 1.0), "scale": lambda x: x * 0.75 + 0.5,
    "square": lambda x: x * x, "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
}  # fmt: skip
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum, "min": torch.minimum,
    "div": lambda a, b: a / (torch.abs(b) + 1.0), "where": lambda a, b: torch.where(a > 0, a, b),
}  # fmt: skip


@dataclass
class Step:
    op: str
    args: tuple  # value indices
    attrs: dict = field(default_factory=dict)


@dataclass
class Program:
    inputs: list[tuple[tuple[Dim, ...], str]]  # (dims, "f32" | "ids")
    steps: list[Step]
    outputs: list[int]
    consts: dict[str, torch.Tensor] = field(default_factory=dict)

    def text(self) -> str:
        ins = ", ".join(f"x{i}{list(d)}:{k}" for i, (d, k) in enumerate(self.inputs))
        body = "; ".join(
            f"v{len(self.inputs) + j}={s.op}{list(s.args)}{s.attrs or ''}" for j, s in enumerate(self.steps)
        )
        return f"({ins}) {body} -> {self.outputs}"


class ProgramModule(torch.nn.Module):
    def __init__(self, prog: Program) -> None:
        super().__init__()
        self.prog = prog
        for k, t in prog.consts.items():
            self.register_buffer(k, t)

    def forward(self, *inputs):
        vals = list(inputs)
        for st in self.prog.steps:
            vals.append(apply(self, st, [vals[a] for a in st.args]))
        return tuple(vals[i] for i in self.prog.outputs)


def apply(m: torch.nn.Module, st: Step, xs: list) -> torch.Tensor:
    a = st.attrs
    op = st.op
    if op in UNARY:
        return UNARY[op](xs[0])
    if op in BINARY:
        return BINARY[op](xs[0], xs[1])
    if op in ("sum", "mean", "amax"):
        f = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}[op]
        return f(xs[0], dim=a["dim"], keepdim=a["keep"])
    if op == "softmax":
        return torch.softmax(xs[0], dim=a["dim"])
    if op == "log_softmax":
        return torch.log_softmax(xs[0], dim=a["dim"])
    if op == "layer_norm":
        return torch.nn.functional.layer_norm(xs[0], xs[0].shape[-1:], getattr(m, a["w"]), getattr(m, a["b"]))
    if op == "permute":
        return xs[0].permute(a["dims"])
    if op == "merge":  # merge dims k and k+1
        k, s = a["k"], xs[0].shape
        return xs[0].reshape(*s[:k], s[k] * s[k + 1], *s[k + 2 :])
    if op == "split":  # split static dim k into (a, n / a)
        k, s = a["k"], xs[0].shape
        return xs[0].reshape(*s[:k], a["parts"], s[k] // a["parts"], *s[k + 1 :])
    if op == "slice":
        idx = [slice(None)] * xs[0].dim()
        idx[a["dim"]] = slice(a["start"], a["end"])
        return xs[0][tuple(idx)]
    if op == "cat":
        return torch.cat([xs[0], xs[1]], dim=a["dim"])
    if op == "linear":
        return torch.nn.functional.linear(xs[0], getattr(m, a["w"]), getattr(m, a["b"]) if a["b"] else None)
    if op == "bmm":  # x @ x^T over the last two dims
        return xs[0] @ xs[0].transpose(-1, -2)
    if op == "embed":
        return torch.nn.functional.embedding(xs[0], getattr(m, a["w"]))
    if op == "expand":  # a unit dim to a static size, or to the size of a symbolic dim of another value
        to = a["to"] if isinstance(a["to"], int) else xs[1].shape[a["ref_dim"]]
        return xs[0].expand([to if k == a["dim"] else -1 for k in range(xs[0].dim())])
    raise KeyError(op)


def size(d: Dim, binding: dict[str, int]) -> int:
    return binding[d] if isinstance(d, str) else d


def generate(rng: random.Random, max_steps: int = 6) -> Program:
    """One random valid program."""
    shapes: list[tuple[Dim, ...]] = []
    kinds: list[str] = []
    inputs = []
    consts: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(rng.randrange(2**31))

    def const(name_hint: str, *shape: int) -> str:
        name = f"c{len(consts)}_{name_hint}"
        consts[name] = torch.randn(*shape, generator=gen) * 0.5
        return name

    rank = rng.choice((2, 3, 3, 4))
    base = ["B", "S"] + [rng.choice(STATIC[1:]) for _ in range(rank - 2)]
    if rank == 2 and rng.random() < 0.5:
        base = ["S", rng.choice(STATIC[1:])]
    if rng.random() < 0.25:  # token ids through an embedding first
        inputs.append((tuple(base[:2]), "ids"))
        shapes.append(tuple(base[:2]))
        kinds.append("ids")
        vocab, width = rng.choice((5, 33)), rng.choice((4, 8, 17))
        steps = [Step("embed", (0,), {"w": const("emb", vocab, width)})]
        shapes.append(tuple(base[:2]) + (width,))
        kinds.append("f32")
    else:
        inputs.append((tuple(base), "f32"))
        shapes.append(tuple(base))
        kinds.append("f32")
        steps = []
        if rng.random() < 0.6:  # a second input, broadcast against the first
            other = tuple(d if rng.random() < 0.6 else 1 for d in base)[rng.randrange(len(base)) :]
            inputs.append((other or (1,), "f32"))
            shapes.append(other or (1,))
            kinds.append("f32")
    n_inputs = len(inputs)

    def floats() -> list[int]:
        return [i for i, k in enumerate(kinds) if k == "f32"]

    def broadcastable(a: tuple, b: tuple) -> bool:
        for x, y in zip(a[::-1], b[::-1]):
            if x != y and x != 1 and y != 1:
                return False
        return True

    for _ in range(rng.randint(2, max_steps)):
        cur = rng.choice(floats()[-3:])
        s = shapes[cur]
        r = len(s)
        choices = ["unary", "unary", "binary", "binary", "reduce", "softmax", "permute", "slice", "cat"]
        if r >= 1 and isinstance(s[-1], int):
            choices += ["layer_norm", "linear", "linear"]
        if r >= 2:
            choices += ["merge", "bmm"]
        if any(isinstance(d, int) and d % 2 == 0 and d > 2 for d in s):
            choices.append("split")
        if 1 in s:
            choices.append("expand")
        kind = rng.choice(choices)
        if kind == "unary":
            st, out = Step(rng.choice(list(UNARY)), (cur,)), s
        elif kind == "binary":
            partners = [i for i in floats() if broadcastable(shapes[i], s) and len(shapes[i]) <= r]
            other = rng.choice(partners)
            st = Step(rng.choice(list(BINARY)), (cur, other) if rng.random() < 0.5 else (other, cur))
            o = shapes[other]
            o = (1,) * (r - len(o)) + tuple(o)
            out = tuple(y if x == 1 else x for x, y in zip(s, o))  # the broadcast shape
        elif kind == "reduce":
            d, keep = rng.randrange(r), rng.random() < 0.5
            st = Step(rng.choice(("sum", "mean", "amax")), (cur,), {"dim": d, "keep": keep})
            out = tuple(1 if k == d else x for k, x in enumerate(s)) if keep else s[:d] + s[d + 1 :]
            if not out:
                continue
        elif kind == "softmax":
            st, out = Step(rng.choice(("softmax", "log_softmax")), (cur,), {"dim": rng.randrange(r)}), s
        elif kind == "layer_norm":
            n = s[-1]
            st, out = Step("layer_norm", (cur,), {"w": const("lnw", n), "b": const("lnb", n)}), s
        elif kind == "linear":
            n = rng.choice((1, 4, 8, 17, 33))
            bias = const("lb", n) if rng.random() < 0.7 else ""
            st, out = Step("linear", (cur,), {"w": const("lw", n, s[-1]), "b": bias}), s[:-1] + (n,)
        elif kind == "permute":
            dims = list(range(r))
            rng.shuffle(dims)
            st, out = Step("permute", (cur,), {"dims": tuple(dims)}), tuple(s[d] for d in dims)
        elif kind == "merge":
            k = rng.randrange(r - 1)
            a, b = s[k], s[k + 1]
            if isinstance(a, str) and isinstance(b, str):
                continue  # B*S stays expressible, but keep shapes simple to reason about below
            merged = a * b if isinstance(a, int) and isinstance(b, int) else (a if b == 1 else b if a == 1 else None)
            if merged is None:
                continue
            st, out = Step("merge", (cur,), {"k": k}), s[:k] + (merged,) + s[k + 2 :]
        elif kind == "split":
            k = rng.choice([i for i, d in enumerate(s) if isinstance(d, int) and d % 2 == 0 and d > 2])
            st, out = Step("split", (cur,), {"k": k, "parts": 2}), s[:k] + (2, s[k] // 2) + s[k + 1 :]
        elif kind == "slice":
            d = rng.randrange(r)
            if isinstance(s[d], str):  # a symbolic dim: a slice from a start that is always valid
                st, out = Step("slice", (cur,), {"dim": d, "start": 0, "end": None}), s
            else:
                start = rng.randrange(s[d])
                end = rng.randrange(start + 1, s[d] + 1)
                st, out = (
                    Step("slice", (cur,), {"dim": d, "start": start, "end": end}),
                    s[:d] + (end - start,) + s[d + 1 :],
                )
        elif kind == "cat":
            d = rng.randrange(r)
            if isinstance(s[d], str):
                continue
            st, out = Step("cat", (cur, cur), {"dim": d}), s[:d] + (2 * s[d],) + s[d + 1 :]
        elif kind == "bmm":
            st, out = Step("bmm", (cur,)), s[:-1] + (s[-2],)
        elif kind == "expand":
            d = s.index(1)
            refs = [(i, k, x) for i, sh in enumerate(shapes) for k, x in enumerate(sh) if isinstance(x, str)]
            if refs and rng.random() < 0.7:
                i, k, to = rng.choice(refs)
                st = Step("expand", (cur, i), {"dim": d, "to": to, "ref_dim": k})
            else:
                to = 3
                st = Step("expand", (cur,), {"dim": d, "to": to})
            out = s[:d] + (to,) + s[d + 1 :]
        steps.append(st)
        shapes.append(out)
        kinds.append("f32")
    last = len(shapes) - 1
    outs = [last] + ([rng.choice(floats()[n_inputs:-1])] if len(floats()) > n_inputs + 1 and rng.random() < 0.3 else [])
    return Program(inputs, steps, outs, consts)


def make_inputs(prog: Program, binding: dict[str, int], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for dims, kind in prog.inputs:
        shape = [size(d, binding) for d in dims]
        if kind == "ids":
            vocab = next(t.shape[0] for k, t in prog.consts.items() if "emb" in k)
            out.append(torch.randint(0, vocab, shape, generator=g))
        else:
            out.append(torch.randn(shape, generator=g) * 2)
    return out


def dynamic_spec(prog: Program) -> dict[str, dict[int, str]]:
    return {
        f"x{i}": {d: n for d, n in enumerate(dims) if isinstance(n, str)} for i, (dims, _) in enumerate(prog.inputs)
    }
