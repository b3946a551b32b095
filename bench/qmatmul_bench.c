/* kiln/QuantMatMul on the CPU, per weight format:
 *  - decode: one row of x against a weight matrix of about 1 GiB (k = 4096,
 *    as many rows as fit; far larger than the caches), reported as GB/s of
 *    weight bytes read, to set beside bench/membw's read bandwidth;
 *  - prefill: 512 rows of x against 4096 x 4096 weights, reported as
 *    GFLOP/s (2 · rows · n · k per call), beside OpenBLAS sgemm on the same
 *    shape in f32 (what an engine built with f32 weights runs).
 * The kernels are the ones the plugin picks (KILN_QMATMUL_ISA and
 * KILN_QMATMUL_F32ACT apply). Weights are random blocks with sane scales.
 *
 * --decode-mib sets the decode weights' size: a few MiB stay in the caches
 * and show what the kernel itself can do, apart from DRAM.
 *
 *     qmatmul_bench [--threads N] [--reps N] [--formats Q4_K,Q6_K,...] [--decode-mib N]
 */
#include <cblas.h>
#include <kiln/kiln.h>
#include <kiln/plugin.h>
#include <kiln/registry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/scalar.h"
#include "core/threadpool.h"
#include "llm/gguf.h"

#include "bench_util.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* n rows of k values of `type`: random bytes, then every f16 scale (and
 * F16/BF16 value) set to something finite and small. */
static uint8_t *random_weights(uint32_t type, int64_t n, int64_t k, size_t *bytes)
{
    int64_t block = kiln_ggml_block_elements(type), nb = n * (k / block);
    size_t bb = kiln_ggml_block_bytes(type);
    *bytes = (size_t)nb * bb;
    uint8_t *w = malloc(*bytes);
    if (!w)
        return NULL;
    for (size_t i = 0; i + 8 <= *bytes; i += 8) {
        uint64_t r = next_u64();
        memcpy(w + i, &r, 8);
    }
    uint16_t d = kiln_f32_to_f16(0.002f);
    if (type == KILN_GGML_F16 || type == KILN_GGML_BF16) {
        uint16_t v = type == KILN_GGML_F16 ? d : kiln_f32_to_bf16(0.002f);
        for (size_t i = 0; i < *bytes; i += 2)
            w[i] = (uint8_t)v, w[i + 1] = (uint8_t)(v >> 8);
        return w;
    }
    size_t at = type == KILN_GGML_Q6_K ? 208 : 0;
    int min = type == KILN_GGML_Q4_1 || type == KILN_GGML_Q5_1 || type == KILN_GGML_Q4_K || type == KILN_GGML_Q5_K;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + (size_t)b * bb;
        p[at] = (uint8_t)d, p[at + 1] = (uint8_t)(d >> 8);
        if (min)
            p[2] = (uint8_t)d, p[3] = (uint8_t)(d >> 8);
    }
    return w;
}

/* Median seconds of one QuantMatMul call, rows x k by n x k. */
static int time_qmm(const kiln_plugin_creator *c, kiln_threadpool *pool, uint32_t type, int64_t rows, int64_t n,
                    int64_t k, int reps, double *sec, size_t *wbytes)
{
    const char *name = kiln_ggml_type_name(type);
    int32_t n32 = (int32_t)n, k32 = (int32_t)k;
    kiln_field f[3] = {{sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "format", KILN_FIELD_STRING, 1, name},
                       {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "n", KILN_FIELD_I32, 1, &n32},
                       {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "k", KILN_FIELD_I32, 1, &k32}};
    kiln_plugin *p = NULL;
    if (kiln_plugin_create(c, f, 3, &p) != KILN_OK) {
        fprintf(stderr, "qmatmul_bench: %s\n", kiln_last_error());
        return 1;
    }
    uint8_t *w = random_weights(type, n, k, wbytes);
    float *x = malloc(sizeof(float) * (size_t)(rows * k)), *y = malloc(sizeof(float) * (size_t)(rows * n));
    kiln_tensor_desc d[3] = {desc(KILN_DTYPE_F32, 2, (int64_t[]){rows, k}),
                             desc(KILN_DTYPE_U8, 2, (int64_t[]){n, (int64_t)(*wbytes / (size_t)n)}),
                             desc(KILN_DTYPE_F32, 2, (int64_t[]){rows, n})};
    size_t wsz = p->ops->workspace_size(p, d, 2, d + 2, 1);
    void *ws = malloc(wsz ? wsz : 1);
    int rc = 1;
    if (w && x && y && ws) {
        for (int64_t i = 0; i < rows * k; i++)
            x[i] = (float)((int64_t)(next_u64() % 2001) - 1000) / 1000.0f;
        const void *in[2] = {x, w};
        void *out[1] = {y};
        double t[64];
        rc = 0;
        for (int r = -1; r < reps && !rc; r++) {
            double t0 = now_s();
            rc = p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, 2, d + 2, out, 1, ws, pool) != KILN_OK;
            if (r >= 0)
                t[r] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof t[0], cmp_double);
        *sec = t[reps / 2];
    }
    free(ws);
    free(x);
    free(y);
    free(w);
    p->ops->destroy(p);
    return rc;
}

