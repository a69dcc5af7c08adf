// symfuse's row GEMM: the register-tile micro-kernel and sf_linear_rows. Parameterised by the
// generator (codegen/cpu/gemm.py: gemm_source), from the target's register tile:
//   SF_MR, SF_NV   rows and vectors of the tile; SF_KC steps of K in a chunk of a panel
//   SF_TILES, SF_TILES_PF, SF_TILES_NV   the tables of the tile's template instances
#include <omp.h>
// A library is built from two translation units at once (codegen/cpu/generate.py): the row GEMM
// and the tile instances in one, the same for every model of a target, and the model's kernels in
// the other, which defines SF_ROWS_ELSEWHERE and sees declarations of what it calls; hidden: a
// library calls its own copy, never another loaded library's
#define SF_HIDDEN __attribute__((visibility("hidden")))
// ---- the GEMM micro-kernel: C[MR, nn] = A[MR, K] W (+ bias), or with `add` C += A[MR, K] W;
// W one panel, its rows SF_PANEL floats apart or, with STRIDED, ldw apart (the merged attention's
// values read in place: a row of v); with PF, pf_lines lines from `pf` on are prefetched meanwhile,
// spread over the K steps (without PF, as the merged attention's tiles run, none of its cost)
#define SF_PANEL (SF_NV * SF_LANES)
// the next chunk is prefetched while a thread has at most this many blocks of rows; past them
// the products take long enough for the hardware's prefetchers, and the bookkeeping only costs
// (`symfuse bench --model bert-base --batch 1,8 --seq 128,512 --profile`: linear layers)
#define SF_PF_BLOCKS 32
// NV: vectors of the panel the tile computes (fewer than SF_NV for a narrow last panel, whose
// columns past them are not computed at all; the panel's rows keep their SF_PANEL stride).
// Every loop over `acc` is unrolled, so each index is a constant and the accumulators stay in
// registers: one loop left rolled puts all of them on the stack, a store and a load each per
// call (in chunks of 80 steps of K, 4% of the tile's time). `scale`: each row of the product
// times its value before it is stored (the merged attention's late normalisation), or nullptr
template <int MR, bool PF, int NV = SF_NV, bool STRIDED = false>
static inline void sf_tile(const float* __restrict__ A, int64_t lda, const float* __restrict__ w, int64_t ldw,
                           float* __restrict__ C, int64_t ldc, const float* __restrict__ bias, bool add, int64_t n0,
                           int64_t nn, int64_t K, const float* __restrict__ pf, int64_t pf_lines,
                           const float* __restrict__ scale) {
  sf_vec acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[m][j] = sf_splat(0.0f);
  int64_t pf_due = 0, pf_next = 0;                // a share of the next panel, fetched while this one computes
  const int64_t step = STRIDED ? ldw : SF_PANEL;  // a constant for the row GEMM's packed panels
  for (int64_t k = 0; k < K; ++k) {
    sf_vec wv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      wv[j] = sf_load(w + k * step + j * SF_LANES);
      SF_IN_REGISTER(wv[j]);  // loaded once a step, not once per row
    }
    for (pf_due += pf_lines; PF && pf_due >= K; pf_due -= K)  // pf_lines spread evenly over the K steps
      __builtin_prefetch(pf + 16 * pf_next++, 0, 2);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const sf_vec a = sf_splat(A[m * lda + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[m][j] = sf_fma(a, wv[j], acc[m][j]);
    }
  }
  if (scale) {  // each row times its value, before the bias or C is added
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[m][j] = acc[m][j] * sf_splat(scale[m]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j) {
    const int64_t c = n0 + SF_LANES * j, left = nn - SF_LANES * j;
    if (left <= 0) break;
    if (left >= SF_LANES) {
      const sf_vec bv = bias && !add ? sf_load(bias + c) : sf_splat(0.0f);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) sf_store(C + m * ldc + c, acc[m][j] + (add ? sf_load(C + m * ldc + c) : bv));
    } else {  // the panel's last, partial vector
      const sf_vec bv = bias && !add ? sf_load_n(bias + c, left) : sf_splat(0.0f);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m)
        sf_store_n(C + m * ldc + c, acc[m][j] + (add ? sf_load_n(C + m * ldc + c, left) : bv), left);
    }
  }
}
typedef void (*sf_tile_fn)(const float*, int64_t, const float*, int64_t, float*, int64_t, const float*, bool, int64_t,
                           int64_t, int64_t, const float*, int64_t, const float*);
