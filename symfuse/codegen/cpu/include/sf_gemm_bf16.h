// The bf16 row GEMM (AVX512-BF16 targets): sf_tile_bf16, sf_tile_dp and sf_linear_rows_bf16.
// Parameterised by the generator (codegen/cpu/gemm.py: gemm_source):
//   SF_BF16_MULTIPLY   0: vdpbf16ps, 1: FMA on weights widened to float32, 2: AMX tiles
//   SF_TILES_BF16, SF_TILES_DP   the tables of the tiles' template instances
// ---- the bf16 row kernel: C[M, N] = act(A[M, K] W^T + bias), A, W, bias and C bfloat16, products
// accumulated in float32; W as panels [SF_PAIRS(K)][SF_PANEL][2], the pair (k, k+1) of each column
// side by side, K padded with zeros to whole AMX steps (32). Three ways to multiply, the fastest
// measured per machine (calibrate.py, "bf16_multiply"):
//   0: vdpbf16ps, a pair of k steps per instruction on bf16 A;
//   1: FMA on W widened to float32 in registers (exact: a bf16 is a float's high half) and A
//      widened once per call, for CPUs whose vdpbf16ps runs at half their FMA rate;
//   2: AMX tiles (tdpbf16ps): a block of 16 rows times the panel's four 16-column blocks, 32 k
//      steps an instruction, accumulated in four 16x16 float tiles.
#include <immintrin.h>
static_assert(SF_LANES == 16, "the bf16 row kernel is AVX-512");
#define SF_PAIRS(K) (((K) + 31) / 32 * 16)  // pairs of k steps in a packed panel: whole AMX steps

// the epilogue of a tile of mr rows held in float (`out`, rows of SF_PANEL): bias and activation,
// then rounded to bf16 once
static inline void sf_bf16_epilogue(float (*out)[SF_PANEL], int64_t mr, sf_bf16* __restrict__ C, int64_t ldc,
                                    const sf_bf16* __restrict__ bias, int64_t n0, int64_t nn, int64_t act) {
  float b[SF_PANEL] = {};
  for (int64_t j = 0; j < nn && bias; ++j) b[j] = sf_from_bf16(bias[n0 + j]);
  for (int64_t m = 0; m < mr; ++m) {
#pragma omp simd
    for (int64_t j = 0; j < SF_PANEL; ++j) out[m][j] += b[j];
    if (act) sf_activate(out[m], nn, act);
    sf_bf16* __restrict__ c = C + m * ldc + n0;
#pragma omp simd
    for (int64_t j = 0; j < nn; ++j) c[j] = sf_to_bf16(out[m][j]);
  }
}

#if SF_BF16_MULTIPLY == 1
typedef float sf_bf16_a;  // A as the tile reads it
#else
typedef sf_bf16 sf_bf16_a;
#endif
#if SF_BF16_MULTIPLY != 1
// acc[MR][NV] += A[MR, K] W by vdpbf16ps, a pair of k steps per instruction: A bf16 rows, W one
// panel of pairs (an odd K's last step meets W's zero-padded pair), its first NV vectors;
// pf_lines lines from `pf` on are prefetched meanwhile, spread over the pairs
template <int MR, int NV = SF_NV>
static inline __attribute__((always_inline)) void sf_dp(const sf_bf16* __restrict__ A, int64_t lda,
                                                        const sf_bf16* __restrict__ w, int64_t K, __m512 (&acc)[MR][NV],
                                                        const sf_bf16* __restrict__ pf, int64_t pf_lines) {
  const int64_t pairs = (K + 1) / 2;
  int64_t pf_due = 0, pf_next = 0;
  auto step = [&](int64_t k2, bool whole) __attribute__((always_inline)) {
    __m512bh wv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      wv[j] = (__m512bh)_mm512_loadu_si512(w + (k2 * SF_PANEL + j * SF_LANES) * 2);
      SF_IN_REGISTER(wv[j]);
    }
    for (pf_due += pf_lines; pf_due >= pairs; pf_due -= pairs) __builtin_prefetch(pf + 32 * pf_next++, 0, 2);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      uint32_t pair = A[m * lda + 2 * k2];  // an odd K's last step: one element, W's pair is zero-padded
      if (whole) std::memcpy(&pair, A + m * lda + 2 * k2, sizeof pair);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int32_t(pair));
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], a, wv[j]);
    }
  };
  for (int64_t k2 = 0; k2 < K / 2; ++k2) step(k2, true);
  if (K % 2) step(K / 2, false);
}

