/* Element conversions shared by every CPU kernel and file reader. */
#ifndef KILN_CORE_DTYPE_H
#define KILN_CORE_DTYPE_H

#include <kiln/kiln.h>

float kiln_half_to_float(uint16_t h);
uint16_t kiln_float_to_half(float f);    /* round to nearest even */
float kiln_bf16_to_float(uint16_t b);
uint16_t kiln_float_to_bf16(float f);    /* round to nearest even, NaN kept */

int kiln_dtype_is_float(kiln_dtype t);   /* f32, f16, bf16 */
int kiln_dtype_is_integer(kiln_dtype t); /* i8, u8, i32, i64, bool */

/* Reads element i of a buffer of dtype t as f32 / writes f32 into it
 * (integers: rounded toward zero, saturating). */
float kiln_load_f32(const void *p, kiln_dtype t, int64_t i);
void kiln_store_f32(void *p, kiln_dtype t, int64_t i, float v);

/* Converts n elements between dtypes (any pair of supported dtypes).
 * The fp8 dtypes are reserved and not supported here: loading one gives
 * NaN, storing into one does nothing, converting into one writes zeros. */
void kiln_convert(void *dst, kiln_dtype dst_type, const void *src, kiln_dtype src_type, int64_t n);

#endif
