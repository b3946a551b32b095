/* Weight-only quantization (llm/woq.h, kiln/WeightOnlyMatMul) on the CPU:
 * - round-to-nearest: every weight within half a step of its dequantized
 *   value, int8 scales max|w| / 127, zero exact in int4; int8, int4 and
 *   FP8 weights byte for byte as numpy quantizes them (tests/data/woq);
 * - AWQ and GPTQ words unpacked to the positions their formats define
 *   (hand-placed nibbles);
 * - the plugin (f32 and bf16 activations, per channel and grouped) against
 *   y = x · Wᵀ computed here in double from the formats' definitions,
 *   w = s · q and w = s · (q − z), with q, s, z random;
 * - FP8 E4M3 (src/core/fp8.h) at values the OCP format fixes (448, 1, the
 *   subnormals, ties to even, saturation, NaN) and every code back and
 *   forth; Fp8MatMul on the CPU against its definition in double. */
#include "test.h"

#include <kiln/plugin.h>

#include "core/fp8.h"
#include "core/threadpool.h"
#include "llm/woq.h"

static kiln_registry *reg;
static kiln_threadpool *pool;

static uint32_t rng = 77;
static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next() >> 8) / 16777216.0f; }

static void test_rtn(void)
{
    const int64_t n = 5, k = 256;
    float *w = malloc(sizeof(float) * n * k), *d = malloc(sizeof(float) * n * k);
    for (int64_t i = 0; i < n * k; i++)
        w[i] = uniform(-0.1f, 0.3f);
    w[7] = 0.0f;
    for (int bits = 8; bits >= 4; bits -= 4) {
        int32_t group = bits == 8 ? (int32_t)k : 64;
        kiln_woq_weight q;
        CHECK_OK(kiln_woq_quantize(w, n, k, bits, group, "test", &q));
        kiln_woq_dequantize(&q, d);
        double worst = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < k; i++) {
                float s = q.scales[r * (k / group) + i / group];
                double e = fabs((double)d[r * k + i] - w[r * k + i]) / s;
                worst = e > worst ? e : worst;
            }
        CHECK(worst <= 0.5 + 1e-3);
        CHECK(d[7] == 0.0f);
        if (bits == 8) {
            float amax = 0;
            for (int64_t i = 0; i < k; i++)
                amax = fabsf(w[i]) > amax ? fabsf(w[i]) : amax;
            CHECK_NEAR(q.scales[0], amax / 127.0f, 1e-9);
        }
        kiln_woq_free(&q);
    }
    kiln_woq_weight q;
    CHECK_FAILS(kiln_woq_quantize(w, n, k, 4, 48, "w48", &q), KILN_ERROR_UNSUPPORTED, "group size 48");
    CHECK_FAILS(kiln_woq_quantize(w, n, 100, 8, 100, "w100", &q), KILN_ERROR_UNSUPPORTED, "multiple of 32");
    w[3] = NAN;
    CHECK_FAILS(kiln_woq_quantize(w, n, k, 4, 64, "wnan", &q), KILN_ERROR_FORMAT, "NaN");
    free(w);
    free(d);
    /* rows are quantized in parallel: the lowest bad row is the one named */
    const int64_t rows = 64;
    float *big = calloc((size_t)(rows * k), sizeof(float)), sc[64];
    uint8_t *codes = malloc((size_t)(rows * k));
    big[40 * k + 9] = INFINITY;
    big[17 * k + 200] = NAN;
    CHECK_FAILS(kiln_woq_quantize(big, rows, k, 8, (int32_t)k, "rows", &q), KILN_ERROR_FORMAT, "row 17 holds");
    CHECK_FAILS(kiln_woq_quantize(big, rows, k, 4, 64, "rows", &q), KILN_ERROR_FORMAT, "row 17 holds");
    CHECK_FAILS(kiln_fp8_quantize(big, rows, k, "rows", codes, sc), KILN_ERROR_FORMAT, "row 17 holds");
    free(big);
    free(codes);
}

static int q4(const kiln_woq_weight *w, int64_t r, int64_t i)
{
    uint8_t b = w->q[r * (w->k / 2) + i / 2];
    return i & 1 ? b >> 4 : b & 0x0F;
}

/* Reads tests/data/woq/NAME.npy: `count` elements of dtype `t`, or NULL. */
static void *fixture(const char *name, kiln_dtype t, size_t count)
{
    char path[128];
    snprintf(path, sizeof path, "tests/data/woq/%s.npy", name);
    kiln_dtype got;
    kiln_dims dims;
    void *data = NULL;
    size_t size;
    CHECK_OK(kiln_npy_read(path, &got, &dims, &data, &size));
    if (data && (got != t || size != count * kiln_dtype_size(t))) {
        fprintf(stderr, "%s: unexpected dtype or size\n", path);
        CHECK(0);
        kiln_free(data);
        data = NULL;
    }
    return data;
}

/* The build-time quantizers against numpy's quantization of the same
 * weights from the formats' definitions (tests/data/woq/make_reference.py:
 * rows with ties, all positive, all zero), byte for byte. */
