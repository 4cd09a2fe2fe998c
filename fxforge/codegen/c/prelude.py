"""The helpers every C kernel source starts with.

``fx_expf``, ``fx_tanhf`` and ``fx_erff`` are branch-free float32 versions of ``expf``,
``tanhf`` and ``erff`` that a C compiler turns into vector code (the C library's calls are
not vectorized without ``-ffast-math``, which would also reorder eager's arithmetic):

* ``fx_expf``: ``x = n ln2 + r`` (Cody-Waite, two constants), a degree-7 polynomial for
  ``exp(r)`` on ``|r| <= ln2/2`` (fused multiply-adds, written out: ``fmaf``); ``n`` is read from
  the rounding constant's bits and ``2**n`` applied in two multiplies (by ``2**(n -+ 64)`` and
  ``2**(+-64)``), so results overflow to ``inf``, round into the subnormals and below them to 0 as
  ``expf``'s do; within 1 ulp of ``expf`` on [-106, 89].
* ``fx_expf_neg``: the same for ``x <= 0`` with one multiply and no overflow or subnormal care
  (faster): ``fx_erff``'s ``exp(-x*x)`` and the log-softmax template's ``exp(x - max)``.
* ``fx_tanhf``: an odd polynomial below 0.625 in magnitude, ``1 - 2 / (exp(2|x|) + 1)`` above.
* ``fx_erff``: Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, as eager's vectorized
  CPU ``erf``), through ``fx_expf_neg``: GELU runs at about ATen's speed.
* ``fx_gelu_gradf``: the exact GELU's derivative, ``Phi(x) + x phi(x)``, with one ``exp`` for both
  terms.

* ``fx_tile_in8`` / ``fx_tile_out8``: a tile of 8 rows moved between a tensor read or stored
  across its rows (element ``j`` of row ``x`` at ``x + s*j``: a transposed value) and a local
  array holding each row contiguously (``schedule.TILE_ROWS``), 8 x 8 blocks transposed in vector
  registers (``__builtin_shufflevector``; a plain loop for compilers without it).

``FX_MAX_NAN`` / ``FX_MIN_NAN`` propagate NaN like ``torch.maximum``/``amax``.
"""

PRELUDE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <math.h>

/* the element helpers are inlined, whatever the size of the unit it is compiled in (past gcc's unit growth
   limit a large unit would call it, and the loop calling it would not be vectorized) */
#define FX_INLINE static inline __attribute__((always_inline))

/* NaN when either is (a + b), as torch.maximum/minimum; selects only (a test of a's NaN-ness or'ed with
   the comparison kept gcc from vectorizing loops where a came from another select, as after a relu) */
#define FX_MAX_NAN(a, b) (((a) > (b)) ? (a) : (((b) >= (a)) ? (b) : (a) + (b)))
#define FX_MIN_NAN(a, b) (((a) < (b)) ? (a) : (((b) <= (a)) ? (b) : (a) + (b)))

/* exp(x) = 2**n * p: t = x / ln2 + 1.5 * 2**23 rounds to an integer whose low mantissa bits hold
   n (returned as t's bits), p = exp(r) for r = x - n ln2 (Cody-Waite, two constants), a degree-7
   polynomial on |r| <= ln2/2 */
FX_INLINE float fx_exp_split(float x, uint32_t* t_bits) {
    const float t = fmaf(x, 1.44269504088896341f, 12582912.0f);
    const float n = t - 12582912.0f;
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    memcpy(t_bits, &t, sizeof t);
    return fmaf(p, r * r, r + 1.0f);
}

/* 2**(n + bias - 127) from t's bits, n + bias in [1, 254]: (t_bits + bias) << 23 is n + bias in
   the exponent field (t's other bits are shifted out) */
