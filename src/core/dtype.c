/* Element conversions. f16 is IEEE 754 binary16; bf16 is the upper half of
 * a binary32. Both round to nearest, ties to even.
 *
 * The fp8 dtypes are reserved (kiln_dtype_size gives 1) but have no
 * conversion yet: kiln_load_f32 reads them as NaN, kiln_store_f32 leaves
 * them untouched and kiln_convert fills an fp8 destination with zero bytes.
 * No layer accepts them, so the network API rejects them before this. */
#include "dtype.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float bits_f32(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

float kiln_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        /* Subnormal: shift the leading 1 into the implicit position. */
        uint32_t e = 113; /* biased binary32 exponent of 2^-14 */
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return bits_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t kiln_float_to_half(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        if (a == 0x7f800000u)
            return sign | 0x7c00u;
        /* NaN: keep the top payload bits and force quiet so it stays NaN. */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    /* 65520 is halfway between 65504 (odd mantissa) and 2^16: ties go up. */
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;
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
}

float kiln_bf16_to_float(uint16_t b) { return bits_f32((uint32_t)b << 16); }

uint16_t kiln_float_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet, so truncation cannot make it Inf */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

int kiln_dtype_is_float(kiln_dtype t)
{
    return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16;
}

int kiln_dtype_is_integer(kiln_dtype t)
{
    return t == KILN_DTYPE_I8 || t == KILN_DTYPE_U8 || t == KILN_DTYPE_I32 ||
           t == KILN_DTYPE_I64 || t == KILN_DTYPE_BOOL;
}

/* ---- element access ------------------------------------------------------------ */

/* Float to integer: toward zero, saturating, NaN to 0. The bounds are
 * powers of two, exact in f32. */
static int64_t sat_i64(float v, double lo, double hi)
{
    if (v != v)
        return 0;
    if ((double)v <= lo)
        return (int64_t)lo;
    if ((double)v >= hi)
        return (int64_t)hi;
    return (int64_t)v;
}

float kiln_load_f32(const void *p, kiln_dtype t, int64_t i)
{
    switch (t) {
    case KILN_DTYPE_F32: return ((const float *)p)[i];
    case KILN_DTYPE_F16: return kiln_half_to_float(((const uint16_t *)p)[i]);
    case KILN_DTYPE_BF16: return kiln_bf16_to_float(((const uint16_t *)p)[i]);
    case KILN_DTYPE_I8: return (float)((const int8_t *)p)[i];
    case KILN_DTYPE_U8: return (float)((const uint8_t *)p)[i];
    case KILN_DTYPE_I32: return (float)((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return (float)((const int64_t *)p)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    default: return NAN;
    }
}

void kiln_store_f32(void *p, kiln_dtype t, int64_t i, float v)
{
    switch (t) {
    case KILN_DTYPE_F32: ((float *)p)[i] = v; break;
    case KILN_DTYPE_F16: ((uint16_t *)p)[i] = kiln_float_to_half(v); break;
    case KILN_DTYPE_BF16: ((uint16_t *)p)[i] = kiln_float_to_bf16(v); break;
    case KILN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)sat_i64(v, -128.0, 127.0); break;
    case KILN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)sat_i64(v, 0.0, 255.0); break;
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

/* Integers convert exactly between themselves (f32 would lose bits of
 * large i32/i64 values). */
static int64_t load_int(const void *p, kiln_dtype t, int64_t i)
{
    switch (t) {
    case KILN_DTYPE_I8: return ((const int8_t *)p)[i];
    case KILN_DTYPE_U8: return ((const uint8_t *)p)[i];
    case KILN_DTYPE_I32: return ((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0;
    }
}

static int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

static void store_int(void *p, kiln_dtype t, int64_t i, int64_t v)
{
    switch (t) {
    case KILN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)clamp_i64(v, INT8_MIN, INT8_MAX); break;
    case KILN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)clamp_i64(v, 0, UINT8_MAX); break;
    case KILN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)clamp_i64(v, INT32_MIN, INT32_MAX); break;
    case KILN_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = v != 0; break;
    }
}

static int is_fp8(kiln_dtype t) { return t == KILN_DTYPE_FP8_E4M3 || t == KILN_DTYPE_FP8_E5M2; }

void kiln_convert(void *dst, kiln_dtype dst_type, const void *src, kiln_dtype src_type, int64_t n)
{
    if (n <= 0)
        return;
    if (is_fp8(dst_type)) {
        memset(dst, 0, (size_t)n);
        return;
    }
    if (dst_type == src_type) {
        memmove(dst, src, (size_t)n * kiln_dtype_size(src_type));
        return;
    }
    if (kiln_dtype_is_integer(dst_type) && kiln_dtype_is_integer(src_type)) {
        for (int64_t i = 0; i < n; i++)
            store_int(dst, dst_type, i, load_int(src, src_type, i));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        kiln_store_f32(dst, dst_type, i, kiln_load_f32(src, src_type, i));
}