static void test_rtn_reference(void)
{
    const int64_t n = 8, k = 384;
    float *w = fixture("w", KILN_DTYPE_F32, (size_t)(n * k));
    if (!w)
        return;
    const struct {
        const char *name;
        int32_t bits, group;
    } cases[] = {{"int8", 8, 384}, {"int8g", 8, 128}, {"int4", 4, 128}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char qn[32], sn[32];
        snprintf(qn, sizeof qn, "%s.q", cases[c].name);
        snprintf(sn, sizeof sn, "%s.s", cases[c].name);
        size_t groups = (size_t)(n * (k / cases[c].group));
        uint8_t *q = fixture(qn, cases[c].bits == 8 ? KILN_DTYPE_I8 : KILN_DTYPE_U8, (size_t)(n * k));
        float *s = fixture(sn, KILN_DTYPE_F32, groups);
        uint8_t *z = cases[c].bits == 4 ? fixture("int4.z", KILN_DTYPE_U8, groups) : NULL;
        kiln_woq_weight got;
        CHECK_OK(kiln_woq_quantize(w, n, k, cases[c].bits, cases[c].group, "fixture", &got));
        int bad_q = 0, bad_s = 0, bad_z = 0;
        for (int64_t r = 0; q && r < n; r++)
            for (int64_t i = 0; i < k; i++)
                bad_q += (cases[c].bits == 8 ? got.q[r * k + i] : (uint8_t)q4(&got, r, i)) != q[r * k + i];
        for (size_t g = 0; s && g < groups; g++) {
            bad_s += got.scales[g] != s[g];
            bad_z += z && got.zeros[g] != z[g];
        }
        if (bad_q || bad_s || bad_z)
            fprintf(stderr, "%s: %d values, %d scales, %d zeros differ from numpy's\n", cases[c].name, bad_q, bad_s,
                    bad_z);
        CHECK(bad_q == 0 && bad_s == 0 && bad_z == 0);
        kiln_woq_free(&got);
        kiln_free(q);
        kiln_free(s);
        kiln_free(z);
    }
    uint8_t *q = fixture("fp8.q", KILN_DTYPE_U8, (size_t)(n * k)), *codes = malloc((size_t)(n * k));
    float *s = fixture("fp8.s", KILN_DTYPE_F32, (size_t)n), scales[8];
    CHECK_OK(kiln_fp8_quantize(w, n, k, "fixture", codes, scales));
    int bad = 0;
    for (int64_t i = 0; q && i < n * k; i++)
        bad += codes[i] != q[i];
    for (int64_t r = 0; s && r < n; r++)
        bad += scales[r] != s[r];
    CHECK(q && s && bad == 0);
    kiln_free(q);
    kiln_free(s);
    free(codes);
    kiln_free(w);
}

/* AWQ: qweight [k, n / 8], nibble i of word c holds output 8c + (0, 2, 4,
 * 6, 1, 3, 5, 7)[i]; GPTQ: qweight [k / 8, n], nibble j of row r holds
 * input 8r + j; GPTQ v1 zeros are stored minus one. */
static void test_layouts(void)
{
    const int64_t n = 16, k = 32;
    int32_t qw[32 * 2] = {0}, qz[2] = {0};
    float sc[16];
    for (int i = 0; i < 16; i++)
        sc[i] = 0.5f + (float)i;
    qw[3 * 2 + 1] = 5 << 4;      /* input 3, word 1, nibble 1: output 8 + 2 */
    qz[0] = (int32_t)(9u << 28); /* word 0, nibble 7: output 7 */
    kiln_woq_weight w;
    CHECK_OK(kiln_woq_from_awq(qw, qz, sc, n, k, 32, "awq", &w));
    CHECK(q4(&w, 10, 3) == 5);
    CHECK(q4(&w, 9, 3) == 0 && q4(&w, 10, 2) == 0);
    CHECK(w.zeros[7] == 9 && w.zeros[3] == 0);
    CHECK(w.scales[10] == 10.5f);
    kiln_woq_free(&w);

    int32_t gq[4 * 16] = {0}, gz[2] = {0}, gidx[32];
    for (int i = 0; i < 32; i++)
        gidx[i] = 0;
    gq[1 * 16 + 5] = 9 << 8; /* row 1, output 5, nibble 2: input 10 */
    gz[0] = 6 << 12;         /* output 3 stores 6: zero 7 */
    CHECK_OK(kiln_woq_from_gptq(gq, gz, sc, gidx, n, k, 32, 1, 1, "gptq", &w));
    CHECK(q4(&w, 5, 10) == 9);
    CHECK(q4(&w, 5, 9) == 0 && q4(&w, 4, 10) == 0);
    CHECK(w.zeros[3] == 7 && w.zeros[0] == 1);
    kiln_woq_free(&w);
    CHECK_OK(kiln_woq_from_gptq(gq, gz, sc, NULL, n, k, 32, 1, 0, "gptq2", &w));
    CHECK(w.zeros[3] == 6 && w.zeros[0] == 0);
    kiln_woq_free(&w);
    gidx[31] = 1;
    CHECK_FAILS(kiln_woq_from_gptq(gq, gz, sc, gidx, n, k, 32, 1, 1, "act", &w), KILN_ERROR_UNSUPPORTED, "desc_act");
}

static kiln_tensor_desc desc2(kiln_dtype t, int64_t a, int64_t b)
{
    kiln_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.abi_version = KILN_PLUGIN_ABI_VERSION;
    d.dtype = t;
    d.dims.rank = 2;
    d.dims.d[0] = a;
    d.dims.d[1] = b;
    return d;
}

static kiln_field fi32(const char *name, const int32_t *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_I32, 1, v};
}

