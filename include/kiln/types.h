/* kiln/types.h — the plain types shared by every kiln header and by plugins.
 *
 * Header-only: nothing here needs libkiln at link time, so a plugin that
 * includes <kiln/plugin.h> (which includes this) links against nothing.
 * Enums are append-only; their numeric values are part of the engine format
 * and of the plugin ABI.
 */
#ifndef KILN_TYPES_H
#define KILN_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Symbols of libkiln that form its API. Everything else is hidden. */
#if defined(KILN_BUILDING_LIBRARY)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

/* Version of the public structs that begin with struct_size and
 * abi_version (outside the plugin ABI, which has KILN_PLUGIN_ABI_VERSION):
 * their _init functions store it. Bumped when members are appended; the
 * library reads a member only when the caller's struct_size covers it. */
#define KILN_API_VERSION 1u

/* A four-character code: engine section ids (KILN_FOURCC('L','L','M','C')). */
#define KILN_FOURCC(a, b, c, d) \
    ((uint32_t)(uint8_t)(a) | ((uint32_t)(uint8_t)(b) << 8) | ((uint32_t)(uint8_t)(c) << 16) | \
     ((uint32_t)(uint8_t)(d) << 24))

/* Highest tensor rank any layer or plugin sees. */
#define KILN_MAX_RANK 8

/* Result of every fallible call. 0 is success; on failure the call leaves
 * its outputs untouched and kiln_last_error() (status.h) holds a one-line
 * message naming the problem. */
typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERROR_INVALID_ARGUMENT, /* a bad argument or field from the caller  */
    KILN_ERROR_OUT_OF_MEMORY,
    KILN_ERROR_IO,          /* open/read/write/mmap failed              */
    KILN_ERROR_FORMAT,      /* a file or blob is malformed or truncated */
    KILN_ERROR_CHECKSUM,    /* a section's checksum does not match      */
    KILN_ERROR_VERSION,     /* a format, ABI or blob version mismatch   */
    KILN_ERROR_SHAPE,       /* shapes are inconsistent or out of range  */
    KILN_ERROR_PLUGIN,      /* a plugin is missing or failed            */
    KILN_ERROR_NOT_FOUND,   /* a named tensor, input or creator         */
    KILN_ERROR_UNSUPPORTED, /* valid, but outside what kiln handles   */
    KILN_ERROR_TARGET,      /* the engine's target is not available     */
    KILN_ERROR_BACKEND,     /* a backend call (CUDA, BLAS) failed       */
    KILN_ERROR_INTERNAL,
    KILN_ERROR_CANCELLED,
    KILN_ERROR_LIMIT, /* a request exceeds a configured limit     */
    KILN_STATUS_COUNT
} kiln_status;

/* Element types. Storage type; the CPU backend computes f16/bf16 in f32. */
typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_F16,
    KILN_DTYPE_BF16,
    KILN_DTYPE_I8,
    KILN_DTYPE_U8,
    KILN_DTYPE_I32,
    KILN_DTYPE_I64,
    KILN_DTYPE_BOOL,     /* one byte, 0 or 1                       */
    KILN_DTYPE_FP8_E4M3, /* reserved: no layer accepts it yet      */
    KILN_DTYPE_FP8_E5M2, /* reserved: no layer accepts it yet      */
    KILN_DTYPE_COUNT
} kiln_dtype;

/* Memory layout of a tensor. Only row-major (last axis contiguous) exists
 * today; the member is in every descriptor so formats can be added. */
typedef enum kiln_format { KILN_FORMAT_LINEAR = 0, KILN_FORMAT_COUNT } kiln_format;

/* Where an engine runs. */
typedef enum kiln_backend { KILN_BACKEND_CPU = 0, KILN_BACKEND_CUDA, KILN_BACKEND_COUNT } kiln_backend;

/* A concrete shape. In a network definition a dim of -1 is dynamic. A
 * fixed-layout value type: it never grows (a larger rank is a new type). */
typedef struct kiln_dims {
    int32_t rank;
    int32_t reserved;
    int64_t d[KILN_MAX_RANK];
} kiln_dims;

/* A concrete tensor as a kernel or plugin sees it. */
typedef struct kiln_tensor_desc {
    uint32_t struct_size;
    uint32_t abi_version;
    kiln_dtype dtype;
    kiln_format format;
    kiln_dims dims;
} kiln_tensor_desc;

#ifdef __cplusplus
}
#endif

#endif
