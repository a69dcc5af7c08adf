"""symfuse's own GEMM for linear layers over few rows, where streaming the weights is the
cost: all rows pass over each chunk of a panel of packed weights while it sits in cache (two
thirds of L1 or a quarter of L2, measured per machine: `chunk_choices`), the next chunk is
prefetched meanwhile (while a thread has up to 192 rows on
AVX-512; past them the hardware's prefetchers keep up, and the tiles run without the
bookkeeping, as the merged attention's do), and bias and activation are applied
to the tile while it is in registers and cache. The host picks it or oneDNN per call from
the row count, at a switch point measured on the machine (`calibrate.py`).

The micro-kernel is written once over `sf_vec` (c.py's vector abstraction) and shaped per
target: a tile of `rows` x `vectors` accumulators plus one register per weight vector and
one for the broadcast A element must fit in the target's vector registers (AVX-512: 6 x 4
vectors of 16 floats, a 64-column panel; AVX2: 6 x 2 vectors of 8, a 16-column panel;
NEON: 6 x 4 vectors of 4; SSE2 and other targets: 4 x 3 vectors of 4). The same tile is
the merged attention kernel's GEMM.
"""

from __future__ import annotations

import torch

from symfuse.runtime.code import Tile
from symfuse.runtime.target import Target

ACTIVATIONS = {"none": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3, "tanh": 4, "sigmoid": 5, "swish": 6}


def tile_for(target: Target, chunk: int = 0) -> Tile:
    """The register tile with the most accumulators that fits (rows*vectors accumulators,
    `vectors` weight vectors, one broadcast). On a tie, the one whose panel row is whole
    cache lines (AVX2: 6x2, 64 bytes a step, over 4x3's 96 bytes, which loads A less but
    measured 0-25% slower on BERT's layers, `docs/gemm.md`), then the wider one. `chunk`:
    steps of K in a chunk of a panel (0: the first of `chunk_choices`)."""
    rows, vectors = _tile_shape(target)
    return Tile(rows, vectors, target.lanes, chunk or chunk_choices(target)[0])


