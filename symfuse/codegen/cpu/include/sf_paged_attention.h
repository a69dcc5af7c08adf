// Attention of a decoding step over a paged key/value cache (codegen/cpu/paged.py).
#include <omp.h>

#include <vector>
// q [B, Hq, S, D], k and v [B, Hkv, S, D] (strided: element (b, h, s, d) at b*sb + h*sh + s*ss + d),
// pools [N, Hkv, BLOCK, D] (contiguous), table [B, M] and lengths [B] (int64), out [B, Hq, S, D]
// contiguous. Query row i of sequence b sits at position n = lengths[b] + i and sees keys 0..n
// (the past through the table, then the new ones), those within `window` of it when one is set.
// The G = Hq / Hkv query heads that share a kv head are computed together, so each key and value
// is read once for the group. Work is split over (sequence, kv head, query row, chunk of keys):
// each task keeps a running max, sum and weighted sum of values for its chunk (flash-decoding's
// partial softmax), and a second pass merges a row's chunks: a single decoding row over a long
// past is spread over every thread.
// dims: B, Hq, Hkv, S, D, M, BLOCK, window, scale's float bits, then the strides of q, k and v
// (b, h, s each).
#define SF_PA_CHUNK 32  // keys scored at once (.venv/bin/python bench/paged_attention.py)

// the keys and values are float32, or bfloat16 in a bf16 program (widened as they are loaded)
static inline sf_vec sf_pa_load(const float* p) { return sf_load(p); }
static inline sf_vec sf_pa_load(const sf_bf16* p) {
  sf_vec r;
  for (int64_t l = 0; l < SF_LANES; ++l) r[l] = sf_from_bf16(p[l]);
  return r;
}
static inline float sf_pa_at(const float* p, int64_t j) { return p[j]; }
static inline float sf_pa_at(const sf_bf16* p, int64_t j) { return sf_from_bf16(p[j]); }

template <class T>
static inline float sf_pa_dot(const float* __restrict__ a, const T* __restrict__ b, int64_t d) {
  sf_vec acc = sf_splat(0.0f);
  int64_t j = 0;
  for (; j + SF_LANES <= d; j += SF_LANES) acc = sf_fma(sf_load(a + j), sf_pa_load(b + j), acc);
  float s = 0.0f;
  for (int64_t l = 0; l < SF_LANES; ++l) s += acc[l];
  for (; j < d; ++j) s += a[j] * sf_pa_at(b, j);
  return s;
}

// acc[0..d) = acc * c + w * v
template <class T>
static inline void sf_pa_axpby(float* __restrict__ acc, float c, float w, const T* __restrict__ v, int64_t d) {
  const sf_vec cv = sf_splat(c), wv = sf_splat(w);
  int64_t j = 0;
  for (; j + SF_LANES <= d; j += SF_LANES) sf_store(acc + j, sf_fma(wv, sf_pa_load(v + j), sf_load(acc + j) * cv));
  for (; j < d; ++j) acc[j] = acc[j] * c + w * sf_pa_at(v, j);
}

