"""Compile time of a built-in model: cold (empty kernel cache) and warm (cache hit).

Run: .venv/bin/python bench/compile_time.py [MODEL]   (default bert-base)
"""

from __future__ import annotations

import sys
import tempfile
import time

import symfuse
from symfuse.models import load


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "bert-base"
    case = load(name)
    example = case.inputs(**case.example)
    with tempfile.TemporaryDirectory() as cache:
        for run in ("cold", "warm"):
            t0 = time.perf_counter()
            c = symfuse.compile(case.model, example, case.dynamic, cache_dir=cache)
            total = time.perf_counter() - t0
            stages = ", ".join(f"{k} {v:.2f}s" for k, v in c.native.seconds.items())
            print(f"{name} {run}: {total:.2f}s in all (capture {c.captured.seconds:.2f}s; {stages})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
