// The LSTM recurrence: one call runs every time step of one layer and direction (codegen/cpu/lstm.py).
#include <omp.h>
// ---- the LSTM recurrence of one layer and direction, in torch's gate order (input, forget,
// cell, output): gates = G[t] + h W_hh^T, c = sig(f) c + sig(i) tanh(g), h = sig(o) tanh(c).
// G [T, B, 4H]: x W_ih^T + b_ih + b_hh for every step; WT [H, 4H]: W_hh transposed, so a step
// is h's elements broadcast over rows of WT; h, c [B, H]: the initial state, overwritten with
// the final one; out [T, B, ld_out]: h at each step (the caller offsets it by the direction).
// With `reverse` the steps run from T - 1 down to 0. Each thread owns the hidden units
// [j0, j1) of every batch row (their four gates, cell and output); a barrier ends each step,
// since the next one reads every unit's output.
// out[j] = g[j] + sum_k h[k] w[k * ldw + j] for j < n: blocks of four vectors of j kept in
// registers over the whole sum, then single vectors (in four partial sums), then single elements
static inline void sf_lstm_gates(const float* __restrict__ g, const float* __restrict__ w, int64_t ldw,
                                 const float* __restrict__ h, int64_t K, float* __restrict__ out, int64_t n) {
  int64_t j = 0;
  for (; j + 4 * SF_LANES <= n; j += 4 * SF_LANES) {
    sf_vec a0 = sf_load(g + j), a1 = sf_load(g + j + SF_LANES), a2 = sf_load(g + j + 2 * SF_LANES),
           a3 = sf_load(g + j + 3 * SF_LANES);
    for (int64_t k = 0; k < K; ++k) {
      const sf_vec hk = sf_splat(h[k]);
      const float* __restrict__ wk = w + k * ldw + j;
      a0 = sf_fma(hk, sf_load(wk), a0);
      a1 = sf_fma(hk, sf_load(wk + SF_LANES), a1);
      a2 = sf_fma(hk, sf_load(wk + 2 * SF_LANES), a2);
      a3 = sf_fma(hk, sf_load(wk + 3 * SF_LANES), a3);
    }
    sf_store(out + j, a0);
    sf_store(out + j + SF_LANES, a1);
    sf_store(out + j + 2 * SF_LANES, a2);
    sf_store(out + j + 3 * SF_LANES, a3);
  }
  for (; j + SF_LANES <= n; j += SF_LANES) {  // four partial sums over k: one would wait on each FMA
    sf_vec a0 = sf_load(g + j), a1 = sf_splat(0.0f), a2 = sf_splat(0.0f), a3 = sf_splat(0.0f);
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
      a0 = sf_fma(sf_splat(h[k]), sf_load(w + k * ldw + j), a0);
      a1 = sf_fma(sf_splat(h[k + 1]), sf_load(w + (k + 1) * ldw + j), a1);
      a2 = sf_fma(sf_splat(h[k + 2]), sf_load(w + (k + 2) * ldw + j), a2);
      a3 = sf_fma(sf_splat(h[k + 3]), sf_load(w + (k + 3) * ldw + j), a3);
    }
    for (; k < K; ++k) a0 = sf_fma(sf_splat(h[k]), sf_load(w + k * ldw + j), a0);
    sf_store(out + j, (a0 + a1) + (a2 + a3));
  }
  for (; j < n; ++j) {
    float a = g[j];
    for (int64_t k = 0; k < K; ++k) a += h[k] * w[k * ldw + j];
    out[j] = a;
  }
}
// the same for four rows of h at once, one vector of j at a time (each weight vector loaded
// once for the four; their sums are four independent chains): out[r][j] for r < 4, rows of g,
// h and out `ldg`, `ldh` and `ldo` apart; the columns past the last whole vector row by row
static inline void sf_lstm_gates4(const float* __restrict__ g, int64_t ldg, const float* __restrict__ w, int64_t ldw,
                                  const float* __restrict__ h, int64_t ldh, int64_t K, float* __restrict__ out,
                                  int64_t ldo, int64_t n) {
  int64_t j = 0;
  for (; j + SF_LANES <= n; j += SF_LANES) {
    sf_vec a0 = sf_load(g + j), a1 = sf_load(g + ldg + j), a2 = sf_load(g + 2 * ldg + j), a3 = sf_load(g + 3 * ldg + j);
    for (int64_t k = 0; k < K; ++k) {
      const sf_vec wv = sf_load(w + k * ldw + j);
      a0 = sf_fma(sf_splat(h[k]), wv, a0);
      a1 = sf_fma(sf_splat(h[ldh + k]), wv, a1);
      a2 = sf_fma(sf_splat(h[2 * ldh + k]), wv, a2);
      a3 = sf_fma(sf_splat(h[3 * ldh + k]), wv, a3);
    }
    sf_store(out + j, a0);
    sf_store(out + ldo + j, a1);
    sf_store(out + 2 * ldo + j, a2);
    sf_store(out + 3 * ldo + j, a3);
  }
  if (j < n)
    for (int r = 0; r < 4; ++r) sf_lstm_gates(g + r * ldg + j, w + j, ldw, h + r * ldh, K, out + r * ldo + j, n - j);
}
// G [M, N] = bias + X [M, K] W^T, the input projection of every step at once (X one row per
// step and batch row, `ldx` apart; WT [K, N] = W_ih transposed): four rows of X share each
// weight vector (sf_lstm_gates4, the bias as every row of g). For few rows, where a library
// GEMM's call costs more than its arithmetic (runtime/lstm.py decides)
extern "C" void sf_lstm_input(const float* __restrict__ X, int64_t ldx, const float* __restrict__ WT,
                              const float* __restrict__ bias, float* __restrict__ G, int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = (M + 3) / 4;
#pragma omp parallel for schedule(static) if (M * N * K >= 65536)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t m = 4 * blk;
    if (m + 4 <= M) {
      sf_lstm_gates4(bias, 0, WT, N, X + m * ldx, ldx, K, G + m * N, N, N);
    } else {
      for (int64_t r = m; r < M; ++r) sf_lstm_gates(bias, WT, N, X + r * ldx, K, G + r * N, N);
    }
  }
}
extern "C" void sf_lstm(const float* __restrict__ G, const float* __restrict__ WT, float* __restrict__ h,
                        float* __restrict__ c, float* __restrict__ out, int64_t ld_out, int64_t T, int64_t B, int64_t H,
                        int64_t reverse) {
  std::unique_ptr<float[]> other(new float[B * H]);
  float* bufs[2] = {h, other.get()};             // a step reads one and writes the other
  const bool parallel = 4 * H * H * B >= 16384;  // a step's multiply-adds worth a barrier each
#pragma omp parallel if (parallel)
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t j0 = H * id / nt, n = H * (id + 1) / nt - j0;
    std::unique_ptr<float[]> pre(new float[B * 4 * n + 1]);  // the thread's gates, [B][4][n]
    for (int64_t s = 0; s < T; ++s) {
      const int64_t t = reverse ? T - 1 - s : s;
      const float* __restrict__ hin = bufs[s % 2];
      float* __restrict__ hout = bufs[(s + 1) % 2];
      const float* __restrict__ g = G + t * B * 4 * H + j0;
      for (int q = 0; q < 4; ++q) {  // P[b][q][j] = g[b][q][j] + h[b] W_hh^T over the thread's units
        const float* __restrict__ w = WT + j0 + q * H;
        int64_t b = 0;
        for (; b + 4 <= B; b += 4)
          sf_lstm_gates4(g + b * 4 * H + q * H, 4 * H, w, 4 * H, hin + b * H, H, H, pre.get() + (b * 4 + q) * n, 4 * n,
                         n);
        for (; b < B; ++b)
          sf_lstm_gates(g + b * 4 * H + q * H, w, 4 * H, hin + b * H, H, pre.get() + (b * 4 + q) * n, n);
      }
      for (int64_t b = 0; b < B; ++b) {
        const float* __restrict__ P = pre.get() + b * 4 * n;
        float* __restrict__ cb = c + b * H + j0;
        float* __restrict__ hb = hout + b * H + j0;
        float* __restrict__ ob = out + (t * B + b) * ld_out + j0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const float in = 1.0f / (1.0f + sf_expf(-P[j])), forget = 1.0f / (1.0f + sf_expf(-P[n + j]));
          const float cell = forget * cb[j] + in * tanhf(P[2 * n + j]);
          const float hv = tanhf(cell) / (1.0f + sf_expf(-P[3 * n + j]));
          cb[j] = cell;
          hb[j] = hv;
          ob[j] = hv;
        }
      }
#pragma omp barrier
    }
  }
  if (T % 2) std::memcpy(h, other.get(), B * H * sizeof(float));  // the last step wrote the other buffer
}
