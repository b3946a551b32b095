/* kiln/QuantMatMul against kiln_ggml_dequantize (itself checked against
 * the gguf package in test_gguf.c), on every kernel set (portable C, AVX2,
 * AVX-512 VNNI where the CPU has them):
 *  - f32 activations (KILN_QMATMUL_F32ACT=1): per-weight formulas exactly,
 *    products within 1e-5 of Σ|x·w| of a double-precision dot over the
 *    dequantized weights;
 *  - 8-bit activations (the default): exact where every product and sum is
 *    representable (integer x with a 127 in each block, power-of-two
 *    scales), else within the quantization bound d/2 · Σ|w| per block
 *    (d = max|x| / 127 of ggml's Q8 formula) plus 1e-5 of Σ|x·w|. */
#include "test.h"

#include <kiln/plugin.h>

#include "core/threadpool.h"
#include "llm/gguf.h"
#include "llm/llm_config.h"

typedef struct fmt {
    const char *name;
    uint32_t type;
    size_t block_bytes;
} fmt;

static const fmt fmts[] = {{"Q8_0", KILN_GGML_Q8_0, 34}, {"Q4_0", KILN_GGML_Q4_0, 18}, {"Q4_1", KILN_GGML_Q4_1, 20}};

static uint32_t rng = 12345;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() >> 8) / 16777216.0f; }

/* n rows of k/32 random blocks: random quant bytes, f16 scales in a
 * realistic range (the min of Q4_1 negative, as trained weights have). */
static uint8_t *random_blocks(const fmt *f, int32_t n, int32_t k)
{
    size_t nb = (size_t)n * (size_t)(k / 32);
    uint8_t *b = malloc(nb * f->block_bytes);
    for (size_t i = 0; i < nb; i++) {
        uint8_t *p = b + i * f->block_bytes;
        for (size_t j = 0; j < f->block_bytes; j++)
            p[j] = (uint8_t)next_u32();
        uint16_t d = kiln_host()->float_to_half(uniform(0.001f, 0.05f));
        p[0] = (uint8_t)d, p[1] = (uint8_t)(d >> 8);
        if (f->type == KILN_GGML_Q4_1) {
            uint16_t m = kiln_host()->float_to_half(uniform(-0.4f, 0.0f));
            p[2] = (uint8_t)m, p[3] = (uint8_t)(m >> 8);
        }
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

static kiln_status make(const kiln_plugin_creator *c, const char *format, int32_t n, int32_t k, kiln_plugin **p)
{
    kiln_field f[3] = {fstr("format", format), fi32("n", &n), fi32("k", &k)};
    return kiln_plugin_create(c, f, 3, p);
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
                             desc(KILN_DTYPE_U8, n, (int64_t)(k / 32) * (int64_t)f->block_bytes),
                             desc(KILN_DTYPE_F32, t, n)};
    const void *in[2] = {x, w};
    void *out[1] = {y};
    size_t wsz = p->ops->workspace_size(p, d, 2, d + 2, 1);
    void *ws = wsz ? malloc(wsz) : NULL;
    kiln_status s = p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, 2, d + 2, out, 1, ws, stream);
    free(ws);
    return s;
}

/* x = e_j picks weight (row, j) out unchanged: the plugin's per-block
 * dequantization equals kiln_ggml_dequantize bit for bit. */
