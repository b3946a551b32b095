/* Small helpers shared by kiln's built-in plugins. Built-ins are written
 * against <kiln/plugin.h> like any outside plugin: they reach the host only
 * through the kiln_host_api table. */
#ifndef KILN_PLUGINS_UTIL_H
#define KILN_PLUGINS_UTIL_H

#include <kiln/plugin.h>

#include <stddef.h>
#include <string.h>

/* The backends a built-in runs on: the CPU, and CUDA when libkiln is built
 * with it (every built-in has a kernel beside its CPU reference). */
#ifdef KILN_HAVE_CUDA
#define PLUGIN_BUILTIN_BACKENDS (KILN_BACKEND_BIT(KILN_BACKEND_CPU) | KILN_BACKEND_BIT(KILN_BACKEND_CUDA))
#else
#define PLUGIN_BUILTIN_BACKENDS KILN_BACKEND_BIT(KILN_BACKEND_CPU)
#endif

/* A CPU kernel compiled twice, for AVX2 and for the baseline, the clone
 * chosen at load by the CPU (libkiln is built for the baseline x86-64).
 * Static functions only; helpers it calls are inlined into each clone.
 * Not under TSan, whose runtime crashes in the ifunc resolvers. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PLUGIN_NO_CLONES 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define PLUGIN_NO_CLONES 1
#endif
#if defined(__x86_64__) && !defined(PLUGIN_NO_CLONES)
#define PLUGIN_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define PLUGIN_SIMD
#endif

/* AVX-512 kernels beside the portable ones (x86-64 with GCC or clang, not
 * where clones are off): PLUGIN_AVX512_FN functions run only where
 * plugin_has_avx512(). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PLUGIN_NO_CLONES)
#include <immintrin.h>
#define PLUGIN_AVX512 1
#define PLUGIN_AVX512_FN __attribute__((target("avx512f,fma")))

static inline int plugin_has_avx512(void) { return __builtin_cpu_supports("avx512f"); }

/* e^x on 16 floats: x = n·ln2 + r, |r| <= ln2/2, e^r by its Taylor
 * polynomial of degree 7 (relative error below 1e-8 before rounding),
 * times 2^n. Below -87 (and -inf) it is 0, not a subnormal: the weights of
 * keys far below the maximum (and of masked ones) would otherwise make
 * every FMA that reads them take a microcode assist. */
__attribute__((target("avx512f,fma"), always_inline)) static inline __m512 plugin_exp16(__m512 x)
{
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.5f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 e = _mm512_set1_ps(1.0f / 5040);
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 720));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 120));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 24));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f / 6));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(0.5f));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f));
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, e, n);
}
#endif

/* The field named `name` among schema-checked fields, or NULL. */
static inline const kiln_field *plugin_field(const kiln_field *fields, int32_t n, const char *name)
{
    for (int32_t i = 0; i < n; i++)
        if (strcmp(fields[i].name, name) == 0)
            return &fields[i];
    return NULL;
}

static inline float plugin_field_f32(const kiln_field *fields, int32_t n, const char *name, float dflt)
{
    const kiln_field *f = plugin_field(fields, n, name);
    return f ? ((const float *)f->data)[0] : dflt;
}

static inline int32_t plugin_field_i32(const kiln_field *fields, int32_t n, const char *name, int32_t dflt)
{
    const kiln_field *f = plugin_field(fields, n, name);
    return f ? ((const int32_t *)f->data)[0] : dflt;
}

static inline int64_t plugin_desc_count(const kiln_tensor_desc *d)
{
    int64_t n = 1;
    for (int32_t i = 0; i < d->dims.rank; i++)
        n *= d->dims.d[i];
    return n;
}

static inline int plugin_is_float(kiln_dtype t)
{
    return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16;
}

