/* Scalar math written once for the host C code and the CUDA device code:
 * f16/bf16 conversions, element loads and stores (saturating, wrapping,
 * clamping) and the f32 formulas of the elementwise ops. The CPU kernels,
 * src/core/dtype.c and the CUDA kernels all include this header, so the two
 * backends cannot drift apart in rounding, NaN or overflow rules.
 *
 * KILN_HD marks every function: `static inline` in C, `__host__ __device__`
 * under nvcc. Where the GPU has an instruction that gives the very same
 * result (f16 conversions, bit casts), the device path uses it; the
 * portable code beside it is the definition the CPU follows, and the op
 * tests compare both bit for bit. */
#ifndef KILN_CORE_SCALAR_H
#define KILN_CORE_SCALAR_H

#include <kiln/network.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD static inline
#endif

/* ---- bits and 16-bit floats ---------------------------------------------------------- */

KILN_HD float kiln_f32_from_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

KILN_HD uint32_t kiln_f32_to_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* bf16 is the upper half of a binary32. */
KILN_HD float kiln_bf16_to_f32(uint16_t b) { return kiln_f32_from_bits((uint32_t)b << 16); }

/* Round to nearest even; a NaN stays NaN (quieted, so truncation cannot
 * turn it into Inf). */
KILN_HD uint16_t kiln_f32_to_bf16(float f)
{
    uint32_t x = kiln_f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* IEEE binary16 to binary32, exact (subnormals, Inf and NaN payloads
 * included): rebias the exponent; Inf/NaN get the rest of the rebias;
 * subnormals are normalized by a float subtraction of the implicit bit. */
KILN_HD float kiln_f16_to_f32(uint16_t h)
{
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t exp_mask = 0x7c00u << 13;
    uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
    uint32_t e = o & exp_mask;
    o += (uint32_t)(127 - 15) << 23;
    if (e == exp_mask)
        o += (uint32_t)(128 - 16) << 23;
    else if (e == 0)
        o = kiln_f32_to_bits(kiln_f32_from_bits(o + (1u << 23)) - kiln_f32_from_bits(113u << 23));
    return kiln_f32_from_bits(o | ((uint32_t)h & 0x8000u) << 16);
#endif
}

/* binary32 to binary16, round to nearest even; a NaN keeps its top payload
 * bits and is forced quiet so it stays NaN. */
KILN_HD uint16_t kiln_f32_to_f16(float f)
{
    uint32_t x = kiln_f32_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(f));
#else
    /* 65520 is halfway between 65504 (odd mantissa) and 2^16: ties go up. */
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal half: >= 2^-14 */
        a += 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
    }
    if (a < 0x33000000u) /* below 2^-25 (half the smallest subnormal) */
        return sign;
    /* Subnormal half: value * 2^24 rounded to an integer mantissa. */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
#endif
}

/* ---- element loads and stores ---------------------------------------------------------- */

KILN_HD int kiln_dtype_is_int_or_bool(int t)
{
    return t == KILN_DTYPE_I8 || t == KILN_DTYPE_U8 || t == KILN_DTYPE_I32 || t == KILN_DTYPE_I64 ||
           t == KILN_DTYPE_BOOL;
}

/* Element i of a buffer of dtype t as f32 (fp8 and unknown dtypes: NaN). */
KILN_HD float kiln_elem_load_f32(const void *p, int t, int64_t i)
{
    switch (t) {
    case KILN_DTYPE_F32: return ((const float *)p)[i];
    case KILN_DTYPE_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_DTYPE_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    case KILN_DTYPE_I8: return (float)((const int8_t *)p)[i];
    case KILN_DTYPE_U8: return (float)((const uint8_t *)p)[i];
    case KILN_DTYPE_I32: return (float)((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return (float)((const int64_t *)p)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    default: return kiln_f32_from_bits(0x7fc00000u);
    }
}

/* Float to integer: toward zero, saturating, NaN to 0. The bounds are
 * powers of two (or small integers), exact in f32. */
KILN_HD int64_t kiln_sat_f32(float v, float lo, float hi)
{
    if (v != v)
        return 0;
    if (v <= lo)
        return (int64_t)lo;
    if (v >= hi)
        return (int64_t)hi;
    return (int64_t)v;
}

/* Writes f32 v as element i of dtype t: 16-bit floats round to nearest
 * even, integers saturate (kiln_sat_f32), bool is v != 0; fp8 and unknown
 * dtypes are left untouched. */
KILN_HD void kiln_elem_store_f32(void *p, int t, int64_t i, float v)
{
    switch (t) {
    case KILN_DTYPE_F32: ((float *)p)[i] = v; break;
    case KILN_DTYPE_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16(v); break;
    case KILN_DTYPE_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16(v); break;
    case KILN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)kiln_sat_f32(v, -128.0f, 127.0f); break;
    case KILN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)kiln_sat_f32(v, 0.0f, 255.0f); break;
    case KILN_DTYPE_I32:
        /* 2^31 is exact in f32 but 2^31-1 is not: compare against 2^31. */
        if (v != v)
            ((int32_t *)p)[i] = 0;
        else if (v >= 2147483648.0f)
            ((int32_t *)p)[i] = INT32_MAX;
        else if (v <= -2147483648.0f)
            ((int32_t *)p)[i] = INT32_MIN;
        else
            ((int32_t *)p)[i] = (int32_t)v;
        break;
    case KILN_DTYPE_I64:
        if (v != v)
            ((int64_t *)p)[i] = 0;
        else if (v >= 9223372036854775808.0f)
            ((int64_t *)p)[i] = INT64_MAX;
        else if (v <= -9223372036854775808.0f)
            ((int64_t *)p)[i] = INT64_MIN;
        else
            ((int64_t *)p)[i] = (int64_t)v;
        break;
    case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0.0f; break;
    default: break;
    }
}

