/* FP8 E4M3 (OCP 8-bit floating point, the "fn" variant Hopper's tensor
 * cores take): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
 * infinities, S.1111.111 is NaN, the largest finite value is 448 and
 * subnormals are M · 2^-9. Written once for the host and the device
 * (KILN_HD, src/core/scalar.h): the FP8 plugin's CPU reference, the
 * build-time weight quantizer and the CUDA kernels round alike. */
#ifndef KILN_CORE_FP8_H
#define KILN_CORE_FP8_H

#include "core/scalar.h"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

#define KILN_E4M3_MAX 448.0f

/* The value of E4M3 code c (exact in f32). */
KILN_HD float kiln_e4m3_to_f32(uint8_t c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    float v = e == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return c & 0x80 ? -v : v;
}

/* f rounded to the nearest E4M3 value, ties to even, saturating to ±448
 * (NaN stays NaN): the codes of the hardware's cvt.rn.satfinite.e4m3x2,
 * which the CUDA quantizers (fp8_quant.cuh) and the FP8 cache write of
 * f16/bf16 rows use (their op tests compare bytes with this function);
 * the device runs this code itself where it converts one value at a time
 * (the cache write of f32 or unaligned rows). */
KILN_HD uint8_t kiln_f32_to_e4m3(float f)
{
    if (isnan(f))
        return 0x7F;
    const uint8_t s = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= KILN_E4M3_MAX)
        return s | 0x7E;
    if (a < 0.015625f) /* below 2^-6: subnormal steps of 2^-9 (8 steps reach 2^-6, code 0x08) */
        return s | (uint8_t)rintf(a * 512.0f);
    /* a in [2^e, 2^(e+1)), e in -6..8: its 23 mantissa bits rounded to 3,
     * to nearest, ties to even, on the integer bits (the build quantizes
     * billions of weights through this; frexpf and ldexpf took about a
     * third of its time); a carry out of the mantissa (q = 8) moves to the
     * next exponent */
    const uint32_t b = kiln_f32_to_bits(a), m = b & 0x7FFFFF, rem = m & 0xFFFFF;
    const int e = (int)(b >> 23) - 127;
    const uint32_t q = (m >> 20) + (rem > 0x80000 || (rem == 0x80000 && (m >> 20 & 1)));
    const int code = ((e + 7) << 3) + (int)q;
    return (uint8_t)(s | (code > 0x7E ? 0x7E : code));
}

/* A row of activations quantized as kiln/Fp8MatMul quantizes its x (and
 * RMSNorm, AddRMSNorm and SwiGLU their y with quantize = fp8): a = max
 * |x|, q = e4m3(x · (448 / a)), all 0 when a = 0; returns the row's scale
 * a / 448. The CPU reference of every one of them. With a static amax > 0
 * (the field x_amax, from a calibration text: docs/llm.md) a is amax for
 * every row instead, and values beyond ±amax saturate to ±448. */
static inline float kiln_fp8_quantize_row(const float *x, int64_t k, float amax, uint8_t *q)
{
    float a = amax;
    if (!(amax > 0.0f)) {
        a = 0.0f;
        for (int64_t i = 0; i < k; i++)
            a = fabsf(x[i]) > a ? fabsf(x[i]) : a;
    }
    const float inv = a > 0.0f ? KILN_E4M3_MAX / a : 0.0f;
    for (int64_t i = 0; i < k; i++)
        q[i] = kiln_f32_to_e4m3(x[i] * inv);
    return a / KILN_E4M3_MAX;
}

#endif