static void check_formulas(const kiln_plugin_creator *c, const fmt *f, void *pool)
{
    const int32_t n = 5, k = 64;
    uint8_t *w = random_blocks(f, n, k);
    float *wf = malloc(sizeof(float) * (size_t)(n * k)), x[64], y[5];
    CHECK_OK(kiln_ggml_dequantize(f->type, w, (int64_t)n * k, wf));
    kiln_plugin *p = NULL;
    CHECK_OK(make(c, f->name, n, k, &p));
    int exact = 1;
    for (int32_t j = 0; j < k && p; j++) {
        memset(x, 0, sizeof x);
        x[j] = 1.0f;
        CHECK_OK(run(p, f, x, 1, k, w, n, y, pool));
        for (int32_t r = 0; r < n; r++)
            exact &= memcmp(&y[r], &wf[r * k + j], sizeof(float)) == 0;
    }
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
    const char *isas[3] = {"c", "avx2", "best"};
    setenv("KILN_QMATMUL_F32ACT", f32act ? "1" : "0", 1);
    for (int i = 0; i < 3 && c; i++) {
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
    for (int64_t i = 0; i < (int64_t)n * (k / 32); i++) {
        uint8_t *b = w + i * (int64_t)f->block_bytes;
        uint16_t d = kiln_host()->float_to_half(ldexpf(1.0f, -(int)(next_u32() % 4) - 1));
        b[0] = (uint8_t)d, b[1] = (uint8_t)(d >> 8);
        if (f->type == KILN_GGML_Q4_1) {
            uint16_t m = kiln_host()->float_to_half(-ldexpf(1.0f, -(int)(next_u32() % 4) - 1));
            b[2] = (uint8_t)m, b[3] = (uint8_t)(m >> 8);
        }
    }
    float *wf = malloc(sizeof(float) * (size_t)n * (size_t)k), *x = malloc(sizeof(float) * (size_t)t * (size_t)k),
          *y = malloc(sizeof(float) * (size_t)t * (size_t)n);
    CHECK_OK(kiln_ggml_dequantize(f->type, w, (int64_t)n * k, wf));
    for (int64_t i = 0; i < (int64_t)t * k; i++)
        x[i] = (float)((int32_t)(next_u32() % 15) - 7);
    for (int64_t b = 0; b < (int64_t)t * k / 32; b++)
        x[b * 32 + next_u32() % 32] = next_u32() & 1 ? 127.0f : -127.0f;
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
            for (int32_t b = 0; b < k / 32; b++) {
                double amax = 0, wsum = 0;
                for (int32_t j = b * 32; j < b * 32 + 32; j++) {
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

static void q8_body(const kiln_plugin_creator *c, void *pool)
{
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        check_exact_q8(c, &fmts[i], 32, 7, 1, pool);
        check_exact_q8(c, &fmts[i], 576, 33, 3, pool);
        check_exact_q8(c, &fmts[i], 256, 9, 70, pool); /* more rows than one quantized chunk (64) */
        check_bound_q8(c, &fmts[i], 32, 7, 1, pool);
        check_bound_q8(c, &fmts[i], 576, 129, 17, pool);
        check_bound_q8(c, &fmts[i], 256, 5, 70, pool);
    }
}

static void formulas_body(const kiln_plugin_creator *c, void *pool)
{
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++)
        check_formulas(c, &fmts[i], pool);
}

static void products_body(const kiln_plugin_creator *c, void *pool)
{
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        check_products(c, &fmts[i], 32, 7, pool);
        check_products(c, &fmts[i], 256, 33, pool);
        check_products(c, &fmts[i], 576, 129, pool);
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
        float xf[21 * 96], yf[21 * 7], ws[16 * 96 + 16 * 7];
        uint16_t xh[21 * 96], yh[21 * 7];
        for (int i = 0; i < t * k; i++) {
            float v = uniform(-1, 1);
            xh[i] = dt == KILN_DTYPE_F16 ? h->float_to_half(v) : h->float_to_bf16(v);
            xf[i] = dt == KILN_DTYPE_F16 ? h->half_to_float(xh[i]) : h->bf16_to_float(xh[i]);
        }
        kiln_plugin *p = NULL;
        CHECK_OK(make(c, "Q4_1", n, k, &p));
        CHECK_OK(run(p, &fmts[2], xf, t, k, w, n, yf, NULL));
        kiln_tensor_desc d[3] = {desc(dt, t, k), desc(KILN_DTYPE_U8, n, (int64_t)(k / 32) * 20), desc(dt, t, n)};
        CHECK(p && p->ops->workspace_size(p, d, 2, d + 2, 1) == sizeof ws);
        const void *in[2] = {xh, w};
        void *out[1] = {yh};
        if (p)
            CHECK_OK(p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, 2, d + 2, out, 1, ws, NULL));
        int same = 1;
        for (int i = 0; i < t * n; i++)
            same &= yh[i] == (dt == KILN_DTYPE_F16 ? h->float_to_half(yf[i]) : h->float_to_bf16(yf[i]));
        CHECK(same);
        if (p)
            p->ops->destroy(p);
        free(w);
    }
    kiln_registry_destroy(reg);
}

static void test_formulas(void) { each_kernel(formulas_body, 1); }
static void test_products(void) { each_kernel(products_body, 1); }
static void test_q8_activations(void) { each_kernel(q8_body, 0); }

static void test_blob_round_trip(void)
{
    kiln_registry *reg = NULL;
    const kiln_plugin_creator *c = creator(&reg);
    kiln_plugin *p = NULL, *q = NULL;
    CHECK_OK(make(c, "Q4_1", 9, 96, &p));
    size_t size = 0;
    CHECK_OK(p->ops->serialize(p, NULL, &size));
    CHECK(size == 12);
    int32_t blob[3] = {0};
    CHECK_OK(p->ops->serialize(p, blob, &size));
    CHECK(blob[0] == 3 && blob[1] == 9 && blob[2] == 96); /* ggml's number for Q4_1 */
    CHECK_OK(c->deserialize(c, c->blob_version, blob, size, &q));
    int32_t again[3] = {0};
    size = sizeof again;
    CHECK(q && q->ops->serialize(q, again, &size) == KILN_OK && memcmp(again, blob, sizeof blob) == 0);
    if (q)
        q->ops->destroy(q);
    CHECK_FAILS(c->deserialize(c, c->blob_version, blob, 8, &q), KILN_ERROR_FORMAT, "QuantMatMul blob is 8 bytes");
    CHECK_FAILS(c->deserialize(c, c->blob_version + 1, blob, size, &q), KILN_ERROR_VERSION, "newer");
    blob[0] = 6; /* Q5_0 */
    CHECK_FAILS(c->deserialize(c, c->blob_version, blob, size, &q), KILN_ERROR_INVALID_ARGUMENT, "ggml type 6");
    p->ops->destroy(p);
    kiln_registry_destroy(reg);
}

static void test_bad_fields_and_shapes(void)
{
    kiln_registry *reg = NULL;
    const kiln_plugin_creator *c = creator(&reg);
    kiln_plugin *p = NULL;
    CHECK_FAILS(make(c, "Q5_0", 4, 32, &p), KILN_ERROR_INVALID_ARGUMENT, "format \"Q5_0\" is not");
    CHECK_FAILS(make(c, "Q8_0", 4, 48, &p), KILN_ERROR_INVALID_ARGUMENT, "k = 48");
    CHECK_FAILS(make(c, "Q8_0", 0, 32, &p), KILN_ERROR_INVALID_ARGUMENT, "n = 0");
    int32_t n = 4;
    kiln_field missing[1] = {fi32("n", &n)};
    CHECK(kiln_plugin_create(c, missing, 1, &p) != KILN_OK);
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
                                   TEST(test_half_activations),
                                   TEST(test_blob_round_trip),
                                   TEST(test_bad_fields_and_shapes),
                                   TEST(test_llmc_quantized_weights)};
TEST_MAIN(tests)
