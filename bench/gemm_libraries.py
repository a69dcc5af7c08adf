"""Which GEMM should symfuse call on this CPU? Measures BERT's linear layers per library.

Libraries, all fp32, all threads of the machine:
  mkl            torch.nn.functional.linear (torch's default CPU path: MKL sgemm)
  mkl-packed     torch.ops.mkl._mkl_linear with weights packed once (for 128 rows) and
                 used at every sequence length
  onednn         torch.ops.mkldnn._linear_pointwise with weights reordered once with no
                 row-count hint (the path Inductor's freezing uses); "+gelu" fuses GELU
                 as a post-op
  openblas       cblas_sgemm from the scipy-openblas32 wheel, through ctypes
and the machine's fp32 FMA peak, from an AVX-512 loop of 12 independent FMA chains.

Shapes: batch 1, sequence S in {16, 128, 384}; (K, N) for the QKV-fused projection
(768 -> 2304), attention output (768 -> 768), FFN up (768 -> 3072) and down (3072 -> 768).

A second table runs all 48 linear layers of BERT-base one after the other, each with its own
weights (340 MB, far more than the caches), as a forward pass does: at few rows this is
bound by streaming the weights from memory, and symfuse's own row kernel
(`symfuse/codegen/cpu/gemm.py`) joins the comparison.

Run: .venv/bin/pip install scipy-openblas32 && .venv/bin/python bench/gemm_libraries.py
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

SEQS = (16, 128, 384)
LAYERS = {
    "qkv 768->2304": (768, 2304),
    "out 768->768": (768, 768),
    "ffn-up 768->3072": (768, 3072),
    "ffn-down 3072->768": (3072, 768),
}

PEAK_C = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
  const long iters = 200000000L / 12;
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now();
    float sink = 0;
    #pragma omp parallel reduction(+:sink)
    {
      __m512 a = _mm512_set1_ps(1.0000001f), b = _mm512_set1_ps(0.9999999f);
      // twelve chains that start apart: equal ones would be merged into one by the compiler
      __m512 c0 = _mm512_set1_ps(0.0f), c1 = _mm512_set1_ps(1.0f), c2 = _mm512_set1_ps(2.0f);
      __m512 c3 = _mm512_set1_ps(3.0f), c4 = _mm512_set1_ps(4.0f), c5 = _mm512_set1_ps(5.0f);
      __m512 c6 = _mm512_set1_ps(6.0f), c7 = _mm512_set1_ps(7.0f), c8 = _mm512_set1_ps(8.0f);
      __m512 c9 = _mm512_set1_ps(9.0f), c10 = _mm512_set1_ps(10.0f), c11 = _mm512_set1_ps(11.0f);
      for (long i = 0; i < iters; i++) {
        c0 = _mm512_fmadd_ps(a, b, c0); c1 = _mm512_fmadd_ps(a, b, c1); c2 = _mm512_fmadd_ps(a, b, c2);
        c3 = _mm512_fmadd_ps(a, b, c3); c4 = _mm512_fmadd_ps(a, b, c4); c5 = _mm512_fmadd_ps(a, b, c5);
        c6 = _mm512_fmadd_ps(a, b, c6); c7 = _mm512_fmadd_ps(a, b, c7); c8 = _mm512_fmadd_ps(a, b, c8);
        c9 = _mm512_fmadd_ps(a, b, c9); c10 = _mm512_fmadd_ps(a, b, c10); c11 = _mm512_fmadd_ps(a, b, c11);
      }
      __m512 s = _mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3));
      s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
      s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
      sink += _mm512_reduce_add_ps(s);
    }
    double dt = now() - t0;
    double gflops = (double)omp_get_max_threads() * iters * 12 * 16 * 2 / dt / 1e9;
    if (gflops > best) best = gflops;
    if (sink == 42) printf("!");
  }
  printf("%.1f\n", best);
  return 0;
}
"""


