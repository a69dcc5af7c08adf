// What every library symfuse builds starts with: includes, vector math, the vector type and
// the scalar helpers its kernels call. Parameterised by the generator (codegen/cpu/c.py):
//   SF_LANES      floats in one vector of the target
//   SF_SPLAT(x)   x repeated SF_LANES times, separated by commas
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

// glibc's vector math (libmvec) for the loops below; it exists on x86-64 Linux only
#if defined(__x86_64__) && defined(__linux__)
extern "C" {
#pragma omp declare simd notinbranch
float expf(float) noexcept;
#pragma omp declare simd notinbranch
float logf(float) noexcept;
#pragma omp declare simd notinbranch
float tanhf(float) noexcept;
}
#endif

// one vector of SF_LANES floats as a GCC/Clang vector extension: the compiler maps it onto
// the registers the target's flags allow (zmm, ymm, xmm, NEON q) or onto scalars
typedef float sf_vec __attribute__((vector_size(SF_LANES * sizeof(float))));
static inline sf_vec sf_load(const float* p) {
  sf_vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
static inline void sf_store(float* p, sf_vec v) { std::memcpy(p, &v, sizeof v); }
static inline sf_vec sf_splat(float x) { return sf_vec{SF_SPLAT(x)}; }
static inline sf_vec sf_fma(sf_vec a, sf_vec b, sf_vec acc) { return a * b + acc; }  // one FMA: -ffp-contract=fast
static inline sf_vec sf_load_n(const float* p, int64_t n) {  // the first n < SF_LANES floats, zeros after
  sf_vec v = sf_splat(0.0f);
  std::memcpy(&v, p, n * sizeof(float));
  return v;
}
static inline void sf_store_n(float* p, sf_vec v, int64_t n) { std::memcpy(p, &v, n * sizeof(float)); }
// `v` held in a register from here on: the compiler may no longer fold the load that made it
// into each instruction that reads it (GCC does so in a GEMM tile of 1-3 rows, loading each
// weight vector once per row: 10 loads a step for 8 FMAs at 2 rows, 70% of the FMA rate)
#if defined(__AVX512F__)
#define SF_IN_REGISTER(v) __asm__("" : "+v"(v))
#elif defined(__SSE2__)
#define SF_IN_REGISTER(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define SF_IN_REGISTER(v) __asm__("" : "+w"(v))
#else
#define SF_IN_REGISTER(v) ((void)0)
#endif
// bfloat16 storage: the top half of a float. Loads widen it exactly; stores round to
// nearest even (NaN stays NaN), as torch does. Plain integer code, so loops over it vectorise.
typedef uint16_t sf_bf16;
static inline float sf_from_bf16(sf_bf16 h) {
  const uint32_t u = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
static inline sf_bf16 sf_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
  return sf_bf16((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}
// the first out-of-range gather index of a call (read as 0 instead) goes to that call's
// error slot, three int64s after the symbols in its `sym` array: index, extent, site.
// Each call has its own array, so calls on several threads report their own errors.
// a gather index checked: out of range, it reads element 0 and the call's error slot gets
// (index, extent, site), the extent negated for an index that may count from the end
static inline int64_t sf_index_bad(int64_t i, int64_t n, int64_t site, const int64_t* err) {
  int64_t* slot = const_cast<int64_t*>(err);
#pragma omp critical(sf_error)
  if (slot[2] < 0) {
    slot[0] = i;
    slot[1] = n;
    slot[2] = site;
  }
  return 0;
}
static inline int64_t sf_index(int64_t i, int64_t n, int64_t site, const int64_t* err) {
  return i >= 0 && i < n ? i : sf_index_bad(i, n, site, err);
}
static inline int64_t sf_index_from_end(int64_t i, int64_t n, int64_t site, const int64_t* err) {  // Python's
  return i >= -n && i < n ? (i < 0 ? i + n : i) : sf_index_bad(i, -n, site, err);
}
// the same checks inside a vector loop, free of branches: an index out of range reads element 0
// instead and raises `worst` (a max reduction of the loop, INT64_MIN while every index is in
// range), which the code after the loop reports through sf_index_bad
static inline int64_t sf_index_v(int64_t i, int64_t n, int64_t& worst) {
  const bool ok = i >= 0 && i < n;
  const int64_t bad = ok ? INT64_MIN : i;
  worst = bad > worst ? bad : worst;
  return ok ? i : 0;
}
static inline int64_t sf_index_from_end_v(int64_t i, int64_t n, int64_t& worst) {
  const bool ok = i >= -n && i < n;
  const int64_t bad = ok ? INT64_MIN : i;
  worst = bad > worst ? bad : worst;
  return ok ? (i < 0 ? i + n : i) : 0;
}
template <class T>
static inline T sf_select(bool c, T a, T b) {
  return c ? a : b;
}  // both sides evaluated
// torch's maximum and minimum of floats: a NaN on either side gives NaN (std::max drops one
// on the right); branch-free, so the loop stays a vector loop
template <class T>
static inline T sf_maximum(T a, T b) {
  return a != a ? a : (b > a || b != b) ? b : a;
}
template <class T>
static inline T sf_minimum(T a, T b) {
  return a != a ? a : (b < a || b != b) ? b : a;
}
template <class T>
static inline T sf_floordiv(T a, T b) {
  T q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
// a tensor's integer division, which C traps on (SIGFPE) for a zero divisor and for the
// smallest integer over -1: a zero divisor goes to the call's error slot as (dividend,
// SF_DIV_BY_ZERO, site) and reads as 0; over -1 the negation wraps, as in torch
#define SF_DIV_BY_ZERO INT64_MIN
template <class T>
static inline T sf_idiv(T a, T b, int64_t site, const int64_t* err) {
  if (b == 0) return T(sf_index_bad(int64_t(a), SF_DIV_BY_ZERO, site, err));
  return b == -1 ? T(0 - uint64_t(a)) : T(a / b);
}
template <class T>
static inline T sf_ifloordiv(T a, T b, int64_t site, const int64_t* err) {
  const T q = sf_idiv<T>(a, b, site, err);
  return (b != 0 && q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
// exp in a form the vectoriser keeps in registers (Cephes' polynomial, about 1 ulp): k, the
// nearest integer to x log2(e), comes from adding 1.5 * 2^23 (its low mantissa bits then hold
// k), so no float-to-int conversion sees a NaN and no floor is needed (SSE2 has none, which kept
// the loop scalar there); 2^k is built from k's bits. NaN propagates through the polynomial, x
// past 88.37 makes 2^k infinite (expf overflows past 88.72), -inf and x below -87.33 (where
// exp leaves the normal floats) give 0 whatever the polynomial made of them: one clamp and one
// test (tests for NaN and overflow and a floor cost more a vector; a clamp from below as well
// makes GCC blend precomputed values for each clamped side: more instructions a vector)
static inline float sf_expf(float x) {
  const float xc = 89.0f < x ? 89.0f : x;                   // NaN stays NaN
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // 12582912 = 1.5 * 2^23
  const float k = t - 12582912.0f;
  const float r = xc - k * 0.693359375f + k * 2.12194440e-4f;
  const float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  uint32_t bits;  // t's bits are 0x4B400000 + k
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4B400000u + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.33f ? 0.0f : y * scale;
}
// erf as x times a ratio of polynomials in x^2 (the coefficients of Eigen's fast float erf):
// within 5e-7 of the exact value everywhere (measured over [-8, 8] in steps of 4e-7), and a
// loop of it vectorises on every target (a loop calling libm's erff stays scalar, ~30x
// slower, where no vector erff is declared); NaN propagates, +-inf gives +-1. Computed on |x|
// with x's sign put back (the same bits: the ratio is odd in x): a clamp from both sides makes
// GCC blend precomputed values for each clamped side
static inline float sf_erff(float x) {
  float a = std::fabs(x);
  a = 4.0f < a ? 4.0f : a;  // erf is +-1 in float past +-4
  const float z = a * a;
  float p = -2.72614225801306e-10f;
  p = p * z + 2.77068142495902e-08f;
  p = p * z - 2.10102402082508e-06f;
  p = p * z - 5.69250639462346e-05f;
  p = p * z - 7.34990630326855e-04f;
  p = p * z - 2.95459980854025e-03f;
  p = p * z - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * z - 2.13374055278905e-04f;
  q = q * z - 1.68282697438203e-03f;
  q = q * z - 7.37332916720468e-03f;
  q = q * z - 1.42647390514189e-02f;
  return std::copysign(a * p / q, x);
}
static inline float sf_gelu_erf(float x) { return 0.5f * x * (1.0f + sf_erff(x * 0.70710678118654752f)); }
// 0.5 x (1 + tanh(u)) is x / (1 + exp(-2u)): no tanhf call (scalar on most targets) and no
// cancellation where tanh(u) is near -1
static inline float sf_gelu_tanh(float x) {
  return x / (1.0f + sf_expf(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
}
