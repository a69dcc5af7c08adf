"""symfuse's own GEMM for linear layers over few rows, where streaming the weights is the
cost: all rows pass over each 64-column panel of packed weights while it sits in L2, the
next panel is prefetched meanwhile, and bias and activation are applied to the tile while
it is in registers and cache. It wins over oneDNN up to about 48 rows on this kind of CPU
(docs/gemm.md); the host picks it or oneDNN per call from the row count.
"""

from __future__ import annotations

import torch

PANEL = 64  # output columns per packed weight panel
MAX_ROWS = 48  # up to this many rows the host calls this kernel, above it oneDNN
ACTIVATIONS = {"none": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3, "tanh": 4, "sigmoid": 5, "swish": 6}


def pack_panels(w: torch.Tensor) -> torch.Tensor:
    """Weight [N, K] as panels [ceil(N/64), K, 64], zero-padded: one panel is contiguous."""
    n, k = w.shape
    panels = (n + PANEL - 1) // PANEL
    padded = torch.zeros(panels * PANEL, k, dtype=w.dtype)
    padded[:n] = w
    return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


def activation_code(postop: tuple[str, str] | None) -> int:
    if postop is None:
        return 0
    attr, algo = postop
    return ACTIVATIONS["gelu_tanh" if attr == "gelu" and algo == "tanh" else attr]


SOURCE = r"""
// ---- sf_linear_rows: C[M, N] = act(A[M, K] W^T + bias) for few rows; W packed [N/64][K][64]
#include <immintrin.h>
template <int MR>
static inline void sf_tile(const float* __restrict__ A, int64_t lda, const float* __restrict__ w,
                           float* __restrict__ C, int64_t ldc, const float* __restrict__ bias, int64_t n0, int64_t nn,
                           int64_t K, const float* __restrict__ pf, int64_t pf_lines) {
  __m512 acc[MR][4];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m512 w0 = _mm512_loadu_ps(w + k * 64), w1 = _mm512_loadu_ps(w + k * 64 + 16);
    const __m512 w2 = _mm512_loadu_ps(w + k * 64 + 32), w3 = _mm512_loadu_ps(w + k * 64 + 48);
    for (int64_t j = k * pf_lines / K; j < (k + 1) * pf_lines / K; ++j)  // a share of the next panel
      _mm_prefetch((const char*)(pf + j * 16), _MM_HINT_T1);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512 a = _mm512_set1_ps(A[m * lda + k]);
      acc[m][0] = _mm512_fmadd_ps(a, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(a, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(a, w2, acc[m][2]);
      acc[m][3] = _mm512_fmadd_ps(a, w3, acc[m][3]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const int64_t c = n0 + 16 * j, left = nn - 16 * j;
    if (left <= 0) break;
    const __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(C + m * ldc + c, mask, _mm512_add_ps(acc[m][j], bv));
  }
}
typedef void (*sf_tile_fn)(const float*, int64_t, const float*, float*, int64_t, const float*, int64_t, int64_t,
                           int64_t, const float*, int64_t);
static const sf_tile_fn sf_tiles[6] = {sf_tile<1>, sf_tile<2>, sf_tile<3>, sf_tile<4>, sf_tile<5>, sf_tile<6>};

#define SF_ROW_LOOP(expr) \
  { _Pragma("omp simd") for (int64_t j = 0; j < n; ++j) { const float x = row[j]; row[j] = (expr); } }
static inline void sf_activate(float* __restrict__ row, int64_t n, int64_t act) {
  switch (act) {
    case 1: SF_ROW_LOOP(sf_gelu_erf(x)) break;
    case 2: SF_ROW_LOOP(sf_gelu_tanh(x)) break;
    case 3: SF_ROW_LOOP(x > 0.0f ? x : 0.0f) break;
    case 4: SF_ROW_LOOP(tanhf(x)) break;
    case 5: SF_ROW_LOOP(1.0f / (1.0f + sf_expf(-x))) break;
    case 6: SF_ROW_LOOP(x / (1.0f + sf_expf(-x))) break;
    default: break;
  }
}

extern "C" void sf_linear_rows(const float* A, int64_t lda, const float* Wp, const float* bias, float* C,
                               int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act) {
  const int64_t panels = (N + 63) / 64, blocks = (M + 5) / 6;
  const int64_t share = (4 * K + blocks - 1) / blocks;  // lines of the next panel each row block prefetches
#pragma omp parallel for schedule(static) if (panels > 1)
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n0 = p * 64, nn = std::min<int64_t>(64, N - n0);
    const float* w = Wp + p * K * 64;
    for (int64_t m0 = 0, rb = 0; m0 < M; m0 += 6, ++rb) {
      const int64_t left = std::max<int64_t>(0, std::min(share, 4 * K - rb * share));
      const int64_t lines = (blocks > 1 && p + 1 < panels) ? left : 0;
      sf_tiles[std::min<int64_t>(6, M - m0) - 1](A + m0 * lda, lda, w, C + m0 * ldc, ldc, bias, n0, nn, K,
                                                  w + K * 64 + rb * share * 16, lines);
      if (act)  // the epilogue, on the tile while it is in cache
        for (int64_t m = m0; m < std::min(M, m0 + 6); ++m) sf_activate(C + m * ldc + n0, nn, act);
    }
  }
}
"""
