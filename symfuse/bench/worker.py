"""A benchmark worker: one engine, one model, one process.

The parent talks to it in JSON lines on stdin/stdout. Replies start with `MARK`, so
whatever libraries print on stdout (exporters do) is skipped. Requests:
`{"cmd": "run", "binding": {...}, "min_reps": n, "max_reps": m, "budget_s": t}` times the
engine at one binding; `{"cmd": "stats"}` gives recompilations and peak memory;
`{"cmd": "profile", "binding": {...}}` (symfuse only) times each kind of step;
`{"cmd": "work", "binding": {...}}` (symfuse only) counts a call's FLOPs and weight bytes;
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
    """Memory bandwidth (copy, read + write; read alone) and SGEMM rate of this machine, via
    torch; the float32 FMA peak of its cores (`fma_peak`), a native read loop's bandwidth (the
    read bandwidth where it beats torch's sum) and its L3 cache, via symfuse's target."""
    import torch

    src = torch.empty(64 * 2**20, dtype=torch.float32).uniform_()  # 256 MiB
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(10))
    read = min(_timed(lambda: src.sum()) for _ in range(10))
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    gemm = min(_timed(lambda: torch.matmul(a, b)) for _ in range(5))
    out = {
        "copy_gbps": 2 * src.numel() * 4 / best / 1e9,
        "read_gbps": src.numel() * 4 / read / 1e9,
        "sgemm_gflops": 2 * n**3 / gemm / 1e9,
        "sgemm_n": n,
        "machine": machine(),
    }
    try:
        out.update(fma_peak())
        out["read_gbps"] = max(out["read_gbps"], out.pop("native_read_gbps"))
    except Exception as e:  # noqa: BLE001 - no compiler: the tables go without the floor
        out["fma_error"] = short_error(e)
    return out


# The FMA peak: on every thread, CHAINS independent chains of vector FMAs on registers (one
# chain waits for its last FMA; twelve cover the latency of every CPU measured), in the
# vector type and FMA every generated kernel uses
_CHAINS = 12
_FMA_PEAK = """
#include <omp.h>
#define CHAINS @CHAINS@
// a and b opaque to the compiler at every step, so that it multiplies them there (a product
// it could hoist out of the loop would leave only additions to time; where the ISA has no FMA,
// generic, the chains share one product a step and the rate is that of their additions)
#if defined(__x86_64__) || defined(__i386__)
#define SF_OPAQUE(v) __asm__ volatile("" : "+x"(v))
#elif defined(__aarch64__)
#define SF_OPAQUE(v) __asm__ volatile("" : "+w"(v))
#else
#define SF_OPAQUE(v) (void)0
#endif
extern "C" double sf_fma_peak(int64_t steps) {
  double seconds = 0;
  float sink = 0;
  #pragma omp parallel reduction(+ : sink) reduction(max : seconds)
  {
    sf_vec a = sf_splat(1.0000001f), b = sf_splat(0.9999999f), c[CHAINS];
    for (int j = 0; j < CHAINS; ++j) c[j] = sf_splat((float)j);  // apart: equal chains would be merged
    #pragma omp barrier
    double t0 = omp_get_wtime();
    for (int64_t i = 0; i < steps; ++i) {
      SF_OPAQUE(a);
      SF_OPAQUE(b);
      #pragma GCC unroll @CHAINS@
      for (int j = 0; j < CHAINS; ++j) c[j] = sf_fma(a, b, c[j]);
    }
    seconds = omp_get_wtime() - t0;
    for (int j = 0; j < CHAINS; ++j) sink += c[j][0];
  }
  return sink == 42.0f ? -seconds : seconds;
}
extern "C" int sf_fma_threads() { return omp_get_max_threads(); }
// the read bandwidth: every thread sums its share of n floats in eight vector accumulators
// (torch's sum of the same floats reads at a half to a third of this on 2 cores)
extern "C" float sf_read(const float* p, int64_t n) {
  float total = 0;
  #pragma omp parallel for reduction(+ : total) schedule(static)
  for (int64_t c = 0; c < n / 4096; ++c) {
    const float* q = p + c * 4096;
    sf_vec a[8];
    for (int j = 0; j < 8; ++j) a[j] = sf_splat(0.0f);
    for (int64_t i = 0; i + 8 * SF_LANES <= 4096; i += 8 * SF_LANES)
      for (int j = 0; j < 8; ++j) a[j] += sf_load(q + i + j * SF_LANES);
    for (int j = 1; j < 8; ++j) a[0] += a[j];
    for (int l = 0; l < SF_LANES; ++l) total += a[0][l];
  }
  return total;
}
"""


def fma_peak(isa: str = "") -> dict:
    """The float32 FMA peak of this machine's cores (GFLOP/s on every thread) in the vectors of
    `isa` ("": the best this machine runs), the best of at least 5 tries over a second; and its
    L3 cache in bytes. A try is as slow as its slowest thread: where other work holds a core
    for a moment, every try in it measures half the peak (once seen: 117 of 235 GFLOP/s on 2
    cores, where five tries took 0.14 s), and the profile's shares of the peak double."""
    import ctypes

    import torch

    from symfuse.codegen.cpu.build import build
    from symfuse.codegen.cpu.c import preamble
    from symfuse.codegen.cpu.target import detect
    from symfuse.options import Options

    opts = Options.from_env()
    target = detect(opts.cxx, isa, opts.machine_cache)
    lib = ctypes.CDLL(build(preamble(target) + _FMA_PEAK.replace("@CHAINS@", str(_CHAINS)), target, opts)[0])
    lib.sf_fma_peak.argtypes, lib.sf_fma_peak.restype = [ctypes.c_int64], ctypes.c_double
    lib.sf_read.argtypes, lib.sf_read.restype = [ctypes.c_void_p, ctypes.c_int64], ctypes.c_float
    steps = 1 << 22
    best, tries, start = float("inf"), 0, time.perf_counter()
    while tries < 5 or time.perf_counter() - start < 1.0:
        best, tries = min(best, abs(lib.sf_fma_peak(steps))), tries + 1
    flops = 2 * _CHAINS * target.lanes * steps * lib.sf_fma_threads()
    src = torch.ones(128 * 2**20, dtype=torch.float32)  # 512 MiB: far past any L3
    read = min(_timed(lambda: lib.sf_read(src.data_ptr(), src.numel())) for _ in range(8))
    return {"fma_gflops": flops / best / 1e9, "l3_bytes": target.l3, "native_read_gbps": src.numel() * 4 / read / 1e9}


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

    be, (tensors, binding) = compiled.native, _prepared(compiled, inputs)
    runs = [dict(be.program.profile(tensors, binding)[0]) for _ in range(5)]
    stats: dict = {}
    for st in be.schedule.steps:
        label, flops, moved, _ = step_work(be, st, binding)
        s = stats.setdefault(label, {"op": label, "calls": 0, "seconds": 0.0, "bytes": 0, "flops": 0})
        s["calls"] += 1
        s["seconds"] += statistics.median(r.get(st.name, 0.0) for r in runs)
        s["bytes"] += moved
        s["flops"] += flops
    return sorted(stats.values(), key=lambda s: -s["seconds"])