/* Element i of an integer (or bool) buffer, exactly. */
KILN_HD int64_t kiln_elem_load_int(const void *p, int t, int64_t i)
{
    switch (t) {
    case KILN_DTYPE_I8: return ((const int8_t *)p)[i];
    case KILN_DTYPE_U8: return ((const uint8_t *)p)[i];
    case KILN_DTYPE_I32: return ((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0;
    }
}

/* Integer arithmetic results wrap to the storage width, as in C and numpy. */
KILN_HD void kiln_elem_store_wrap(void *p, int t, int64_t i, int64_t v)
{
    switch (t) {
    case KILN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case KILN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case KILN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case KILN_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = v != 0; break;
    }
}

/* Integer-to-integer casts saturate. */
KILN_HD void kiln_elem_store_clamp(void *p, int t, int64_t i, int64_t v)
{
    switch (t) {
    case KILN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)(v < INT8_MIN ? INT8_MIN : v > INT8_MAX ? INT8_MAX : v); break;
    case KILN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)(v < 0 ? 0 : v > UINT8_MAX ? UINT8_MAX : v); break;
    case KILN_DTYPE_I32:
        ((int32_t *)p)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v);
        break;
    case KILN_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = v != 0; break;
    }
}

/* ---- the elementwise ops -------------------------------------------------------------------- */

/* gelu with the tanh approximation: 0.5 x (1 + tanh(K (x + C x^3))). */
#define KILN_GELU_TANH_K 0.79788456080286536f
#define KILN_GELU_TANH_C 0.044715f
/* gelu with erf: 0.5 x (1 + erf(x / sqrt 2)). */
#define KILN_SQRT1_2 0.70710678118654752f

/* f32 binary op (kiln_binary_op). NaN rules follow the C expressions: max
 * and min return y when the comparison with a NaN fails. */
KILN_HD float kiln_binary_f32(int op, float x, float y)
{
    switch (op) {
    case KILN_BINARY_ADD: return x + y;
    case KILN_BINARY_SUB: return x - y;
    case KILN_BINARY_MUL: return x * y;
    case KILN_BINARY_DIV: return x / y;
    case KILN_BINARY_POW: return powf(x, y);
    case KILN_BINARY_MAX: return x > y ? x : y;
    case KILN_BINARY_MIN: return x < y ? x : y;
    default: return 0.0f;
    }
}

/* f32 unary op (kiln_unary_op) with the C library's functions. */
KILN_HD float kiln_unary_f32(int op, float x)
{
    switch (op) {
    case KILN_UNARY_NEG: return -x;
    case KILN_UNARY_ABS: return fabsf(x);
    case KILN_UNARY_EXP: return expf(x);
    case KILN_UNARY_LOG: return logf(x);
    case KILN_UNARY_SQRT: return sqrtf(x);
    case KILN_UNARY_RSQRT: return 1.0f / sqrtf(x);
    case KILN_UNARY_TANH: return tanhf(x);
    case KILN_UNARY_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case KILN_UNARY_RELU: return x > 0.0f ? x : 0.0f;
    case KILN_UNARY_GELU_ERF: return 0.5f * x * (1.0f + erff(x * KILN_SQRT1_2));
    case KILN_UNARY_GELU_TANH: {
        /* tanh(z) = 1 - 2 / (e^{2z} + 1): exact limits at ±inf through exp */
        float e = expf(2.0f * KILN_GELU_TANH_K * (x + KILN_GELU_TANH_C * x * x * x));
        return 0.5f * x * (1.0f + (1.0f - 2.0f / (e + 1.0f)));
    }
    case KILN_UNARY_SILU: return x / (1.0f + expf(-x));
    default: return 0.0f;
    }
}

/* Integer binary op over int64 compute. Unsigned arithmetic so overflow
 * wraps instead of being undefined; division by zero gives 0 rather than
 * trapping; negative powers give what the integer result rounds to. */
KILN_HD int64_t kiln_binary_int(int op, int64_t x, int64_t y)
{
    uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
    switch (op) {
    case KILN_BINARY_ADD: return (int64_t)(ux + uy);
    case KILN_BINARY_SUB: return (int64_t)(ux - uy);
    case KILN_BINARY_MUL: return (int64_t)(ux * uy);
    case KILN_BINARY_DIV:
        if (y == 0)
            return 0;
        if (y == -1)
            return (int64_t)(0 - ux);
        return x / y;
    case KILN_BINARY_POW: {
        if (y < 0)
            return x == 1 ? 1 : x == -1 ? (y % 2 ? -1 : 1) : 0;
        uint64_t r = 1, base = ux;
        for (; y; y >>= 1) {
            if (y & 1)
                r *= base;
            base *= base;
        }
        return (int64_t)r;
    }
    case KILN_BINARY_MAX: return x > y ? x : y;
    case KILN_BINARY_MIN: return x < y ? x : y;
    default: return 0;
    }
}

/* The integer unary ops: neg, abs, relu (the only ones defined on integers). */
KILN_HD int64_t kiln_unary_int(int op, int64_t x)
{
    uint64_t neg = 0 - (uint64_t)x;
    switch (op) {
    case KILN_UNARY_NEG: return (int64_t)neg;
    case KILN_UNARY_ABS: return x < 0 ? (int64_t)neg : x;
    default: return x > 0 ? x : 0; /* relu */
    }
}

#endif
