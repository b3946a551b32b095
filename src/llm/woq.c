/* Weight-only quantized weights: round-to-nearest at build, AWQ and GPTQ
 * unpacking (llm/woq.h). */
#include "llm/woq.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fp8.h"
#include "core/threadpool.h"

kiln_status kiln_woq_alloc(kiln_woq_weight *w, int32_t bits, int32_t group, int64_t n, int64_t k, const char *what)
{
    memset(w, 0, sizeof *w);
    if (bits != 8 && bits != 4)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: %d-bit weights are not supported (8 or 4)", what, bits);
    if (n <= 0 || k <= 0 || k % 32 != 0 || n > (1 << 30) || k > (1 << 30))
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "%s: shape [%lld, %lld] cannot be quantized: k must be a multiple of 32", what, (long long)n,
                         (long long)k);
    if (group <= 0 || group % 32 != 0 || k % group != 0)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: group size %d must be a multiple of 32 that divides %lld", what,
                         group, (long long)k);
    w->bits = bits, w->group = group, w->n = n, w->k = k;
    w->q = calloc(kiln_woq_q_bytes(w), 1);
    w->scales = calloc(kiln_woq_groups(w), sizeof(float));
    w->zeros = bits == 4 ? calloc(kiln_woq_groups(w), 1) : NULL;
    if (!w->q || !w->scales || (bits == 4 && !w->zeros)) {
        kiln_woq_free(w);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory quantizing [%lld, %lld]", what, (long long)n,
                         (long long)k);
    }
    return KILN_OK;
}

void kiln_woq_free(kiln_woq_weight *w)
{
    if (!w)
        return;
    free(w->q);
    free(w->scales);
    free(w->zeros);
    memset(w, 0, sizeof *w);
}

size_t kiln_woq_q_bytes(const kiln_woq_weight *w) { return (size_t)w->n * (size_t)w->k * (size_t)w->bits / 8; }

size_t kiln_woq_groups(const kiln_woq_weight *w) { return (size_t)w->n * (size_t)(w->k / w->group); }

static void set_q4(kiln_woq_weight *w, int64_t r, int64_t i, int v)
{
    uint8_t *b = w->q + r * (w->k / 2) + i / 2;
    *b = (uint8_t)(i & 1 ? (*b & 0x0F) | v << 4 : (*b & 0xF0) | v);
}

/* Rows quantize independently, so a build spreads them over the process's
 * thread pool (an 8B checkpoint has seven billion weights); the lowest
 * row holding a NaN or an infinity is reported. */
typedef struct quant_job {
    const float *src;
    int64_t k;
    int32_t bits, group;
    kiln_woq_weight *w; /* kiln_woq_quantize */
    uint8_t *codes;     /* kiln_fp8_quantize */
    float *scales;
    _Atomic int64_t bad; /* the lowest such row, or INT64_MAX */
} quant_job;

static void note_bad(quant_job *j, int64_t r)
{
    int64_t cur = atomic_load(&j->bad);
    while (r < cur && !atomic_compare_exchange_weak(&j->bad, &cur, r)) {
    }
}

/* Runs fn over the job's n rows on the pool; the error names the lowest
 * row that held a NaN or an infinity. */
static kiln_status quant_run(quant_job *j, int64_t n, kiln_parallel_fn fn, const char *what)
{
    atomic_init(&j->bad, INT64_MAX);
    kiln_threadpool_run(kiln_threadpool_global(), n, fn, j);
    int64_t bad = atomic_load(&j->bad);
    if (bad != INT64_MAX)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: row %lld holds a NaN or infinity", what, (long long)bad);
    return KILN_OK;
}

static void woq_rows(void *arg, int64_t begin, int64_t end)
{
    quant_job *j = arg;
    kiln_woq_weight *wp = j->w;
    const int64_t k = j->k, ng = k / j->group;
    const int32_t group = j->group, bits = j->bits;
    for (int64_t r = begin; r < end; r++)
        for (int64_t g = 0; g < ng; g++) {
            const float *x = j->src + r * k + g * group;
            float lo = 0, hi = 0;
            int finite = 1;
            for (int32_t i = 0; i < group; i++) {
                lo = x[i] < lo ? x[i] : lo;
                hi = x[i] > hi ? x[i] : hi;
                finite &= isfinite(x[i]) != 0;
            }
            if (!finite) {
                note_bad(j, r);
                break;
            }
            /* w / s divided, not multiplied by 1 / s: the rounded
             * reciprocal moves values that sit on a half (a group with
             * max = -min has z = 7.5) to the other side */
            if (bits == 8) {
                float amax = -lo > hi ? -lo : hi, s = amax / 127.0f;
                wp->scales[r * ng + g] = s;
                for (int32_t i = 0; i < group; i++) {
                    float q = s > 0 ? roundf(x[i] / s) : 0.0f;
                    wp->q[r * k + g * group + i] = (uint8_t)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
                }
                continue;
            }
            float s = (hi - lo) / 15.0f;
            float zf = s > 0 ? roundf(-lo / s) : 0.0f;
            int z = zf > 15 ? 15 : zf < 0 ? 0 : (int)zf;
            wp->scales[r * ng + g] = s;
            wp->zeros[r * ng + g] = (uint8_t)z;
            for (int32_t i = 0; i < group; i++) {
                float q = (s > 0 ? roundf(x[i] / s) : 0.0f) + (float)z;
                set_q4(wp, r, g * group + i, q > 15 ? 15 : q < 0 ? 0 : (int)q);
            }
        }
}