template <class T>
static void sf_paged_attention_of(const float* q, const T* k, const T* v, const T* kp, const T* vp,
                                  const int64_t* table, const int64_t* lengths, float* out, const int64_t* dims) {
  const int64_t B = dims[0], Hq = dims[1], Hkv = dims[2], S = dims[3], D = dims[4], M = dims[5], BL = dims[6],
                window = dims[7];
  float scale;
  const uint32_t bits = uint32_t(dims[8]);
  std::memcpy(&scale, &bits, sizeof scale);
  const int64_t qb = dims[9], qh = dims[10], qs = dims[11], kb = dims[12], kh = dims[13], ks = dims[14], vb = dims[15],
                vh = dims[16], vs = dims[17];
  const int64_t G = Hq / Hkv;
  int64_t most = 0;  // the most keys a row sees: the chunking's scale
  for (int64_t b = 0; b < B; ++b) most = lengths[b] + S > most ? lengths[b] + S : most;
  const int64_t rows = B * Hkv * S, threads = omp_get_max_threads();
  // chunks of at least 64 keys (a chunk's merge costs about as much as 64 keys' work), as
  // many as give every thread about 4 tasks
  int64_t chunks = (4 * threads + rows - 1) / rows;
  if (chunks > (most + 63) / 64) chunks = (most + 63) / 64;
  if (chunks < 1) chunks = 1;
  const int64_t span = (most + chunks - 1) / chunks;
  const int64_t part = G * (D + 2);  // per task: for each head of the group, max, sum, D weighted values
  std::vector<float> partials(size_t(rows * chunks * part));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < rows * chunks; ++task) {
    const int64_t c = task % chunks, row = task / chunks;
    const int64_t i = row % S, g = (row / S) % Hkv, b = row / (S * Hkv);
    const int64_t past = lengths[b], pos = past + i;
    const int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    const int64_t lo = c * span > first ? c * span : first;
    const int64_t hi = (c + 1) * span < pos + 1 ? (c + 1) * span : pos + 1;
    float* mine = partials.data() + task * part;
    float qrow[G * D];  // the group's queries, scaled
    for (int64_t h = 0; h < G; ++h) {
      const float* src = q + b * qb + (g * G + h) * qh + i * qs;
      for (int64_t d = 0; d < D; ++d) qrow[h * D + d] = src[d] * scale;
      mine[h * (D + 2)] = -INFINITY;
      mine[h * (D + 2) + 1] = 0.0f;
      std::memset(mine + h * (D + 2) + 2, 0, D * sizeof(float));
    }
    // keys in chunks of SF_PA_CHUNK: the chunk's scores first (independent dot products the
    // core overlaps), then one max, their exponentials and the weighted values; a per-key
    // running max made each key wait on the last one's exp
    for (int64_t j0 = lo; j0 < hi; j0 += SF_PA_CHUNK) {
      const int64_t n = hi - j0 < SF_PA_CHUNK ? hi - j0 : SF_PA_CHUNK;
      const T* keys[SF_PA_CHUNK];
      const T* values[SF_PA_CHUNK];
      for (int64_t t = 0; t < n; ++t) {
        const int64_t j = j0 + t;
        if (j < past) {
          const int64_t at = (table[b * M + j / BL] * Hkv + g) * BL + j % BL;
          keys[t] = kp + at * D, values[t] = vp + at * D;
        } else {
          keys[t] = k + b * kb + g * kh + (j - past) * ks, values[t] = v + b * vb + g * vh + (j - past) * vs;
        }
      }
      for (int64_t h = 0; h < G; ++h) {
        float* st = mine + h * (D + 2);
        float score[SF_PA_CHUNK];
        float top = st[0];
        for (int64_t t = 0; t < n; ++t) {
          score[t] = sf_pa_dot(qrow + h * D, keys[t], D);
          top = score[t] > top ? score[t] : top;
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < n; ++t) {
          score[t] = sf_expf(score[t] - top);
          sum += score[t];
        }
        const float c = sf_expf(st[0] - top);  // the earlier chunks' share, rescaled (0 at the first)
        st[0] = top;
        st[1] = st[1] * c + sum;
        float* acc = st + 2;
        sf_pa_axpby(acc, c, score[0], values[0], D);
        for (int64_t t = 1; t < n; ++t) sf_pa_axpby(acc, 1.0f, score[t], values[t], D);
      }
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t i = row % S, g = (row / S) % Hkv, b = row / (S * Hkv);
    for (int64_t h = 0; h < G; ++h) {
      float m = -INFINITY;
      for (int64_t c = 0; c < chunks; ++c) {
        const float x = partials[(row * chunks + c) * part + h * (D + 2)];
        m = x > m ? x : m;
      }
      float* dst = out + ((b * Hq + g * G + h) * S + i) * D;
      std::memset(dst, 0, D * sizeof(float));
      float sum = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) {
        const float* st = partials.data() + (row * chunks + c) * part + h * (D + 2);
        if (st[1] == 0.0f) continue;  // a chunk with no key this row sees
        const float w = sf_expf(st[0] - m);
        sum += st[1] * w;
        sf_pa_axpby<float>(dst, 1.0f, w, st + 2, D);
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < D; ++d) dst[d] *= inv;
    }
  }
}

extern "C" void sf_paged_attention(const float* q, const float* k, const float* v, const float* kp, const float* vp,
                                   const int64_t* table, const int64_t* lengths, float* out, const int64_t* dims) {
  sf_paged_attention_of<float>(q, k, v, kp, vp, table, lengths, out, dims);
}
// q float32; new and cached keys and values bfloat16
extern "C" void sf_paged_attention_bf16(const float* q, const sf_bf16* k, const sf_bf16* v, const sf_bf16* kp,
                                        const sf_bf16* vp, const int64_t* table, const int64_t* lengths, float* out,
                                        const int64_t* dims) {
  sf_paged_attention_of<sf_bf16>(q, k, v, kp, vp, table, lengths, out, dims);
}