static void check_plugin(int32_t bits, int32_t group, kiln_dtype t)
{
    const kiln_host_api *h = kiln_host();
    int32_t n = 37, k = 384, rows = 21, ng = k / group;
    kiln_field f[4] = {fi32("bits", &bits), fi32("group_size", &group), fi32("n", &n), fi32("k", &k)};
    const kiln_plugin_creator *c = kiln_registry_find(reg, "WeightOnlyMatMul", "1", "kiln", NULL);
    kiln_plugin *p = NULL;
    CHECK(c != NULL);
    if (!c || kiln_plugin_create(c, f, 4, &p) != KILN_OK) {
        CHECK(0);
        return;
    }
    uint8_t *q = malloc((size_t)n * k * bits / 8), *z = malloc((size_t)n * ng);
    float *s = malloc(sizeof(float) * n * ng), *xf = malloc(sizeof(float) * rows * k);
    uint16_t *xh = malloc(2 * (size_t)rows * k), *yh = malloc(2 * (size_t)rows * n);
    float *y = malloc(sizeof(float) * rows * n);
    for (int64_t i = 0; i < (int64_t)n * k * bits / 8; i++)
        q[i] = (uint8_t)next();
    for (int64_t i = 0; i < (int64_t)n * ng; i++) {
        s[i] = uniform(0.001f, 0.05f);
        z[i] = (uint8_t)(next() % 16);
    }
    for (int64_t i = 0; i < (int64_t)rows * k; i++) {
        xf[i] = uniform(-1, 1);
        if (t == KILN_DTYPE_BF16) {
            xh[i] = h->float_to_bf16(xf[i]);
            xf[i] = h->bf16_to_float(xh[i]);
        }
    }
    kiln_tensor_desc d[5] = {desc2(t, rows, k), desc2(KILN_DTYPE_U8, n, (int64_t)k * bits / 8),
                             desc2(KILN_DTYPE_F32, n, ng), desc2(KILN_DTYPE_U8, n, ng)};
    int32_t n_in = bits == 4 ? 4 : 3;
    d[n_in] = desc2(t, rows, n);
    const void *in[4] = {t == KILN_DTYPE_F32 ? (const void *)xf : xh, q, s, z};
    void *out[1] = {t == KILN_DTYPE_F32 ? (void *)y : yh};
    size_t wsz = p->ops->workspace_size(p, d, n_in, d + n_in, 1);
    void *ws = malloc(wsz ? wsz : 1);
    CHECK(p->ops->supports(p, KILN_BACKEND_CPU, d, n_in, 1));
    CHECK_OK(p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, n_in, d + n_in, out, 1, ws, pool));
    double diff = 0, ref = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < n; o++) {
            double acc = 0;
            for (int64_t i = 0; i < k; i++) {
                int64_t g = o * ng + i / group;
                double w;
                if (bits == 8) {
                    w = (double)s[g] * (int8_t)q[o * k + i];
                } else {
                    uint8_t b = q[o * (k / 2) + i / 2];
                    w = (double)s[g] * ((i & 1 ? b >> 4 : b & 15) - z[g]);
                }
                acc += w * xf[r * k + i];
            }
            double got = t == KILN_DTYPE_F32 ? y[r * n + o] : h->bf16_to_float(yh[r * n + o]);
            diff += (got - acc) * (got - acc);
            ref += acc * acc;
        }
    double rel = sqrt(diff / ref), tol = t == KILN_DTYPE_F32 ? 1e-6 : 4e-3;
    if (!(rel <= tol))
        fprintf(stderr, "int%d g%d %s: relative error %.3g > %g\n", bits, group, t == KILN_DTYPE_F32 ? "f32" : "bf16",
                rel, tol);
    CHECK(rel <= tol);
    free(q), free(z), free(s), free(xf), free(xh), free(yh), free(y), free(ws);
    p->ops->destroy(p);
}

static void test_plugin(void)
{
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_OK(kiln_threadpool_create(2, &pool));
    check_plugin(8, 384, KILN_DTYPE_F32);
    check_plugin(8, 128, KILN_DTYPE_BF16);
    check_plugin(4, 128, KILN_DTYPE_F32);
    check_plugin(4, 32, KILN_DTYPE_BF16);
    /* values the creator refuses, each named */
    int32_t bits = 3, g = 128, n = 8, k = 256;
    kiln_field f[4] = {fi32("bits", &bits), fi32("group_size", &g), fi32("n", &n), fi32("k", &k)};
    const kiln_plugin_creator *c = kiln_registry_find(reg, "WeightOnlyMatMul", "1", "kiln", NULL);
    kiln_plugin *p = NULL;
    CHECK_FAILS(kiln_plugin_create(c, f, 4, &p), KILN_ERROR_INVALID_ARGUMENT, "bits 3");
    bits = 4, g = 96;
    CHECK_FAILS(kiln_plugin_create(c, f, 4, &p), KILN_ERROR_INVALID_ARGUMENT, "group_size 96");
    kiln_threadpool_destroy(pool);
    kiln_registry_destroy(reg);
}

static void test_e4m3(void)
{
    const struct {
        float f;
        uint8_t c;
    } cases[] = {{448.0f, 0x7E},        {1.0f, 0x38},          {0.5f, 0x30},   {0.015625f, 0x08}, {0.001953125f, 0x01},
                 {1.0625f, 0x38},       {1.1875f, 0x3A},       {-3.0f, 0xC4},  {500.0f, 0x7E},    {-1e9f, 0xFE},
                 {0.0009765625f, 0x00}, {0.0029296875f, 0x02}, {240.0f, 0x77}, {-0.0f, 0x80},     {0.0f, 0x00}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t c = kiln_f32_to_e4m3(cases[i].f);
        if (c != cases[i].c)
            fprintf(stderr, "e4m3(%g) = 0x%02X, expected 0x%02X\n", cases[i].f, c, cases[i].c);
        CHECK(c == cases[i].c);
    }
    CHECK(kiln_f32_to_e4m3(NAN) == 0x7F);
    CHECK(isnan(kiln_e4m3_to_f32(0x7F)) && isnan(kiln_e4m3_to_f32(0xFF)));
    CHECK(kiln_e4m3_to_f32(0x7E) == 448.0f && kiln_e4m3_to_f32(0x01) == 0.001953125f);
    int bad = 0;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7F) != 0x7F)
            bad += kiln_f32_to_e4m3(kiln_e4m3_to_f32((uint8_t)c)) != c;
    CHECK(bad == 0);
    /* values are increasing in the code: the rounding is to a neighbour */
    for (int c = 0; c < 0x7E; c++)
        CHECK(kiln_e4m3_to_f32((uint8_t)c) < kiln_e4m3_to_f32((uint8_t)(c + 1)));
}