static const sf_tile_fn sf_tiles[SF_MR] = {SF_TILES};        // sf_tiles[m - 1]: a tile of m rows
static const sf_tile_fn sf_tiles_pf[SF_MR] = {SF_TILES_PF};  // the same, prefetching
// sf_tiles_nv[v - 1][m - 1]: a tile of m rows by v vectors, its panel's rows ldw apart (the merged
// attention's GEMMs: a panel of fewer keys or value columns than SF_PANEL, at 16 keys or a head of
// 32 on AVX-512; v read in place)
SF_HIDDEN extern const sf_tile_fn sf_tiles_nv[SF_NV][SF_MR];
#ifndef SF_ROWS_ELSEWHERE
const sf_tile_fn sf_tiles_nv[SF_NV][SF_MR] = {SF_TILES_NV};
#endif
static inline int64_t sf_vectors(int64_t columns) {  // of a panel, to cover `columns` of it
  return std::min<int64_t>(SF_NV, (columns + SF_LANES - 1) / SF_LANES);
}
static inline sf_tile_fn sf_tile_for(int64_t rows, int64_t columns) {  // the narrowest that covers them
  return sf_tiles_nv[sf_vectors(columns) - 1][rows - 1];
}

#define SF_ROW_LOOP(expr)                                 \
  {                                                       \
    _Pragma("omp simd") for (int64_t j = 0; j < n; ++j) { \
      const float x = row[j];                             \
      row[j] = (expr);                                    \
    }                                                     \
  }
static inline void sf_activate(float* __restrict__ row, int64_t n, int64_t act) {
  switch (act) {
    case 1:
      SF_ROW_LOOP(sf_gelu_erf(x)) break;
    case 2:
      SF_ROW_LOOP(sf_gelu_tanh(x)) break;
    case 3:
      SF_ROW_LOOP(x < 0.0f ? 0.0f : x) break;  // a NaN stays NaN, as in torch
    case 4:
      SF_ROW_LOOP(tanhf(x)) break;
    case 5:
      SF_ROW_LOOP(1.0f / (1.0f + sf_expf(-x))) break;
    case 6:
      SF_ROW_LOOP(x / (1.0f + sf_expf(-x))) break;
    default:
      break;
  }
}

// the panels [p0, p1) and rows [m0, m1) one thread of a team takes: the panels split between
// the threads, or with rows_first a grid of row groups (as many as threads, or blocks of rows)
// times panel groups; threads past the grid take nothing. The row groups split the rows evenly
// in units of `unit` rows: split by whole tiles, 16 rows in tiles of 6 would give one thread 6
// rows and the other 10. A thread's rows run as tiles() tiles of at most SF_MR rows, as even as
// they go (8 rows as 4 + 4, 16 as 6 + 5 + 5, not 6 + 2 and 6 + 6 + 4): each tile prefetches the
// same share of the next chunk, which a 2-row tile issued three times as fast as a 6-row one,
// and a 2-row tile runs a few percent below the FMA rate (`symfuse bench --model bert-small
// --seq 16,64 --profile`: linear layers)
struct sf_grid {
  int64_t p0, p1, m0, m1;
  int64_t tiles() const { return (m1 - m0 + SF_MR - 1) / SF_MR; }
  int64_t tile_row(int64_t b) const { return m0 + (m1 - m0) * b / tiles(); }  // tile b's first row
  static void shape(int64_t threads, int64_t panels, int64_t blocks, bool rows_first, int64_t& tr, int64_t& tp) {
    tr = rows_first ? std::min(threads, blocks) : 1;
    tp = std::min(panels, std::max<int64_t>(1, threads / tr));
  }
  static int64_t threads(int64_t panels, int64_t blocks, bool rows_first) {  // to ask for
    int64_t tr, tp;
    shape(omp_get_max_threads(), panels, blocks, rows_first, tr, tp);
    return tr * tp;
  }
  // blocks: tiles of rows (how many row groups there can be); unit: the rows a split keeps whole
  static sf_grid mine(int64_t panels, int64_t blocks, int64_t M, int64_t unit, bool rows_first) {
    int64_t tr, tp;  // in the team there is (OpenMP may give fewer threads than asked)
    shape(omp_get_num_threads(), panels, blocks, rows_first, tr, tp);
    const int64_t id = omp_get_thread_num(), pi = id % tp, ri = id / tp, units = (M + unit - 1) / unit;
    if (ri >= tr) return {0, 0, 0, 0};
    return {panels * pi / tp, panels * (pi + 1) / tp, std::min(M, unit * (units * ri / tr)),
            std::min(M, unit * (units * (ri + 1) / tr))};
  }
};