// C[MR, NV vectors] = A[MR, K] W in float, by vdpbf16ps (the merged attention's GEMMs in bf16)
template <int MR, int NV>
static inline void sf_tile_dp(const sf_bf16* __restrict__ A, int64_t lda, const sf_bf16* __restrict__ w,
                              float* __restrict__ C, int64_t ldc, int64_t K) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[m][j] = _mm512_setzero_ps();
  sf_dp<MR, NV>(A, lda, w, K, acc, nullptr, 0);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(C + m * ldc + SF_LANES * j, acc[m][j]);
}
typedef void (*sf_tile_dp_fn)(const sf_bf16*, int64_t, const sf_bf16*, float*, int64_t, int64_t);
// sf_tiles_dp[v - 1][m - 1]: m rows by v vectors; sf_tile_dp_for: the narrowest covering `columns`
SF_HIDDEN extern const sf_tile_dp_fn sf_tiles_dp[SF_NV][SF_MR];  // (defined with the row GEMM, sf_gemm.h)
#ifndef SF_ROWS_ELSEWHERE
const sf_tile_dp_fn sf_tiles_dp[SF_NV][SF_MR] = {SF_TILES_DP};
#endif
static inline sf_tile_dp_fn sf_tile_dp_for(int64_t rows, int64_t columns) {
  return sf_tiles_dp[sf_vectors(columns) - 1][rows - 1];
}
#endif

template <int MR>
static inline void sf_tile_bf16(const sf_bf16_a* __restrict__ A, int64_t lda, const sf_bf16* __restrict__ w,
                                sf_bf16* __restrict__ C, int64_t ldc, const sf_bf16* __restrict__ bias, int64_t n0,
                                int64_t nn, int64_t K, int64_t act, const sf_bf16* __restrict__ pf, int64_t pf_lines) {
  __m512 acc[MR][SF_NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < SF_NV; ++j) acc[m][j] = _mm512_setzero_ps();
#if SF_BF16_MULTIPLY == 1
  const int64_t pairs = (K + 1) / 2;
  int64_t pf_due = 0, pf_next = 0;  // a share of the next panel, fetched while this one computes
  const __m512i high = _mm512_set1_epi32(int32_t(0xffff0000u));
  for (int64_t k2 = 0; k2 < pairs; ++k2) {
    for (pf_due += pf_lines; pf_due >= pairs; pf_due -= pairs) __builtin_prefetch(pf + 32 * pf_next++, 0, 2);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // k = 2 k2 (the pair's low half), then 2 k2 + 1 (its high half)
      __m512 wv[SF_NV];
#pragma GCC unroll 4
      for (int j = 0; j < SF_NV; ++j) {
        const __m512i v = _mm512_loadu_si512(w + (k2 * SF_PANEL + j * SF_LANES) * 2);
        wv[j] = _mm512_castsi512_ps(h ? _mm512_and_si512(v, high) : _mm512_slli_epi32(v, 16));
      }
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m512 a = _mm512_set1_ps(A[m * lda + 2 * k2 + h]);  // A's K is padded to even
#pragma GCC unroll 4
        for (int j = 0; j < SF_NV; ++j) acc[m][j] = _mm512_fmadd_ps(a, wv[j], acc[m][j]);
      }
    }
  }
#else
  sf_dp<MR>(A, lda, w, K, acc, pf, pf_lines);
#endif
  float out[MR][SF_PANEL];  // the tile in float: bias and activation, then rounded once
#pragma GCC unroll 4
  for (int j = 0; j < SF_NV; ++j)
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) _mm512_storeu_ps(out[m] + SF_LANES * j, acc[m][j]);
  sf_bf16_epilogue(out, MR, C, ldc, bias, n0, nn, act);
}
typedef void (*sf_tile_bf16_fn)(const sf_bf16_a*, int64_t, const sf_bf16*, sf_bf16*, int64_t, const sf_bf16*, int64_t,
                                int64_t, int64_t, int64_t, const sf_bf16*, int64_t);
static const sf_tile_bf16_fn sf_tiles_bf16[SF_MR] = {SF_TILES_BF16};

