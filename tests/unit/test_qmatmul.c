/* kiln/QuantMatMul against kiln_ggml_dequantize (itself bit-compared with
 * the gguf package in test_gguf.c), for every format (Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16) on every kernel set (portable
 * C, AVX2, AVX-512 VNNI where the CPU has them), with one row of x (decode)
 * and many (the four-row GEMM kernels and their remainders):
 *  - f32 activations (KILN_QMATMUL_F32ACT=1, and always for F16/BF16):
 *    per-weight formulas exactly, products within 1e-5 of Σ|x·w| of a
 *    double-precision dot over the dequantized weights;
 *  - 8-bit activations (the default): exact where every product and sum is
 *    representable (integer x with a 127 in each activation block,
 *    power-of-two scales, small sub-scales), else within the quantization
 *    bound d/2 · Σ|w| per activation block (32 values, 256 for the K
 *    formats; d = max|x| / 127 of ggml's Q8 formula) plus 1e-5 of Σ|x·w|;
 *  - each SIMD kernel set against the portable C one on the same input;
 *  - Q8_0, Q4_0, Q4_1, Q4_K and Q6_K weights in the row-panel layout (kiln_qmm_panel_pack,
 *    what CPU engines hold) through the same checks on every path: the
 *    panel GEMV, the GEMM and the row kernels reading them as stored;
 *  - the panel GEMVs against the portable C kernel at the inputs' extremes
 *    (the largest integer sums), with and without GFNI. */
#include "test.h"

#include <kiln/plugin.h>

#include "core/threadpool.h"
#include "llm/gguf.h"
#include "qmatmul/qmatmul_cpu.h"
#include "llm/llm_config.h"

typedef struct fmt {
    const char *name;
    uint32_t type;
    int32_t block;      /* elements per block (F16/BF16: counted by 32) */
    size_t block_bytes; /* bytes per block */
    int32_t act_block;  /* elements per 8-bit activation block; 0: f32 activations */
} fmt;

static const fmt fmts[] = {{"Q8_0", KILN_GGML_Q8_0, 32, 34, 32},    {"Q4_0", KILN_GGML_Q4_0, 32, 18, 32},
                           {"Q4_1", KILN_GGML_Q4_1, 32, 20, 32},    {"Q5_0", KILN_GGML_Q5_0, 32, 22, 32},
                           {"Q5_1", KILN_GGML_Q5_1, 32, 24, 32},    {"Q4_K", KILN_GGML_Q4_K, 256, 144, 256},
                           {"Q5_K", KILN_GGML_Q5_K, 256, 176, 256}, {"Q6_K", KILN_GGML_Q6_K, 256, 210, 256},
                           {"F16", KILN_GGML_F16, 32, 64, 0},       {"BF16", KILN_GGML_BF16, 32, 64, 0}};
#define N_FMTS (sizeof fmts / sizeof fmts[0])

static uint32_t rng = 12345;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() >> 8) / 16777216.0f; }

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = kiln_host()->float_to_half(v);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

/* Where a block keeps its f16 scale d and (Q4_1, Q5_1, Q4_K, Q5_K) its
 * min or dmin; -1 for none. */
static int d_at(const fmt *f) { return f->type == KILN_GGML_Q6_K ? 208 : 0; }
static int m_at(const fmt *f)
{
    uint32_t t = f->type;
    return t == KILN_GGML_Q4_1 || t == KILN_GGML_Q5_1 || t == KILN_GGML_Q4_K || t == KILN_GGML_Q5_K ? 2 : -1;
}

/* n rows of k values in random blocks: random quant bytes (every pattern
 * is valid, sub-scales included), f16 scales in a realistic range (Q4_1 /
 * Q5_1 mins negative, K dmins positive, as trained weights have); F16 and
 * BF16 as random values in [-1, 1]. */
static uint8_t *random_blocks(const fmt *f, int32_t n, int32_t k)
{
    size_t nb = (size_t)n * (size_t)(k / f->block);
    uint8_t *b = malloc(nb * f->block_bytes);
    if (f->act_block == 0) {
        for (size_t i = 0; i < nb * 32; i++) {
            float v = uniform(-1, 1);
            uint16_t h = f->type == KILN_GGML_F16 ? kiln_host()->float_to_half(v) : kiln_host()->float_to_bf16(v);
            b[2 * i] = (uint8_t)h, b[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return b;
    }
    for (size_t i = 0; i < nb; i++) {
        uint8_t *p = b + i * f->block_bytes;
        for (size_t j = 0; j < f->block_bytes; j++)
            p[j] = (uint8_t)next_u32();
        int big = f->block == 256; /* K: d multiplies a sub-scale of up to 63 */
        put_f16(p + d_at(f), uniform(0.001f, 0.05f) / (big ? 32.0f : 1.0f));
        if (m_at(f) >= 0)
            put_f16(p + m_at(f), big ? uniform(0.0f, 0.01f) : uniform(-0.4f, 0.0f));
    }
    return b;
}

static kiln_field fstr(const char *name, const char *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_STRING, 1, v};
}
static kiln_field fi32(const char *name, const int32_t *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_I32, 1, v};
}

static const kiln_plugin_creator *creator(kiln_registry **reg)
{
    CHECK_OK(kiln_registry_create(reg));
    const kiln_plugin_creator *c = kiln_registry_find(*reg, "QuantMatMul", "1", "kiln", NULL);
    CHECK(c != NULL);
    return c;
}

/* 1: make() and run() put Q4_0/Q4_1 weights in panels (n a multiple of 16). */
static int32_t panels_on;

static int panel_fmt(const char *format)
{
    return !strcmp(format, "Q8_0") || !strcmp(format, "Q4_0") || !strcmp(format, "Q4_1") || !strcmp(format, "Q4_K") ||
           !strcmp(format, "Q6_K");
}