def peak_gflops() -> float | None:
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "peak.c"), os.path.join(d, "peak")
        open(src, "w").write(PEAK_C)
        r = subprocess.run(
            ["gcc", "-O3", "-march=native", "-funroll-loops", "-fopenmp", src, "-o", exe],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            print("peak loop did not compile:", r.stderr[:300], file=sys.stderr)
            return None
        return float(subprocess.run([exe], capture_output=True, text=True, check=True).stdout.strip())


def timed(fn, budget: float = 0.4, min_reps: int = 10) -> float:
    """Median seconds per call after two warm-up calls."""
    fn()
    fn()
    times, start = [], time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def openblas():
    try:
        import scipy_openblas32
    except ImportError:
        return None
    (path,) = glob.glob(os.path.join(scipy_openblas32.get_lib_dir(), "lib*.so"))
    lib = ctypes.CDLL(path)
    fn = lib.scipy_cblas_sgemm
    fn.restype = None
    fp = ctypes.POINTER(ctypes.c_float)
    fn.argtypes = [ctypes.c_int] * 6 + [
        ctypes.c_float,
        fp,
        ctypes.c_int,
        fp,
        ctypes.c_int,
        ctypes.c_float,
        fp,
        ctypes.c_int,
    ]

    def linear(x, w, out):  # out[M, N] = x[M, K] @ w[N, K]^T, row-major
        m, k = x.shape
        n = w.shape[0]
        p = lambda t: ctypes.cast(t.data_ptr(), fp)
        fn(101, 111, 112, m, n, k, 1.0, p(x), k, p(w), k, 0.0, p(out), n)  # RowMajor, NoTrans, Trans

    return linear


def symfuse_rows():
    """symfuse's own kernel for few rows, built as the backend builds it for this machine's
    target (SYMFUSE_ISA picks another); returns the function and its panel width."""
    from symfuse.codegen.cpu.calibrate import row_kernel
    from symfuse.codegen.cpu.gemm import tile_for
    from symfuse.codegen.cpu.target import detect
    from symfuse.options import Options

    opts = Options.from_env()
    target = detect(opts.cxx, opts.isa, opts.machine_cache)
    return row_kernel(target, opts), tile_for(target).panel


def forward_pass(rows=(1, 8, 16, 33, 48, 64, 128)) -> None:
    from symfuse.codegen.cpu.gemm import pack_panels

    layers = [shape for _ in range(12) for shape in LAYERS.values()]
    ws = [torch.randn(n, k) * 0.02 for k, n in layers]
    bs = [torch.randn(n) for _, n in layers]
    wd = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]
    fn, panel = symfuse_rows()
    wp = [pack_panels(w, panel) for w in ws]
    mb = sum(w.numel() for w in ws) * 4 / 1e6
    print(f"\nall 48 linear layers of BERT-base in sequence ({mb:.0f} MB of weights), ms per pass")
    print("| rows | mkl | onednn | symfuse rows kernel |")
    print("|---|---|---|---|")
    for m in rows:
        xs = {k: torch.randn(m, k) for k in (768, 3072)}
        outs = [torch.empty(m, n) for _, n in layers]

        def ours(m=m, xs=xs, outs=outs):
            for (k, n), p, b, o in zip(layers, wp, bs, outs):
                fn(xs[k].data_ptr(), k, p.data_ptr(), b.data_ptr(), o.data_ptr(), n, m, n, k, 0)

        with torch.no_grad():
            res = {
                "mkl": timed(lambda: [F.linear(xs[k], w, b) for (k, _), w, b in zip(layers, ws, bs)], 1.0, 5),
                "onednn": timed(
                    lambda: [
                        torch.ops.mkldnn._linear_pointwise(xs[k], w, b, "none", [], "")
                        for (k, _), w, b in zip(layers, wd, bs)
                    ],
                    1.0,
                    5,
                ),
                "ours": timed(ours, 1.0, 5),
            }
        for (k, _), w, b, o in zip(layers, ws, bs, outs):
            assert torch.allclose(o, F.linear(xs[k], w, b), rtol=1e-4, atol=1e-4)
        best = min(res.values())
        cells = [f"**{v * 1e3:.2f}**" if v == best else f"{v * 1e3:.2f}" for v in res.values()]
        print(f"| {m} | " + " | ".join(cells) + " |")


def main() -> int:
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(threads))
    peak = peak_gflops()
    blas = openblas()
    rows = []
    for s in SEQS:
        for layer, (k, n) in LAYERS.items():
            x, w, b = torch.randn(s, k), torch.randn(n, k) * 0.02, torch.randn(n)
            flops = 2 * s * k * n
            res = {}
            with torch.no_grad():
                res["mkl"] = timed(lambda: F.linear(x, w, b))
                # weights are prepared once for every shape, as a compile-once engine must:
                # MKL packs for one batch size (128) and serves any; oneDNN gets no size hint
                wp = torch.ops.mkl._mkl_reorder_linear_weight(w, 128)
                res["mkl-packed"] = timed(lambda: torch.ops.mkl._mkl_linear(x, wp, w, b, 128))
                wd = torch.ops.mkldnn._reorder_linear_weight(w)
                res["onednn"] = timed(lambda: torch.ops.mkldnn._linear_pointwise(x, wd, b, "none", [], ""))
                res["onednn+gelu"] = timed(lambda: torch.ops.mkldnn._linear_pointwise(x, wd, b, "gelu", [], "none"))
                res["mkl then gelu"] = timed(lambda: F.gelu(F.linear(x, w, b)))
                ref = F.linear(x, w, b)
                assert torch.allclose(
                    torch.ops.mkldnn._linear_pointwise(x, wd, b, "none", [], ""), ref, rtol=1e-4, atol=1e-4
                )
                assert torch.allclose(torch.ops.mkl._mkl_linear(x, wp, w, b, 128), ref, rtol=1e-4, atol=1e-4)
                if blas:
                    out = torch.empty(s, n)
                    blas(x, w, out)
                    assert torch.allclose(out + b, ref, rtol=1e-4, atol=1e-4)
                    res["openblas"] = timed(lambda: blas(x, w, out))
            rows.append((s, layer, {name: flops / t / 1e9 for name, t in res.items()}))
    libs = list(rows[0][2])
    print(
        f"fp32 GFLOP/s, {threads} threads; FMA peak {peak:.0f} GFLOP/s" if peak else f"fp32 GFLOP/s, {threads} threads"
    )
    print("| S | layer | " + " | ".join(libs) + " |")
    print("|---|---|" + "---|" * len(libs))
    for s, layer, g in rows:
        best = max(v for name, v in g.items() if "gelu" not in name)
        cells = [f"**{v:.0f}**" if v == best else f"{v:.0f}" for v in g.values()]
        print(f"| {s} | {layer} | " + " | ".join(cells) + " |")
    forward_pass()
    return 0


if __name__ == "__main__":
    sys.exit(main())