static void check_fp8_plugin(kiln_dtype t, int32_t rows)
{
    const kiln_host_api *h = kiln_host();
    int32_t n = 24, k = 160;
    kiln_field f[2] = {fi32("n", &n), fi32("k", &k)};
    const kiln_plugin_creator *c = kiln_registry_find(reg, "Fp8MatMul", "1", "kiln", NULL);
    kiln_plugin *p = NULL;
    CHECK(c != NULL);
    if (!c || kiln_plugin_create(c, f, 2, &p) != KILN_OK) {
        CHECK(0);
        return;
    }
    uint8_t *w = malloc((size_t)n * k);
    float *sw = malloc(sizeof(float) * n), *xf = malloc(sizeof(float) * rows * k),
          *y = malloc(sizeof(float) * rows * n);
    uint16_t *xh = malloc(2 * (size_t)rows * k), *yh = malloc(2 * (size_t)rows * n);
    for (int64_t i = 0; i < (int64_t)n * k; i++) {
        w[i] = (uint8_t)next();
        if ((w[i] & 0x7F) == 0x7F)
            w[i] ^= 1;
    }
    for (int64_t i = 0; i < n; i++)
        sw[i] = uniform(0.001f, 0.01f);
    for (int64_t i = 0; i < (int64_t)rows * k; i++) {
        xf[i] = uniform(-2, 2);
        if (t == KILN_DTYPE_BF16) {
            xh[i] = h->float_to_bf16(xf[i]);
            xf[i] = h->bf16_to_float(xh[i]);
        }
    }
    for (int64_t i = 0; i < k; i++)
        xf[i] = 0; /* a row of zeros: scale 0, output 0 */
    if (t == KILN_DTYPE_BF16)
        for (int64_t i = 0; i < k; i++)
            xh[i] = 0;
    kiln_tensor_desc d[4] = {desc2(t, rows, k), desc2(KILN_DTYPE_U8, n, k), desc2(KILN_DTYPE_F32, n, 1),
                             desc2(t, rows, n)};
    d[2].dims.rank = 1;
    const void *in[3] = {t == KILN_DTYPE_F32 ? (const void *)xf : xh, w, sw};
    void *out[1] = {t == KILN_DTYPE_F32 ? (void *)y : yh};
    size_t wsz = p->ops->workspace_size(p, d, 3, d + 3, 1);
    void *ws = malloc(wsz ? wsz : 1);
    CHECK(p->ops->supports(p, KILN_BACKEND_CPU, d, 3, 1));
    CHECK_OK(p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, 3, d + 3, out, 1, ws, pool));
    /* the definition: per-row scale max|x| / 448, x · 448 / max rounded to
     * E4M3, products of the exact values, times both scales */
    double diff = 0, ref = 0;
    for (int64_t r = 0; r < rows; r++) {
        float a = 0;
        for (int64_t i = 0; i < k; i++)
            a = fabsf(xf[r * k + i]) > a ? fabsf(xf[r * k + i]) : a;
        float inv = a > 0 ? 448.0f / a : 0.0f;
        for (int64_t o = 0; o < n; o++) {
            double acc = 0;
            for (int64_t i = 0; i < k; i++)
                acc += (double)kiln_e4m3_to_f32(kiln_f32_to_e4m3(xf[r * k + i] * inv)) * kiln_e4m3_to_f32(w[o * k + i]);
            acc *= (double)(a / 448.0f) * sw[o];
            double got = t == KILN_DTYPE_F32 ? y[r * n + o] : h->bf16_to_float(yh[r * n + o]);
            if (r == 0)
                CHECK(got == 0.0);
            diff += (got - acc) * (got - acc);
            ref += acc * acc;
        }
    }
    double rel = sqrt(diff / ref), tol = t == KILN_DTYPE_F32 ? 1e-6 : 4e-3;
    if (!(rel <= tol))
        fprintf(stderr, "Fp8MatMul %s: relative error %.3g > %g\n", t == KILN_DTYPE_F32 ? "f32" : "bf16", rel, tol);
    CHECK(rel <= tol);
    free(w), free(sw), free(xf), free(y), free(xh), free(yh), free(ws);
    p->ops->destroy(p);
    /* k not a multiple of 16 is refused */
    k = 40;
    CHECK_FAILS(kiln_plugin_create(c, f, 2, &p), KILN_ERROR_INVALID_ARGUMENT, "multiple of 16");
}

static void test_fp8_plugin(void)
{
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_OK(kiln_threadpool_create(2, &pool));
    check_fp8_plugin(KILN_DTYPE_F32, 3);
    check_fp8_plugin(KILN_DTYPE_BF16, 17);
    kiln_threadpool_destroy(pool);
    kiln_registry_destroy(reg);
}

static kiln_field fstr(const char *name, const char *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_STRING, 1, v};
}

static kiln_plugin *make(const char *name, const kiln_field *f, int32_t n)
{
    const kiln_plugin_creator *c = kiln_registry_find(reg, name, "1", "kiln", NULL);
    kiln_plugin *p = NULL;
    CHECK(c != NULL);
    if (c)
        CHECK_OK(kiln_plugin_create(c, f, n, &p));
    return p;
}

/* Whether plugin p on the CPU gives the same bytes in out[i] (bytes[i]
 * each) as in ref[i]. */
static int same_bytes(void *const *out, void *const *ref, const size_t *bytes, int n)
{
    int same = 1;
    for (int i = 0; i < n; i++)
        same &= memcmp(out[i], ref[i], bytes[i]) == 0;
    return same;
}

/* E4M3 activations handed over by the kernel that writes them (quantize =
 * fp8 of RMSNorm, AddRMSNorm and SwiGLU; Fp8MatMul's x_scale input): the
 * same bytes as the unquantized plugin's y quantized row by row as
 * Fp8MatMul quantizes its x (kiln_fp8_quantize_row), and Fp8MatMul on
 * those codes the same y as Fp8MatMul on x. The FP8 engine's layers so
 * compute exactly what they computed with each matmul quantizing its x. */
