/* Library version and the names of the public enums. */
#include <kiln/kiln.h>

#include <string.h>

#include "core/error.h"

const char *kiln_version(void) { return KILN_VERSION_STRING; }

static const char *const dtype_names[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_F32] = "f32",
    [KILN_DTYPE_F16] = "f16",
    [KILN_DTYPE_BF16] = "bf16",
    [KILN_DTYPE_I8] = "i8",
    [KILN_DTYPE_U8] = "u8",
    [KILN_DTYPE_I32] = "i32",
    [KILN_DTYPE_I64] = "i64",
    [KILN_DTYPE_BOOL] = "bool",
    [KILN_DTYPE_FP8_E4M3] = "fp8_e4m3",
    [KILN_DTYPE_FP8_E5M2] = "fp8_e5m2",
};

static const size_t dtype_sizes[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_F32] = 4,      [KILN_DTYPE_F16] = 2,      [KILN_DTYPE_BF16] = 2, [KILN_DTYPE_I8] = 1,
    [KILN_DTYPE_U8] = 1,       [KILN_DTYPE_I32] = 4,      [KILN_DTYPE_I64] = 8,  [KILN_DTYPE_BOOL] = 1,
    [KILN_DTYPE_FP8_E4M3] = 1, [KILN_DTYPE_FP8_E5M2] = 1,
};

const char *kiln_dtype_name(kiln_dtype dtype) { return (unsigned)dtype < KILN_DTYPE_COUNT ? dtype_names[dtype] : "?"; }

kiln_status kiln_dtype_parse(const char *name, kiln_dtype *out)
{
    if (!name || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_dtype_parse: NULL argument");
    for (int i = 0; i < KILN_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (kiln_dtype)i;
            return KILN_OK;
        }
    }
    return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                     "unknown dtype \"%s\" (expected f32, f16, bf16, i8, u8, i32, i64, bool, "
                     "fp8_e4m3 or fp8_e5m2)",
                     name);
}

size_t kiln_dtype_size(kiln_dtype dtype) { return (unsigned)dtype < KILN_DTYPE_COUNT ? dtype_sizes[dtype] : 0; }

const char *kiln_backend_name(kiln_backend backend)
{
    switch (backend) {
    case KILN_BACKEND_CPU: return "cpu";
    case KILN_BACKEND_CUDA: return "cuda";
    default: return "?";
    }
}
