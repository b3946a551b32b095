/* kiln/PagedAttention's decode step on the CPU, at the shapes of the
 * default model (SmolLM2-135M: 9 query heads, 3 kv heads, head_dim 64, 30
 * layers) and of bench/make_gguf_1b.py's 1B (32 / 8 heads, head_dim 64, 16
 * layers): one new token of one sequence against a context of --ctx keys
 * (default 540: a 512-token prompt and some tokens generated), each layer
 * its own f16 cache in blocks of 16 tokens and its own packed qkv row, as
 * an engine runs them.
 *
 *   attention_cpu_bench [--threads N] [--reps N] [--ctx N] [--ct f16|f32]
 *
 * Three figures a shape, each the median over --reps steps of the summed
 * time of every layer's call (and the 25th-75th percentiles):
 *  - l2: every layer's call reads layer 0's cache (414 KB for SmolLM2 at
 *    540 keys), which stays in L2: the kernel's own speed;
 *  - hot: the layers' calls one after another, nothing else between them
 *    (the step's caches, 12.4 MB for SmolLM2 at 540 keys, stay in the last
 *    level cache);
 *  - cold: between two layers' calls a fresh 4 MB slice of a 256 MB buffer
 *    is read (not timed), about the weight bytes a decode step streams
 *    between two attentions, so each layer's cache comes from DRAM.
 * GB/s is the cache bytes the step reads over its time. The kernels are
 * the ones the plugin picks (KILN_ATTENTION_ISA applies). */
#include <kiln/kiln.h>
#include <kiln/plugin.h>
#include <kiln/registry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/scalar.h"
#include "core/threadpool.h"

#include "bench_util.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float next_f(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((int64_t)(rng % 2001) - 1000) / 1000.0f;
}

static kiln_field fi32(const char *name, const int32_t *v)
{
    kiln_field f = {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_I32, 1, v};
    return f;
}

typedef struct shape {
    const char *name;
    int32_t nh, nkv, hd, layers;
} shape;

static volatile float sink;

/* Reads 4 MB of the eviction buffer, a new slice each call. */
static void evict(const float *buf, size_t n, size_t *at)
{
    const size_t slice = (4u << 20) / sizeof(float);
    float s = 0.0f;
    if (*at + slice > n)
        *at = 0;
    for (size_t i = *at; i < *at + slice; i += 16)
        s += buf[i];
    *at += slice;
    sink = s;
}

/* --compare NAME=v1,v2,...: each step is run once with each value of the
 * environment variable NAME, one after the other */
static const char *var_name;
static char *var_values[8];
static int nv = 1;