def _tile_shape(target: Target) -> tuple[int, int]:
    best = (0, 0, 0, 0)
    for vectors in (1, 2, 3, 4):
        rows = min(8, (target.registers - vectors - 1) // vectors)
        whole_lines = (vectors * target.vector_bytes) % 64 == 0
        if rows >= 1:
            best = max(best, (rows * vectors, whole_lines, vectors, rows))
    return best[3], best[2]


def chunk_choices(target: Target) -> tuple[int, ...]:
    """The steps of K a chunk of a panel may take, one of which a machine measures once
    (calibrate.py, "row_chunk"): two thirds of L1, so that the chunk stays there while every
    block of rows multiplies it (an Intel Xeon with a 48 KiB L1: 128 steps, the best of 32 to
    256 streaming BERT-base's weights at 16-64 rows), or a quarter of L2, fewer passes over
    the tile's accumulators (each chunk adds to them in C): on AMD Zen 4, whose 32 KiB L1 gives
    80 steps, 1024 steps ran bert-small's layers at 64-128 rows 10-16% faster, and BERT-base's
    streamed from memory 7-13% faster (docs/benchmarks.md), while the tile still put its
    accumulators on the stack once a call; with them in registers, 7% faster at 128 rows of a
    256->1024 layer and 2% slower at 16 rows of BERT-base's 768->3072."""
    panel_bytes = _tile_shape(target)[1] * target.vector_bytes
    l1 = max(8, target.l1d * 2 // 3 // panel_bytes // 8 * 8)
    l2 = target.l2 // 4 // panel_bytes // 8 * 8
    return (l1, l2) if l2 > l1 else (l1,)


def pack_panels(w: torch.Tensor, panel: int, bf16: bool = False) -> torch.Tensor:
    """Weight [N, K] as panels [ceil(N/panel), K, panel], zero-padded: one panel is contiguous.
    `bf16`: bfloat16 panels [ceil(N/panel), K'/2, panel, 2], the pair (k, k+1) of each column
    side by side, as `vdpbf16ps` and AMX's `tdpbf16ps` multiply them (K' is K padded with zeros
    to a multiple of 32, an AMX tile's steps)."""
    n, k = w.shape
    panels = (n + panel - 1) // panel
    if bf16:
        kp = (k + 31) // 32 * 32
        padded = torch.zeros(panels * panel, kp, dtype=torch.bfloat16)
        padded[:n, :k] = w
        return padded.view(panels, panel, kp // 2, 2).transpose(1, 2).contiguous()
    padded = torch.zeros(panels * panel, k, dtype=w.dtype)
    padded[:n] = w
    return padded.view(panels, panel, k).transpose(1, 2).contiguous()


def has_bf16_rows(target: Target) -> bool:
    """Whether the bf16 row kernel (`vdpbf16ps`, AVX512-BF16) builds and runs for `target`."""
    return "avx512_bf16" in target.extensions


# how the bf16 row kernel multiplies (the value of calibration kind "bf16_multiply")


def bf16_multiplies(target: Target) -> tuple[int, ...]:
    """The ways of `BF16_MULTIPLY` the bf16 row kernel can use on `target` (AMX where the CPU
    has it; the kernel falls back to vdpbf16ps if the OS will not grant the tiles)."""
    return (0, 1, 2) if "amx_bf16" in target.extensions else (0, 1)


def activation_code(postop: tuple[str, str] | None) -> int:
    if postop is None:
        return 0
    attr, algo = postop
    return ACTIVATIONS["gelu_tanh" if attr == "gelu" and algo == "tanh" else attr]


def gemm_source(tile: Tile, bf16: bool = False, multiply: int = 0) -> str:
    """The micro-kernel `sf_tile<MR>` and `sf_linear_rows`, for `tile`; with `bf16` also
    `sf_tile_bf16<MR>` and `sf_linear_rows_bf16` (AVX512-BF16 targets only), multiplying as
    `BF16_MULTIPLY[multiply]` says."""
    out = _SOURCE
    if bf16:
        table = ", ".join(f"sf_tile_bf16<{m}>" for m in range(1, tile.rows + 1))
        dp = _by_vectors(tile, "sf_tile_dp<{m}, {v}>")
        out += (
            _BF16_SOURCE.replace("@TABLE_BF16@", table).replace("@TABLE_DP@", dp).replace("@MULTIPLY@", str(multiply))
        )
    out = out.replace("@MR@", str(tile.rows)).replace("@NV@", str(tile.vectors))
    for key, pf in (("@TABLE@", "false"), ("@TABLE_PF@", "true")):
        out = out.replace(key, ", ".join(f"sf_tile<{m}, {pf}>" for m in range(1, tile.rows + 1)))
    out = out.replace("@TABLE_NV@", _by_vectors(tile, "sf_tile<{m}, false, {v}, true>"))
    return out.replace("@KC@", str(tile.chunk))


def _by_vectors(tile: Tile, name: str) -> str:
    """A C table [vectors][rows] of the tile template `name` (`{m}` rows, `{v}` vectors)."""
    rows = range(1, tile.rows + 1)
    return ", ".join("{" + ", ".join(name.format(m=m, v=v) for m in rows) + "}" for v in range(1, tile.vectors + 1))


_SOURCE = r"""
#include <omp.h>
// ---- the GEMM micro-kernel: C[MR, nn] = A[MR, K] W (+ bias), or with `add` C += A[MR, K] W;
// W one panel, its rows SF_PANEL floats apart or, with STRIDED, ldw apart (the merged attention's
// values read in place: a row of v); with PF, pf_lines lines from `pf` on are prefetched meanwhile,
// spread over the K steps (without PF, as the merged attention's tiles run, none of its cost)
#define SF_MR @MR@
#define SF_NV @NV@
#define SF_PANEL (SF_NV * SF_LANES)
// the next chunk is prefetched while a thread has at most this many blocks of rows; past them
// the products take long enough for the hardware's prefetchers, and the bookkeeping only costs
// (in BERT-base and GPT-2, weights cold and the input just written a block of rows per thread,
// 2 threads: 128-192 rows a thread 5-10% faster with it, 512 rows 0-4% slower)
#define SF_PF_BLOCKS 32
#define SF_KC @KC@  // steps of K in one chunk of a panel (chunk_choices: two thirds of L1 or a quarter of L2)
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
  int64_t pf_due = 0, pf_next = 0;  // a share of the next panel, fetched while this one computes
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
      for (int m = 0; m < MR; ++m)
        sf_store(C + m * ldc + c, acc[m][j] + (add ? sf_load(C + m * ldc + c) : bv));
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
static const sf_tile_fn sf_tiles[SF_MR] = {@TABLE@};  // sf_tiles[m - 1]: a tile of m rows
static const sf_tile_fn sf_tiles_pf[SF_MR] = {@TABLE_PF@};  // the same, prefetching
// sf_tiles_nv[v - 1][m - 1]: a tile of m rows by v vectors, its panel's rows ldw apart (the merged
// attention's GEMMs: a panel of fewer keys or value columns than SF_PANEL, at 16 keys or a head of
// 32 on AVX-512; v read in place)
static const sf_tile_fn sf_tiles_nv[SF_NV][SF_MR] = {@TABLE_NV@};
static inline int64_t sf_vectors(int64_t columns) {  // of a panel, to cover `columns` of it
  return std::min<int64_t>(SF_NV, (columns + SF_LANES - 1) / SF_LANES);
}
static inline sf_tile_fn sf_tile_for(int64_t rows, int64_t columns) {  // the narrowest that covers them
  return sf_tiles_nv[sf_vectors(columns) - 1][rows - 1];
}

#define SF_ROW_LOOP(expr) \
  { _Pragma("omp simd") for (int64_t j = 0; j < n; ++j) { const float x = row[j]; row[j] = (expr); } }
static inline void sf_activate(float* __restrict__ row, int64_t n, int64_t act) {
  switch (act) {
    case 1: SF_ROW_LOOP(sf_gelu_erf(x)) break;
    case 2: SF_ROW_LOOP(sf_gelu_tanh(x)) break;
    case 3: SF_ROW_LOOP(x < 0.0f ? 0.0f : x) break;  // a NaN stays NaN, as in torch
    case 4: SF_ROW_LOOP(tanhf(x)) break;
    case 5: SF_ROW_LOOP(1.0f / (1.0f + sf_expf(-x))) break;
    case 6: SF_ROW_LOOP(x / (1.0f + sf_expf(-x))) break;
    default: break;
  }
}

// the panels [p0, p1) and rows [m0, m1) one thread of a team takes: the panels split between
// the threads, or with rows_first a grid of row groups (as many as threads, or blocks of rows)
// times panel groups; threads past the grid take nothing. The row groups split the rows evenly
// in units of `unit` rows: split by whole tiles, 16 rows in tiles of 6 would give one thread 6
// rows and the other 10. A thread's rows run as tiles() tiles of at most SF_MR rows, as even as
// they go (8 rows as 4 + 4, 16 as 6 + 5 + 5, not 6 + 2 and 6 + 6 + 4): each tile prefetches the
// same share of the next chunk, which a 2-row tile issued three times as fast as a 6-row one,
// and a 2-row tile runs a few percent below the FMA rate (bert-small at 16 rows 2-19% faster,
// the most while other work loads memory; about half of it from the shares; docs/benchmarks.md)
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
// `sf_rows_gemm`, a whole call's in `sf_run`, which ends it with a barrier)
static void sf_rows_gemm_team(const float* A, int64_t lda, const float* Wp, const float* bias, float* C,
                              int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act, bool rows_first) {
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
extern "C" void sf_linear_rows(const float* A, int64_t lda, const float* Wp, const float* bias, float* C,
                               int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act) {
  sf_rows_gemm(A, lda, Wp, bias, C, ldc, M, N, K, act, false);
}
extern "C" void sf_linear_rows_split(const float* A, int64_t lda, const float* Wp, const float* bias, float* C,
                                     int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act) {
  sf_rows_gemm(A, lda, Wp, bias, C, ldc, M, N, K, act, true);
}
"""

_BF16_SOURCE = r"""
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
#define SF_BF16_MULTIPLY @MULTIPLY@
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
                                                        const sf_bf16* __restrict__ w, int64_t K,
                                                        __m512 (&acc)[MR][NV], const sf_bf16* __restrict__ pf,
                                                        int64_t pf_lines) {
  const int64_t pairs = (K + 1) / 2;
  int64_t pf_due = 0, pf_next = 0;
  auto step = [&](int64_t k2, bool whole) __attribute__((always_inline)) {
    __m512bh wv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      wv[j] = (__m512bh)_mm512_loadu_si512(w + (k2 * SF_PANEL + j * SF_LANES) * 2);
      SF_IN_REGISTER(wv[j]);
    }
    for (pf_due += pf_lines; pf_due >= pairs; pf_due -= pairs)
      __builtin_prefetch(pf + 32 * pf_next++, 0, 2);
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
static const sf_tile_dp_fn sf_tiles_dp[SF_NV][SF_MR] = {@TABLE_DP@};
static inline sf_tile_dp_fn sf_tile_dp_for(int64_t rows, int64_t columns) {
  return sf_tiles_dp[sf_vectors(columns) - 1][rows - 1];
}
#endif

template <int MR>
static inline void sf_tile_bf16(const sf_bf16_a* __restrict__ A, int64_t lda, const sf_bf16* __restrict__ w,
                                sf_bf16* __restrict__ C, int64_t ldc, const sf_bf16* __restrict__ bias, int64_t n0,
                                int64_t nn, int64_t K, int64_t act, const sf_bf16* __restrict__ pf,
                                int64_t pf_lines) {
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
    for (pf_due += pf_lines; pf_due >= pairs; pf_due -= pairs)
      __builtin_prefetch(pf + 32 * pf_next++, 0, 2);
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
typedef void (*sf_tile_bf16_fn)(const sf_bf16_a*, int64_t, const sf_bf16*, sf_bf16*, int64_t, const sf_bf16*,
                                int64_t, int64_t, int64_t, int64_t, const sf_bf16*, int64_t);
static const sf_tile_bf16_fn sf_tiles_bf16[SF_MR] = {@TABLE_BF16@};

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
__attribute__((target("amx-tile,amx-bf16"))) static inline void sf_amx_block(
    const sf_bf16* a, int64_t lda, const sf_bf16* w, int64_t K, float (*out)[SF_PANEL]) {
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

__attribute__((target("amx-tile,amx-bf16"))) static void sf_linear_rows_amx(
    const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias, sf_bf16* C, int64_t ldc, int64_t M,
    int64_t N, int64_t K, int64_t act, bool rows_first) {
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
// thread of the caller's team (its own in `sf_rows_gemm_bf16`, a whole call's in `sf_run`)
static void sf_rows_gemm_bf16_team(const sf_bf16* A, int64_t lda, const sf_bf16* Wp, const sf_bf16* bias,
                                   sf_bf16* C, int64_t ldc, int64_t M, int64_t N, int64_t K, int64_t act,
                                   bool rows_first) {
  const int64_t panels = (N + SF_PANEL - 1) / SF_PANEL;
  const int64_t step = SF_PAIRS(K) * 2 * SF_PANEL;  // bf16 elements in one panel
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
"""