static void test_fp8_input(void)
{
    const kiln_host_api *h = kiln_host();
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_OK(kiln_threadpool_create(2, &pool));
    const int64_t rows = 5, k = 96;
    const float eps = 1e-5f;
    float *x = malloc(sizeof(float) * rows * k * 2), *res = malloc(sizeof(float) * rows * k),
          *wn = malloc(sizeof(float) * k), *sum = malloc(sizeof(float) * rows * k),
          *sum_ref = malloc(sizeof(float) * rows * k), *yf = malloc(sizeof(float) * rows * k * 2),
          *sx = malloc(sizeof(float) * rows), *sx_ref = malloc(sizeof(float) * rows);
    uint16_t *yb = malloc(2 * (size_t)rows * k), *wb = malloc(2 * (size_t)k);
    uint8_t *q = malloc((size_t)(rows * k)), *q_ref = malloc((size_t)(rows * k));
    void *ws = malloc((size_t)(rows * k) * 4);
    for (int64_t i = 0; i < rows * k * 2; i++)
        x[i] = uniform(-30, 30);
    for (int64_t i = 0; i < rows * k; i++)
        res[i] = uniform(-3, 3);
    for (int64_t i = 0; i < k; i++)
        wb[i] = h->float_to_bf16(wn[i] = uniform(0.5f, 1.5f));
    for (int add = 0; add < 2; add++) {
        /* x and sum f32, y bf16 (the engine's norms), then all f32 */
        for (int yt16 = 0; yt16 < 2; yt16++) {
            const kiln_dtype yt = yt16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
            kiln_field f[3] = {{sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "epsilon", KILN_FIELD_F32, 1, &eps},
                               fstr("output_dtype", yt16 ? "bf16" : "f32"),
                               fstr("quantize", "fp8")};
            const char *name = add ? "AddRMSNorm" : "RMSNorm";
            kiln_plugin *plain = make(name, f, 2), *quant = make(name, f, 3);
            if (!plain || !quant)
                break;
            /* quantize is in the blob: the plugin loaded back has its outputs */
            {
                const kiln_plugin_creator *rc = kiln_registry_find(reg, name, "1", "kiln", NULL);
                unsigned char blob[64];
                size_t bsz = sizeof blob;
                kiln_plugin *back = NULL;
                CHECK_OK(quant->ops->serialize(quant, blob, &bsz));
                CHECK_OK(rc->deserialize(rc, rc->blob_version, blob, bsz, &back));
                if (back) {
                    CHECK(back->ops->num_outputs(back) == 2 + add);
                    back->ops->destroy(back);
                }
            }
            kiln_tensor_desc d[6] = {desc2(KILN_DTYPE_F32, rows, k), desc2(KILN_DTYPE_F32, rows, k), desc2(yt, k, 1),
                                     desc2(KILN_DTYPE_F32, rows, k)};
            d[2].dims.rank = 1;
            const int32_t ni = 2 + add;
            const void *in[3] = {x, res, yt16 ? (const void *)wb : wn};
            if (!add)
                in[1] = in[2], d[1] = d[2];
            /* outputs: [sum,] y  and  [sum,] codes, scales */
            kiln_tensor_desc dp[2] = {d[3], desc2(yt, rows, k)},
                             dq[3] = {d[3], desc2(KILN_DTYPE_U8, rows, k), desc2(KILN_DTYPE_F32, rows, 1)};
            void *op[2] = {sum_ref, yt16 ? (void *)yb : yf}, *oq[3] = {sum, q, sx};
            kiln_tensor_desc din[6];
            for (int i = 0; i < ni; i++)
                din[i] = d[i];
            for (int i = 0; i < 1 + add; i++)
                din[ni + i] = dp[i + !add];
            CHECK_OK(
                plain->ops->enqueue(plain, KILN_BACKEND_CPU, din, in, ni, din + ni, op + !add, 1 + add, NULL, pool));
            for (int i = 0; i < 2 + add; i++)
                din[ni + i] = dq[i + !add];
            CHECK(quant->ops->supports(quant, KILN_BACKEND_CPU, din, ni, 2 + add));
            CHECK_OK(quant->ops->enqueue(quant, KILN_BACKEND_CPU, din, in, ni, din + ni, oq + !add, 2 + add, ws, pool));
            for (int64_t r = 0; r < rows; r++) {
                float row[96];
                for (int64_t i = 0; i < k; i++)
                    row[i] = yt16 ? h->bf16_to_float(yb[r * k + i]) : yf[r * k + i];
                sx_ref[r] = kiln_fp8_quantize_row(row, k, 0.0f, q_ref + r * k);
            }
            void *got[3] = {q, sx, sum}, *want[3] = {q_ref, sx_ref, sum_ref};
            const size_t bytes[3] = {(size_t)(rows * k), sizeof(float) * rows, sizeof(float) * rows * k};
            CHECK(same_bytes(got, want, bytes, 2 + add));
            plain->ops->destroy(plain);
            quant->ops->destroy(quant);
        }
    }
    /* SwiGLU packed, bf16: gate then up in each row of 2k */
    {
        const int32_t one = 1;
        kiln_field f[2] = {fi32("packed", &one), fstr("quantize", "fp8")};
        kiln_plugin *plain = make("SwiGLU", f, 1), *quant = make("SwiGLU", f, 2);
        uint16_t *gu = malloc(2 * (size_t)rows * k * 2);
        for (int64_t i = 0; i < rows * k * 2; i++)
            gu[i] = h->float_to_bf16(x[i] / 8);
        kiln_tensor_desc d[3] = {desc2(KILN_DTYPE_BF16, rows, 2 * k), desc2(KILN_DTYPE_BF16, rows, k)},
                         dq[3] = {d[0], desc2(KILN_DTYPE_U8, rows, k), desc2(KILN_DTYPE_F32, rows, 1)};
        const void *in[1] = {gu};
        void *op[1] = {yb}, *oq[2] = {q, sx};
        if (plain && quant) {
            CHECK_OK(plain->ops->enqueue(plain, KILN_BACKEND_CPU, d, in, 1, d + 1, op, 1, NULL, pool));
            CHECK(quant->ops->supports(quant, KILN_BACKEND_CPU, dq, 1, 2));
            CHECK_OK(quant->ops->enqueue(quant, KILN_BACKEND_CPU, dq, in, 1, dq + 1, oq, 2, ws, pool));
            for (int64_t r = 0; r < rows; r++) {
                float row[96];
                for (int64_t i = 0; i < k; i++)
                    row[i] = h->bf16_to_float(yb[r * k + i]);
                sx_ref[r] = kiln_fp8_quantize_row(row, k, 0.0f, q_ref + r * k);
            }
            void *got[2] = {q, sx}, *want[2] = {q_ref, sx_ref};
            const size_t bytes[2] = {(size_t)(rows * k), sizeof(float) * rows};
            CHECK(same_bytes(got, want, bytes, 2));
        }
        free(gu);
        if (plain)
            plain->ops->destroy(plain);
        if (quant)
            quant->ops->destroy(quant);
    }
    /* Fp8MatMul on the codes and scales of x against Fp8MatMul on x */
    {
        int32_t n = 24, kk = (int32_t)k;
        kiln_field f[3] = {fi32("n", &n), fi32("k", &kk), fstr("output_dtype", "bf16")};
        kiln_plugin *on_x = make("Fp8MatMul", f, 2), *on_q = make("Fp8MatMul", f, 3);
        uint8_t *w = malloc((size_t)n * k);
        float *sw = malloc(sizeof(float) * n);
        uint16_t *xb = malloc(2 * (size_t)rows * k), *y1 = malloc(2 * (size_t)rows * n),
                 *y2 = malloc(2 * (size_t)rows * n);
        for (int64_t i = 0; i < (int64_t)n * k; i++)
            w[i] = (uint8_t)(next() & 0x7E);
        for (int64_t i = 0; i < n; i++)
            sw[i] = uniform(0.001f, 0.01f);
        for (int64_t r = 0; r < rows; r++) {
            float row[96];
            for (int64_t i = 0; i < k; i++)
                row[i] = h->bf16_to_float(xb[r * k + i] = h->float_to_bf16(x[r * k + i]));
            sx[r] = kiln_fp8_quantize_row(row, k, 0.0f, q + r * k);
        }
        kiln_tensor_desc d[4] = {desc2(KILN_DTYPE_BF16, rows, k), desc2(KILN_DTYPE_U8, n, k),
                                 desc2(KILN_DTYPE_F32, n, 1), desc2(KILN_DTYPE_BF16, rows, n)},
                         dq[5] = {desc2(KILN_DTYPE_U8, rows, k), d[1], d[2], desc2(KILN_DTYPE_F32, rows, 1), d[3]};
        d[2].dims.rank = dq[2].dims.rank = 1;
        const void *in[3] = {xb, w, sw}, *inq[4] = {q, w, sw, sx};
        void *o1[1] = {y1}, *o2[1] = {y2};
        void *mws = on_x ? malloc(on_x->ops->workspace_size(on_x, d, 3, d + 3, 1)) : NULL;
        if (on_x && on_q && mws) {
            CHECK_OK(on_x->ops->enqueue(on_x, KILN_BACKEND_CPU, d, in, 3, d + 3, o1, 1, mws, pool));
            CHECK(on_q->ops->supports(on_q, KILN_BACKEND_CPU, dq, 4, 1));
            CHECK_OK(on_q->ops->enqueue(on_q, KILN_BACKEND_CPU, dq, inq, 4, dq + 4, o2, 1, mws, pool));
            CHECK(memcmp(y1, y2, 2 * (size_t)rows * n) == 0);
            /* codes without output_dtype: y's dtype is unknown */
            kiln_dtype it[4] = {KILN_DTYPE_U8, KILN_DTYPE_U8, KILN_DTYPE_F32, KILN_DTYPE_F32}, ot[1];
            CHECK_FAILS(on_x->ops->output_dtypes(on_x, it, 4, ot, 1), KILN_ERROR_INVALID_ARGUMENT, "output_dtype");
            /* the blob round-trips with y's dtype; a v1 blob (n, k) reads
             * as y in x's dtype */
            const kiln_plugin_creator *fc = kiln_registry_find(reg, "Fp8MatMul", "1", "kiln", NULL);
            unsigned char blob[64];
            size_t bsz = sizeof blob;
            CHECK_OK(on_q->ops->serialize(on_q, blob, &bsz));
            CHECK(bsz == 3 * sizeof(int32_t) + sizeof(float)); /* n, k, y's dtype, x_amax */
            kiln_plugin *back = NULL;
            kiln_dtype bt[4] = {KILN_DTYPE_F16, KILN_DTYPE_U8, KILN_DTYPE_F32, KILN_DTYPE_F32};
            CHECK_OK(fc->deserialize(fc, 2, blob, bsz - sizeof(float), &back)); /* before x_amax */
            if (back) {
                CHECK_OK(back->ops->output_dtypes(back, bt, 3, ot, 1));
                CHECK(ot[0] == KILN_DTYPE_BF16);
                back->ops->destroy(back);
            }
            CHECK_OK(fc->deserialize(fc, 1, blob, 2 * sizeof(int32_t), &back));
            if (back) {
                CHECK_OK(back->ops->output_dtypes(back, bt, 3, ot, 1));
                CHECK(ot[0] == KILN_DTYPE_F16);
                back->ops->destroy(back);
            }
            CHECK_FAILS(fc->deserialize(fc, 4, blob, bsz, &back), KILN_ERROR_VERSION, "newer");
            /* the wrong number of scales */
            dq[3] = desc2(KILN_DTYPE_F32, rows - 1, 1);
            CHECK_FAILS(on_q->ops->enqueue(on_q, KILN_BACKEND_CPU, dq, inq, 4, dq + 4, o2, 1, mws, pool),
                        KILN_ERROR_SHAPE, "x_scale");
        }
        free(mws), free(w), free(sw), free(xb), free(y1), free(y2);
        if (on_x)
            on_x->ops->destroy(on_x);
        if (on_q)
            on_q->ops->destroy(on_q);
    }
    /* fields a user may get wrong */
    kiln_plugin *p = NULL;
    kiln_field bad[2] = {{sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "epsilon", KILN_FIELD_F32, 1, &eps},
                         fstr("quantize", "int4")};
    CHECK_FAILS(kiln_plugin_create(kiln_registry_find(reg, "RMSNorm", "1", "kiln", NULL), bad, 2, &p),
                KILN_ERROR_INVALID_ARGUMENT, "expected none or fp8");
    CHECK_FAILS(kiln_plugin_create(kiln_registry_find(reg, "SwiGLU", "1", "kiln", NULL), bad + 1, 1, &p),
                KILN_ERROR_INVALID_ARGUMENT, "expected none or fp8");
    int32_t n = 16, kk = 32;
    kiln_field bf[3] = {fi32("n", &n), fi32("k", &kk), fstr("output_dtype", "fp4")};
    CHECK_FAILS(kiln_plugin_create(kiln_registry_find(reg, "Fp8MatMul", "1", "kiln", NULL), bf, 3, &p),
                KILN_ERROR_INVALID_ARGUMENT, "expected input, f32, f16 or bf16");
    free(x), free(res), free(wn), free(sum), free(sum_ref), free(yf), free(sx), free(sx_ref), free(yb), free(wb);
    free(q), free(q_ref), free(ws);
    kiln_threadpool_destroy(pool);
    kiln_registry_destroy(reg);
}


