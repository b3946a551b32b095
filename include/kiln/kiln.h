/* kiln/kiln.h — umbrella header: the whole public API of libkiln.
 *
 * Growth: every public struct a caller fills or reads either begins with
 * `uint32_t struct_size; uint32_t abi_version;` and has an _init function
 * (the library reads a member only when struct_size covers it; members
 * are only appended), or is a fixed-layout value type that never grows
 * (kiln_dims, kiln_tensor, kiln_buffer). Arrays of growable structs are
 * passed as arrays of pointers. tests/unit/test_abi_layout.c pins every
 * layout.
 *
 * Ownership: each function's comment says what it borrows, copies or hands
 * over. Memory the library hands over has exactly one way back:
 *   - plain memory (text, id arrays, JSON descriptions): kiln_free;
 *   - objects: the destroy/close function of their type
 *     (kiln_registry_destroy, kiln_network_destroy, kiln_engine_destroy,
 *     kiln_context_destroy, kiln_llm_close);
 *   - a struct holding memory: its _free function (kiln_buffer_free,
 *     kiln_llm_result_free).
 * Never pass library memory to free() directly: libkiln and its caller
 * may use different allocators.
 */
#ifndef KILN_H
#define KILN_H

#include <kiln/types.h>
#include <kiln/status.h>
#include <kiln/plugin.h>
#include <kiln/registry.h>
#include <kiln/network.h>
#include <kiln/builder.h>
#include <kiln/engine.h>
#include <kiln/runtime.h>
#include <kiln/llm.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_STRING "0.1.0"

/* Frees plain memory the library handed over (text, id arrays, JSON).
 * NULL is a no-op. */
KILN_API void kiln_free(void *ptr);

/* Version of the linked library ("0.1.0"); static storage. */
KILN_API const char *kiln_version(void);

/* Lower-case name of a dtype ("bf16"); "?" when out of range. */
KILN_API const char *kiln_dtype_name(kiln_dtype dtype);

/* Parses a dtype name as written by kiln_dtype_name. Returns
 * KILN_ERROR_INVALID_ARGUMENT for an unknown name. */
KILN_API kiln_status kiln_dtype_parse(const char *name, kiln_dtype *out);

/* Bytes per element; 0 when out of range. */
KILN_API size_t kiln_dtype_size(kiln_dtype dtype);

/* Lower-case backend name ("cpu", "cuda"). */
KILN_API const char *kiln_backend_name(kiln_backend backend);

/* ---- shapes, elements and .npy tensor files ---------------------------------- */

/* Element count and bytes of a concrete shape, overflow-checked
 * (KILN_ERROR_SHAPE on overflow or a negative dim). */
KILN_API kiln_status kiln_dims_count(const kiln_dims *dims, int64_t *count);
KILN_API kiln_status kiln_dims_bytes(const kiln_dims *dims, kiln_dtype dtype, size_t *bytes);

/* Writes "4x1024" ("scalar" for rank 0) into buf (NUL-terminated,
 * truncated to size) and returns buf. */
KILN_API char *kiln_dims_format(const kiln_dims *dims, char *buf, size_t size);

/* 1 for f32, f16, bf16 / for i8, u8, i32, i64, bool; else 0. */
KILN_API int kiln_dtype_is_float(kiln_dtype dtype);
KILN_API int kiln_dtype_is_integer(kiln_dtype dtype);

/* Element i of a buffer of `dtype` read as f32, and an f32 written into it
 * (to integers: rounded toward zero, saturating). */
KILN_API float kiln_load_f32(const void *data, kiln_dtype dtype, int64_t i);
KILN_API void kiln_store_f32(void *data, kiln_dtype dtype, int64_t i, float value);

/* Converts n elements between any two dtypes (floats round to nearest
 * even; float to integer rounds toward zero, saturating). The fp8 dtypes
 * are reserved: converting into one writes zeros. */
KILN_API void kiln_convert(void *dst, kiln_dtype dst_dtype, const void *src, kiln_dtype src_dtype, int64_t n);

/* Reads a NumPy .npy file (versions 1.0 to 3.0; little-endian C-order f4,
 * f2, i4, i8, i1, u1, b1). *data is malloc'd (free with kiln_free) and
 * holds *size bytes; a zero-element array still gets a non-NULL pointer.
 * A fortran-order, big-endian or other file fails naming the file and
 * what it holds. */
KILN_API kiln_status kiln_npy_read(const char *path, kiln_dtype *dtype, kiln_dims *dims, void **data, size_t *size);

/* Writes product(dims) elements of `dtype` (borrowed) as a version 1.0 .npy
 * file laid out byte for byte as numpy writes it. bf16 is written as f32
 * (NumPy has no bfloat16); the fp8 dtypes fail with KILN_ERROR_UNSUPPORTED. */
KILN_API kiln_status kiln_npy_write(const char *path, kiln_dtype dtype, const kiln_dims *dims, const void *data);

#ifdef __cplusplus
}
#endif

#endif