static kiln_status make(const kiln_plugin_creator *c, const char *format, int32_t n, int32_t k, kiln_plugin **p)
{
    int32_t one = 1;
    kiln_field f[4] = {fstr("format", format), fi32("n", &n), fi32("k", &k), fi32("panels", &one)};
    return kiln_plugin_create(c, f, panels_on && panel_fmt(format) ? 4 : 3, p);
}

static kiln_tensor_desc desc(kiln_dtype t, int64_t d0, int64_t d1)
{
    kiln_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.abi_version = KILN_PLUGIN_ABI_VERSION;
    d.dtype = t;
    d.dims.rank = 2;
    d.dims.d[0] = d0;
    d.dims.d[1] = d1;
    return d;
}

static kiln_status run(kiln_plugin *p, const fmt *f, const float *x, int32_t t, int32_t k, const uint8_t *w, int32_t n,
                       float *y, void *stream)
{
    kiln_tensor_desc d[3] = {desc(KILN_DTYPE_F32, t, k),
                             desc(KILN_DTYPE_U8, n, (int64_t)(k / f->block) * (int64_t)f->block_bytes),
                             desc(KILN_DTYPE_F32, t, n)};
    uint8_t *packed = NULL;
    if (panels_on && panel_fmt(f->name)) {
        packed = malloc((size_t)n * (size_t)(k / f->block) * f->block_bytes);
        kiln_qmm_panel_pack(kiln_qmm_format_named(f->name), w, n, k, packed);
    }
    const void *in[2] = {x, packed ? packed : w};
    void *out[1] = {y};
    size_t wsz = p->ops->workspace_size(p, d, 2, d + 2, 1);
    void *ws = wsz ? malloc(wsz) : NULL;
    kiln_status s = p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, 2, d + 2, out, 1, ws, stream);
    free(ws);
    free(packed);
    return s;
}

/* x = e_j picks weight (row, j) out unchanged: the plugin's per-block
 * dequantization equals kiln_ggml_dequantize bit for bit (but for the sign
 * of a zero: Q6_K's negative scales make -0, which a sum starting at +0
 * returns as +0). */
static void check_formulas(const kiln_plugin_creator *c, const fmt *f, void *pool)
{
    const int32_t n = 5, k = f->block == 256 ? 256 : 64;
    uint8_t *w = random_blocks(f, n, k);
    float *wf = malloc(sizeof(float) * (size_t)(n * k)), x[256], y[5];
    CHECK_OK(kiln_ggml_dequantize(f->type, w, (int64_t)n * k, wf));
    kiln_plugin *p = NULL;
    CHECK_OK(make(c, f->name, n, k, &p));
    int exact = 1;
    for (int32_t j = 0; j < k && p; j++) {
        memset(x, 0, sizeof x);
        x[j] = 1.0f;
        CHECK_OK(run(p, f, x, 1, k, w, n, y, pool));
        for (int32_t r = 0; r < n; r++)
            exact &= memcmp(&y[r], &wf[r * k + j], sizeof(float)) == 0 || (y[r] == 0 && wf[r * k + j] == 0);
    }
    if (!exact)
        fprintf(stderr, "%s: a weight differs from kiln_ggml_dequantize\n", f->name);
    CHECK(exact);
    if (p)
        p->ops->destroy(p);
    free(wf);
    free(w);
}

/* y against a double dot over the dequantized weights, for several T. */
static void check_products(const kiln_plugin_creator *c, const fmt *f, int32_t k, int32_t n, void *pool)
{
    const int32_t ts[] = {1, 3, 17};
    uint8_t *w = random_blocks(f, n, k);
    float *wf = malloc(sizeof(float) * (size_t)n * (size_t)k);
    CHECK_OK(kiln_ggml_dequantize(f->type, w, (int64_t)n * k, wf));
    kiln_plugin *p = NULL;
    CHECK_OK(make(c, f->name, n, k, &p));
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0] && p; ti++) {
        int32_t t = ts[ti];
        float *x = malloc(sizeof(float) * (size_t)t * (size_t)k), *y = malloc(sizeof(float) * (size_t)t * (size_t)n);
        for (int64_t i = 0; i < (int64_t)t * k; i++)
            x[i] = uniform(-1, 1);
        CHECK_OK(run(p, f, x, t, k, w, n, y, pool));
        double worst = 0;
        for (int32_t r = 0; r < t; r++)
            for (int32_t o = 0; o < n; o++) {
                double ref = 0, mag = 0;
                for (int32_t j = 0; j < k; j++) {
                    double v = (double)x[(int64_t)r * k + j] * wf[(int64_t)o * k + j];
                    ref += v;
                    mag += fabs(v);
                }
                double e = fabs(y[(int64_t)r * n + o] - ref) / mag;
                worst = e > worst ? e : worst;
            }
        if (!(worst <= 1e-5))
            fprintf(stderr, "%s k %d n %d t %d: error %.3g of sum |x*w|\n", f->name, k, n, t, worst);
        CHECK(worst <= 1e-5);
        free(x);
        free(y);
    }
    if (p)
        p->ops->destroy(p);
    free(wf);
    free(w);
}

