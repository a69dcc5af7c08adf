"""The model's switch points against the measured ones: each model compiled twice in one
process, with switch points from the model of the CPU (a fresh machine folder) and measured
on this machine (`switch_points="measure"`, a second fresh folder), timed alternately at each
shape of its sweep (median of --reps), kernels from one cache.

Run: .venv/bin/python bench/switch_points.py [--models bert-small,bert-base,gpt2] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import symfuse
from symfuse.models import load


def _ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="bert-small,bert-base,gpt2")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    torch.manual_seed(0)
    print("| model | shape | modelled ms | measured ms | modelled / measured | switch points that differ |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        case = load(name)
        example = case.inputs(**case.example)
        compiled = {}
        for mode in ("model", "measure"):
            compiled[mode] = symfuse.compile(
                case.model, example, case.dynamic, switch_points=mode, machine_dir=tempfile.mkdtemp()
            )
        a, b = (compiled[m].native.thresholds for m in ("model", "measure"))
        differ = sum(a[k].value != b[k].value for k in a)
        for binding in case.sweep:
            inputs = case.inputs(**binding)
            got = {m: [] for m in compiled}
            for _ in range(3):  # alternate: drift hits both alike
                for m, c in compiled.items():
                    got[m].append(_ms(lambda c=c: c(**inputs), args.reps))
            ms = {m: statistics.median(v) for m, v in got.items()}
            shape = ",".join(f"{k}={v}" for k, v in binding.items())
            print(f"| {name} | {shape} | {ms['model']:.2f} | {ms['measure']:.2f} | "
                  f"{ms['model'] / ms['measure']:.3f} | {differ} of {len(a)} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
