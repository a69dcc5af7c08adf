"""Compile batches of random programs once and run them at several bindings against eager
torch and symfuse's reference executor. `run_corpus` is the fixed-seed corpus CI and the
sanitizer tier run; `python -m tests.cpu.fuzz.corpus N` is the long run (docs/reliability.md)."""

from __future__ import annotations

import copy
import math
import random
import sys
import time

import torch

import symfuse
from tests.cpu.fuzz.programs import Program, ProgramModule, dynamic_spec, generate, make_inputs

BINDINGS = [dict(B=1, S=1), dict(B=3, S=7), dict(B=2, S=16), dict(B=5, S=33), dict(B=2, S=130)]
EXAMPLE = dict(B=2, S=5)


class Batch(torch.nn.Module):
    """Several programs side by side: one compile covers them all."""

    def __init__(self, progs: list[Program]) -> None:
        super().__init__()
        self.progs = torch.nn.ModuleList(ProgramModule(p) for p in progs)
        self.names = [[f"p{j}_x{i}" for i in range(len(p.inputs))] for j, p in enumerate(progs)]


def batch_module(progs: list[Program]) -> Batch:
    """A Batch whose forward takes one named parameter per input (torch.export names dims by them)."""
    m = Batch(progs)
    params = [n for names in m.names for n in names]
    groups = ", ".join("(" + "".join(f"{n}, " for n in names) + ")" for names in m.names)
    src = (
        f"def forward(self, {', '.join(params)}):\n"
        f"    return tuple(out for p, ins in zip(self.progs, [{groups}]) for out in p(*ins))\n"
    )
    ns: dict = {}
    exec(src, ns)  # noqa: S102  (generated parameter names)
    m.__class__ = type("FuzzBatch", (Batch,), {"forward": ns["forward"]})
    return m


def _dynamic(progs: list[Program]) -> dict:
    out = {}
    for j, p in enumerate(progs):
        for name, dims in dynamic_spec(p).items():
            if dims:
                out[f"p{j}_{name}"] = dims
    return out


def _inputs(progs: list[Program], binding: dict, seed: int) -> dict:
    out = {}
    for j, p in enumerate(progs):
        for i, t in enumerate(make_inputs(p, binding, seed + j)):
            out[f"p{j}_x{i}"] = t
    return out


def mismatch(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-4) -> str:
    """Why `got` differs from `want` beyond fp32 rounding, or ''."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if not torch.equal(torch.isnan(got), torch.isnan(want)):
        return "NaN positions differ"
    finite = torch.isfinite(want)
    if not torch.equal(got[~finite & ~torch.isnan(want)], want[~finite & ~torch.isnan(want)]):
        return "infinities differ"
    if finite.any():
        scale = max(1.0, float(want[finite].abs().max()))
        err = float((got[finite] - want[finite]).abs().max())
        if err > tol * scale:
            return f"max abs error {err:.3g} (scale {scale:.3g})"
    return ""


def _float64(module: torch.nn.Module, inputs: dict) -> tuple:
    m64 = copy.deepcopy(module).double()
    with torch.no_grad():
        return m64(**{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})


def as_accurate(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, tol: float = 1e-4) -> bool:
    """An ill-conditioned program (`cos` of a large `exp`) magnifies each library's
    last-bit differences past any fixed tolerance. There, symfuse passes if it is about as
    close to the float64 result as eager float32 is: within 4x, the gap between a function
    good to 2 ulp and one correctly rounded, with NaN and inf in the same places."""
    if got.shape != eager.shape or not torch.equal(torch.isnan(got), torch.isnan(eager)):
        return False
    finite = torch.isfinite(exact) & torch.isfinite(got) & torch.isfinite(eager)
    if not torch.equal(torch.isfinite(got), torch.isfinite(eager)):
        return False
    if not finite.any():
        return True
    scale = max(1.0, float(exact[finite].abs().max()))
    ours = float((got[finite].double() - exact[finite]).abs().max())
    theirs = float((eager[finite].double() - exact[finite]).abs().max())
    return ours <= 4 * theirs + tol * scale * 0.1


def check_batch(progs: list[Program], seed: int = 0) -> list[str]:
    """Compile the programs once and compare at every binding; returns the mismatches."""
    module = batch_module(progs).eval()
    before = symfuse.compile_count()
    compiled = symfuse.compile(module, _inputs(progs, EXAMPLE, seed), _dynamic(progs))
    problems = []
    for b in BINDINGS:
        inputs = _inputs(progs, b, seed + 1000)
        with torch.no_grad():
            want = module(**inputs)
        got = compiled(**inputs)
        ref = compiled.profile(lambda *a: None, **inputs)
        exact: list = []  # float64 eager, computed when some comparison needs it
        k = 0
        for j, p in enumerate(progs):
            for _ in p.outputs:
                for what, other in (("eager", want[k]), ("reference", ref[k])):
                    why = mismatch(got[k], other)
                    if why and not exact:
                        exact = _float64(module, inputs)
                    if why and not as_accurate(got[k], want[k], exact[k]):
                        problems.append(f"program {j} at {b} vs {what}: {why}\n  {p.text()}")
                k += 1
    if symfuse.compile_count() != before + 1:
        problems.append(f"compiled {symfuse.compile_count() - before} times for one batch")
    return problems


def programs_for(seed: int, count: int) -> list[Program]:
    rng = random.Random(seed)
    return [generate(rng) for _ in range(count)]


CORPUS_SEEDS = list(range(6))  # the fixed corpus the sanitizer tier runs: 6 batches of 10


def run_corpus(seeds=CORPUS_SEEDS, per_batch: int = 10) -> int:
    """Run the fixed corpus; raises on the first mismatch; returns the programs run."""
    n = 0
    for s in seeds:
        problems = check_batch(programs_for(s, per_batch), seed=s)
        if problems:
            raise AssertionError(f"seed {s}:\n" + "\n".join(problems[:5]))
        n += per_batch
    return n


def main(argv: list[str]) -> int:
    total = int(argv[0]) if argv else 10_000
    per_batch, first = 10, int(argv[1]) if len(argv) > 1 else 1000
    t0, found, done = time.time(), [], 0
    for s in range(first, first + math.ceil(total / per_batch)):
        progs = programs_for(s, per_batch)
        try:
            new = [f"seed {s}: {p}" for p in check_batch(progs, seed=s)]
        except Exception as e:  # noqa: BLE001  (a crash of the compiler is a finding too)
            new = [f"seed {s}: {type(e).__name__}: {str(e)[:500]}"]
        for f in new:
            print(f, flush=True)
        found += new
        done += per_batch
        if (s - first) % 10 == 0:
            print(f"{done} programs, {len(found)} mismatches, {time.time() - t0:.0f}s", flush=True)
    print(f"done: {done} programs in {done // per_batch} compiled batches, {len(found)} mismatches, "
          f"{time.time() - t0:.0f}s")  # fmt: skip
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