/* body on each kernel set, with f32 (f32act) or 8-bit activations. */
static void each_kernel(void (*body)(const kiln_plugin_creator *, void *), int f32act)
{
    kiln_registry *reg = NULL;
    const kiln_plugin_creator *c = creator(&reg);
    kiln_threadpool *pool = NULL;
    CHECK_OK(kiln_threadpool_create(2, &pool));
    const char *isas[4] = {"c", "avx2", "avx512", "best"};
    setenv("KILN_QMATMUL_F32ACT", f32act ? "1" : "0", 1);
    for (int i = 0; i < 4 && c; i++) {
        /* the plugin reads the switches at each enqueue */
        setenv("KILN_QMATMUL_ISA", isas[i], 1);
        body(c, pool);
        body(c, NULL);
    }
    unsetenv("KILN_QMATMUL_ISA");
    unsetenv("KILN_QMATMUL_F32ACT");
    kiln_threadpool_destroy(pool);
    kiln_registry_destroy(reg);
}

/* Integer x in [-7, 7] with a ±127 in every block (so ggml's scale is
 * exactly 1 and x quantizes to itself) and weight scales and mins of
 * 2^-1 … 2^-4: every product and partial sum is a multiple of 2^-4 below
 * 2^20, exact in f32, so y must equal the double dot over the dequantized
 * weights bit for bit. */
static void check_exact_q8(const kiln_plugin_creator *c, const fmt *f, int32_t k, int32_t n, int32_t t, void *pool)
{
    uint8_t *w = random_blocks(f, n, k);
    for (int64_t i = 0; i < (int64_t)n * (k / f->block); i++) {
        uint8_t *b = w + i * (int64_t)f->block_bytes;
        put_f16(b + d_at(f), ldexpf(1.0f, -(int)(next_u32() % 4) - 1));
        if (m_at(f) >= 0)
            put_f16(b + m_at(f), (f->block == 256 ? 1.0f : -1.0f) * ldexpf(1.0f, -(int)(next_u32() % 4) - 1));
        /* sub-scales and mins of 0..3 (K) or -3..3 (Q6_K) keep the sums small */
        if (f->type == KILN_GGML_Q4_K || f->type == KILN_GGML_Q5_K)
            for (int j = 4; j < 16; j++)
                b[j] &= 0x03;
        if (f->type == KILN_GGML_Q6_K)
            for (int j = 192; j < 208; j++)
                b[j] = (uint8_t)(int8_t)((int)(next_u32() % 7) - 3);
    }
    float *wf = malloc(sizeof(float) * (size_t)n * (size_t)k), *x = malloc(sizeof(float) * (size_t)t * (size_t)k),
          *y = malloc(sizeof(float) * (size_t)t * (size_t)n);
    CHECK_OK(kiln_ggml_dequantize(f->type, w, (int64_t)n * k, wf));
    for (int64_t i = 0; i < (int64_t)t * k; i++)
        x[i] = (float)((int32_t)(next_u32() % 15) - 7);
    for (int64_t b = 0; b < (int64_t)t * k / f->act_block; b++)
        x[b * f->act_block + next_u32() % (uint32_t)f->act_block] = next_u32() & 1 ? 127.0f : -127.0f;
    kiln_plugin *p = NULL;
    CHECK_OK(make(c, f->name, n, k, &p));
    if (p)
        CHECK_OK(run(p, f, x, t, k, w, n, y, pool));
    int exact = 1;
    for (int32_t r = 0; r < t && p; r++)
        for (int32_t o = 0; o < n; o++) {
            double ref = 0;
            for (int32_t j = 0; j < k; j++)
                ref += (double)x[(int64_t)r * k + j] * wf[(int64_t)o * k + j];
            exact &= (double)y[(int64_t)r * n + o] == ref;
        }
    if (!exact)
        fprintf(stderr, "%s k %d n %d t %d: 8-bit product not exact\n", f->name, k, n, t);
    CHECK(exact);
    if (p)
        p->ops->destroy(p);
    free(x);
    free(y);
    free(wf);
    free(w);
}

/* Random x: y within the activation quantization bound of the exact dot. */
static void check_bound_q8(const kiln_plugin_creator *c, const fmt *f, int32_t k, int32_t n, int32_t t, void *pool)
{
    uint8_t *w = random_blocks(f, n, k);
    float *wf = malloc(sizeof(float) * (size_t)n * (size_t)k), *x = malloc(sizeof(float) * (size_t)t * (size_t)k),
          *y = malloc(sizeof(float) * (size_t)t * (size_t)n);
    CHECK_OK(kiln_ggml_dequantize(f->type, w, (int64_t)n * k, wf));
    for (int64_t i = 0; i < (int64_t)t * k; i++)
        x[i] = uniform(-1, 1) * (i % 64 < 32 ? 1.0f : 8.0f);
    kiln_plugin *p = NULL;
    CHECK_OK(make(c, f->name, n, k, &p));
    if (p)
        CHECK_OK(run(p, f, x, t, k, w, n, y, pool));
    int ok = 1;
    for (int32_t r = 0; r < t && p; r++)
        for (int32_t o = 0; o < n; o++) {
            double ref = 0, mag = 0, bound = 0;
            for (int32_t b = 0; b < k / f->act_block; b++) {
                double amax = 0, wsum = 0;
                for (int32_t j = b * f->act_block; j < (b + 1) * f->act_block; j++) {
                    double xv = x[(int64_t)r * k + j], wv = wf[(int64_t)o * k + j];
                    ref += xv * wv;
                    mag += fabs(xv * wv);
                    amax = fabs(xv) > amax ? fabs(xv) : amax;
                    wsum += fabs(wv);
                }
                bound += amax / 127 / 2 * wsum;
            }
            double e = fabs(y[(int64_t)r * n + o] - ref);
            if (!(e <= bound + 1e-5 * mag)) {
                if (ok)
                    fprintf(stderr, "%s k %d n %d t %d: error %.3g, bound %.3g\n", f->name, k, n, t, e, bound);
                ok = 0;
            }
        }
    CHECK(ok);
    if (p)
        p->ops->destroy(p);
    free(x);
    free(y);
    free(wf);
    free(w);
}