/* Element i of a float tensor as f32, and the reverse. */
static inline float plugin_load(const kiln_host_api *h, const void *p, kiln_dtype t, int64_t i)
{
    switch (t) {
    case KILN_DTYPE_F16: return h->half_to_float(((const uint16_t *)p)[i]);
    case KILN_DTYPE_BF16: return h->bf16_to_float(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline void plugin_store(const kiln_host_api *h, void *p, kiln_dtype t, int64_t i, float v)
{
    switch (t) {
    case KILN_DTYPE_F16: ((uint16_t *)p)[i] = h->float_to_half(v); break;
    case KILN_DTYPE_BF16: ((uint16_t *)p)[i] = h->float_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* Field schema entries with one value. */
#define PLUGIN_FIELD_REQUIRED(name, type, doc) \
    { \
        sizeof(kiln_field_spec), KILN_PLUGIN_ABI_VERSION, name, type, 1, 1, 0, NULL, 0, doc \
    }
#define PLUGIN_FIELD_OPTIONAL(name, type, dflt, doc) \
    { \
        sizeof(kiln_field_spec), KILN_PLUGIN_ABI_VERSION, name, type, 1, 0, 0, dflt, 1, doc \
    }

/* v rounded to the storage dtype t (no-op for f32): emulates frameworks
 * that round every intermediate to the model dtype. */
static inline float plugin_round(const kiln_host_api *h, kiln_dtype t, float v)
{
    switch (t) {
    case KILN_DTYPE_F16: return h->half_to_float(h->float_to_half(v));
    case KILN_DTYPE_BF16: return h->bf16_to_float(h->float_to_bf16(v));
    default: return v;
    }
}

/* The sum of squares of RMSNorm, in one fixed order: value i goes into
 * partial sum i % 8, and the eight are added pairwise. The partial sums
 * vectorize (a single running sum waits on each add), and kiln/RMSNorm
 * and kiln/FusedMatMul's prologue, which must agree bit for bit, both
 * sum this way: part holds the partial sums so far (zeros to begin). */
static inline void plugin_sum_squares_add(float part[8], int64_t i0, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i < n && (i0 + i) % 8; i++)
        part[(i0 + i) % 8] += x[i] * x[i];
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            part[k] += x[i + k] * x[i + k];
    for (; i < n; i++)
        part[(i0 + i) % 8] += x[i] * x[i];
}

static inline float plugin_sum_squares_total(const float part[8])
{
    return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

/* Built-ins keep their whole state in one flat struct without pointers,
 * so cloning is a copy and the blob is the bytes of their parameters. */
#include <stdlib.h>

static inline kiln_status plugin_pod_clone(const kiln_host_api *h, const kiln_plugin *self, size_t size,
                                           kiln_plugin **out)
{
    void *p = malloc(size);
    if (!p)
        return h->fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory cloning a plugin");
    memcpy(p, self, size);
    *out = p;
    return KILN_OK;
}

/* Serializes `size` bytes of parameters with the two-call protocol. */
static inline kiln_status plugin_pod_serialize(const kiln_host_api *h, const char *plugin, const void *params,
                                               size_t params_size, void *buf, size_t *size)
{
    if (buf) {
        if (*size < params_size)
            return h->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: serialize buffer of %zu bytes is too small (%zu needed)",
                           plugin, *size, params_size);
        if (params_size)
            memcpy(buf, params, params_size);
    }
    *size = params_size;
    return KILN_OK;
}

/* Checks a blob's version and size before its bytes are copied into params. */
static inline kiln_status plugin_pod_check_blob(const kiln_host_api *h, const char *plugin, uint32_t want_version,
                                                uint32_t version, size_t size, size_t params_size)
{
    if (version != want_version)
        return h->fail(KILN_ERROR_VERSION, "%s blob schema version %u is %s than this kiln reads (%u)", plugin, version,
                       version > want_version ? "newer" : "older", want_version);
    if (size != params_size)
        return h->fail(KILN_ERROR_FORMAT, "%s blob is %zu bytes, expected %zu", plugin, size, params_size);
    return KILN_OK;
}

/* Reads a blob of any schema version 1..want_version into params. Version v
 * holds the first sizes[v-1] bytes of params (fields are only ever appended);
 * the bytes an older blob lacks keep the caller's defaults. */
static inline kiln_status plugin_pod_read_blob(const kiln_host_api *h, const char *plugin, uint32_t want_version,
                                               const size_t *sizes, uint32_t version, const void *blob, size_t size,
                                               void *params)
{
    if (version < 1 || version > want_version)
        return h->fail(KILN_ERROR_VERSION, "%s blob schema version %u is %s than this kiln reads (1 to %u)", plugin,
                       version, version > want_version ? "newer" : "older", want_version);
    if (size != sizes[version - 1])
        return h->fail(KILN_ERROR_FORMAT, "%s blob v%u is %zu bytes, expected %zu", plugin, version, size,
                       sizes[version - 1]);
    /* A schema with no fields has an empty blob, possibly NULL. */
    if (size)
        memcpy(params, blob, size);
    return KILN_OK;
}

/* A float dtype named by a plugin field: f32, f16 or bf16; -1 for `dflt`
 * (the field's word for "as the input", e.g. "input"); -2 for any other
 * name (the caller reports it). */
static inline int32_t plugin_float_dtype_named(const char *name, const char *dflt)
{
    if (strcmp(name, dflt) == 0)
        return -1;
    return strcmp(name, "f32") == 0    ? KILN_DTYPE_F32
           : strcmp(name, "f16") == 0  ? KILN_DTYPE_F16
           : strcmp(name, "bf16") == 0 ? KILN_DTYPE_BF16
                                       : -2;
}

/* The quantize field of RMSNorm, AddRMSNorm and SwiGLU: "none" (0) or
 * "fp8" (1: y as E4M3 codes and a scale a row, kiln/Fp8MatMul's x); -1 for
 * any other word. */
static inline int32_t plugin_quantize_named(const char *name)
{
    return strcmp(name, "none") == 0 ? 0 : strcmp(name, "fp8") == 0 ? 1 : -1;
}

/* Bytes per element of a float dtype. */
static inline size_t plugin_float_size(kiln_dtype t) { return t == KILN_DTYPE_F32 ? 4 : 2; }

/* Registration of the built-ins (plugins/builtin.c). */
kiln_status kiln_rmsnorm_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_rope_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_swiglu_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_attention_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_qmatmul_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_qgather_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_sample_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_woq_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_fp8_register(const kiln_host_api *host, kiln_registry *reg);
kiln_status kiln_fusedmm_register(const kiln_host_api *host, kiln_registry *reg);

#endif