static double time_sgemm(int64_t rows, int64_t n, int64_t k, int reps)
{
    float *a = calloc((size_t)(rows * k), sizeof(float)), *b = calloc((size_t)(n * k), sizeof(float)),
          *c = calloc((size_t)(rows * n), sizeof(float));
    double t[64];
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)k, 1.0f, a, (int)k, b, (int)k,
                    0.0f, c, (int)n);
        if (r >= 0)
            t[r] = now_s() - t0;
    }
    free(a);
    free(b);
    free(c);
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

int main(int argc, char **argv)
{
    int threads = 0, reps = 5;
    double decode_mib = 1024;
    const char *list = "Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q4_K,Q5_K,Q6_K,F16,BF16";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc)
            list = argv[++i];
        else if (!strcmp(argv[i], "--decode-mib") && i + 1 < argc && atof(argv[i + 1]) > 0)
            decode_mib = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: qmatmul_bench [--threads N] [--reps N (1-64)] [--formats Q4_K,Q6_K,...] "
                            "[--decode-mib N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 64) { /* the timings are kept in arrays of 64 */
        fprintf(stderr, "qmatmul_bench: --reps must be 1..64, not %d\n", reps);
        return 2;
    }
    kiln_registry *reg = NULL;
    kiln_threadpool *pool = NULL;
    if (kiln_registry_create(&reg) != KILN_OK || kiln_threadpool_create(threads, &pool) != KILN_OK) {
        fprintf(stderr, "qmatmul_bench: %s\n", kiln_last_error());
        return 1;
    }
    const kiln_plugin_creator *c = kiln_registry_find(reg, "QuantMatMul", "1", "kiln", NULL);
    const int64_t k = 4096, pre_rows = 512, pre_n = 4096;
    openblas_set_num_threads(kiln_threadpool_size(pool));
    double blas = time_sgemm(pre_rows, pre_n, k, reps);
    printf(
        "threads %d, isa %s, f32 activations %s; decode: 1 row, ~%.0f MiB of weights, k %lld; prefill: %lld x %lld x "
        "%lld\n",
        kiln_threadpool_size(pool), getenv("KILN_QMATMUL_ISA") ? getenv("KILN_QMATMUL_ISA") : "best",
        getenv("KILN_QMATMUL_F32ACT") ? getenv("KILN_QMATMUL_F32ACT") : "0", decode_mib, (long long)k,
        (long long)pre_rows, (long long)pre_n, (long long)k);
    printf("%-6s %8s %14s %16s\n", "format", "bits/w", "decode GB/s", "prefill GFLOP/s");
    printf("%-6s %8s %14s %16.1f\n", "sgemm", "32.0", "-", 2.0 * pre_rows * pre_n * k / blas / 1e9);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    int rc = 0;
    for (char *save = NULL, *name = strtok_r(buf, ",", &save); name && !rc; name = strtok_r(NULL, ",", &save)) {
        uint32_t type = 0;
        while (type < 64 && (!kiln_ggml_type_name(type) || strcmp(kiln_ggml_type_name(type), name) != 0))
            type++;
        if (type == 64) {
            fprintf(stderr, "qmatmul_bench: unknown format %s\n", name);
            return 2;
        }
        double bits = 8.0 * (double)kiln_ggml_block_bytes(type) / (double)kiln_ggml_block_elements(type);
        int64_t n_dec = (int64_t)(decode_mib * (1 << 20) * 8.0 / bits / (double)k);
        double t_dec, t_pre;
        size_t wb_dec, wb_pre;
        rc = time_qmm(c, pool, type, 1, n_dec, k, reps, &t_dec, &wb_dec) ||
             time_qmm(c, pool, type, pre_rows, pre_n, k, reps, &t_pre, &wb_pre);
        if (!rc)
            printf("%-6s %8.2f %14.2f %16.1f\n", name, bits, (double)wb_dec / t_dec / 1e9,
                   2.0 * pre_rows * pre_n * k / t_pre / 1e9);
        fflush(stdout);
    }
    kiln_threadpool_destroy(pool);
    kiln_registry_destroy(reg);
    return rc;
}
