"""Memory-bound kernels streaming from memory, against the machine's copy bandwidth.

Three programs over a symbolic row count, each run at a size far past the L3 cache (200-300
MB moved a call): a residual add and layer norm over 768 columns, a scaled softmax over 512,
and gelu(x) * y over 768. For each: the median call, the bytes it must move (inputs read once,
output written once), their rate, and that rate as a share of the copy bandwidth measured at
the start (`torch` copy of 256 MiB, read + write, as `symfuse bench` measures it), with the
page faults a call took. Eager PyTorch on the same inputs for reference.

Run: .venv/bin/python bench/memory_bound.py [--rows-scale 1.0]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

import torch

import symfuse
from symfuse.bench.worker import physics


class AddNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(768)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.norm(x + r)


class ScaledSoftmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 0.125, dim=-1)


class GeluMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x) * y


CASES = [  # name, module, columns, inputs, rows
    ("add + layer norm", AddNorm, 768, 2, 32768),
    ("scaled softmax", ScaledSoftmax, 512, 1, 49152),
    ("gelu(x) * y", GeluMul, 768, 2, 32768),
]


def timed(fn, reps: int) -> tuple[float, int]:
    """Median seconds of `reps` calls (the result dropped each time), and the page faults of one."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return statistics.median(times), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-scale", type=float, default=1.0, help="scale every case's row count")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    copy = physics()["copy_gbps"]
    print(f"copy bandwidth {copy:.1f} GB/s (read + write, 256 MiB)")
    print("| kernel | rows x cols | MB moved | symfuse ms | GB/s | of copy | faults/call | eager ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name, cls, cols, n_in, rows in CASES:
        rows = max(1, int(rows * args.rows_scale))
        m = cls().eval()
        example = tuple(torch.randn(4, cols) for _ in range(n_in))
        c = symfuse.compile(m, example, tuple({0: "N"} for _ in example))
        x = tuple(torch.randn(rows, cols) for _ in range(n_in))
        with torch.no_grad():
            err = (c(*x) - m(*x)).abs().max().item()
            assert err < 1e-4, f"{name}: max abs error {err:.2e} against eager"
            own, faults = timed(lambda: c(*x), args.reps)
            eager, _ = timed(lambda: m(*x), args.reps)
        moved = (n_in + 1) * rows * cols * 4
        rate = moved / own / 1e9
        print(
            f"| {name} | {rows} x {cols} | {moved / 1e6:.0f} | {own * 1e3:.2f} | {rate:.1f} | {rate / copy:.0%} "
            f"| {faults} | {eager * 1e3:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
