/* Element conversions. f16 is IEEE 754 binary16; bf16 is the upper half of
 * a binary32. Both round to nearest, ties to even.
 *
 * The fp8 dtypes are reserved (kiln_dtype_size gives 1) but have no
 * conversion yet: kiln_load_f32 reads them as NaN, kiln_store_f32 leaves
 * them untouched and kiln_convert fills an fp8 destination with zero bytes.
 * No layer accepts them, so the network API rejects them before this. */
#include "core/dtype.h"
#include "core/scalar.h"

#include <string.h>

float kiln_half_to_float(uint16_t h) { return kiln_f16_to_f32(h); }

uint16_t kiln_float_to_half(float f) { return kiln_f32_to_f16(f); }

float kiln_bf16_to_float(uint16_t b) { return kiln_bf16_to_f32(b); }

uint16_t kiln_float_to_bf16(float f) { return kiln_f32_to_bf16(f); }

int kiln_dtype_is_float(kiln_dtype t) { return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16; }

int kiln_dtype_is_integer(kiln_dtype t) { return kiln_dtype_is_int_or_bool(t); }

/* ---- element access ------------------------------------------------------------ */

float kiln_load_f32(const void *p, kiln_dtype t, int64_t i) { return kiln_elem_load_f32(p, t, i); }

void kiln_store_f32(void *p, kiln_dtype t, int64_t i, float v) { kiln_elem_store_f32(p, t, i, v); }

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
    /* Integers convert exactly between themselves (f32 would lose bits of
     * large i32/i64 values). */
    if (kiln_dtype_is_integer(dst_type) && kiln_dtype_is_integer(src_type)) {
        for (int64_t i = 0; i < n; i++)
            kiln_elem_store_clamp(dst, dst_type, i, kiln_elem_load_int(src, src_type, i));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        kiln_store_f32(dst, dst_type, i, kiln_load_f32(src, src_type, i));
}