#if SF_BF16_MULTIPLY == 2
#include <sys/syscall.h>
#include <unistd.h>
// Linux hands out AMX's tile registers per process, on request (ARCH_REQ_XCOMP_PERM, XTILEDATA);
// refused (an older kernel, another machine), the row kernel multiplies by vdpbf16ps instead
static bool sf_amx_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
}
// tiles 0-3: C's four 16x16 float blocks of a panel; 4: 16 rows x 32 k of A; 5-7: 16 pairs x
// 16 columns of W (the fourth block reuses tile 5)
struct sf_tile_config {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
// 16 rows of A (`a`, stride lda, K padded to whole steps of 32 with zeros) times one panel `w`,
// into `out` in float (16 rows of the panel's SF_PANEL columns)
__attribute__((target("amx-tile,amx-bf16"))) static inline void sf_amx_block(const sf_bf16* a, int64_t lda,
                                                                             const sf_bf16* w, int64_t K,
                                                                             float (*out)[SF_PANEL]) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t ldw = SF_PANEL * 2 * sizeof(sf_bf16);  // bytes from one pair of k steps to the next
  for (int64_t k = 0; k < K; k += 32) {
    const sf_bf16* wk = w + k * SF_PANEL;  // pair k / 2
    _tile_loadd(4, a + k, lda * sizeof(sf_bf16));
    _tile_loadd(5, wk, ldw);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, wk + 32, ldw);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, wk + 64, ldw);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, wk + 96, ldw);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, out[0], SF_PANEL * sizeof(float));
  _tile_stored(1, out[0] + 16, SF_PANEL * sizeof(float));
  _tile_stored(2, out[0] + 32, SF_PANEL * sizeof(float));
  _tile_stored(3, out[0] + 48, SF_PANEL * sizeof(float));
}

__attribute__((target("amx-tile,amx-bf16"))) static void sf_linear_rows_amx(const sf_bf16* A, int64_t lda,
                                                                            const sf_bf16* Wp, const sf_bf16* bias,
                                                                            sf_bf16* C, int64_t ldc, int64_t M,
                                                                            int64_t N, int64_t K, int64_t act,
                                                                            bool rows_first) {
  const int64_t panels = (N + SF_PANEL - 1) / SF_PANEL, blocks = (M + 15) / 16;
  const int64_t kp = SF_PAIRS(K) * 2, step = kp * SF_PANEL;  // K padded; bf16 elements in one panel
  // a block of A is read in place when it is whole (16 rows, K a multiple of 32); the others
  // from a copy padded with zeros (rows past M are never stored; k past K meets W's zero pairs)
  const int64_t copied = K % 32 ? blocks : M % 16 ? 1 : 0, first_copied = blocks - copied;
  std::unique_ptr<sf_bf16[]> padded(copied ? new sf_bf16[copied * 16 * kp]() : nullptr);
  for (int64_t m = first_copied * 16; m < M; ++m)
    std::memcpy(padded.get() + (m - first_copied * 16) * kp, A + m * lda, K * sizeof(sf_bf16));
  const int64_t team = sf_grid::threads(panels, blocks, rows_first);
#pragma omp parallel num_threads(team) if (team > 1)
  {
    static const sf_tile_config config;
    _tile_loadconfig(&config);
    alignas(64) float out[16][SF_PANEL];
    const sf_grid g = sf_grid::mine(panels, blocks, M, 16, rows_first);  // whole blocks of 16 rows
    for (int64_t p = g.p0; p < g.p1; ++p) {
      const int64_t n0 = p * SF_PANEL, nn = std::min<int64_t>(SF_PANEL, N - n0);
      for (int64_t rb = g.m0 / 16; rb < (g.m1 + 15) / 16; ++rb) {
        const bool own = rb >= first_copied;
        const sf_bf16* a = own ? padded.get() + (rb - first_copied) * 16 * kp : A + rb * 16 * lda;
        sf_amx_block(a, own ? kp : lda, Wp + p * step, K, out);
        sf_bf16_epilogue(out, std::min<int64_t>(16, M - rb * 16), C + rb * 16 * ldc, ldc, bias, n0, nn, act);
      }
    }
    _tile_release();
  }
}
#endif