/* 8-bit activations: the formats that use them, with k of 1 to 9 blocks
 * (32-element formats) or 1 to 3 (K), rows 1 (decode), 3 (below the
 * four-row kernels), 17, 45 and 70 (GEMM tiles, a remainder, more rows
 * than one quantized chunk of 64; with AVX-512 VNNI the tiled GEMM, whose
 * k = 1280 spans two of its unpacked chunks). */
static void q8_body(const kiln_plugin_creator *c, void *pool)
{
    for (size_t i = 0; i < N_FMTS; i++) {
        const fmt *f = &fmts[i];
        if (f->act_block == 0)
            continue;
        int32_t k1 = f->block, k2 = f->block == 256 ? 768 : 576;
        check_exact_q8(c, f, k1, 7, 1, pool);
        check_exact_q8(c, f, k2, 33, 3, pool);
        check_exact_q8(c, f, k2, 33, 1, pool);   /* Q4_0/Q4_1 decode GEMV: 4 groups and a tail of 2 */
        check_exact_q8(c, f, 1280, 19, 1, pool); /* 10 groups, none partial */
        check_exact_q8(c, f, 256, 9, 70, pool);
        check_exact_q8(c, f, 1280, 37, 45, pool); /* the tiled GEMM: k over two unpacked chunks, 8/4/1-row groups */
        check_bound_q8(c, f, k1, 7, 1, pool);
        check_bound_q8(c, f, k2, 129, 17, pool);
        check_bound_q8(c, f, k2, 129, 1, pool);
        check_bound_q8(c, f, 256, 5, 70, pool);
    }
}

/* Q8_0, Q4_0, Q4_1, Q4_K and Q6_K in panels: 1, 3 and 4 panels of 16 rows,
 * one row of x (the panel GEMV; k of 1 to 40 blocks), 3 (the row
 * kernels) and 45 and 70 (the GEMM, k over two of its unpacked chunks). */
static void panel_q8_body(const kiln_plugin_creator *c, void *pool)
{
    for (size_t i = 0; i < N_FMTS; i++) {
        const fmt *f = &fmts[i];
        if (!panel_fmt(f->name))
            continue;
        int32_t k1 = f->block, k2 = f->block == 256 ? 768 : 576;
        check_exact_q8(c, f, k1, 16, 1, pool);
        check_exact_q8(c, f, k2, 48, 1, pool);
        check_exact_q8(c, f, k2, 48, 3, pool);
        check_exact_q8(c, f, 1280, 64, 1, pool);
        check_exact_q8(c, f, 1280, 32, 45, pool);
        check_bound_q8(c, f, k2, 48, 1, pool);
        check_bound_q8(c, f, k2, 48, 17, pool);
        check_bound_q8(c, f, 256, 16, 70, pool);
    }
}

/* f32 activations on panels: the rows read as stored. */
static void panel_products_body(const kiln_plugin_creator *c, void *pool)
{
    for (size_t i = 0; i < N_FMTS; i++)
        if (panel_fmt(fmts[i].name))
            check_products(c, &fmts[i], fmts[i].block == 256 ? 768 : 576, 48, pool);
}

static void formulas_body(const kiln_plugin_creator *c, void *pool)
{
    for (size_t i = 0; i < N_FMTS; i++)
        check_formulas(c, &fmts[i], pool);
}

static void products_body(const kiln_plugin_creator *c, void *pool)
{
    for (size_t i = 0; i < N_FMTS; i++) {
        int32_t k1 = fmts[i].block == 256 ? 256 : 32, k3 = fmts[i].block == 256 ? 768 : 576;
        check_products(c, &fmts[i], k1, 7, pool);
        check_products(c, &fmts[i], 256, 33, pool);
        check_products(c, &fmts[i], k3, 129, pool);
    }
}

/* The SIMD kernels against the portable C ones on the same weights and x
 * (8-bit activations where the format has them): the integer sums are
 * equal, only the order of the f32 scaling differs, so within 1e-5 of
 * Σ|x·w|. */
static void test_simd_vs_c(void)
{
    kiln_registry *reg = NULL;
    const kiln_plugin_creator *c = creator(&reg);
    /* 9 x 21: the four-row kernels; 45 x 37 with k 1280: with AVX-512
     * VNNI the tiled GEMM, a masked tile, a padded panel and two chunks */
    for (size_t i = 0; i < 2 * N_FMTS && c; i++) {
        const fmt *f = &fmts[i % N_FMTS];
        const int32_t t = i < N_FMTS ? 9 : 45, n = i < N_FMTS ? 21 : 37;
        int32_t k = i >= N_FMTS ? 1280 : f->block == 256 ? 512 : 160;
        uint8_t *w = random_blocks(f, n, k);
        float *wf = malloc(sizeof(float) * (size_t)n * (size_t)k), *x = malloc(sizeof(float) * (size_t)t * (size_t)k);
        float *yc = malloc(sizeof(float) * (size_t)t * (size_t)n), *ys = malloc(sizeof(float) * (size_t)t * (size_t)n);
        CHECK_OK(kiln_ggml_dequantize(f->type, w, (int64_t)n * k, wf));
        for (int64_t j = 0; j < (int64_t)t * k; j++)
            x[j] = uniform(-2, 2);
        kiln_plugin *p = NULL;
        CHECK_OK(make(c, f->name, n, k, &p));
        setenv("KILN_QMATMUL_ISA", "c", 1);
        CHECK_OK(run(p, f, x, t, k, w, n, yc, NULL));
        const char *isas[3] = {"avx2", "avx512", "best"};
        for (int s = 0; s < 3 && p; s++) {
            setenv("KILN_QMATMUL_ISA", isas[s], 1);
            CHECK_OK(run(p, f, x, t, k, w, n, ys, NULL));
            int ok = 1;
            for (int32_t r = 0; r < t; r++)
                for (int32_t o = 0; o < n; o++) {
                    double mag = 0;
                    for (int32_t j = 0; j < k; j++)
                        mag += fabs((double)x[(int64_t)r * k + j] * wf[(int64_t)o * k + j]);
                    ok &= fabs((double)ys[r * n + o] - yc[r * n + o]) <= 1e-5 * mag;
                }
            if (!ok)
                fprintf(stderr, "%s on %s (%d rows) differs from the C kernel\n", f->name, isas[s], t);
            CHECK(ok);
        }
        unsetenv("KILN_QMATMUL_ISA");
        if (p)
            p->ops->destroy(p);
        free(ys);
        free(yc);
        free(x);
        free(wf);
        free(w);
    }
    kiln_registry_destroy(reg);
}

