/* Reading safetensors files (https://github.com/huggingface/safetensors).
 *
 *   u64 LE N | N bytes of JSON header | data region
 *
 * The header maps tensor names to {"dtype", "shape", "data_offsets":
 * [begin, end]} (offsets relative to the data region) plus an optional
 * "__metadata__" object of string -> string. Checked as the reference
 * implementation checks it: the header fits in the file and is at most
 * 100 MB of valid JSON without duplicate keys; every offset lies in the data
 * region; end - begin == product(shape) * element size (overflow-checked);
 * the tensors cover the data region exactly, without holes or overlap.
 *
 * Every dtype of the format is recognised. Those with a kiln dtype (F32,
 * F16, BF16, I8, U8, I32, I64, BOOL, F8_E4M3, F8_E5M2) map to it; the others
 * (F64, I16, U16, U32, U64, F8_E8M0, F4, F6_*) are listed with dtype
 * KILN_DTYPE_COUNT so a reader can skip them, and kiln_safetensors_find()
 * refuses them naming the dtype. A dtype the format does not define is an
 * error for the whole file.
 *
 * Tensor data is not aligned beyond what the writer chose: the reference
 * writer aligns the data region to 8 bytes, but a tensor's pointer may be
 * odd for 1- or 2-byte dtypes. Copy before using a pointer as a wider type.
 */
#ifndef KILN_CORE_SAFETENSORS_H
#define KILN_CORE_SAFETENSORS_H

#include <kiln/kiln.h>

typedef struct kiln_safetensors kiln_safetensors;

typedef struct kiln_safetensors_tensor {
    const char *name;       /* owned by the kiln_safetensors */
    const char *dtype_name; /* as in the file: "BF16", "F64", ... */
    kiln_dtype dtype;       /* KILN_DTYPE_COUNT when kiln has no such dtype */
    kiln_dims dims;
    const void *data; /* inside the file mapping or the parsed buffer */
    size_t size;      /* bytes */
} kiln_safetensors_tensor;

/* Maps `path` read-only and parses it. Errors name the file. The mapping
 * lives until kiln_safetensors_destroy. */
kiln_status kiln_safetensors_open(const char *path, kiln_safetensors **out);

/* Parses a file held in memory. `buf` is borrowed and must outlive the
 * returned object; tensor data pointers point into it. `what` names the
 * source in messages (may be NULL: "safetensors"). */
kiln_status kiln_safetensors_parse(const void *buf, size_t size, const char *what, kiln_safetensors **out);

/* NULL is a no-op. Unmaps a file opened with kiln_safetensors_open. */
void kiln_safetensors_destroy(kiln_safetensors *st);

/* Tensors in file order (by data offset); i in [0, count). Borrowed. */
int32_t kiln_safetensors_count(const kiln_safetensors *st);
const kiln_safetensors_tensor *kiln_safetensors_tensor_at(const kiln_safetensors *st, int32_t i);

/* Finds a tensor by exact name. KILN_ERROR_NOT_FOUND when absent;
 * KILN_ERROR_UNSUPPORTED, naming the dtype, when kiln has no such dtype. */
kiln_status kiln_safetensors_find(const kiln_safetensors *st, const char *name, const kiln_safetensors_tensor **out);

/* The "__metadata__" entries, in file order. Borrowed. */
int32_t kiln_safetensors_metadata_count(const kiln_safetensors *st);
void kiln_safetensors_metadata_at(const kiln_safetensors *st, int32_t i, const char **key, const char **value);

/* Value of one metadata key, or NULL when absent. Borrowed. */
const char *kiln_safetensors_metadata(const kiln_safetensors *st, const char *key);

#endif
