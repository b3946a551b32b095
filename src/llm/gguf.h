/* GGUF files (versions 2 and 3): metadata, tensor directory, and
 * dequantization of the ggml block formats kiln reads.
 *
 * The file is mapped read-only; every string, array and tensor is validated
 * against the file's bounds when it is opened, so accessors never read out
 * of range. Layout facts follow the GGUF specification in the ggml
 * repository (docs/gguf.md).
 */
#ifndef KILN_LLM_GGUF_H
#define KILN_LLM_GGUF_H

#include <kiln/types.h>

/* Metadata value types, as numbered by the specification. */
typedef enum kiln_gguf_value_type {
    KILN_GGUF_U8 = 0,
    KILN_GGUF_I8 = 1,
    KILN_GGUF_U16 = 2,
    KILN_GGUF_I16 = 3,
    KILN_GGUF_U32 = 4,
    KILN_GGUF_I32 = 5,
    KILN_GGUF_F32 = 6,
    KILN_GGUF_BOOL = 7,
    KILN_GGUF_STRING = 8,
    KILN_GGUF_ARRAY = 9,
    KILN_GGUF_U64 = 10,
    KILN_GGUF_I64 = 11,
    KILN_GGUF_F64 = 12,
    KILN_GGUF_VALUE_TYPE_COUNT
} kiln_gguf_value_type;

/* ggml tensor types kiln knows by number (others are reported by number). */
typedef enum kiln_ggml_type {
    KILN_GGML_F32 = 0,
    KILN_GGML_F16 = 1,
    KILN_GGML_Q4_0 = 2,
    KILN_GGML_Q4_1 = 3,
    KILN_GGML_Q5_0 = 6,
    KILN_GGML_Q5_1 = 7,
    KILN_GGML_Q8_0 = 8,
    KILN_GGML_Q8_1 = 9,
    KILN_GGML_Q2_K = 10,
    KILN_GGML_Q3_K = 11,
    KILN_GGML_Q4_K = 12,
    KILN_GGML_Q5_K = 13,
    KILN_GGML_Q6_K = 14,
    KILN_GGML_Q8_K = 15,
    KILN_GGML_BF16 = 30
} kiln_ggml_type;

typedef struct kiln_gguf_kv {
    const char *key; /* NUL-terminated copy */
    kiln_gguf_value_type type;
    kiln_gguf_value_type array_type; /* for KILN_GGUF_ARRAY */
    uint64_t count;                  /* elements of an array, else 1 */
    const uint8_t *value;            /* into the file: the scalar, string or first element */
    const uint8_t **strings;         /* for arrays of strings: start of each (u64 length + bytes) */
} kiln_gguf_kv;

typedef struct kiln_gguf_tensor {
    const char *name; /* NUL-terminated copy */
    int32_t n_dims;
    int64_t ne[4]; /* ne[0] is the fastest-varying (innermost) dim */
    uint32_t type; /* kiln_ggml_type */
    int64_t n_elements;
    const void *data; /* into the mapped file */
    size_t size;      /* bytes */
} kiln_gguf_tensor;

typedef struct kiln_gguf {
    uint32_t version;
    uint64_t alignment;
    kiln_gguf_kv *kvs;
    int64_t n_kvs;
    kiln_gguf_tensor *tensors;
    int64_t n_tensors;
    /* private */
    void *map;
    size_t map_size;
    int mapped;
    char *strings; /* arena of copied keys and names */
} kiln_gguf;

/* Maps and validates a GGUF file. Errors name the file and the problem
 * ("model.gguf: tensor \"blk.0.attn_q.weight\" data ends past the end of
 * the file"). *out is freed with kiln_gguf_close. */
kiln_status kiln_gguf_open(const char *path, kiln_gguf **out);

/* Same over memory (copied). `what` names it in errors. */
kiln_status kiln_gguf_parse(const void *data, size_t size, const char *what, kiln_gguf **out);

void kiln_gguf_close(kiln_gguf *g); /* NULL is a no-op */

const kiln_gguf_kv *kiln_gguf_find_kv(const kiln_gguf *g, const char *key);
const kiln_gguf_tensor *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name);

/* Typed reads of a scalar value; any integer type converts to the
 * requested one when it fits. KILN_ERROR_NOT_FOUND when the key is
 * absent, KILN_ERROR_FORMAT naming the key when the type does not fit. */
kiln_status kiln_gguf_get_i64(const kiln_gguf *g, const char *key, int64_t *out);
kiln_status kiln_gguf_get_f32(const kiln_gguf *g, const char *key, float *out);
/* Borrowed pointer into the file (not NUL-terminated) and its length. */
kiln_status kiln_gguf_get_string(const kiln_gguf *g, const char *key, const char **s, size_t *len);

/* Element i of an array of strings (borrowed, not NUL-terminated). */
void kiln_gguf_array_string(const kiln_gguf_kv *kv, uint64_t i, const char **s, size_t *len);
/* Element i of a numeric array, range-checked before any conversion: an
 * integer in lo..hi (float elements are refused), or an f32 (any numeric
 * type; a value outside the f32 range is refused). Errors name the key and
 * the index. */
kiln_status kiln_gguf_array_int(const kiln_gguf_kv *kv, uint64_t i, int64_t lo, int64_t hi, int64_t *out);
kiln_status kiln_gguf_array_f32(const kiln_gguf_kv *kv, uint64_t i, float *out);

/* Name of a ggml type ("Q4_K"), or NULL when kiln does not know it. */
const char *kiln_ggml_type_name(uint32_t type);

/* Elements per block and bytes per block; 0 for an unknown type. */
int64_t kiln_ggml_block_elements(uint32_t type);
size_t kiln_ggml_block_bytes(uint32_t type);

/* Whether kiln_ggml_dequantize supports the type: F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. */
int kiln_ggml_can_dequantize(uint32_t type);

/* Converts n elements (a multiple of the block size) starting at src into
 * f32. KILN_ERROR_UNSUPPORTED naming the type otherwise. */
kiln_status kiln_ggml_dequantize(uint32_t type, const void *src, int64_t n, float *dst);

#endif