/* A static activation scale (field x_amax, from calibration) on each
 * plugin that quantizes activations: every row's scale is x_amax / 448,
 * a value within ±x_amax becomes its nearest E4M3 step of that scale
 * (relative error at most 2^-4, checked against the value itself, not
 * against kiln_fp8_quantize_row), and a value beyond saturates to ±448
 * (code 0x7E, 0xFE). The field survives the blob; bad values are refused. */
static int static_codes_ok(const float *y, const uint8_t *q, const float *sx, int64_t rows, int64_t k, float amax)
{
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        bad += sx[r] != amax / 448.0f;
        for (int64_t i = 0; i < k; i++) {
            const float v = y[r * k + i], got = kiln_e4m3_to_f32(q[r * k + i]) * sx[r];
            if (fabsf(v) > amax)
                bad += (q[r * k + i] & 0x7F) != 0x7E || (v < 0) != ((q[r * k + i] & 0x80) != 0);
            else
                bad += fabsf(got - v) > fabsf(v) / 16.0f + amax / 448.0f * 0x1p-9f;
        }
    }
    return bad == 0;
}

static void test_fp8_static(void)
{
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_OK(kiln_threadpool_create(2, &pool));
    enum { rows = 4, k = 64 };
    const float eps = 1e-5f, amax = 1.25f;
    static float x[rows * 2 * k], wn[k], y[rows * k], sx[rows], sx2[rows];
    static uint8_t q[rows * k], q2[rows * k];
    static float ws[rows * 2 * k];
    for (int64_t i = 0; i < rows * 2 * k; i++)
        x[i] = uniform(-3, 3);
    for (int64_t i = 0; i < k; i++)
        wn[i] = uniform(0.5f, 1.5f);
    /* RMSNorm: y = x / rms(x) · w has values past 1.25 in every row */
    {
        kiln_field f[4] = {{sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "epsilon", KILN_FIELD_F32, 1, &eps},
                           fstr("output_dtype", "f32"),
                           fstr("quantize", "fp8"),
                           {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "x_amax", KILN_FIELD_F32, 1, &amax}};
        kiln_plugin *plain = make("RMSNorm", f, 2), *quant = make("RMSNorm", f, 4);
        kiln_tensor_desc d[4] = {desc2(KILN_DTYPE_F32, rows, k), desc2(KILN_DTYPE_F32, k, 1),
                                 desc2(KILN_DTYPE_U8, rows, k), desc2(KILN_DTYPE_F32, rows, 1)};
        d[1].dims.rank = 1;
        kiln_tensor_desc dp[3] = {d[0], d[1], desc2(KILN_DTYPE_F32, rows, k)};
        const void *in[2] = {x, wn};
        void *op[1] = {y}, *oq[2] = {q, sx};
        if (plain && quant) {
            CHECK_OK(plain->ops->enqueue(plain, KILN_BACKEND_CPU, dp, in, 2, dp + 2, op, 1, NULL, pool));
            CHECK_OK(quant->ops->enqueue(quant, KILN_BACKEND_CPU, d, in, 2, d + 2, oq, 2, ws, pool));
            CHECK(static_codes_ok(y, q, sx, rows, k, amax));
            /* the field is in the blob */
            const kiln_plugin_creator *rc = kiln_registry_find(reg, "RMSNorm", "1", "kiln", NULL);
            unsigned char blob[64];
            size_t bsz = sizeof blob;
            kiln_plugin *back = NULL;
            CHECK_OK(quant->ops->serialize(quant, blob, &bsz));
            CHECK(bsz == 2 * sizeof(float) + 2 * sizeof(int32_t));
            CHECK_OK(rc->deserialize(rc, rc->blob_version, blob, bsz, &back));
            if (back) {
                void *ob[2] = {q2, sx2};
                CHECK_OK(back->ops->enqueue(back, KILN_BACKEND_CPU, d, in, 2, d + 2, ob, 2, ws, pool));
                CHECK(memcmp(q, q2, sizeof q) == 0 && memcmp(sx, sx2, sizeof sx) == 0);
                back->ops->destroy(back);
            }
            /* a v3 blob (before x_amax) quantizes each row by its own max */
            CHECK_OK(rc->deserialize(rc, 3, blob, bsz - sizeof(float), &back));
            if (back) {
                void *ob[2] = {q2, sx2};
                CHECK_OK(back->ops->enqueue(back, KILN_BACKEND_CPU, d, in, 2, d + 2, ob, 2, ws, pool));
                float m = 0.0f;
                for (int64_t i = 0; i < k; i++)
                    m = fabsf(y[i]) > m ? fabsf(y[i]) : m;
                CHECK(sx2[0] == m / 448.0f);
                back->ops->destroy(back);
            }
        }
        if (plain)
            plain->ops->destroy(plain);
        if (quant)
            quant->ops->destroy(quant);
    }
    /* SwiGLU packed, f32 */
    {
        const int32_t one = 1;
        kiln_field f[3] = {fi32("packed", &one),
                           fstr("quantize", "fp8"),
                           {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "x_amax", KILN_FIELD_F32, 1, &amax}};
        kiln_plugin *plain = make("SwiGLU", f, 1), *quant = make("SwiGLU", f, 3);
        kiln_tensor_desc d[2] = {desc2(KILN_DTYPE_F32, rows, 2 * k), desc2(KILN_DTYPE_F32, rows, k)},
                         dq[3] = {d[0], desc2(KILN_DTYPE_U8, rows, k), desc2(KILN_DTYPE_F32, rows, 1)};
        const void *in[1] = {x};
        void *op[1] = {y}, *oq[2] = {q, sx};
        if (plain && quant) {
            CHECK_OK(plain->ops->enqueue(plain, KILN_BACKEND_CPU, d, in, 1, d + 1, op, 1, NULL, pool));
            CHECK_OK(quant->ops->enqueue(quant, KILN_BACKEND_CPU, dq, in, 1, dq + 1, oq, 2, ws, pool));
            CHECK(static_codes_ok(y, q, sx, rows, k, amax));
        }
        if (plain)
            plain->ops->destroy(plain);
        if (quant)
            quant->ops->destroy(quant);
    }
    /* Fp8MatMul quantizing its own x: the same y as on the codes and
     * scales of x quantized statically */
    {
        int32_t n = 8, kk = k;
        kiln_field f[3] = {fi32("n", &n),
                           fi32("k", &kk),
                           {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "x_amax", KILN_FIELD_F32, 1, &amax}};
        kiln_field fq[3] = {fi32("n", &n), fi32("k", &kk), fstr("output_dtype", "f32")};
        kiln_plugin *on_x = make("Fp8MatMul", f, 3), *on_q = make("Fp8MatMul", fq, 3);
        static uint8_t w[8 * k];
        static float sw[8], y1[rows * 8], y2[rows * 8];
        for (int64_t i = 0; i < 8 * k; i++)
            w[i] = (uint8_t)(next() & 0x7E);
        for (int64_t i = 0; i < 8; i++)
            sw[i] = uniform(0.001f, 0.01f);
        for (int64_t r = 0; r < rows; r++)
            sx[r] = kiln_fp8_quantize_row(x + r * k, k, amax, q + r * k);
        CHECK(static_codes_ok(x, q, sx, rows, k, amax));
        kiln_tensor_desc d[4] = {desc2(KILN_DTYPE_F32, rows, k), desc2(KILN_DTYPE_U8, 8, k),
                                 desc2(KILN_DTYPE_F32, 8, 1), desc2(KILN_DTYPE_F32, rows, 8)},
                         dq[5] = {desc2(KILN_DTYPE_U8, rows, k), d[1], d[2], desc2(KILN_DTYPE_F32, rows, 1), d[3]};
        d[2].dims.rank = dq[2].dims.rank = 1;
        const void *in[3] = {x, w, sw}, *inq[4] = {q, w, sw, sx};
        void *o1[1] = {y1}, *o2[1] = {y2};
        void *mws = on_x ? malloc(on_x->ops->workspace_size(on_x, d, 3, d + 3, 1)) : NULL;
        if (on_x && on_q && mws) {
            CHECK_OK(on_x->ops->enqueue(on_x, KILN_BACKEND_CPU, d, in, 3, d + 3, o1, 1, mws, pool));
            CHECK_OK(on_q->ops->enqueue(on_q, KILN_BACKEND_CPU, dq, inq, 4, dq + 4, o2, 1, mws, pool));
            CHECK(memcmp(y1, y2, sizeof y1) == 0);
        }
        free(mws);
        if (on_x)
            on_x->ops->destroy(on_x);
        if (on_q)
            on_q->ops->destroy(on_q);
    }
    /* fields a user may get wrong */
    kiln_plugin *p = NULL;
    const float neg = -1.0f;
    kiln_field bad[3] = {{sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "epsilon", KILN_FIELD_F32, 1, &eps},
                         fstr("quantize", "fp8"),
                         {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "x_amax", KILN_FIELD_F32, 1, &neg}};
    CHECK_FAILS(kiln_plugin_create(kiln_registry_find(reg, "RMSNorm", "1", "kiln", NULL), bad, 3, &p),
                KILN_ERROR_INVALID_ARGUMENT, "x_amax");
    CHECK_FAILS(kiln_plugin_create(kiln_registry_find(reg, "SwiGLU", "1", "kiln", NULL), bad + 1, 2, &p),
                KILN_ERROR_INVALID_ARGUMENT, "x_amax");
    /* without quantize = fp8 there is nothing to scale */
    bad[1] = bad[2];
    bad[1].data = &amax;
    CHECK_FAILS(kiln_plugin_create(kiln_registry_find(reg, "RMSNorm", "1", "kiln", NULL), bad, 2, &p),
                KILN_ERROR_INVALID_ARGUMENT, "without quantize");
    int32_t n = 16, kk = 32;
    kiln_field bf[3] = {fi32("n", &n),
                        fi32("k", &kk),
                        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "x_amax", KILN_FIELD_F32, 1, &neg}};
    CHECK_FAILS(kiln_plugin_create(kiln_registry_find(reg, "Fp8MatMul", "1", "kiln", NULL), bf, 3, &p),
                KILN_ERROR_INVALID_ARGUMENT, "x_amax");
    kiln_threadpool_destroy(pool);
    kiln_registry_destroy(reg);
}

static const test_case_ tests[] = {TEST(test_rtn),       TEST(test_rtn_reference), TEST(test_layouts),
                                   TEST(test_plugin),    TEST(test_e4m3),          TEST(test_fp8_plugin),
                                   TEST(test_fp8_input), TEST(test_fp8_static)};
TEST_MAIN(tests)