// C[M, N] = act(A[M, K] W^T + bias) for few rows, in bf16; W packed by pack_panels(bf16=True); the
// threads on the panels or, with rows_first, on the rows first (sf_grid).
// `sf_rows_gemm_bf16_team` is one thread's share by vector instructions (not AMX tiles), run by every
// thread of the caller's team (its own in `sf_rows_gemm_bf16`, a whole call's in `sf_run`); in
// the translation unit of the model's kernels a declaration (sf_gemm.h: SF_ROWS_ELSEWHERE)
#ifdef SF_ROWS_ELSEWHERE
SF_HIDDEN void sf_rows_gemm_bf16_team(const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias, sf_bf16* C,
                                      int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act, bool rows_first);
extern "C" void sf_linear_rows_bf16(const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias, sf_bf16* C,
                                    int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act);
extern "C" void sf_linear_rows_bf16_split(const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias,
                                          sf_bf16* C, int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act);
#else
SF_HIDDEN void sf_rows_gemm_bf16_team(const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias, sf_bf16* C,
                                      int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act, bool rows_first) {
  const int64_t panels = (N + SF_PANEL - 1) / SF_PANEL;
  const int64_t step = SF_PAIRS(K) * 2 * SF_PANEL;        // bf16 elements in one panel
  const int64_t lines = (K + 1) / 2 * 2 * SF_PANEL / 32;  // 64-byte lines the kernel reads of a panel
  const sf_grid g = sf_grid::mine(panels, (M + SF_MR - 1) / SF_MR, M, 1, rows_first);
  const int64_t mine = std::max<int64_t>(1, g.tiles()), share = (lines + mine - 1) / mine;
#if SF_BF16_MULTIPLY == 1
  // the thread's rows of A widened to float32 by the thread (cheap next to the products;
  // shared, its rows would cross between cores), K padded to even with a zero
  const int64_t lda_a = K + K % 2;
  std::unique_ptr<float[]> wide(new float[M * lda_a]);
  for (int64_t m = g.m0; m < g.m1; ++m) {
    float* __restrict__ row = wide.get() + m * lda_a;
#pragma omp simd
    for (int64_t k = 0; k < K; ++k) row[k] = sf_from_bf16(A[m * lda + k]);
    if (K % 2) row[K] = 0.0f;
  }
  const float* a_in = wide.get();
#else
  const int64_t lda_a = lda;
  const sf_bf16* a_in = A;
#endif
  for (int64_t p = g.p0; p < g.p1; ++p) {
    const int64_t n0 = p * SF_PANEL, nn = std::min<int64_t>(SF_PANEL, N - n0);
    const sf_bf16* w = Wp + p * step;
    for (int64_t b = 0; b < g.tiles(); ++b) {
      const int64_t m0 = g.tile_row(b), first = b * share;
      const int64_t pf = mine > 1 && p + 1 < g.p1 ? std::max<int64_t>(0, std::min(share, lines - first)) : 0;
      sf_tiles_bf16[g.tile_row(b + 1) - m0 - 1](a_in + m0 * lda_a, lda_a, w, C + m0 * ldc, ldc, bias, n0, nn, K, act,
                                                w + step + first * 32, pf);
    }
  }
}
static void sf_rows_gemm_bf16(const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias, sf_bf16* C,
                              int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act, bool rows_first) {
#if SF_BF16_MULTIPLY == 2
  if (sf_amx_granted()) return sf_linear_rows_amx(A, lda, Wp, bias, C, ldc, M, N, K, act, rows_first);
#endif
  const int64_t team = sf_grid::threads((N + SF_PANEL - 1) / SF_PANEL, (M + SF_MR - 1) / SF_MR, rows_first);
#pragma omp parallel num_threads(team) if (team > 1)
  sf_rows_gemm_bf16_team(A, lda, Wp, bias, C, ldc, M, N, K, act, rows_first);
}
extern "C" void sf_linear_rows_bf16(const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias, sf_bf16* C,
                                    int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act) {
  sf_rows_gemm_bf16(A, lda, Wp, bias, C, ldc, M, N, K, act, false);
}
extern "C" void sf_linear_rows_bf16_split(const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias,
                                          sf_bf16* C, int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act) {
  sf_rows_gemm_bf16(A, lda, Wp, bias, C, ldc, M, N, K, act, true);
}
#endif  // SF_ROWS_ELSEWHERE
