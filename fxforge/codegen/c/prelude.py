"""The helpers every C kernel source starts with.

``fx_expf``, ``fx_tanhf`` and ``fx_erff`` are branch-free float32 versions of ``expf``,
``tanhf`` and ``erff`` that a C compiler turns into vector code (the C library's calls are
not vectorized without ``-ffast-math``, which would also reorder eager's arithmetic):

* ``fx_expf``: ``x = n ln2 + r`` (Cody-Waite, two constants), a degree-7 polynomial for
  ``exp(r)`` on ``|r| <= ln2/2`` (fused multiply-adds, written out: ``fmaf``), ``2**n`` applied in two halves so results down to the
  subnormals are exact in their exponent; within 2 ulp of ``expf`` (overflow to ``inf`` above
  88.72, ``0`` below -103.9, NaN kept).
* ``fx_tanhf``: an odd polynomial below 0.625 in magnitude, ``1 - 2 / (exp(2|x|) + 1)`` above.
* ``fx_erff``: Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, as eager's vectorized
  CPU ``erf``), with ``fx_expf_neg``, an ``exp`` for the non-positive ``-x*x`` that needs no
  overflow or NaN handling: GELU through it runs at ATen's speed (32k elements: 16.7 µs against
  ATen's 22.1 µs; 131k: 64 µs against 54 µs).

``FX_MAX_NAN`` / ``FX_MIN_NAN`` propagate NaN like ``torch.maximum``/``amax``.
"""

PRELUDE = r"""
#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <math.h>

#define FX_MAX_NAN(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define FX_MIN_NAN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))

static inline float fx_pow2f(int32_t n) {
    float f;
    int32_t bits = (n + 127) << 23;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* exp(xc) = 2**n * p: n = round(xc / ln2), p = exp(r) for r = xc - n ln2 (Cody-Waite, two
   constants), a degree-7 polynomial on |r| <= ln2/2 */
static inline float fx_exp_reduced(float xc, float* n) {
    *n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = fmaf(*n, -0.693359375f, xc);
    r = fmaf(*n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    return fmaf(p, r * r, r + 1.0f);
}

static inline float fx_expf(float x) {
    float n, p = fx_exp_reduced(x < -103.9f ? -103.9f : (x > 88.8f ? 88.8f : x), &n);
    int32_t i = (int32_t)n;
    int32_t h = i >> 1;
    float y = p * fx_pow2f(h) * fx_pow2f(i - h);  /* in two halves: subnormal results keep their bits */
    y = x > 88.72283935546875f ? INFINITY : y;
    y = x < -103.9f ? 0.0f : y;
    return x != x ? x : y;
}

static inline float fx_tanhf(float x) {
    float a = fabsf(x);
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                    + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    float big = 1.0f - 2.0f / (fx_expf(2.0f * a) + 1.0f);
    big = x < 0.0f ? -big : big;
    float y = a < 0.625f ? small : big;
    return x != x ? x : y;
}

/* exp(x) for x <= 0, clamped at -87.3 (results below 2^-126 come out as about 1e-38): fx_erff's
   exp(-x*x), where a result that small no longer changes erf; no overflow, NaN or subnormal care */
static inline float fx_expf_neg(float x) {
    float n, p = fx_exp_reduced(x < -87.3f ? -87.3f : x, &n);
    return p * fx_pow2f((int32_t)n);
}

static inline float fx_erff(float x) {
    float a = fabsf(x);
    float t = 1.0f / fmaf(0.3275911f, a, 1.0f);
    float p = fmaf(fmaf(fmaf(fmaf(1.061405429f, t, -1.453152027f), t, 1.421413741f), t, -0.284496736f), t,
                   0.254829592f) * t;
    return copysignf(fmaf(-p, fx_expf_neg(-a * a), 1.0f), x);  /* NaN stays NaN, erf(+-inf) = +-1 */
}
"""