/* The panel GEMVs against the portable C kernel on the same quantized x,
 * at the ends of every range: quant bytes random or all 0xFF, K sub-scales
 * and mins random or all 63 (Q6_K's int8 scales random, all 127 or all
 * -128), x random or all ±127 (the largest sums each integer step holds),
 * 1 and 3 panels, k of 1, 3 and 32 blocks. The integer sums are equal, so
 * y differs only by f32 rounding: within 1e-5 of B = Σ|x_q · dx| · (the
 * largest |term| a value of its block can add), where a lost or wrapped
 * integer sum would be off by about B. On each kernel set that has them:
 * AVX-512 ("avx512", without GFNI) and the best. */
static void test_panel_extremes(void)
{
    const char *isas[2] = {"avx512", "best"};
    const int32_t ks[3] = {256, 768, 8192}, ns[2] = {16, 48};
    for (size_t fi = 0; fi < N_FMTS; fi++) {
        const fmt *f = &fmts[fi];
        if (!panel_fmt(f->name))
            continue;
        const qmm_format *qf = kiln_qmm_format_named(f->name);
        qmm_kernels ref;
        kiln_qmm_kernels_pick(qf, "c", 0, &ref);
        for (int trial = 0; trial < 12; trial++) {
            const int32_t k = ks[trial % 3], n = ns[trial / 3 % 2];
            const int fill = trial / 6; /* 0: random, 1: the extremes */
            uint8_t *w = random_blocks(f, n, k), *pw = malloc((size_t)n * (size_t)(k / f->block) * f->block_bytes);
            float *x = malloc(sizeof(float) * (size_t)k), *yr = malloc(sizeof(float) * (size_t)n),
                  *y = malloc(sizeof(float) * (size_t)n);
            void *xq = malloc(kiln_qmm_act_row_bytes(qf, k));
            const size_t wrow = (size_t)(k / f->block) * f->block_bytes;
            for (int32_t b = 0; b < n * (k / f->block) && fill; b++) {
                uint8_t *p = w + (size_t)b * f->block_bytes;
                int extreme_scale = b % 3; /* Q6_K: 127, -128 or random */
                for (size_t j = 0; j < f->block_bytes; j++)
                    if (j != (size_t)d_at(f) && j != (size_t)d_at(f) + 1 && (int)j != m_at(f) && (int)j != m_at(f) + 1)
                        p[j] = 0xFF;
                if (f->type == KILN_GGML_Q6_K)
                    for (int j = 192; j < 208; j++)
                        p[j] = extreme_scale == 0 ? 0x7F : extreme_scale == 1 ? 0x80 : (uint8_t)next_u32();
            }
            for (int32_t j = 0; j < k; j++)
                x[j] = fill ? (j % 3 ? 1.0f : -1.0f) : uniform(-1, 1);
            kiln_qmm_quantize_row(qf, ref.quant, x, k, xq);
            kiln_qmm_panel_pack(qf, w, n, k, pw);
            /* B from the dequantized weights' largest magnitude a block allows */
            double bound = 0;
            for (int32_t r = 0; r < n; r++) {
                double br = 0;
                for (int32_t b = 0; b < k / f->block; b++) {
                    const uint8_t *p = w + (size_t)r * wrow + (size_t)b * f->block_bytes;
                    float d = kiln_host()->half_to_float((uint16_t)(p[d_at(f)] | p[d_at(f) + 1] << 8));
                    float m =
                        m_at(f) >= 0 ? kiln_host()->half_to_float((uint16_t)(p[m_at(f)] | p[m_at(f) + 1] << 8)) : 0;
                    double big = f->type == KILN_GGML_Q4_K   ? fabs(d) * 63 * 15 + fabs(m) * 63
                                 : f->type == KILN_GGML_Q6_K ? fabs(d) * 128 * 32
                                 : f->type == KILN_GGML_Q8_0 ? fabs(d) * 128
                                                             : fabs(d) * 15 + fabs(m) + fabs(d) * 8;
                    double sx = 0;
                    for (int32_t j = b * f->block; j < (b + 1) * f->block; j++)
                        sx += fabs(x[j]) * 1.01; /* x_q · dx is within half a step of x */
                    br += big * sx;
                }
                bound = br > bound ? br : bound;
                ref.one(qf->type, w + (size_t)r * wrow, xq, 0, k, &yr[r]);
            }
            for (int s = 0; s < 2; s++) {
                qmm_panel_fn fn = kiln_qmm_panel_pick(qf, isas[s], 0);
                if (!fn)
                    continue;
                fn(pw, wrow, n / 16, k, xq, y);
                int ok = 1;
                for (int32_t r = 0; r < n; r++)
                    ok &= fabs((double)y[r] - yr[r]) <= 1e-5 * bound;
                if (!ok)
                    fprintf(stderr, "%s k %d n %d fill %d on %s: the panel GEMV differs from the C kernel\n", f->name,
                            k, n, fill, isas[s]);
                CHECK(ok);
            }
            free(xq);
            free(y);
            free(yr);
            free(x);
            free(pw);
            free(w);
        }
    }
}

