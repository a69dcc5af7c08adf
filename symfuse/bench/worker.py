"""A benchmark worker: one engine, one model, one process.

The parent talks to it in JSON lines on stdin/stdout. Replies start with `MARK`, so
whatever libraries print on stdout (exporters do) is skipped. Requests:
`{"cmd": "run", "binding": {...}, "min_reps": n, "max_reps": m, "budget_s": t}` times the
engine at one binding; `{"cmd": "stats"}` gives recompilations and peak memory;
`{"cmd": "profile", "binding": {...}}` (symfuse only) times each kind of step;
`{"cmd": "quit"}` ends it. The first reply says whether the engine is ready.
"""

from __future__ import annotations

import importlib.util
import json
import re
import resource
import sys
import tempfile
import time
import traceback

MARK = "@@symfuse-bench@@ "


def reply(obj: dict) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def short_error(e: BaseException) -> str:
    """One readable line: type and first line of the message, without terminal colours."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(e).__name__}: {e}").strip().splitlines()[0]
    return text if len(text) <= 160 else text[:157] + "..."


def rel_err(outs: list, refs: list) -> float:
    import numpy as np

    worst = 0.0
    for a, b in zip(outs, refs):
        a = a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)
        b = b.detach().numpy()
        if a.shape != b.shape:
            return float("inf")
        if b.size and b.dtype.kind == "f":
            worst = max(worst, float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-12)))
    return worst


def physics() -> dict:
    """Memory bandwidth (copy, read + write) and SGEMM rate of this machine, via torch."""
    import torch

    src = torch.empty(64 * 2**20, dtype=torch.float32).uniform_()  # 256 MiB
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(10))
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    gemm = min(_timed(lambda: torch.matmul(a, b)) for _ in range(5))
    return {
        "copy_gbps": 2 * src.numel() * 4 / best / 1e9,
        "sgemm_gflops": 2 * n**3 / gemm / 1e9,
        "sgemm_n": n,
        "machine": machine(),
    }


def machine() -> str:
    """The CPU as symfuse's target detection sees it (ISA, extensions, caches, cores)."""
    import platform

    from symfuse.codegen.cpu.target import detect
    from symfuse.options import Options

    try:
        return detect(Options.from_env().cxx).describe()
    except Exception as e:  # noqa: BLE001 - no compiler: the platform's own words
        return f"{platform.machine()} {platform.processor()} ({type(e).__name__}: {e})"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def profile_symfuse(compiled, inputs: dict) -> list[dict]:
    """Time, bytes moved and FLOPs of each kind of step of one call of the compiled program
    (median of 5 profiled calls per step), run step by step: each step in its own parallel region,
    also where the call itself would run as one C++ call (`sf_run`)."""
    import statistics

    from symfuse.ir.dims import evaluate
    from symfuse.schedule.attention import AttentionStep
    from symfuse.schedule.steps import GemmStep, NativeStep, OpaqueStep

    be = compiled.native
    tensors = compiled._inputs((), {k: v for k, v in inputs.items() if k in compiled.captured.input_names})
    binding = compiled.guard(tensors)
    runs = [dict(be.program.profile(tensors, binding)[0]) for _ in range(5)]
    sched = be.schedule

    def numel(dims) -> int:
        n = 1
        for d in dims:
            n *= evaluate(d, binding)
        return n

    def nbytes(name: str) -> int:
        b = sched.buffers[name]
        return numel(b.shape) * b.dtype.torch.itemsize

    stats: dict = {}
    for st in sched.steps:
        if isinstance(st, AttentionStep):
            q, k, v = st.scores.a.sizes, st.scores.b.sizes, st.context.b.sizes
            keys = evaluate(k[-1], binding)
            if be.runs_own(st, keys):
                label = "attention (merged kernel)"
            else:
                label = "attention (torch fused)" if st.library else "attention (three steps)"
            flops = 2 * numel(q[:-1]) * evaluate(k[-1], binding) * (evaluate(q[-1], binding) + evaluate(v[-1], binding))
            moved = nbytes(st.out) + 3 * numel(q) * 4
        elif isinstance(st, GemmStep):
            out = sched.buffers[st.out].shape
            if st.conv is not None:
                label, k = "convolution (oneDNN)", numel(st.b.sizes[1:])
            elif st.weight is not None:
                k = evaluate(st.a.sizes[-1], binding)
                own = be.runs_own(st, numel(out[:-1]))
                label = "linear (row kernel)" if own else "linear (oneDNN)"
            else:
                label, k = "batched matmul (torch)", evaluate(st.a.sizes[-1], binding)
            flops = 2 * numel(out) * k
            moved = nbytes(st.out) + numel(st.a.sizes) * 4 + (numel(st.b.sizes) * 4 if st.b else 0)
            if st.weight is not None:
                moved += nbytes(st.weight)
        elif isinstance(st, NativeStep):
            label, flops = f"C++ {st.kind} kernels", 0
            src = be.kernels.get(st.name)
            moved = sum(nbytes(n) for n in src.args) if src else 0
        else:
            assert isinstance(st, OpaqueStep)
            label, flops = f"torch: {st.node.op}", 0
            moved = sum(nbytes(v.name) for v in st.node.inputs if v is not None and v.name in sched.buffers)
            moved += sum(nbytes(v.name) for v in st.node.outputs)
        s = stats.setdefault(label, {"op": label, "calls": 0, "seconds": 0.0, "bytes": 0, "flops": 0})
        s["calls"] += 1
        s["seconds"] += statistics.median(r.get(st.name, 0.0) for r in runs)
        s["bytes"] += moved
        s["flops"] += flops
    return sorted(stats.values(), key=lambda s: -s["seconds"])


def main() -> int:
    cfg = json.loads(sys.stdin.readline())
    if cfg.get("physics"):
        reply({"status": "ready", "physics": physics()})
        return 0
    import torch

    from symfuse.bench.engines import ENGINES
    from symfuse.models import load

    torch.manual_seed(0)
    engine = ENGINES[cfg["engine"]]()
    missing = [m for m in engine.requires if importlib.util.find_spec(m) is None]
    if missing:
        reply({"status": "missing", "detail": f"not installed: {', '.join(missing)} (pip install .[bench])"})
        return 0
    try:
        case = load(cfg["model"])
        t0 = time.perf_counter()
        run = engine.prepare(case, tempfile.mkdtemp(prefix="symfuse-bench-"))
        prepare_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - any failure of a peer is reported, not raised
        traceback.print_exc()  # the whole story goes to the worker's log
        reply({"status": "failed", "detail": short_error(e)})
        return 0
    reply({"status": "ready", "prepare_s": prepare_s})
    refs: dict = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["cmd"] == "quit":
                break
            if req["cmd"] == "stats":
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                reply({"recompiles": engine.recompiles(), "peak_rss_mb": rss})
                continue
            inputs = case.inputs(**req["binding"])
            if req["cmd"] == "profile":
                reply({"profile": profile_symfuse(engine.compiled, inputs)})
                continue
            key = json.dumps(req["binding"], sort_keys=True)
            if key not in refs:
                with torch.no_grad():
                    from symfuse.bench.engines import flat_outputs

                    refs[key] = flat_outputs(case.model(**inputs))
            err = rel_err(run(inputs), refs[key])
            times = []
            start = time.perf_counter()
            while len(times) < req["max_reps"] and (
                len(times) < req["min_reps"] or time.perf_counter() - start < req["budget_s"]
            ):
                times.append(_timed(lambda: run(inputs)) * 1e3)
            reply({"times_ms": times, "err": err})
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            reply({"error": short_error(e)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