FX_INLINE float fx_pow2_bits(uint32_t t_bits, uint32_t bias) {
    const uint32_t b = (t_bits + bias) << 23;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

FX_INLINE float fx_expf_inline(float x) {
    /* clamped to [-105, 88.8], where 2**n spans [2**-151, 2**128]: scaled in two steps, by 2**(n -+ 64)
       and 2**(+-64), so results overflow to inf, round into the subnormals and below them to 0 as
       one multiply would; NaN passes the clamp and every product */
    const float xc = x < -105.0f ? -105.0f : (x > 88.8f ? 88.8f : x);
    uint32_t t;
    const float p = fx_exp_split(xc, &t);
    const bool neg = xc < 0.0f;
    return p * fx_pow2_bits(t, neg ? 127u + 64u : 127u - 64u) * (neg ? 5.42101086242752217e-20f : 1.8446744073709552e19f);
}

/* exp as kernels call it: once a translation unit, out of line, with its vector version (declare
   simd): the loops calling it are vectorized as with the inline one, and a unit of many kernels
   does not compile its body at every call */
#pragma omp declare simd notinbranch
__attribute__((noinline)) static float fx_expf(float x) {
    return fx_expf_inline(x);
}

FX_INLINE float fx_tanhf(float x) {
    float a = fabsf(x);
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                    + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    float big = 1.0f - 2.0f / (fx_expf_inline(2.0f * a) + 1.0f);
    big = x < 0.0f ? -big : big;
    float y = a < 0.625f ? small : big;
    return x != x ? x : y;
}

/* -ln(FLT_MIN): exp of anything below -FX_EXPF_MIN_ARG is below float32's normal range */
#define FX_EXPF_MIN_ARG 87.33654f

/* exp(x) for x <= 0, clamped at -FX_EXPF_MIN_ARG (results below 2^-126 come out as about 1e-38): fx_erff's
   exp(-x*x) and the row templates' exp(x - max), where a result that small no longer changes
   the value; one scaling, no overflow or subnormal care; NaN passes the clamp and the product */
FX_INLINE float fx_expf_neg(float x) {
    uint32_t t;
    const float p = fx_exp_split(x < -FX_EXPF_MIN_ARG ? -FX_EXPF_MIN_ARG : x, &t);
    return p * fx_pow2_bits(t, 127u);
}

/* Abramowitz & Stegun 7.1.26: erf(a) = 1 - p(a) exp(-a*a) for a >= 0 */
FX_INLINE float fx_erf_p(float a) {
    const float t = 1.0f / fmaf(0.3275911f, a, 1.0f);
    return fmaf(fmaf(fmaf(fmaf(1.061405429f, t, -1.453152027f), t, 1.421413741f), t, -0.284496736f), t,
                0.254829592f) * t;
}

FX_INLINE float fx_erff(float x) {
    const float a = fabsf(x);
    return copysignf(fmaf(-fx_erf_p(a), fx_expf_neg(-a * a), 1.0f), x);  /* NaN stays NaN, erf(+-inf) = +-1 */
}

/* d gelu(x)/dx = Phi(x) + x phi(x) (exact GELU): erf(x / sqrt2) as fx_erff computes it, and
   phi(x) = exp(-x*x/2) / sqrt(2 pi) from that same exp(-a*a), a = |x / sqrt2| (one exp, not two);
   0 below float32's normal range, so inf * phi(inf) is NaN, as eager's */
FX_INLINE float fx_gelu_gradf(float x) {
    const float a = fabsf(x * 0.7071067811865476f);
    const float e = a * a > FX_EXPF_MIN_ARG ? 0.0f : fx_expf_neg(-a * a);
    return 0.5f * (1.0f + copysignf(fmaf(-fx_erf_p(a), e, 1.0f), x)) + x * (e * 0.3989422804014327f);
}

/* Tiles of 8 rows: row x of the tile (x < nb <= 8) holds elements j < n of a tensor's row x,
   which lie at x + s*j from the tile's first element (rows one element apart, a transposed
   value); the tile's rows are ld floats apart.  fx_tile_in8 reads them, fx_tile_out8 stores
   them back; full tiles move 8 x 8 blocks through vector registers (eight 8-float loads or
   stores, each a contiguous run of the tensor, and 24 shuffles), the rest one element at a time */
#ifndef FX_TILE_VECTORS  /* 0 or 1 from the command line: the plain loops or the vectors */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define FX_TILE_VECTORS 1
#else
#define FX_TILE_VECTORS 0
#endif
#endif
#if FX_TILE_VECTORS
typedef float fx_v8f __attribute__((vector_size(32)));

/* c[k] = column k of the 8 x 8 block whose row i is r[i]: pairs interleaved by 32, then 64,
   then 128 bits */
static inline void fx_transpose8(const fx_v8f r[8], fx_v8f c[8]) {
    const fx_v8f t0 = __builtin_shufflevector(r[0], r[1], 0, 8, 1, 9, 4, 12, 5, 13);
    const fx_v8f t1 = __builtin_shufflevector(r[0], r[1], 2, 10, 3, 11, 6, 14, 7, 15);
    const fx_v8f t2 = __builtin_shufflevector(r[2], r[3], 0, 8, 1, 9, 4, 12, 5, 13);
    const fx_v8f t3 = __builtin_shufflevector(r[2], r[3], 2, 10, 3, 11, 6, 14, 7, 15);
    const fx_v8f t4 = __builtin_shufflevector(r[4], r[5], 0, 8, 1, 9, 4, 12, 5, 13);
    const fx_v8f t5 = __builtin_shufflevector(r[4], r[5], 2, 10, 3, 11, 6, 14, 7, 15);
    const fx_v8f t6 = __builtin_shufflevector(r[6], r[7], 0, 8, 1, 9, 4, 12, 5, 13);
    const fx_v8f t7 = __builtin_shufflevector(r[6], r[7], 2, 10, 3, 11, 6, 14, 7, 15);
    const fx_v8f u0 = __builtin_shufflevector(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13);
    const fx_v8f u1 = __builtin_shufflevector(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15);
    const fx_v8f u2 = __builtin_shufflevector(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13);
    const fx_v8f u3 = __builtin_shufflevector(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15);
    const fx_v8f u4 = __builtin_shufflevector(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13);
    const fx_v8f u5 = __builtin_shufflevector(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15);
    const fx_v8f u6 = __builtin_shufflevector(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13);
    const fx_v8f u7 = __builtin_shufflevector(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15);
    c[0] = __builtin_shufflevector(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11);
    c[1] = __builtin_shufflevector(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11);
    c[2] = __builtin_shufflevector(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11);
    c[3] = __builtin_shufflevector(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11);
    c[4] = __builtin_shufflevector(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15);
    c[5] = __builtin_shufflevector(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15);
    c[6] = __builtin_shufflevector(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15);
    c[7] = __builtin_shufflevector(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15);
}
#endif

static inline void fx_tile_in8(float* tile, int64_t ld, const float* src, int64_t s, int64_t n, int64_t nb) {
    const int64_t v = FX_TILE_VECTORS && nb == 8 ? n - n % 8 : 0;  /* columns moved as 8 x 8 blocks */
#if FX_TILE_VECTORS
    for (int64_t j = 0; j < v; j += 8) {
        fx_v8f r[8], c[8];
        for (int i = 0; i < 8; i++) memcpy(&r[i], src + s * (j + i), sizeof r[i]);
        fx_transpose8(r, c);
        for (int x = 0; x < 8; x++) memcpy(tile + x * ld + j, &c[x], sizeof c[x]);
    }
#endif
    for (int64_t x = 0; x < nb; x++)
        for (int64_t k = v; k < n; k++) tile[x * ld + k] = src[x + s * k];
}

static inline void fx_tile_out8(float* dst, int64_t s, const float* tile, int64_t ld, int64_t n, int64_t nb) {
    const int64_t v = FX_TILE_VECTORS && nb == 8 ? n - n % 8 : 0;
#if FX_TILE_VECTORS
    for (int64_t j = 0; j < v; j += 8) {
        fx_v8f r[8], c[8];
        for (int x = 0; x < 8; x++) memcpy(&r[x], tile + x * ld + j, sizeof r[x]);
        fx_transpose8(r, c);
        for (int i = 0; i < 8; i++) memcpy(dst + s * (j + i), &c[i], sizeof c[i]);
    }
#endif
    for (int64_t x = 0; x < nb; x++)
        for (int64_t k = v; k < n; k++) dst[x + s * k] = tile[x * ld + k];
}
"""
