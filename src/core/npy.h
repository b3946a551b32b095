/* Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
 *
 * Supported element types, all little-endian and C order:
 *   '<f4' f32   '<f2' f16   '<i4' i32   '<i8' i64   '|i1' i8   '|u1' u8   '|b1' bool
 * NumPy has no bfloat16, so a bf16 tensor is written as an f32 .npy (every
 * bf16 value is exactly representable in f32); the fp8 dtypes have no .npy
 * form and cannot be written. A file with fortran_order True, a big-endian
 * or other dtype, or more than KILN_MAX_RANK dims is refused with a message
 * naming it. The header dict is parsed strictly: exactly the keys 'descr',
 * 'fortran_order' and 'shape', each once.
 */
#ifndef KILN_CORE_NPY_H
#define KILN_CORE_NPY_H

#include <kiln/kiln.h>

/* Parses a whole .npy file held in memory. On success *data points into
 * `buf` (borrowed: valid as long as buf) at *size bytes of element data,
 * which must be exactly product(dims) * element size: trailing bytes are an
 * error. Outputs are untouched on failure. */
kiln_status kiln_npy_parse(const void *buf, size_t len, kiln_dtype *dtype, kiln_dims *dims, const void **data,
                           size_t *size);

/* kiln_npy_read and kiln_npy_write are public (kiln/kiln.h). */

#endif