kiln_status kiln_woq_quantize(const float *src, int64_t n, int64_t k, int32_t bits, int32_t group, const char *what,
                              kiln_woq_weight *out)
{
    kiln_woq_weight w;
    KILN_TRY(kiln_woq_alloc(&w, bits, group, n, k, what));
    quant_job j = {.src = src, .k = k, .bits = bits, .group = group, .w = &w};
    kiln_status st = quant_run(&j, n, woq_rows, what);
    if (st != KILN_OK) {
        kiln_woq_free(&w);
        return st;
    }
    *out = w;
    return KILN_OK;
}

static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7};

kiln_status kiln_woq_from_awq(const int32_t *qweight, const int32_t *qzeros, const float *scales, int64_t n, int64_t k,
                              int32_t group, const char *what, kiln_woq_weight *out)
{
    if (n % 8 != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: AWQ output features %lld are not a multiple of 8", what, (long long)n);
    kiln_woq_weight w;
    KILN_TRY(kiln_woq_alloc(&w, 4, group, n, k, what));
    const int64_t ng = k / group, words = n / 8;
    for (int64_t i = 0; i < k; i++)
        for (int64_t c = 0; c < words; c++) {
            uint32_t v = (uint32_t)qweight[i * words + c];
            for (int j = 0; j < 8; j++)
                set_q4(&w, c * 8 + awq_order[j], i, (int)(v >> (4 * j) & 0xF));
        }
    for (int64_t g = 0; g < ng; g++)
        for (int64_t c = 0; c < words; c++) {
            uint32_t v = (uint32_t)qzeros[g * words + c];
            for (int j = 0; j < 8; j++)
                w.zeros[(c * 8 + awq_order[j]) * ng + g] = (uint8_t)(v >> (4 * j) & 0xF);
        }
    for (int64_t g = 0; g < ng; g++)
        for (int64_t o = 0; o < n; o++)
            w.scales[o * ng + g] = scales[g * n + o];
    *out = w;
    return KILN_OK;
}

kiln_status kiln_woq_from_gptq(const int32_t *qweight, const int32_t *qzeros, const float *scales, const int32_t *g_idx,
                               int64_t n, int64_t k, int32_t group, int32_t n_groups, int32_t zero_offset,
                               const char *what, kiln_woq_weight *out)
{
    if (n % 8 != 0 || k % 8 != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: GPTQ shape [%lld, %lld] is not in multiples of 8", what, (long long)n,
                         (long long)k);
    if (k / group != n_groups)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: GPTQ has %d groups, %lld inputs in groups of %d make %lld", what,
                         n_groups, (long long)k, group, (long long)(k / group));
    for (int64_t i = 0; g_idx && i < k; i++)
        if (g_idx[i] != i / group)
            return kiln_fail(KILN_ERROR_UNSUPPORTED,
                             "%s: g_idx[%lld] = %d, not input / group_size: act-order (desc_act) GPTQ checkpoints "
                             "with reordered groups are not supported",
                             what, (long long)i, g_idx[i]);
    kiln_woq_weight w;
    KILN_TRY(kiln_woq_alloc(&w, 4, group, n, k, what));
    const int64_t ng = n_groups, words = n / 8;
    for (int64_t r = 0; r < k / 8; r++)
        for (int64_t o = 0; o < n; o++) {
            uint32_t v = (uint32_t)qweight[r * n + o];
            for (int j = 0; j < 8; j++)
                set_q4(&w, o, r * 8 + j, (int)(v >> (4 * j) & 0xF));
        }
    for (int64_t g = 0; g < ng; g++)
        for (int64_t c = 0; c < words; c++) {
            uint32_t v = (uint32_t)qzeros[g * words + c];
            for (int j = 0; j < 8; j++) {
                /* v1's z − 1 wraps a zero of 0 to 15: read back as 16, as
                 * GPTQ's own kernels do (no mask after the + 1) */
                int z = (int)(v >> (4 * j) & 0xF) + zero_offset;
                w.zeros[(c * 8 + j) * ng + g] = (uint8_t)z;
            }
        }
    for (int64_t g = 0; g < ng; g++)
        for (int64_t o = 0; o < n; o++)
            w.scales[o * ng + g] = scales[g * n + o];
    *out = w;
    return KILN_OK;
}

void kiln_woq_dequantize(const kiln_woq_weight *w, float *dst)
{
    const int64_t ng = w->k / w->group;
    for (int64_t r = 0; r < w->n; r++)
        for (int64_t i = 0; i < w->k; i++) {
            int64_t g = r * ng + i / w->group;
            if (w->bits == 8) {
                dst[r * w->k + i] = w->scales[g] * (float)(int8_t)w->q[r * w->k + i];
            } else {
                uint8_t b = w->q[r * (w->k / 2) + i / 2];
                int v = i & 1 ? b >> 4 : b & 0x0F;
                dst[r * w->k + i] = w->scales[g] * (float)(v - w->zeros[g]);
            }
        }
}

static void fp8_rows(void *arg, int64_t begin, int64_t end)
{
    quant_job *j = arg;
    const int64_t k = j->k;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->src + r * k;
        float a = 0;
        int64_t i = 0;
        for (; i < k && isfinite(x[i]); i++)
            a = fabsf(x[i]) > a ? fabsf(x[i]) : a;
        if (i < k) {
            note_bad(j, r);
            continue;
        }
        float inv = a > 0 ? KILN_E4M3_MAX / a : 0.0f;
        j->scales[r] = a / KILN_E4M3_MAX;
        for (i = 0; i < k; i++)
            j->codes[r * k + i] = kiln_f32_to_e4m3(x[i] * inv);
    }
}

kiln_status kiln_fp8_quantize(const float *w, int64_t n, int64_t k, const char *what, uint8_t *codes, float *scales)
{
    quant_job j = {.src = w, .k = k, .codes = codes, .scales = scales};
    return quant_run(&j, n, fp8_rows, what);
}