/* Every activation quantizer gives the portable one's bytes and scale:
 * random blocks, halves (ties, rounded away from zero), an all-zero block. */
static void test_quantizers(void)
{
    const char *isas[3] = {"c", "avx2", "best"};
    qmm_kernels ref, ks;
    kiln_qmm_kernels_pick(kiln_qmm_format(KILN_GGML_Q8_0), "c", 0, &ref);
    float x[256];
    int8_t qr[256], qs[256];
    for (int trial = 0; trial < 40; trial++) {
        int n = trial % 2 ? 256 : 32;
        for (int j = 0; j < n; j++)
            x[j] = trial % 4 < 2 ? uniform(-3, 3) : (float)((int)(next_u32() % 254) - 127) + 0.5f;
        if (trial % 4 >= 2) /* d = 1 (the halves stay below 127): every other value a tie */
            x[next_u32() % (uint32_t)n] = 127.0f;
        if (trial == 39)
            for (int j = 0; j < n; j++)
                x[j] = 0.0f;
        float dr = ref.quant(x, n, qr);
        if (trial == 2)
            for (int j = 0; j < n; j++)
                CHECK(x[j] == 127.0f || qr[j] == (int8_t)(x[j] > 0 ? x[j] + 0.5f : x[j] - 0.5f));
        for (int i = 1; i < 3; i++) {
            kiln_qmm_kernels_pick(kiln_qmm_format(KILN_GGML_Q4_K), isas[i], 0, &ks);
            float ds = ks.quant(x, n, qs);
            CHECK(ds == dr && memcmp(qs, qr, (size_t)n) == 0);
        }
    }
}

/* f16/bf16 activations: y equals the f32 product of the widened x,
 * rounded once to the activation dtype. */
static void test_half_activations(void)
{
    kiln_registry *reg = NULL;
    const kiln_plugin_creator *c = creator(&reg);
    const kiln_dtype types[2] = {KILN_DTYPE_F16, KILN_DTYPE_BF16};
    const int32_t t = 21, k = 96, n = 7; /* more rows than one f32 chunk (16) */
    const kiln_host_api *h = kiln_host();
    for (int ti = 0; ti < 2 && c; ti++) {
        kiln_dtype dt = types[ti];
        uint8_t *w = random_blocks(&fmts[2], n, k);
        /* workspace: 16 rows of 3 quantized blocks (40 bytes each), f32 x,
         * f32 y, one row packed for the decode GEMV (256 bytes) */
        float xf[21 * 96], yf[21 * 7], ws[16 * 3 * 10 + 16 * 96 + 16 * 7 + 64];
        uint16_t xh[21 * 96], yh[21 * 7];
        for (int i = 0; i < t * k; i++) {
            float v = uniform(-1, 1);
            xh[i] = dt == KILN_DTYPE_F16 ? h->float_to_half(v) : h->float_to_bf16(v);
            xf[i] = dt == KILN_DTYPE_F16 ? h->half_to_float(xh[i]) : h->bf16_to_float(xh[i]);
        }
        kiln_plugin *p = NULL;
        CHECK_OK(make(c, "Q4_1", n, k, &p));
        /* the f32 product through the four-row kernels that half x takes
         * (the tiled GEMM for f32 x sums in another order) */
        setenv("KILN_QMATMUL_ISA", "avx2", 1);
        CHECK_OK(run(p, &fmts[2], xf, t, k, w, n, yf, NULL));
        kiln_tensor_desc d[3] = {desc(dt, t, k), desc(KILN_DTYPE_U8, n, (int64_t)(k / 32) * 20), desc(dt, t, n)};
        CHECK(p && p->ops->workspace_size(p, d, 2, d + 2, 1) == sizeof ws);
        const void *in[2] = {xh, w};
        void *out[1] = {yh};
        if (p)
            CHECK_OK(p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, 2, d + 2, out, 1, ws, NULL));
        unsetenv("KILN_QMATMUL_ISA");
        int same = 1;
        for (int i = 0; i < t * n; i++)
            same &= yh[i] == (dt == KILN_DTYPE_F16 ? h->float_to_half(yf[i]) : h->float_to_bf16(yf[i]));
        CHECK(same);
        /* one row (a decode step) on the best kernels: with AVX-512 VBMI the
         * Q4_1 decode GEMV, whose packed x follows the row's f32 x and y in
         * the workspace; the same bits as the f32 call on that row, rounded */
        if (p) {
            float y1[7];
            uint16_t yh1[7];
            CHECK_OK(run(p, &fmts[2], xf, 1, k, w, n, y1, NULL));
            kiln_tensor_desc d1[3] = {desc(dt, 1, k), d[1], desc(dt, 1, n)};
            void *ws1 = malloc(p->ops->workspace_size(p, d1, 2, d1 + 2, 1)), *out1[1] = {yh1};
            CHECK_OK(p->ops->enqueue(p, KILN_BACKEND_CPU, d1, in, 2, d1 + 2, out1, 1, ws1, NULL));
            for (int i = 0; i < n; i++)
                same &= yh1[i] == (dt == KILN_DTYPE_F16 ? h->float_to_half(y1[i]) : h->float_to_bf16(y1[i]));
            CHECK(same);
            free(ws1);
        }
        if (p)
            p->ops->destroy(p);
        free(w);
    }
    kiln_registry_destroy(reg);
}