static int run_shape(const kiln_plugin_creator *c, kiln_threadpool *pool, const shape *sh, int64_t ctx, kiln_dtype ct,
                     int reps, const float *evbuf, size_t ev_n)
{
    const int32_t bs = 16, one = 1;
    kiln_field f[5] = {fi32("n_heads", &sh->nh), fi32("n_kv_heads", &sh->nkv), fi32("head_dim", &sh->hd),
                       fi32("block_size", &bs), fi32("packed_qkv", &one)};
    kiln_plugin *p = NULL;
    if (kiln_plugin_create(c, f, 5, &p) != KILN_OK) {
        fprintf(stderr, "attention_cpu_bench: %s\n", kiln_last_error());
        return 1;
    }
    const int64_t L = sh->layers, blocks = (ctx + bs - 1) / bs, width = (int64_t)(sh->nh + 2 * sh->nkv) * sh->hd;
    const int64_t cache_n = blocks * 2 * sh->nkv * bs * sh->hd;
    const size_t es = ct == KILN_DTYPE_F16 ? 2 : 4;
    int64_t dq[2] = {1, width}, dc[5] = {blocks, 2, sh->nkv, bs, sh->hd}, dt[2] = {1, blocks}, ds[1] = {1},
            dqs[1] = {2}, dout[2] = {1, (int64_t)sh->nh * sh->hd};
    kiln_tensor_desc d[6] = {desc(KILN_DTYPE_F32, 2, dq),  desc(ct, 5, dc),
                             desc(KILN_DTYPE_I32, 2, dt),  desc(KILN_DTYPE_I32, 1, ds),
                             desc(KILN_DTYPE_I32, 1, dqs), desc(KILN_DTYPE_F32, 2, dout)};
    size_t ws_size = p->ops->workspace_size(p, d, 5, d + 5, 1);
    void *ws = malloc(ws_size ? ws_size : 1);
    float *qkv = malloc(sizeof(float) * (size_t)(L * width)), *out = malloc(sizeof(float) * (size_t)dout[1]);
    unsigned char *cache = malloc((size_t)(L * cache_n) * es);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)blocks), seq_len = (int32_t)ctx, qstart[2] = {0, 1};
    /* t[(mode * nv + variant) * reps + rep] */
    double *t = malloc(sizeof(double) * (size_t)(3 * nv * reps)), *ratio = malloc(sizeof(double) * (size_t)reps);
    double *sorted = malloc(sizeof(double) * (size_t)reps);
    int rc = !(ws && qkv && out && cache && table && t && ratio && sorted);
    for (int64_t i = 0; !rc && i < L * width; i++)
        qkv[i] = next_f();
    for (int64_t i = 0; !rc && i < L * cache_n; i++) {
        float x = 2.0f * next_f();
        if (ct == KILN_DTYPE_F16) {
            uint16_t h = kiln_f32_to_f16(x);
            memcpy(cache + (size_t)i * 2, &h, 2);
        } else
            memcpy(cache + (size_t)i * 4, &x, 4);
    }
    for (int64_t b = 0; !rc && b < blocks; b++)
        table[b] = (int32_t)b;
    size_t at = 0;
    for (int mode = 0; mode < 3 && !rc; mode++)
        for (int r = -2; r < reps && !rc; r++)
            for (int v = 0; v < nv && !rc; v++) {
                if (var_name)
                    setenv(var_name, var_values[v], 1);
                double sum = 0;
                for (int64_t l = 0; l < L && !rc; l++) {
                    if (mode == 2)
                        evict(evbuf, ev_n, &at);
                    const void *in[5] = {qkv + l * width, cache + (size_t)(mode ? l * cache_n : 0) * es, table,
                                         &seq_len, qstart};
                    void *o[1] = {out};
                    double t0 = now_s();
                    rc = p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, 5, d + 5, o, 1, ws, pool) != KILN_OK;
                    sum += now_s() - t0;
                }
                if (r >= 0)
                    t[(mode * nv + v) * reps + r] = sum;
            }
    /* each call reads every key and value row once (the append writes one) */
    const double bytes = (double)L * (double)ctx * 2.0 * sh->nkv * sh->hd * (double)es;
    for (int v = 0; v < nv && !rc; v++) {
        printf("%-8s %6lld %5s %-10s", sh->name, (long long)ctx, ct == KILN_DTYPE_F16 ? "f16" : "f32",
               var_name ? var_values[v] : "-");
        for (int mode = 0; mode < 3; mode++) {
            double *tv = t + (mode * nv + v) * reps, *t0 = t + mode * nv * reps;
            for (int r = 0; r < reps; r++)
                ratio[r] = tv[r] / t0[r];
            qsort(ratio, (size_t)reps, sizeof ratio[0], cmp_double);
            memcpy(sorted, tv, sizeof(double) * (size_t)reps);
            qsort(sorted, (size_t)reps, sizeof sorted[0], cmp_double);
            const double q[3] = {sorted[reps / 4], sorted[reps / 2], sorted[3 * reps / 4]};
            printf(" | %6.3f (%.3f-%.3f) %5.1f", q[1] * 1e3, q[0] * 1e3, q[2] * 1e3, bytes / q[1] / 1e9);
            if (v > 0)
                printf(" x%.3f (%.3f-%.3f)", ratio[reps / 2], ratio[reps / 4], ratio[3 * reps / 4]);
        }
        printf("\n");
    }
    if (rc)
        fprintf(stderr, "attention_cpu_bench: %s\n", kiln_last_error());
    free(ws), free(qkv), free(out), free(cache), free(table), free(t), free(ratio), free(sorted);
    p->ops->destroy(p);
    return rc;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 41;
    int64_t ctx = 540;
    kiln_dtype ct = KILN_DTYPE_F16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            ctx = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--compare") && i + 1 < argc && strchr(argv[i + 1], '=')) {
            char *eq = strchr(argv[++i], '=');
            *eq = '\0';
            var_name = argv[i];
            nv = 0;
            for (char *save = NULL, *v = strtok_r(eq + 1, ",", &save); v && nv < 8; v = strtok_r(NULL, ",", &save))
                var_values[nv++] = v;
            nv = nv ? nv : 1;
        } else if (!strcmp(argv[i], "--ct") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "f16") || !strcmp(argv[i + 1], "f32")))
            ct = !strcmp(argv[++i], "f16") ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        else {
            fprintf(stderr, "usage: attention_cpu_bench [--threads N] [--reps N] [--ctx N (1-65536)] [--ct f16|f32] "
                            "[--compare NAME=v1,v2,...]\n");
            return 2;
        }
    }
    if (reps < 4 || reps > 10000)
        reps = 41;
    if (ctx < 1 || ctx > 65536)
        ctx = 540;
    kiln_registry *reg = NULL;
    kiln_threadpool *pool = NULL;
    if (kiln_registry_create(&reg) != KILN_OK || kiln_threadpool_create(threads, &pool) != KILN_OK) {
        fprintf(stderr, "attention_cpu_bench: %s\n", kiln_last_error());
        return 1;
    }
    const kiln_plugin_creator *c = kiln_registry_find(reg, "PagedAttention", "1", "kiln", NULL);
    const size_t ev_n = (256u << 20) / sizeof(float);
    float *evbuf = malloc(ev_n * sizeof(float));
    if (!c || !evbuf) {
        fprintf(stderr, "attention_cpu_bench: no PagedAttention or out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < ev_n; i++)
        evbuf[i] = (float)(i & 255);
    static const shape shapes[2] = {{"smollm2", 9, 3, 64, 30}, {"1b", 32, 8, 64, 16}};
    printf("threads %d, isa %s; ms a decode step (all layers' attention), median (p25-p75), and cache GB/s\n",
           kiln_threadpool_size(pool), getenv("KILN_ATTENTION_ISA") ? getenv("KILN_ATTENTION_ISA") : "best");
    printf("shape keys cache variant | l2: ms (p25-p75) GB/s [xratio to the first variant, paired] | hot: ... | cold: "
           "...\n");
    int rc = 0;
    for (int s = 0; s < 2 && !rc; s++)
        rc = run_shape(c, pool, &shapes[s], ctx, ct, reps, evbuf, ev_n);
    free(evbuf);
    kiln_threadpool_destroy(pool);
    kiln_registry_destroy(reg);
    return rc;
}