def work_symfuse(compiled, inputs: dict) -> dict:
    """What one call of the compiled program does at `inputs`' binding, whoever runs it: its
    FLOPs (GEMMs, convolutions, attention) and the bytes of the weights it reads."""
    be, (_, binding) = compiled.native, _prepared(compiled, inputs)
    flops = weights = 0
    for st in be.schedule.steps:
        _, f, _, w = step_work(be, st, binding)
        flops, weights = flops + f, weights + w
    return {"flops": flops, "weight_bytes": weights}


def _prepared(compiled, inputs: dict) -> tuple[list, dict[str, int]]:
    """The compiled program's input tensors for `inputs`, and their binding."""
    tensors = compiled._inputs((), {k: v for k, v in inputs.items() if k in compiled.captured.input_names})
    return tensors, compiled.guard(tensors)


def step_work(be, st, binding: dict[str, int]) -> tuple[str, int, int, int]:
    """One step of a compiled program at `binding`: (the profile's label for its kind, FLOPs,
    bytes it moves, bytes of weights among them)."""
    from symfuse.ir.dims import evaluate
    from symfuse.schedule.attention import AttentionStep
    from symfuse.schedule.steps import GemmStep, NativeStep, OpaqueStep

    sched = be.schedule

    def numel(dims) -> int:
        n = 1
        for d in dims:
            n *= evaluate(d, binding)
        return n

    def nbytes(name: str) -> int:
        b = sched.buffers[name]
        return numel(b.shape) * b.dtype.torch.itemsize

    flops = weights = 0
    if isinstance(st, AttentionStep):
        q, k, v = st.scores.a.sizes, st.scores.b.sizes, st.context.b.sizes
        keys = evaluate(k[-1], binding)
        if be.runs_own(st, keys):
            label = "attention (merged kernel)"
        else:
            label = "attention (torch fused)" if st.library else "attention (three steps)"
        flops = 2 * numel(q[:-1]) * keys * (evaluate(q[-1], binding) + evaluate(v[-1], binding))
        moved = nbytes(st.out) + 3 * numel(q) * 4
    elif isinstance(st, GemmStep):
        out = sched.buffers[st.out].shape
        if st.conv is not None:
            label, k = "convolution (oneDNN)", numel(st.b.sizes[1:])
            weights = nbytes(st.b.buffer)
        elif st.weight is not None:
            k = evaluate(st.a.sizes[-1], binding)
            own = be.runs_own(st, numel(out[:-1]))
            label = "linear (row kernel)" if own else "linear (oneDNN)"
            weights = nbytes(st.weight)
        else:
            label, k = "batched matmul (torch)", evaluate(st.a.sizes[-1], binding)
        flops = 2 * numel(out) * k
        moved = nbytes(st.out) + numel(st.a.sizes) * 4 + (numel(st.b.sizes) * 4 if st.b else 0)
        if st.weight is not None:
            moved += weights
    elif isinstance(st, NativeStep):
        label = f"C++ {st.kind} kernels"
        src = be.kernels.get(st.name)
        moved = sum(nbytes(n) for n in src.args) if src else 0
    else:
        assert isinstance(st, OpaqueStep)
        label = f"torch: {st.node.op}"
        moved = sum(nbytes(v.name) for v in st.node.inputs if v is not None and v.name in sched.buffers)
        moved += sum(nbytes(v.name) for v in st.node.outputs)
    return label, flops, moved, weights


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
    reply({"status": "ready", "prepare_s": prepare_s, "detail": engine.note})
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
            if req["cmd"] == "work":
                reply({"work": work_symfuse(engine.compiled, inputs)})
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