static void test_formulas(void) { each_kernel(formulas_body, 1); }
static void test_products(void) { each_kernel(products_body, 1); }
static void test_q8_activations(void) { each_kernel(q8_body, 0); }
static void test_panels(void)
{
    panels_on = 1;
    each_kernel(panel_q8_body, 0);
    each_kernel(panel_products_body, 1);
    panels_on = 0;
}

static void test_blob_round_trip(void)
{
    kiln_registry *reg = NULL;
    const kiln_plugin_creator *c = creator(&reg);
    kiln_plugin *p = NULL, *q = NULL;
    CHECK_OK(make(c, "Q4_1", 9, 96, &p));
    size_t size = 0;
    CHECK_OK(p->ops->serialize(p, NULL, &size));
    CHECK(size == 24);
    int32_t blob[6] = {0};
    CHECK_OK(p->ops->serialize(p, blob, &size));
    /* ggml's number for Q4_1, n, k, the GEMM's rows of x, the GEMV's x, not in panels */
    CHECK(blob[0] == 3 && blob[1] == 9 && blob[2] == 96 && blob[3] == 512 && blob[4] == 1 && blob[5] == 0);
    CHECK_OK(c->deserialize(c, c->blob_version, blob, size, &q));
    int32_t again[6] = {0};
    size = sizeof again;
    CHECK(q && q->ops->serialize(q, again, &size) == KILN_OK && memcmp(again, blob, sizeof blob) == 0);
    if (q)
        q->ops->destroy(q);
    /* a v1 blob (an engine built before the GEMM): read, with no GEMM rows,
     * so the workspace is what that engine reserved */
    CHECK(c->blob_version == 4);
    CHECK_OK(c->deserialize(c, 1, blob, 12, &q));
    size = sizeof again;
    CHECK(q && q->ops->serialize(q, again, &size) == KILN_OK && again[3] == 0);
    kiln_tensor_desc d[3] = {desc(KILN_DTYPE_F32, 100, 96), desc(KILN_DTYPE_U8, 9, 60), desc(KILN_DTYPE_F32, 100, 9)};
    CHECK(q && q->ops->workspace_size(q, d, 2, d + 2, 1) == 64 * 3 * 40);
    CHECK(p->ops->workspace_size(p, d, 2, d + 2, 1) == 104 * (96 + 2 * 4 * 3)); /* 13 panels of 8 rows */
    if (q)
        q->ops->destroy(q);
    /* a v2 blob (before the decode GEMV): one row of f16 x takes its
     * quantized blocks, f32 x and f32 y; a v3 one adds the row packed for
     * the GEMV (one group of 256 bytes) */
    CHECK_OK(c->deserialize(c, 2, blob, 16, &q));
    kiln_tensor_desc d1[3] = {desc(KILN_DTYPE_F16, 1, 96), desc(KILN_DTYPE_U8, 9, 60), desc(KILN_DTYPE_F16, 1, 9)};
    CHECK(q && q->ops->workspace_size(q, d1, 2, d1 + 2, 1) == 3 * 40 + (96 + 9) * 4);
    CHECK(p->ops->workspace_size(p, d1, 2, d1 + 2, 1) == 3 * 40 + (96 + 9) * 4 + 256);
    if (q)
        q->ops->destroy(q);
    /* a v3 blob: not in panels */
    CHECK_OK(c->deserialize(c, 3, blob, 20, &q));
    size = sizeof again;
    CHECK(q && q->ops->serialize(q, again, &size) == KILN_OK && size == 24 && again[5] == 0);
    if (q)
        q->ops->destroy(q);
    size = sizeof blob;
    CHECK_FAILS(c->deserialize(c, c->blob_version, blob, 8, &q), KILN_ERROR_FORMAT, "QuantMatMul blob v4 is 8 bytes");
    CHECK_FAILS(c->deserialize(c, c->blob_version + 1, blob, size, &q), KILN_ERROR_VERSION, "newer");
    blob[3] = 513;
    CHECK_FAILS(c->deserialize(c, c->blob_version, blob, size, &q), KILN_ERROR_INVALID_ARGUMENT, "gemm_rows = 513");
    blob[3] = 512;
    blob[4] = 2;
    CHECK_FAILS(c->deserialize(c, c->blob_version, blob, size, &q), KILN_ERROR_INVALID_ARGUMENT, "gemv_x = 2");
    blob[4] = 1;
    blob[5] = 1; /* panels: n = 9 is not a multiple of 16 */
    CHECK_FAILS(c->deserialize(c, c->blob_version, blob, size, &q), KILN_ERROR_INVALID_ARGUMENT, "panels = 1");
    blob[5] = 0;
    blob[0] = 10; /* Q2_K */
    CHECK_FAILS(c->deserialize(c, c->blob_version, blob, size, &q), KILN_ERROR_INVALID_ARGUMENT, "ggml type 10");
    p->ops->destroy(p);
    kiln_registry_destroy(reg);
}

