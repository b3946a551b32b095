/* Element conversions shared by every CPU kernel and file reader. */
#ifndef KILN_CORE_DTYPE_H
#define KILN_CORE_DTYPE_H

#include <kiln/kiln.h>

float kiln_half_to_float(uint16_t h);
uint16_t kiln_float_to_half(float f); /* round to nearest even */
float kiln_bf16_to_float(uint16_t b);
uint16_t kiln_float_to_bf16(float f); /* round to nearest even, NaN kept */

/* kiln_dtype_is_float, kiln_dtype_is_integer, kiln_load_f32,
 * kiln_store_f32 and kiln_convert are public (kiln/kiln.h). */

#endif