// C[M, N] = act(A[M, K] W^T + bias) for few rows; W packed as panels [N / SF_PANEL][K][SF_PANEL].
// A panel is walked a chunk (SF_KC steps of K) at a time: every block of rows multiplies the
// chunk while it is in L1 and prefetches its share of the next chunk (the weights are one
// stream: the next chunk, then the next panel), so a thread waits for one chunk, not a panel,
// before its first products. The threads split the panels (`sf_linear_rows`) or, first, the
// blocks of rows (`sf_linear_rows_split`, `sf_grid`); which one wins depends on the shape and the
// machine, so the host picks per call at a switch point measured per layer (calibrate.py).
// `sf_rows_gemm_team` is one thread's share, run by every thread of the caller's team (its own in
// `sf_rows_gemm`, a whole call's in `sf_run`, which ends it with a barrier).
// (SF_ROWS_ELSEWHERE: see the top of this file)
#ifdef SF_ROWS_ELSEWHERE
SF_HIDDEN void sf_rows_gemm_team(const float* A, int64_t lda, const float* Wp, const float* bias, float* C, int64_t ldc,
                                 int64_t M, int64_t N, int64_t K, int64_t act, bool rows_first);
extern "C" void sf_linear_rows(const float* A, int64_t lda, const float* Wp, const float* bias, float* C, int64_t ldc,
                               int64_t M, int64_t N, int64_t K, int64_t act);
extern "C" void sf_linear_rows_split(const float* A, int64_t lda, const float* Wp, const float* bias, float* C,
                                     int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act);
#else
SF_HIDDEN void sf_rows_gemm_team(const float* A, int64_t lda, const float* Wp, const float* bias, float* C, int64_t ldc,
                                 int64_t M, int64_t N, int64_t K, int64_t act, bool rows_first) {
  const int64_t panels = (N + SF_PANEL - 1) / SF_PANEL, blocks = (M + SF_MR - 1) / SF_MR;
  const sf_grid g = sf_grid::mine(panels, blocks, M, 1, rows_first);
  // in chunks while the thread's block of C in the panel (added to once a chunk) is at most two
  // chunks' size
  const int64_t kc = g.m1 - g.m0 <= 2 * SF_KC ? std::min<int64_t>(K, SF_KC) : K;
  const int64_t lines = kc * SF_PANEL / 16;  // 64-byte lines in one chunk
  // lines of the next chunk a tile of rows prefetches
  const int64_t mine = std::max<int64_t>(1, g.tiles()), share = (lines + mine - 1) / mine;
  for (int64_t p = g.p0; p < g.p1; ++p) {
    const int64_t n0 = p * SF_PANEL, nn = std::min<int64_t>(SF_PANEL, N - n0);
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
      const int64_t kk = std::min(kc, K - k0);
      const float* w = Wp + (p * K + k0) * SF_PANEL;
      const bool more = mine > 1 && mine <= SF_PF_BLOCKS && (k0 + kk < K || p + 1 < g.p1);
      const sf_tile_fn* tiles = more ? sf_tiles_pf : sf_tiles;
      for (int64_t b = 0; b < g.tiles(); ++b) {
        const int64_t m0 = g.tile_row(b), mr = g.tile_row(b + 1) - m0, first = b * share;
        const int64_t pf = more ? std::max<int64_t>(0, std::min(share, lines - first)) : 0;
        tiles[mr - 1](A + m0 * lda + k0, lda, w, SF_PANEL, C + m0 * ldc, ldc, bias, k0 > 0, n0, nn, kk,
                      w + kk * SF_PANEL + first * 16, pf, nullptr);
        if (act && k0 + kk == K)  // the epilogue, on the tile while it is in cache
          for (int64_t m = m0; m < m0 + mr; ++m) sf_activate(C + m * ldc + n0, nn, act);
      }
    }
  }
}
static void sf_rows_gemm(const float* A, int64_t lda, const float* Wp, const float* bias, float* C, int64_t ldc,
                         int64_t M, int64_t N, int64_t K, int64_t act, bool rows_first) {
  const int64_t team = sf_grid::threads((N + SF_PANEL - 1) / SF_PANEL, (M + SF_MR - 1) / SF_MR, rows_first);
#pragma omp parallel num_threads(team) if (team > 1)
  sf_rows_gemm_team(A, lda, Wp, bias, C, ldc, M, N, K, act, rows_first);
}
extern "C" void sf_linear_rows(const float* A, int64_t lda, const float* Wp, const float* bias, float* C, int64_t ldc,
                               int64_t M, int64_t N, int64_t K, int64_t act) {
  sf_rows_gemm(A, lda, Wp, bias, C, ldc, M, N, K, act, false);
}
extern "C" void sf_linear_rows_split(const float* A, int64_t lda, const float* Wp, const float* bias, float* C,
                                     int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act) {
  sf_rows_gemm(A, lda, Wp, bias, C, ldc, M, N, K, act, true);
}
#endif  // SF_ROWS_ELSEWHERE