static void test_bad_fields_and_shapes(void)
{
    kiln_registry *reg = NULL;
    const kiln_plugin_creator *c = creator(&reg);
    kiln_plugin *p = NULL;
    CHECK_FAILS(make(c, "Q3_K", 4, 256, &p), KILN_ERROR_INVALID_ARGUMENT, "format \"Q3_K\" is not");
    CHECK_FAILS(make(c, "Q4_K", 4, 288, &p), KILN_ERROR_INVALID_ARGUMENT, "a multiple of 256 for Q4_K");
    CHECK_FAILS(make(c, "Q8_0", 4, 48, &p), KILN_ERROR_INVALID_ARGUMENT, "k = 48");
    CHECK_FAILS(make(c, "Q8_0", 0, 32, &p), KILN_ERROR_INVALID_ARGUMENT, "n = 0");
    int32_t n = 4;
    kiln_field missing[1] = {fi32("n", &n)};
    CHECK(kiln_plugin_create(c, missing, 1, &p) != KILN_OK);
    /* panels: not Q5_0 (no panel layout); n a multiple of 16 */
    panels_on = 1;
    CHECK_FAILS(make(c, "Q4_1", 8, 64, &p), KILN_ERROR_INVALID_ARGUMENT, "panels = 1");
    CHECK_OK(make(c, "Q4_0", 16, 64, &p));
    kiln_tensor_desc pd[3] = {desc(KILN_DTYPE_F32, 1, 64), desc(KILN_DTYPE_U8, 16, 36), desc(KILN_DTYPE_F32, 1, 16)};
    CHECK(p && !p->ops->supports(p, KILN_BACKEND_CUDA, pd, 2, 1) && p->ops->supports(p, KILN_BACKEND_CPU, pd, 2, 1));
    if (p)
        p->ops->destroy(p);
    panels_on = 0;
    int32_t two = 2, n16 = 16, k64 = 64;
    kiln_field bad_panels[4] = {fstr("format", "Q5_0"), fi32("n", &n16), fi32("k", &k64), fi32("panels", &two)};
    CHECK_FAILS(kiln_plugin_create(c, bad_panels, 4, &p), KILN_ERROR_INVALID_ARGUMENT, "panels = 2");
    bad_panels[3] = fi32("panels", &(int32_t){1});
    CHECK_FAILS(kiln_plugin_create(c, bad_panels, 4, &p), KILN_ERROR_INVALID_ARGUMENT, "panels = 1");
    CHECK_OK(make(c, "Q8_0", 4, 64, &p));
    float x[2 * 64] = {0}, y[2 * 4];
    uint8_t w[4 * 2 * 34] = {0};
    /* x with 32 columns, w with 3 rows, w with Q4_0-sized rows */
    kiln_tensor_desc bad[3][3] = {
        {desc(KILN_DTYPE_F32, 2, 32), desc(KILN_DTYPE_U8, 4, 68), desc(KILN_DTYPE_F32, 2, 4)},
        {desc(KILN_DTYPE_F32, 2, 64), desc(KILN_DTYPE_U8, 3, 68), desc(KILN_DTYPE_F32, 2, 4)},
        {desc(KILN_DTYPE_F32, 2, 64), desc(KILN_DTYPE_U8, 4, 36), desc(KILN_DTYPE_F32, 2, 4)}};
    const void *in[2] = {x, w};
    void *out[1] = {y};
    for (int i = 0; i < 3; i++)
        CHECK_FAILS(p->ops->enqueue(p, KILN_BACKEND_CPU, bad[i], in, 2, bad[i] + 2, out, 1, NULL, NULL),
                    KILN_ERROR_SHAPE, "QuantMatMul: x's last dim must be k = 64 and w [4, 68]");
    kiln_tensor_desc f16x[3] = {desc(KILN_DTYPE_F16, 2, 64), desc(KILN_DTYPE_U8, 4, 68), desc(KILN_DTYPE_F16, 2, 4)};
    kiln_tensor_desc mixed[3] = {desc(KILN_DTYPE_F16, 2, 64), desc(KILN_DTYPE_U8, 4, 68), desc(KILN_DTYPE_F32, 2, 4)};
    CHECK(p->ops->supports(p, KILN_BACKEND_CPU, f16x, 2, 1));
    CHECK(!p->ops->supports(p, KILN_BACKEND_CPU, mixed, 2, 1));
#ifndef KILN_HAVE_CUDA
    CHECK(!p->ops->supports(p, KILN_BACKEND_CUDA, bad[0], 2, 1));
#endif
    CHECK(p->ops->supports(p, KILN_BACKEND_CPU, bad[0], 2, 1));
    p->ops->destroy(p);
    kiln_registry_destroy(reg);
}

/* The LLMC section records the kept formats; engines without the key read
 * back as unquantized. */
static void test_llmc_quantized_weights(void)
{
    kiln_llm_config c, back;
    kiln_llm_config_init(&c);
    snprintf(c.architecture, sizeof c.architecture, "llama");
    c.vocab_size = 10, c.hidden_size = 8, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 4;
    c.intermediate_size = 16, c.rms_norm_eps = 1e-5, c.rope.rotary_dim = 4;
    c.max_seq_len = 16, c.max_batch = 1, c.max_tokens = 16, c.block_size = 16;
    snprintf(c.quantized, sizeof c.quantized, "Q4_1,Q8_0");
    char *json = NULL;
    size_t len = 0;
    CHECK_OK(kiln_llm_config_to_json(&c, &json, &len));
    CHECK(json && strstr(json, "\"quantized_weights\":\"Q4_1,Q8_0\"") != NULL);
    CHECK_OK(kiln_llm_config_from_json(json, len, &back));
    CHECK(strcmp(back.quantized, "Q4_1,Q8_0") == 0);
    free(json);
    c.quantized[0] = '\0';
    CHECK_OK(kiln_llm_config_to_json(&c, &json, &len));
    CHECK(json && strstr(json, "quantized_weights") == NULL);
    CHECK_OK(kiln_llm_config_from_json(json, len, &back));
    CHECK(back.quantized[0] == '\0');
    free(json);
}

static const test_case_ tests[] = {TEST(test_formulas),
                                   TEST(test_products),
                                   TEST(test_q8_activations),
                                   TEST(test_panels),
                                   TEST(test_simd_vs_c),
                                   TEST(test_panel_extremes),
                                   TEST(test_quantizers),
                                   TEST(test_half_activations),
                                   TEST(test_blob_round_trip),
                                   TEST(test_bad_fields_and_shapes),
                                   TEST(test_llmc_quantized_weights)};
TEST_MAIN(tests)
