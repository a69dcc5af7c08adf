"""Per-call overhead of a compiled model on top of its kernels.

A 2-layer, hidden-128 BERT at batch 1, sequence 8: small enough that the time outside
the kernels shows. For each call: the whole public call (input checks, binding, host code,
kernels; one C++ call, `sf_run`, where every step is symfuse's own), the same call made step
by step by the Python host, and from the profiled host, the time inside kernel and library
calls alone (each in its own parallel region). overhead = call - kernels. Medians over many
calls.

Run: .venv/bin/python bench/overhead.py
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import symfuse
from symfuse.models import bert


def main() -> int:
    torch.manual_seed(0)
    case = bert(layers=2, hidden=128, heads=2, ffn=512, name="bert-2x128")
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
    inputs = case.inputs(B=1, S=8)
    tensors = c._inputs((), inputs)
    binding = c.guard(tensors)
    prog = c.native.program
    for _ in range(50):
        c(**inputs)
    calls, stepwise, kernels, hosts, guards = [], [], [], [], []
    for _ in range(2000):
        t0 = time.perf_counter()
        c(**inputs)
        calls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        prog(tensors, binding, whole=False)
        stepwise.append(time.perf_counter() - t0)
        steps, host = prog.profile(tensors, binding)
        kernels.append(sum(t for _, t in steps))
        hosts.append(host)
        t0 = time.perf_counter()
        c.guard(c._inputs((), inputs))
        guards.append(time.perf_counter() - t0)
    with torch.no_grad():
        eager = []
        for _ in range(500):
            t0 = time.perf_counter()
            case.model(**inputs)
            eager.append(time.perf_counter() - t0)
    med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    n_steps = len(c.native.schedule.steps)
    print(f"bert 2 layers x 128, B=1 S=8: {n_steps} steps, {len(c.native.kernels)} native kernels")
    whole = "one C++ call" if c.native.host.run is not None else "step by step"
    print(f"  call ({whole})     {med(calls):8.1f} us   (eager PyTorch {med(eager):.1f} us)")
    print(f"  host code step by step    {med(stepwise):8.1f} us   (no input checks or binding)")
    print(f"  inside kernels/libraries  {med(kernels):8.1f} us")
    print(f"  overhead                  {med(calls) - med(kernels):8.1f} us")
    print(f"    input checks + binding  {med(guards):8.1f} us")
    around = med(hosts) - med(kernels)
    print(f"    host code around calls  {around:8.1f} us  ({around / n_steps:.1f} us a step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
