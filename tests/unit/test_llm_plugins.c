/* The fused modes of the built-in LLM plugins on the CPU against a
 * straightforward composition of the unfused plugins (and plain C for the
 * residual add): AddRMSNorm against an add then RMSNorm, RoPE on the
 * packed qkv row against RoPE on q and k apart, packed SwiGLU against
 * SwiGLU on gate and up apart, packed-qkv PagedAttention against q, k, v
 * given apart; QuantGather's rows against the Q8_0 formula and the
 * host's ggml dequantization; FusedMatMul against RMSNorm, a plain
 * matmul and SwiGLU, the residual add or RoPE. PagedAttention with an FP8
 * cache against a reference E4M3 encoder and attention in double.
 * Each fused path runs the same f32 arithmetic on the same rounded values,
 * so the results must agree bit for bit. Old (v1) blobs still load.
 * The mixed dtypes of an f32 residual stream in a bf16/f16 engine
 * (AddRMSNorm: x f32 + a bf16 residual, y bf16) against the definition
 * in double; FusedMatMul with an f32 x or residual against the
 * composition of the mixed RMSNorm, a matmul and an f32 add. */
#include "test.h"

#include <kiln/plugin.h>

#include <math.h>

#include "core/fp8.h"
#include "core/threadpool.h"
#include "llm/gguf.h"
#include "qmatmul/qmatmul_cpu.h"

static kiln_registry *reg;
static kiln_threadpool *pool;

static uint32_t rng = 2024;
static float uniform(float lo, float hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return lo + (hi - lo) * (float)(rng >> 8) / 16777216.0f;
}

static size_t esize(kiln_dtype t) { return t == KILN_DTYPE_F32 || t == KILN_DTYPE_I32 ? 4 : 2; }

static void store(void *p, kiln_dtype t, int64_t i, float v)
{
    const kiln_host_api *h = kiln_host();
    if (t == KILN_DTYPE_F32)
        ((float *)p)[i] = v;
    else if (t == KILN_DTYPE_F16)
        ((uint16_t *)p)[i] = h->float_to_half(v);
    else
        ((uint16_t *)p)[i] = h->float_to_bf16(v);
}

static float load(const void *p, kiln_dtype t, int64_t i)
{
    const kiln_host_api *h = kiln_host();
    if (t == KILN_DTYPE_F32)
        return ((const float *)p)[i];
    if (t == KILN_DTYPE_F16)
        return h->half_to_float(((const uint16_t *)p)[i]);
    return h->bf16_to_float(((const uint16_t *)p)[i]);
}

/* n random values in [-1, 1) stored as t. */
static void *random_buf(kiln_dtype t, int64_t n)
{
    void *p = malloc((size_t)n * esize(t));
    for (int64_t i = 0; i < n; i++)
        store(p, t, i, uniform(-1.0f, 1.0f));
    return p;
}

static kiln_tensor_desc desc(kiln_dtype t, int32_t rank, const int64_t *dims)
{
    kiln_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.abi_version = KILN_PLUGIN_ABI_VERSION;
    d.dtype = t;
    d.dims.rank = rank;
    for (int32_t i = 0; i < rank; i++)
        d.dims.d[i] = dims[i];
    return d;
}
#define DESC(t, ...) desc(t, (int32_t)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static kiln_field fi32(const char *name, const int32_t *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_I32, 1, v};
}

static kiln_field ff32(const char *name, const float *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_F32, 1, v};
}
static kiln_field fstr(const char *name, const char *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_STRING, 1, v};
}

static kiln_plugin *make(const char *name, const kiln_field *f, int32_t n)
{
    const kiln_plugin_creator *c = kiln_registry_find(reg, name, "1", "kiln", NULL);
    CHECK(c != NULL);
    kiln_plugin *p = NULL;
    if (c)
        CHECK_OK(kiln_plugin_create(c, f, n, &p));
    return p;
}

/* Runs p on the CPU; d holds the n_in input then the n_out output descs. */
static kiln_status run(kiln_plugin *p, const kiln_tensor_desc *d, const void *const *in, int32_t n_in, void *const *out,
                       int32_t n_out)
{
    if (!p->ops->supports(p, KILN_BACKEND_CPU, d, n_in, n_out))
        return KILN_ERROR_UNSUPPORTED;
    return p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, n_in, d + n_in, out, n_out, NULL, pool);
}

/* Serializes p, checks the blob's size, and loads it back as schema
 * version `version` (older blobs are prefixes of newer ones). */
static void check_blob(kiln_plugin *p, const char *name, uint32_t version, size_t old_size)
{
    const kiln_plugin_creator *c = kiln_registry_find(reg, name, "1", "kiln", NULL);
    size_t size = 0;
    CHECK_OK(p->ops->serialize(p, NULL, &size));
    unsigned char blob[256];
    CHECK(size <= sizeof blob && old_size < size);
    CHECK_OK(p->ops->serialize(p, blob, &size));
    kiln_plugin *q = NULL;
    CHECK_OK(c->deserialize(c, c->blob_version, blob, size, &q));
    if (q)
        q->ops->destroy(q);
    CHECK_OK(c->deserialize(c, version, blob, old_size, &q));
    if (q) {
        size_t again = 0;
        CHECK_OK(q->ops->serialize(q, NULL, &again));
        CHECK(again == size);
        q->ops->destroy(q);
    }
    CHECK_FAILS(c->deserialize(c, version, blob, size, &q), KILN_ERROR_FORMAT, "bytes");
    CHECK_FAILS(c->deserialize(c, c->blob_version + 1, blob, size, &q), KILN_ERROR_VERSION, "newer");
}

static const kiln_dtype float_types[3] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};

/* Columns [col, col + width) of a [rows, ld] tensor, as a new buffer. */
static void *columns(const void *src, kiln_dtype t, int64_t rows, int64_t ld, int64_t col, int64_t width)
{
    size_t es = esize(t);
    char *out = malloc((size_t)(rows * width) * es);
    for (int64_t r = 0; r < rows; r++)
        memcpy(out + (size_t)(r * width) * es, (const char *)src + (size_t)(r * ld + col) * es, (size_t)width * es);
    return out;
}

/* ---------------------------------------------------------------------------
 * AddRMSNorm against x + residual (stored in x's dtype) then RMSNorm
 * ------------------------------------------------------------------------- */

static void test_add_rmsnorm(void)
{
    const float eps = 1e-6f;
    kiln_field f = ff32("epsilon", &eps);
    kiln_plugin *norm = make("RMSNorm", &f, 1), *add = make("AddRMSNorm", &f, 1);
    const int64_t rows = 5, h = 67;
    for (int ti = 0; ti < 3 && norm && add; ti++) {
        kiln_dtype t = float_types[ti];
        size_t bytes = (size_t)(rows * h) * esize(t);
        void *x = random_buf(t, rows * h), *res = random_buf(t, rows * h), *w = random_buf(t, h);
        void *sum_ref = malloc(bytes), *y_ref = malloc(bytes), *sum = malloc(bytes), *y = malloc(bytes);
        for (int64_t i = 0; i < rows * h; i++)
            store(sum_ref, t, i, load(x, t, i) + load(res, t, i));
        kiln_tensor_desc dn[3] = {DESC(t, rows, h), DESC(t, h), DESC(t, rows, h)};
        const void *in_n[2] = {sum_ref, w};
        void *out_n[1] = {y_ref};
        CHECK_OK(run(norm, dn, in_n, 2, out_n, 1));
        kiln_tensor_desc da[5] = {DESC(t, rows, h), DESC(t, rows, h), DESC(t, h), DESC(t, rows, h), DESC(t, rows, h)};
        const void *in_a[3] = {x, res, w};
        void *out_a[2] = {sum, y};
        CHECK_OK(run(add, da, in_a, 3, out_a, 2));
        CHECK(memcmp(sum, sum_ref, bytes) == 0);
        CHECK(memcmp(y, y_ref, bytes) == 0);
        CHECK(load(y, t, 3) != 0.0f);
        free(x), free(res), free(w), free(sum_ref), free(y_ref), free(sum), free(y);
    }
    /* the residual must match x */
    kiln_tensor_desc bad[5] = {DESC(KILN_DTYPE_F32, 2, 8), DESC(KILN_DTYPE_F32, 1, 8), DESC(KILN_DTYPE_F32, 8),
                               DESC(KILN_DTYPE_F32, 2, 8), DESC(KILN_DTYPE_F32, 2, 8)};
    float buf16[16] = {0}, w8[8] = {0}, o1[16], o2[16];
    const void *in_bad[3] = {buf16, buf16, w8};
    void *out_bad[2] = {o1, o2};
    if (add)
        CHECK_FAILS(run(add, bad, in_bad, 3, out_bad, 2), KILN_ERROR_SHAPE, "residual");
    if (norm)
        norm->ops->destroy(norm);
    if (add)
        add->ops->destroy(add);
}

/* ---------------------------------------------------------------------------
 * AddRMSNorm and RMSNorm with an f32 x (the residual stream) and a bf16 or
 * f16 residual, weight and y, against the definition in double: sum = x +
 * residual (one f32 rounding: exact in double, then rounded), y =
 * sum / sqrt(mean(sum²) + eps) · weight, rounded once to y's dtype
 * ------------------------------------------------------------------------- */

static void test_add_rmsnorm_mixed(void)
{
    const float eps = 1e-6f;
    const int64_t rows = 4, h = 96;
    const kiln_dtype half[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int hi = 0; hi < 2; hi++) {
        const kiln_dtype t = half[hi];
        kiln_field f[2] = {ff32("epsilon", &eps), fstr("output_dtype", t == KILN_DTYPE_BF16 ? "bf16" : "f16")};
        kiln_plugin *norm = make("RMSNorm", f, 2), *add = make("AddRMSNorm", f, 2);
        if (!norm || !add)
            break;
        kiln_dtype in_t[3] = {KILN_DTYPE_F32, t, t}, out_t[2];
        CHECK_OK(add->ops->output_dtypes(add, in_t, 3, out_t, 2));
        CHECK(out_t[0] == KILN_DTYPE_F32 && out_t[1] == t);
        /* x spans several binades, so that the f32 sum keeps bits a
         * 16-bit sum would round away */
        float *x = malloc((size_t)(rows * h) * sizeof(float)), *sum = malloc((size_t)(rows * h) * sizeof(float));
        void *res = random_buf(t, rows * h), *w = random_buf(t, h), *y = malloc((size_t)(rows * h) * 2),
             *yn = malloc((size_t)(rows * h) * 2);
        for (int64_t i = 0; i < rows * h; i++)
            x[i] = uniform(-1.0f, 1.0f) * (float)(1 << (i % 7));
        kiln_tensor_desc d[5] = {DESC(KILN_DTYPE_F32, rows, h), DESC(t, rows, h), DESC(t, h),
                                 DESC(KILN_DTYPE_F32, rows, h), DESC(t, rows, h)};
        const void *in[3] = {x, res, w};
        void *out[2] = {sum, y};
        CHECK_OK(run(add, d, in, 3, out, 2));
        /* RMSNorm alone: y of the f32 sum */
        kiln_tensor_desc dn[3] = {DESC(KILN_DTYPE_F32, rows, h), DESC(t, h), DESC(t, rows, h)};
        const void *in_n[2] = {sum, w};
        void *out_n[1] = {yn};
        CHECK_OK(run(norm, dn, in_n, 2, out_n, 1));
        CHECK(memcmp(y, yn, (size_t)(rows * h) * 2) == 0);
        int64_t finer = 0, bad_sum = 0, bad_y = 0;
        for (int64_t r = 0; r < rows; r++) {
            double ss = 0.0;
            for (int64_t i = r * h; i < (r + 1) * h; i++) {
                double s = (double)x[i] + (double)load(res, t, i);
                bad_sum += sum[i] != (float)s;
                ss += (double)(float)s * (double)(float)s;
            }
            double inv = 1.0 / sqrt(ss / (double)h + (double)eps);
            for (int64_t i = r * h; i < (r + 1) * h; i++) {
                double want = (double)sum[i] * inv * (double)load(w, t, i - r * h), got = load(y, t, i);
                /* one rounding to t: at most half a unit in the last
                 * place (2^-8 of the value in bf16, 2^-11 in f16; f16's
                 * subnormals 2^-25), and f32's own roundings */
                double ulp = t == KILN_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
                bad_y += fabs(got - want) > (ulp / 2 + 1e-6) * fabs(want) + 3e-8;
            }
        }
        /* the stream held bits a 16-bit sum would not have */
        for (int64_t i = 0; i < rows * h; i++) {
            float one; /* room for any dtype (GCC -O3 checks the f32 branch too) */
            store(&one, t, 0, sum[i]);
            finer += load(&one, t, 0) != sum[i];
        }
        CHECK(bad_sum == 0);
        CHECK(bad_y == 0);
        CHECK(finer > rows * h / 2);
        /* y must be of output_dtype: an f32 y is refused */
        d[4] = DESC(KILN_DTYPE_F32, rows, h);
        CHECK(!add->ops->supports(add, KILN_BACKEND_CPU, d, 3, 2));
        /* a v1 blob (epsilon alone) loads as y in x's dtype */
        check_blob(add, "AddRMSNorm", 1, sizeof(float));
        /* a v2 blob (before quantize) loads as quantize none: one output fewer */
        check_blob(add, "AddRMSNorm", 2, sizeof(float) + sizeof(int32_t));
        const kiln_plugin_creator *c = kiln_registry_find(reg, "AddRMSNorm", "1", "kiln", NULL);
        kiln_plugin *v1 = NULL;
        CHECK_OK(c->deserialize(c, 1, &eps, sizeof eps, &v1));
        if (v1) {
            CHECK_OK(v1->ops->output_dtypes(v1, in_t, 3, out_t, 2));
            CHECK(out_t[0] == KILN_DTYPE_F32 && out_t[1] == KILN_DTYPE_F32);
            v1->ops->destroy(v1);
        }
        free(x), free(sum), free(res), free(w), free(y), free(yn);
        norm->ops->destroy(norm);
        add->ops->destroy(add);
    }
    const kiln_plugin_creator *c = kiln_registry_find(reg, "RMSNorm", "1", "kiln", NULL);
    kiln_field bad[2] = {ff32("epsilon", &eps), fstr("output_dtype", "int8")};
    kiln_plugin *p = NULL;
    CHECK_FAILS(kiln_plugin_create(c, bad, 2, &p), KILN_ERROR_INVALID_ARGUMENT, "output_dtype");
}

/* ---------------------------------------------------------------------------
 * RoPE on the packed qkv row against RoPE on q and k apart
 * ------------------------------------------------------------------------- */

static void check_rope_packed(kiln_dtype t, const char *scaling, int32_t interleaved, int32_t rotary_dim)
{
    const int32_t nh = 4, nkv = 2, hd = 16;
    const float theta = 10000.0f, factor = 4.0f;
    const int64_t T = 6, row = (int64_t)(nh + 2 * nkv) * hd;
    kiln_field fq[7] = {fi32("n_heads", &nh),
                        fi32("head_dim", &hd),
                        ff32("theta", &theta),
                        fi32("rotary_dim", &rotary_dim),
                        fi32("interleaved", &interleaved),
                        fstr("scaling", scaling),
                        ff32("factor", &factor)};
    kiln_field fk[7];
    memcpy(fk, fq, sizeof fk);
    fk[0] = fi32("n_heads", &nkv);
    kiln_field fp[8];
    memcpy(fp, fq, sizeof fq);
    fp[7] = fi32("n_kv_heads", &nkv);
    kiln_plugin *rq = make("RoPE", fq, 7), *rk = make("RoPE", fk, 7), *rp = make("RoPE", fp, 8);
    void *qkv = random_buf(t, T * row);
    int32_t pos[6] = {0, 1, 7, 100, 2047, 8191};
    void *q = columns(qkv, t, T, row, 0, nh * hd), *k = columns(qkv, t, T, row, nh * hd, nkv * hd);
    void *v = columns(qkv, t, T, row, (nh + nkv) * hd, nkv * hd);
    size_t es = esize(t);
    void *qo = malloc((size_t)(T * nh * hd) * es), *ko = malloc((size_t)(T * nkv * hd) * es),
         *po = malloc((size_t)(T * row) * es);
    if (rq && rk && rp) {
        kiln_tensor_desc dq[3] = {DESC(t, T, nh * hd), DESC(KILN_DTYPE_I32, T), DESC(t, T, nh * hd)};
        kiln_tensor_desc dk[3] = {DESC(t, T, nkv * hd), DESC(KILN_DTYPE_I32, T), DESC(t, T, nkv * hd)};
        kiln_tensor_desc dp[3] = {DESC(t, T, row), DESC(KILN_DTYPE_I32, T), DESC(t, T, row)};
        const void *iq[2] = {q, pos}, *ik[2] = {k, pos}, *ip[2] = {qkv, pos};
        void *oq[1] = {qo}, *ok[1] = {ko}, *op[1] = {po};
        CHECK_OK(run(rq, dq, iq, 2, oq, 1));
        CHECK_OK(run(rk, dk, ik, 2, ok, 1));
        CHECK_OK(run(rp, dp, ip, 2, op, 1));
        void *pq = columns(po, t, T, row, 0, nh * hd), *pk = columns(po, t, T, row, nh * hd, nkv * hd);
        void *pv = columns(po, t, T, row, (nh + nkv) * hd, nkv * hd);
        CHECK(memcmp(pq, qo, (size_t)(T * nh * hd) * es) == 0);
        CHECK(memcmp(pk, ko, (size_t)(T * nkv * hd) * es) == 0);
        CHECK(memcmp(pv, v, (size_t)(T * nkv * hd) * es) == 0);
        CHECK(memcmp(pq, q, (size_t)(T * nh * hd) * es) != 0); /* it did rotate */
        /* in place: y is x */
        memcpy(po, qkv, (size_t)(T * row) * es);
        const void *ipp[2] = {po, pos};
        CHECK_OK(run(rp, dp, ipp, 2, op, 1));
        void *iq2 = columns(po, t, T, row, 0, nh * hd), *iv2 = columns(po, t, T, row, (nh + nkv) * hd, nkv * hd);
        CHECK(memcmp(iq2, qo, (size_t)(T * nh * hd) * es) == 0 && memcmp(iv2, v, (size_t)(T * nkv * hd) * es) == 0);
        free(pq), free(pk), free(pv), free(iq2), free(iv2);
        if (t == KILN_DTYPE_F32 && rotary_dim == hd && !interleaved)
            check_blob(rp, "RoPE", 1, 40);
        /* the packed plugin refuses an unpacked row */
        CHECK(run(rp, dq, iq, 2, oq, 1) == KILN_ERROR_SHAPE);
    }
    if (rq)
        rq->ops->destroy(rq);
    if (rk)
        rk->ops->destroy(rk);
    if (rp)
        rp->ops->destroy(rp);
    free(qkv), free(q), free(k), free(v), free(qo), free(ko), free(po);
}

static void test_rope_packed(void)
{
    const char *scalings[3] = {"none", "linear", "llama3"};
    for (int ti = 0; ti < 3; ti++)
        for (int s = 0; s < 3; s++) {
            check_rope_packed(float_types[ti], scalings[s], 0, 16);
            check_rope_packed(float_types[ti], scalings[s], 1, 8);
        }
}

/* ---------------------------------------------------------------------------
 * Packed SwiGLU against SwiGLU on gate and up apart
 * ------------------------------------------------------------------------- */

static void test_swiglu_packed(void)
{
    const int32_t one = 1;
    kiln_field f = fi32("packed", &one);
    kiln_plugin *apart = make("SwiGLU", NULL, 0), *packed = make("SwiGLU", &f, 1);
    const int64_t rows = 3, I = 37;
    for (int ti = 0; ti < 3 && apart && packed; ti++) {
        kiln_dtype t = float_types[ti];
        size_t es = esize(t);
        void *gu = random_buf(t, rows * 2 * I);
        void *g = columns(gu, t, rows, 2 * I, 0, I), *u = columns(gu, t, rows, 2 * I, I, I);
        void *ya = malloc((size_t)(rows * I) * es), *yp = malloc((size_t)(rows * I) * es);
        kiln_tensor_desc da[3] = {DESC(t, rows, I), DESC(t, rows, I), DESC(t, rows, I)};
        kiln_tensor_desc dp[2] = {DESC(t, rows, 2 * I), DESC(t, rows, I)};
        const void *ia[2] = {g, u}, *ip[1] = {gu};
        void *oa[1] = {ya}, *op[1] = {yp};
        CHECK_OK(run(apart, da, ia, 2, oa, 1));
        CHECK_OK(run(packed, dp, ip, 1, op, 1));
        CHECK(memcmp(ya, yp, (size_t)(rows * I) * es) == 0);
        if (t == KILN_DTYPE_F32) {
            /* against silu(g) · u in double (the AVX-512 path's e^x and the
             * scalar tail both within a few ulps) */
            int close = 1;
            for (int64_t i = 0; i < rows * I; i++) {
                double gv = ((const float *)g)[i], want = gv / (1.0 + exp(-gv)) * ((const float *)u)[i];
                close &= fabs(((const float *)ya)[i] - want) <= 1e-6 * (fabs(want) + 1e-30);
            }
            CHECK(close);
        }
        if (ti == 0) {
            check_blob(packed, "SwiGLU", 1, 0);
            check_blob(packed, "SwiGLU", 2, sizeof(int32_t));
            CHECK(packed->ops->num_outputs(packed) == 1);
        }
        free(gu), free(g), free(u), free(ya), free(yp);
    }
    if (apart)
        apart->ops->destroy(apart);
    if (packed)
        packed->ops->destroy(packed);
}

/* ---------------------------------------------------------------------------
 * PagedAttention: packed qkv against q, k, v apart
 * ------------------------------------------------------------------------- */

static void check_attention_packed(kiln_dtype t)
{
    const int32_t nh = 4, nkv = 2, hd = 8, bs = 4, one = 1;
    const int64_t S = 2, max_blocks = 4, n_blocks = S * max_blocks, T = 7;
    const int64_t qw = nh * hd, kw = nkv * hd, row = qw + 2 * kw;
    kiln_field f[5] = {fi32("n_heads", &nh), fi32("n_kv_heads", &nkv), fi32("head_dim", &hd), fi32("block_size", &bs),
                       fi32("packed_qkv", &one)};
    kiln_plugin *apart = make("PagedAttention", f, 4), *packed = make("PagedAttention", f, 5);
    /* sequence 0: 3 cached tokens + 5 new; sequence 1: 2 new (prefill) */
    int32_t table[8] = {5, 2, 7, 0, 1, 3, 4, 6}, seq_lens[2] = {8, 2}, qstart[3] = {0, 5, 7};
    int64_t cache_n = n_blocks * 2 * kw * bs;
    void *qkv = random_buf(t, T * row), *cache0 = random_buf(t, cache_n);
    void *q = malloc((size_t)(T * qw) * esize(t)), *k = malloc((size_t)(T * kw) * esize(t)),
         *v = malloc((size_t)(T * kw) * esize(t));
    size_t es = esize(t);
    for (int64_t i = 0; i < T; i++) {
        memcpy((char *)q + i * qw * es, (char *)qkv + i * row * es, (size_t)qw * es);
        memcpy((char *)k + i * kw * es, (char *)qkv + (i * row + qw) * es, (size_t)kw * es);
        memcpy((char *)v + i * kw * es, (char *)qkv + (i * row + qw + kw) * es, (size_t)kw * es);
    }
    void *cache_a = malloc((size_t)cache_n * es), *cache_p = malloc((size_t)cache_n * es);
    memcpy(cache_a, cache0, (size_t)cache_n * es);
    memcpy(cache_p, cache0, (size_t)cache_n * es);
    void *out_a = malloc((size_t)(T * qw) * es), *out_p = malloc((size_t)(T * qw) * es);
    kiln_tensor_desc cd = DESC(t, n_blocks, 2, nkv, bs, hd), btd = DESC(KILN_DTYPE_I32, S, max_blocks),
                     sd = DESC(KILN_DTYPE_I32, S), qsd = DESC(KILN_DTYPE_I32, S + 1), od = DESC(t, T, qw);
    kiln_tensor_desc da[8] = {DESC(t, T, qw), DESC(t, T, kw), DESC(t, T, kw), cd, btd, sd, qsd, od};
    kiln_tensor_desc dp[6] = {DESC(t, T, row), cd, btd, sd, qsd, od};
    const void *ia[7] = {q, k, v, cache_a, table, seq_lens, qstart}, *ip[5] = {qkv, cache_p, table, seq_lens, qstart};
    void *oa[1] = {out_a}, *op[1] = {out_p};
    if (apart && packed) {
        CHECK_OK(run(apart, da, ia, 7, oa, 1));
        CHECK_OK(run(packed, dp, ip, 5, op, 1));
        CHECK(memcmp(out_a, out_p, (size_t)(T * qw) * es) == 0);
        CHECK(memcmp(cache_a, cache_p, (size_t)cache_n * es) == 0);
        /* the new tokens did land in the cache: token 0 of sequence 1 is at block 1 slot 0 */
        CHECK(memcmp(cache0, cache_p, (size_t)cache_n * es) != 0);
        CHECK(load(cache_p, t, 1 * 2 * kw * bs) == load(qkv, t, 5 * row + qw));
        /* packed: q, k or v alone is refused */
        CHECK(run(packed, da, ia, 7, oa, 1) == KILN_ERROR_UNSUPPORTED);
        check_blob(packed, "PagedAttention", 1, 20);
    }
    if (apart)
        apart->ops->destroy(apart);
    if (packed)
        packed->ops->destroy(packed);
    free(qkv), free(cache0), free(q), free(k), free(v), free(cache_a), free(cache_p), free(out_a), free(out_p);
}

/* PagedAttention against softmax(q·K/sqrt(d))·V in double over the cache
 * it wrote, for long decode steps (keys split into chunks and merged) and
 * prefill, with a query group larger than the kernel's sub-group (MQA with
 * 18 heads) and plain GQA. The cache in f32 or f16 (ct): the reference
 * reads the values the cache holds, so an f16 cache is held to the same
 * tolerance (its rounding happened when the keys were stored). */
static void check_attention_reference_ct(int32_t nh, int32_t nkv, int32_t hd, int64_t cached, int64_t T_per_seq,
                                         kiln_dtype ct)
{
    const int32_t bs = 16;
    const int64_t S = 2, max_blocks = (cached + T_per_seq + bs - 1) / bs, n_blocks = S * max_blocks, T = S * T_per_seq;
    const int64_t qw = nh * hd, kw = nkv * hd;
    kiln_field f[4] = {fi32("n_heads", &nh), fi32("n_kv_heads", &nkv), fi32("head_dim", &hd), fi32("block_size", &bs)};
    kiln_plugin *a = make("PagedAttention", f, 4);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)(S * max_blocks));
    for (int64_t i = 0; i < S * max_blocks; i++) /* blocks interleaved between the sequences */
        table[i] = (int32_t)((i % max_blocks) * S + i / max_blocks);
    int32_t seq_lens[2] = {(int32_t)(cached + T_per_seq), (int32_t)(cached / 2 + T_per_seq)};
    int32_t qstart[3] = {0, (int32_t)T_per_seq, (int32_t)T};
    int64_t cache_n = n_blocks * 2 * kw * bs;
    float *q = random_buf(KILN_DTYPE_F32, T * qw), *k = random_buf(KILN_DTYPE_F32, T * kw);
    float *v = random_buf(KILN_DTYPE_F32, T * kw), *cache = random_buf(KILN_DTYPE_F32, cache_n);
    for (int64_t i = 0; i < T * kw; i++) /* spread the scores so the softmax is not flat */
        k[i] *= 4.0f;
    for (int64_t i = 0; i < cache_n; i++)
        cache[i] *= 4.0f;
    /* the cache as the plugin holds it (f16: the same values rounded), and
     * read back after the step as f32 for the reference */
    void *cache_t = malloc((size_t)cache_n * esize(ct));
    for (int64_t i = 0; i < cache_n; i++)
        store(cache_t, ct, i, cache[i]);
    float *out = malloc(sizeof(float) * (size_t)(T * qw));
    kiln_tensor_desc d[8] = {DESC(KILN_DTYPE_F32, T, qw),         DESC(KILN_DTYPE_F32, T, kw),
                             DESC(KILN_DTYPE_F32, T, kw),         DESC(ct, n_blocks, 2, nkv, bs, hd),
                             DESC(KILN_DTYPE_I32, S, max_blocks), DESC(KILN_DTYPE_I32, S),
                             DESC(KILN_DTYPE_I32, S + 1),         DESC(KILN_DTYPE_F32, T, qw)};
    const void *in[7] = {q, k, v, cache_t, table, seq_lens, qstart};
    void *o[1] = {out};
    if (a) {
        size_t ws = a->ops->workspace_size(a, d, 7, d + 7, 1);
        void *workspace = malloc(ws ? ws : 1);
        CHECK_OK(a->ops->enqueue(a, KILN_BACKEND_CPU, d, in, 7, d + 7, o, 1, workspace, pool));
        for (int64_t i = 0; i < cache_n; i++)
            cache[i] = load(cache_t, ct, i);
        double err = 0, norm = 0;
        for (int64_t t = 0; t < T; t++) {
            int64_t s = t / T_per_seq, pos = seq_lens[s] - T_per_seq + t % T_per_seq;
            for (int32_t h = 0; h < nh; h++) {
                int32_t kvh = h / (nh / nkv);
                double m = -1e300, l = 0, acc[128] = {0}, sc[1024];
                for (int64_t j = 0; j <= pos; j++) {
                    int64_t blk = table[s * max_blocks + j / bs];
                    const float *kr = cache + (((blk * 2 + 0) * nkv + kvh) * bs + j % bs) * hd;
                    double dot = 0;
                    for (int32_t e = 0; e < hd; e++)
                        dot += (double)q[t * qw + h * hd + e] * kr[e];
                    sc[j] = dot / sqrt((double)hd);
                    m = sc[j] > m ? sc[j] : m;
                }
                for (int64_t j = 0; j <= pos; j++) {
                    int64_t blk = table[s * max_blocks + j / bs];
                    const float *vr = cache + (((blk * 2 + 1) * nkv + kvh) * bs + j % bs) * hd;
                    double w = exp(sc[j] - m);
                    l += w;
                    for (int32_t e = 0; e < hd; e++)
                        acc[e] += w * vr[e];
                }
                for (int32_t e = 0; e < hd; e++) {
                    double want = acc[e] / l, got = out[t * qw + h * hd + e];
                    err += (got - want) * (got - want);
                    norm += want * want;
                }
            }
        }
        if (!(sqrt(err / norm) < 1e-5))
            fprintf(stderr, "attention %d/%d heads of %d, %lld cached, %lld new, cache %s: error %.3g\n", nh, nkv, hd,
                    (long long)cached, (long long)T_per_seq, ct == KILN_DTYPE_F16 ? "f16" : "f32", sqrt(err / norm));
        CHECK(sqrt(err / norm) < 1e-5);
        free(workspace);
        a->ops->destroy(a);
    }
    free(table), free(q), free(k), free(v), free(cache), free(cache_t), free(out);
}

static void check_attention_reference(int32_t nh, int32_t nkv, int32_t hd, int64_t cached, int64_t T_per_seq)
{
    check_attention_reference_ct(nh, nkv, hd, cached, T_per_seq, KILN_DTYPE_F32);
}

/* Each case on the portable kernel and on the best the CPU has (with
 * AVX-512, steps of head_dim 64 and 128 take the tiled kernel: tiles of
 * 16 / group tokens, short key tiles at a sequence's end, decode steps'
 * key chunks). */
static void test_attention_reference(void)
{
    for (int isa = 0; isa < 2; isa++) {
        if (isa == 0)
            setenv("KILN_ATTENTION_ISA", "c", 1);
        check_attention_reference(18, 1, 16, 700, 1);  /* decode, keys in chunks, 3 sub-groups of the MQA group */
        check_attention_reference(9, 3, 16, 900, 4);   /* decode of 4 tokens per sequence, GQA */
        check_attention_reference(6, 2, 16, 40, 37);   /* prefill beyond the split limit: one chunk */
        check_attention_reference(9, 3, 64, 0, 29);    /* SmolLM2's heads, a prompt: tiles of 5 tokens */
        check_attention_reference(32, 8, 64, 21, 40);  /* a 1B's heads after a cached prefix: tiles of 4 */
        check_attention_reference(4, 4, 128, 5, 19);   /* MHA, head_dim 128: tiles of 16 tokens */
        check_attention_reference(32, 2, 64, 3, 12);   /* a group of 16: one token a tile */
        check_attention_reference(9, 3, 64, 700, 1);   /* SmolLM2's decode: keys in chunks, merged */
        check_attention_reference(32, 8, 64, 300, 4);  /* a 1B's decode of 4 tokens, chunks */
        check_attention_reference(8, 8, 128, 40, 3);   /* a decode step shorter than one chunk */
        check_attention_reference(32, 8, 128, 517, 1); /* an 8B's decode: keys in lanes, head_dim 128 */
        check_attention_reference(9, 3, 64, 5, 1);     /* a decode row shorter than one key tile */
        check_attention_reference(8, 8, 128, 40, 1);   /* MHA decode: eight kv heads a task, two heads a V pass */
        check_attention_reference(16, 1, 64, 300, 1);  /* a decode group of 16 heads: one kv head a task, chunks */
        /* an f16 cache: decode rows (chunks, a short last tile) and prefill tiles widen it */
        check_attention_reference_ct(9, 3, 64, 700, 1, KILN_DTYPE_F16);
        check_attention_reference_ct(32, 8, 128, 45, 1, KILN_DTYPE_F16);
        check_attention_reference_ct(9, 3, 64, 21, 29, KILN_DTYPE_F16);
        check_attention_reference_ct(4, 4, 128, 5, 19, KILN_DTYPE_F16);
        unsetenv("KILN_ATTENTION_ISA");
    }
}

/* The AVX-512 decode row kernel against the portable kernel
 * (KILN_ATTENTION_ISA=c) on the same step: three sequences of one new
 * token each (lengths `cached`, an odd one near half of it, and 1), the
 * cache in ct. The cache both leave must be the same bytes (an f16 cache's
 * rows are appended by vcvtps2ph on AVX-512, by kiln_f32_to_f16 in C), and
 * the outputs agree to 1e-5 relative (both sum in f32, in other orders).
 * Then an f16 cache appended with values at the edges of f16 (overflow to
 * inf, subnormals, ties, NaN, -0) is bit-compared the same way. On a CPU
 * without AVX-512 both runs take the portable kernel. */
static void check_attention_decode_isa(int32_t nh, int32_t nkv, int32_t hd, int64_t cached, kiln_dtype ct)
{
    const int32_t bs = 16;
    const int64_t S = 3, max_blocks = (cached + 1 + bs - 1) / bs, n_blocks = S * max_blocks, T = S;
    const int64_t qw = nh * hd, kw = nkv * hd, cache_n = n_blocks * 2 * kw * bs;
    kiln_field f[4] = {fi32("n_heads", &nh), fi32("n_kv_heads", &nkv), fi32("head_dim", &hd), fi32("block_size", &bs)};
    kiln_plugin *a = make("PagedAttention", f, 4);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)(S * max_blocks));
    for (int64_t i = 0; i < S * max_blocks; i++) /* blocks interleaved between the sequences */
        table[i] = (int32_t)((i % max_blocks) * S + i / max_blocks);
    int32_t seq_lens[3] = {(int32_t)(cached + 1), (int32_t)((cached / 2) | 1), 1}, qstart[4] = {0, 1, 2, 3};
    float *q = random_buf(KILN_DTYPE_F32, T * qw), *k = random_buf(KILN_DTYPE_F32, T * kw);
    float *v = random_buf(KILN_DTYPE_F32, T * kw);
    for (int64_t i = 0; i < T * kw; i++)
        k[i] *= 4.0f;
    const size_t cache_bytes = (size_t)cache_n * (ct == KILN_DTYPE_U8 ? 1 : esize(ct));
    unsigned char *cache0 = malloc(cache_bytes), *cache[2] = {malloc(cache_bytes), malloc(cache_bytes)};
    for (int64_t i = 0; i < cache_n; i++) {
        float x = uniform(-4.0f, 4.0f);
        if (ct == KILN_DTYPE_U8) /* any code but NaN's */
            cache0[i] = (uint8_t)(uniform(0.0f, 255.0f)) & 0xF7;
        else
            store(cache0, ct, i, x);
    }
    float *out[2] = {malloc(sizeof(float) * (size_t)(T * qw)), malloc(sizeof(float) * (size_t)(T * qw))};
    kiln_tensor_desc d[8] = {DESC(KILN_DTYPE_F32, T, qw),         DESC(KILN_DTYPE_F32, T, kw),
                             DESC(KILN_DTYPE_F32, T, kw),         DESC(ct, n_blocks, 2, nkv, bs, hd),
                             DESC(KILN_DTYPE_I32, S, max_blocks), DESC(KILN_DTYPE_I32, S),
                             DESC(KILN_DTYPE_I32, S + 1),         DESC(KILN_DTYPE_F32, T, qw)};
    if (a) {
        size_t ws = a->ops->workspace_size(a, d, 7, d + 7, 1);
        void *workspace = malloc(ws ? ws : 1);
        for (int pass = 0; pass < 2; pass++) {
            for (int isa = 0; isa < 2; isa++) {
                if (isa == 0)
                    setenv("KILN_ATTENTION_ISA", "c", 1);
                else
                    unsetenv("KILN_ATTENTION_ISA");
                memcpy(cache[isa], cache0, cache_bytes);
                const void *in[7] = {q, k, v, cache[isa], table, seq_lens, qstart};
                void *o[1] = {out[isa]};
                CHECK_OK(a->ops->enqueue(a, KILN_BACKEND_CPU, d, in, 7, d + 7, o, 1, workspace, pool));
            }
            CHECK(memcmp(cache[0], cache[1], cache_bytes) == 0);
            if (pass == 1)
                break;
            double err = 0, norm = 0;
            for (int64_t i = 0; i < T * qw; i++) {
                err += ((double)out[1][i] - out[0][i]) * ((double)out[1][i] - out[0][i]);
                norm += (double)out[0][i] * out[0][i];
            }
            if (!(sqrt(err / norm) < 1e-5))
                fprintf(stderr, "decode %d/%d heads of %d, %lld cached, cache dtype %d: AVX-512 against C %.3g\n", nh,
                        nkv, hd, (long long)cached, (int)ct, sqrt(err / norm));
            CHECK(sqrt(err / norm) < 1e-5);
            if (ct != KILN_DTYPE_F16)
                break;
            /* f16's edges in the rows appended: 65520 rounds up to inf,
             * 65519 down to 65504; 2^-25 is a tie to 0, 3 * 2^-25 to the
             * subnormal 2^-23; NaN stays NaN; -0 keeps its sign */
            static const float edge[] = {65520.0f, -65519.0f, 0x1p-25f,       3 * 0x1p-25f, 0x1.0p-14f,
                                         -0.0f,    1e-30f,    1.00048828125f, 2049.0f,      1e9f};
            for (int64_t i = 0; i < T * kw; i++) {
                k[i] = i % 11 == 10 ? NAN : edge[i % 10];
                v[i] = edge[(i + 3) % 10] * (i % 2 ? -1.0f : 1.0f);
            }
        }
        unsetenv("KILN_ATTENTION_ISA");
        free(workspace);
        a->ops->destroy(a);
    }
    free(table), free(q), free(k), free(v), free(cache0), free(cache[0]), free(cache[1]), free(out[0]), free(out[1]);
}

/* The decode row kernel's cases: query groups of 1 (sixteen kv heads a
 * task), 3 (SmolLM2), 4 (the 1B, Llama's 8B), 5, 8 and 16 (V passes of 6
 * heads and fewer), head_dim 64 and 128, contexts of one key, a short
 * last tile, whole chunks and odd lengths, each cache dtype. */
static void test_attention_decode_isa(void)
{
    static const int32_t shapes[][3] = {{16, 16, 64}, {9, 3, 64},  {32, 8, 64},  {15, 3, 64},  {16, 2, 64},
                                        {16, 1, 64},  {8, 8, 128}, {12, 4, 128}, {32, 8, 128}, {16, 2, 128}};
    static const int64_t lens[] = {0, 14, 47, 540, 1001};
    static const kiln_dtype cts[] = {KILN_DTYPE_F16, KILN_DTYPE_F32, KILN_DTYPE_U8};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
            for (size_t c = 0; c < 3; c++)
                if (c == 0 || l == 3) /* f32 and FP8 caches at one length */
                    check_attention_decode_isa(shapes[s][0], shapes[s][1], shapes[s][2], lens[l], cts[c]);
}

/* E4M3 from the OCP 8-bit floating point spec, written here apart from the
 * codec under test: code c is (-1)^s · 2^(e-7) · (1 + m/8), or m/8 · 2^-6
 * when e = 0; S.1111.111 is NaN and 448 the largest finite value. */
static double ref_e4m3_value(int c)
{
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? m / 8.0 * ldexp(1.0, -6) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return c & 0x80 ? -v : v;
}

/* f rounded to the nearest finite E4M3 value by search over the codes,
 * ties to the even code (an even last mantissa bit); beyond 448 it
 * saturates (the satfinite conversion); NaN is 0x7F. */
static uint8_t ref_e4m3(float f)
{
    static double value[0x7F];
    if (value[0x7E] == 0)
        for (int c = 0; c < 0x7F; c++)
            value[c] = ref_e4m3_value(c);
    if (isnan(f))
        return 0x7F;
    double a = fabs((double)f), best_d = INFINITY;
    int best = 0;
    for (int c = 0; c < 0x7F; c++) {
        double d = fabs(value[c] - a);
        if (d < best_d || (d == best_d && !(c & 1)))
            best = c, best_d = d;
    }
    return (uint8_t)((signbit(f) ? 0x80 : 0) | best);
}

/* PagedAttention with an FP8 (E4M3 codes in u8) cache: the cache after the
 * step must hold exactly the codes ref_e4m3 gives for the new keys and
 * values (activations of dtype t, so bf16 ones are rounded first) and
 * leave every other byte alone, and the output must be softmax(q·K/sqrt(d))·V
 * in double over the values those codes stand for. Some new keys and values
 * lie beyond ±448 (saturated) or below 2^-6 (subnormal codes). */
static void check_attention_fp8(int32_t nh, int32_t nkv, int32_t hd, int64_t cached, int64_t T_per_seq, kiln_dtype t)
{
    const int32_t bs = 16;
    const int64_t S = 2, max_blocks = (cached + T_per_seq + bs - 1) / bs, n_blocks = S * max_blocks, T = S * T_per_seq;
    const int64_t qw = nh * hd, kw = nkv * hd;
    kiln_field f[4] = {fi32("n_heads", &nh), fi32("n_kv_heads", &nkv), fi32("head_dim", &hd), fi32("block_size", &bs)};
    kiln_plugin *a = make("PagedAttention", f, 4);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)(S * max_blocks));
    for (int64_t i = 0; i < S * max_blocks; i++) /* blocks interleaved between the sequences */
        table[i] = (int32_t)((i % max_blocks) * S + i / max_blocks);
    int32_t seq_lens[2] = {(int32_t)(cached + T_per_seq), (int32_t)(cached / 2 + T_per_seq)};
    int32_t qstart[3] = {0, (int32_t)T_per_seq, (int32_t)T};
    int64_t cache_n = n_blocks * 2 * kw * bs;
    void *q = random_buf(t, T * qw), *k = malloc((size_t)(T * kw) * esize(t)), *v = malloc((size_t)(T * kw) * esize(t));
    for (int64_t i = 0; i < T * kw; i++) {
        store(k, t, i, uniform(-4.0f, 4.0f));
        store(v, t, i, uniform(-1.0f, 1.0f));
    }
    static const float special[] = {1000.0f, -600.0f, 460.0f, 0.004f, -0.0009f, 0.0f, 300.0f, -0.012f};
    for (int i = 0; i < 8; i++) {
        store(k, t, (i * 37) % (T * kw), special[i] / (fabsf(special[i]) > 100.0f ? 8.0f : 1.0f));
        store(v, t, (i * 53) % (T * kw), special[i]);
    }
    uint8_t *cache = malloc((size_t)cache_n), *want = malloc((size_t)cache_n);
    for (int64_t i = 0; i < cache_n; i++) /* E4M3 codes up to 0x4B (5.5) of either sign */
        cache[i] = (uint8_t)((int)uniform(0.0f, 76.0f) | (uniform(0.0f, 1.0f) < 0.5f ? 0x80 : 0));
    memcpy(want, cache, (size_t)cache_n);
    for (int64_t tok = 0; tok < T; tok++) {
        int64_t s = tok / T_per_seq, pos = seq_lens[s] - T_per_seq + tok % T_per_seq;
        int64_t blk = table[s * max_blocks + pos / bs];
        for (int32_t h = 0; h < nkv; h++)
            for (int32_t e = 0; e < hd; e++) {
                want[(((blk * 2 + 0) * nkv + h) * bs + pos % bs) * hd + e] =
                    ref_e4m3(load(k, t, tok * kw + h * hd + e));
                want[(((blk * 2 + 1) * nkv + h) * bs + pos % bs) * hd + e] =
                    ref_e4m3(load(v, t, tok * kw + h * hd + e));
            }
    }
    void *out = malloc((size_t)(T * qw) * esize(t));
    kiln_tensor_desc d[8] = {DESC(t, T, qw),
                             DESC(t, T, kw),
                             DESC(t, T, kw),
                             DESC(KILN_DTYPE_U8, n_blocks, 2, nkv, bs, hd),
                             DESC(KILN_DTYPE_I32, S, max_blocks),
                             DESC(KILN_DTYPE_I32, S),
                             DESC(KILN_DTYPE_I32, S + 1),
                             DESC(t, T, qw)};
    const void *in[7] = {q, k, v, cache, table, seq_lens, qstart};
    void *o[1] = {out};
    if (a) {
        CHECK(a->ops->supports(a, KILN_BACKEND_CPU, d, 7, 1));
        size_t ws = a->ops->workspace_size(a, d, 7, d + 7, 1);
        void *workspace = malloc(ws ? ws : 1);
        CHECK_OK(a->ops->enqueue(a, KILN_BACKEND_CPU, d, in, 7, d + 7, o, 1, workspace, pool));
        CHECK(memcmp(cache, want, (size_t)cache_n) == 0);
        double err = 0, norm = 0;
        for (int64_t tok = 0; tok < T; tok++) {
            int64_t s = tok / T_per_seq, pos = seq_lens[s] - T_per_seq + tok % T_per_seq;
            for (int32_t h = 0; h < nh; h++) {
                int32_t kvh = h / (nh / nkv);
                double m = -1e300, l = 0, acc[128] = {0}, sc[1024];
                for (int64_t j = 0; j <= pos; j++) {
                    int64_t blk = table[s * max_blocks + j / bs];
                    const uint8_t *kr = want + (((blk * 2 + 0) * nkv + kvh) * bs + j % bs) * hd;
                    double dot = 0;
                    for (int32_t e = 0; e < hd; e++)
                        dot += (double)load(q, t, tok * qw + h * hd + e) * ref_e4m3_value(kr[e]);
                    sc[j] = dot / sqrt((double)hd);
                    m = sc[j] > m ? sc[j] : m;
                }
                for (int64_t j = 0; j <= pos; j++) {
                    int64_t blk = table[s * max_blocks + j / bs];
                    const uint8_t *vr = want + (((blk * 2 + 1) * nkv + kvh) * bs + j % bs) * hd;
                    double w = exp(sc[j] - m);
                    l += w;
                    for (int32_t e = 0; e < hd; e++)
                        acc[e] += w * ref_e4m3_value(vr[e]);
                }
                for (int32_t e = 0; e < hd; e++) {
                    double want_o = acc[e] / l, got = load(out, t, tok * qw + h * hd + e);
                    err += (got - want_o) * (got - want_o);
                    norm += want_o * want_o;
                }
            }
        }
        /* f32 arithmetic, then the output rounded to t */
        double tol = t == KILN_DTYPE_F32 ? 1e-5 : t == KILN_DTYPE_F16 ? 1e-3 : 6e-3;
        if (!(sqrt(err / norm) < tol))
            fprintf(stderr, "fp8 attention %d/%d heads of %d, %lld cached, %lld new, %s: error %.3g\n", nh, nkv, hd,
                    (long long)cached, (long long)T_per_seq, kiln_dtype_name(t), sqrt(err / norm));
        CHECK(sqrt(err / norm) < tol);
        free(workspace);
        a->ops->destroy(a);
    }
    free(table), free(q), free(k), free(v), free(cache), free(want), free(out);
}

/* The FP8 cache on the portable kernel and on the tiled one (f32
 * activations, head_dim 64 and 128): decode chunks, short key tiles,
 * prefill tiles; bf16 activations on the portable kernel. The reference
 * encoder itself against points of the spec: 448 the largest, 2^-9 the
 * smallest subnormal, 1.0625 between 1 and 1.125 rounds to the even 1. */
static void test_attention_fp8(void)
{
    CHECK(ref_e4m3(448.0f) == 0x7E && ref_e4m3(1e9f) == 0x7E && ref_e4m3(-1e9f) == 0xFE);
    CHECK(ref_e4m3(0.001953125f) == 0x01 && ref_e4m3(1.0625f) == 0x38 && ref_e4m3(1.1875f) == 0x3A);
    CHECK(ref_e4m3_value(0x7E) == 448.0 && ref_e4m3_value(0x38) == 1.0 && ref_e4m3_value(0x08) == 0.015625);
    for (int isa = 0; isa < 2; isa++) {
        if (isa == 0)
            setenv("KILN_ATTENTION_ISA", "c", 1);
        check_attention_fp8(9, 3, 64, 700, 1, KILN_DTYPE_F32);  /* SmolLM2's decode: keys in chunks */
        check_attention_fp8(32, 8, 128, 45, 1, KILN_DTYPE_F32); /* an 8B's decode, a short last tile */
        check_attention_fp8(9, 3, 64, 21, 29, KILN_DTYPE_F32);  /* prefill after a cached prefix */
        check_attention_fp8(9, 3, 64, 300, 8, KILN_DTYPE_F32);  /* chunks of 8 tokens, as kiln perplexity scores */
        check_attention_fp8(4, 4, 128, 5, 19, KILN_DTYPE_F32);  /* MHA prefill, tiles of 16 tokens */
        check_attention_fp8(6, 2, 16, 40, 37, KILN_DTYPE_F32);  /* head_dim 16: the portable kernel */
        check_attention_fp8(9, 3, 64, 300, 2, KILN_DTYPE_BF16);
        check_attention_fp8(8, 2, 64, 33, 17, KILN_DTYPE_F16);
        unsetenv("KILN_ATTENTION_ISA");
    }
}

static void test_attention_packed(void)
{
    check_attention_packed(KILN_DTYPE_F32);
    check_attention_packed(KILN_DTYPE_BF16);
}

/* ---------------------------------------------------------------------------
 * QuantGather: rows of a quantized table, by index
 * ------------------------------------------------------------------------- */

/* A table of n rows of k values in `type`, random bytes with every block's
 * f16 scales (at `scale_at` within the block, n_scales of them) set to
 * finite values in [-0.5, 0.5). */
static uint8_t *random_blocks(uint32_t type, int64_t n, int64_t k, int scale_at, int n_scales)
{
    int64_t block = kiln_ggml_block_elements(type);
    size_t bytes = kiln_ggml_block_bytes(type), total = (size_t)(n * k / block) * bytes;
    uint8_t *t = malloc(total);
    for (size_t i = 0; i < total; i++)
        t[i] = (uint8_t)(uniform(0.0f, 256.0f));
    for (size_t b = 0; b < total / bytes; b++)
        for (int s = 0; s < n_scales; s++) {
            uint16_t h = kiln_host()->float_to_half(uniform(-0.5f, 0.5f));
            memcpy(t + b * bytes + (size_t)scale_at + 2 * (size_t)s, &h, 2);
        }
    return t;
}

static void test_quant_gather(void)
{
    const int32_t n = 7, k8 = 64, kk = 512;
    int32_t ids[5] = {3, 0, 6, 3, 1};
    float out[5 * 512], want[512];
    /* Q8_0 against its definition: value j of a block = d * (int8) q[j] */
    kiln_field f8[3] = {fstr("format", "Q8_0"), fi32("n", &n), fi32("k", &k8)};
    kiln_plugin *g8 = make("QuantGather", f8, 3);
    uint8_t *t8 = random_blocks(KILN_GGML_Q8_0, n, k8, 0, 1);
    kiln_tensor_desc d8[3] = {DESC(KILN_DTYPE_U8, n, k8 / 32 * 34), DESC(KILN_DTYPE_I32, 5),
                              DESC(KILN_DTYPE_F32, 5, k8)};
    const void *in8[2] = {t8, ids};
    void *o[1] = {out};
    if (g8) {
        CHECK_OK(run(g8, d8, in8, 2, o, 1));
        int same = 1;
        for (int t = 0; t < 5; t++)
            for (int j = 0; j < k8; j++) {
                const uint8_t *blk = t8 + (size_t)ids[t] * (k8 / 32 * 34) + (size_t)(j / 32) * 34;
                uint16_t h;
                memcpy(&h, blk, 2);
                same &= out[t * k8 + j] == kiln_host()->half_to_float(h) * (float)(int8_t)blk[2 + j % 32];
            }
        CHECK(same);
        /* an id outside the table is an error, not a read past it */
        int32_t bad[5] = {0, 1, 7, 2, 3};
        const void *inb[2] = {t8, bad};
        CHECK_FAILS(run(g8, d8, inb, 2, o, 1), KILN_ERROR_INVALID_ARGUMENT, "outside");
        /* the blob round-trips */
        const kiln_plugin_creator *c = kiln_registry_find(reg, "QuantGather", "1", "kiln", NULL);
        unsigned char blob[64];
        size_t size = sizeof blob;
        kiln_plugin *again = NULL;
        CHECK_OK(g8->ops->serialize(g8, blob, &size));
        CHECK(size == 16);
        CHECK_OK(c->deserialize(c, 2, blob, size, &again));
        if (again) {
            CHECK_OK(run(again, d8, in8, 2, o, 1));
            again->ops->destroy(again);
        }
        CHECK_OK(c->deserialize(c, 1, blob, 12, &again)); /* v1: the table as stored */
        if (again)
            again->ops->destroy(again);
        g8->ops->destroy(g8);
    }
    /* a Q8_0 table of 32 rows in QuantMatMul's panels (what a tied CPU
     * engine holds): the same rows as from the stored table */
    const int32_t np = 32, one = 1;
    int32_t pids[5] = {31, 0, 17, 16, 5};
    kiln_field fp[4] = {fstr("format", "Q8_0"), fi32("n", &np), fi32("k", &k8), fi32("panels", &one)};
    kiln_plugin *gp = make("QuantGather", fp, 4), *gs = make("QuantGather", fp, 3);
    uint8_t *ts = random_blocks(KILN_GGML_Q8_0, np, k8, 0, 1), *tp = malloc((size_t)np * (k8 / 32 * 34));
    kiln_qmm_panel_pack(kiln_qmm_format(KILN_GGML_Q8_0), ts, np, k8, tp);
    kiln_tensor_desc dp[3] = {DESC(KILN_DTYPE_U8, np, k8 / 32 * 34), DESC(KILN_DTYPE_I32, 5),
                              DESC(KILN_DTYPE_F32, 5, k8)};
    float outs[5 * 64];
    const void *inp[2] = {tp, pids}, *ins[2] = {ts, pids};
    void *os[1] = {outs};
    if (gp && gs) {
        CHECK_OK(run(gp, dp, inp, 2, o, 1));
        CHECK_OK(run(gs, dp, ins, 2, os, 1));
        CHECK(memcmp(out, outs, sizeof outs) == 0);
    }
    if (gp)
        gp->ops->destroy(gp);
    if (gs)
        gs->ops->destroy(gs);
    free(ts);
    free(tp);
    /* Q4_K (256-value blocks, d and dmin first): rows as the importer's
     * dequantization gives them */
    kiln_field fk[3] = {fstr("format", "Q4_K"), fi32("n", &n), fi32("k", &kk)};
    kiln_plugin *gk = make("QuantGather", fk, 3);
    uint8_t *tk = random_blocks(KILN_GGML_Q4_K, n, kk, 0, 2);
    size_t rb = (size_t)kk / 256 * 144;
    kiln_tensor_desc dk[3] = {DESC(KILN_DTYPE_U8, n, (int64_t)rb), DESC(KILN_DTYPE_I32, 5),
                              DESC(KILN_DTYPE_F32, 5, kk)};
    const void *ink[2] = {tk, ids};
    if (gk) {
        CHECK_OK(run(gk, dk, ink, 2, o, 1));
        for (int t = 0; t < 5; t++) {
            CHECK_OK(kiln_ggml_dequantize(KILN_GGML_Q4_K, tk + (size_t)ids[t] * rb, kk, want));
            CHECK(memcmp(out + t * kk, want, sizeof want) == 0);
        }
        gk->ops->destroy(gk);
    }
    /* k must be whole blocks; the format must be one */
    const kiln_plugin_creator *c = kiln_registry_find(reg, "QuantGather", "1", "kiln", NULL);
    kiln_plugin *p = NULL;
    kiln_field bad_k[3] = {fstr("format", "Q4_K"), fi32("n", &n), fi32("k", &k8)};
    kiln_field bad_f[3] = {fstr("format", "Q9_9"), fi32("n", &n), fi32("k", &k8)};
    kiln_field bad_p[4] = {fstr("format", "Q8_0"), fi32("n", &n), fi32("k", &k8), fi32("panels", &(int32_t){1})};
    if (c) {
        CHECK_FAILS(kiln_plugin_create(c, bad_p, 4, &p), KILN_ERROR_INVALID_ARGUMENT, "panels = 1"); /* n = 7 */
        CHECK_FAILS(kiln_plugin_create(c, bad_k, 3, &p), KILN_ERROR_INVALID_ARGUMENT, "multiple of 256");
        CHECK_FAILS(kiln_plugin_create(c, bad_f, 3, &p), KILN_ERROR_INVALID_ARGUMENT, "Q9_9");
    }
    free(t8);
    free(tk);
}

static void setup(void)
{
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_OK(kiln_threadpool_create(2, &pool));
}

static void teardown(void)
{
    kiln_threadpool_destroy(pool);
    kiln_registry_destroy(reg);
}

/* ---------------------------------------------------------------------------
 * FusedMatMul against RMSNorm, a plain matmul (f32 sums, rounded to the
 * dtype) and SwiGLU on the gate and up columns or the residual add
 * ------------------------------------------------------------------------- */

static const char *dtype_field(kiln_dtype t)
{
    return t == KILN_DTYPE_F32 ? "f32" : t == KILN_DTYPE_F16 ? "f16" : "bf16";
}

/* E4M3 codes and per-row scales of w [n, k] (given in t), quantized as
 * kiln/Fp8MatMul's weights are (max |w| of a row / 448). */
static void quantize_fp8_rows(const void *w, kiln_dtype t, int32_t n, int32_t k, uint8_t *codes, float *scales)
{
    float *row = malloc((size_t)k * sizeof *row);
    for (int32_t r = 0; r < n && row; r++) {
        for (int32_t i = 0; i < k; i++)
            row[i] = load(w, t, (int64_t)r * k + i);
        scales[r] = kiln_fp8_quantize_row(row, k, 0.0f, codes + (size_t)r * (size_t)k);
    }
    free(row);
}

/* w in t; x in st with the norm (else t), the residual and y in st with
 * the residual add: st is t, or f32 (a bf16/f16 engine's residual
 * stream); f32_out (epilogue none): y in f32, the sums unrounded (an
 * LLM's logits). fp8: the plugin gets w as E4M3 codes and row scales
 * (weights = fp8), and the reference product is kiln/Fp8MatMul's of the
 * (normalized) x rounded to t. */
static void check_fused_matmul_w(kiln_dtype t, kiln_dtype st, int32_t norm, const char *epilogue, int64_t rows,
                                 int f32_out, int fp8)
{
    const int32_t n = 10, k = fp8 ? 32 : 24;
    const float eps = 1e-5f;
    const int swiglu = strcmp(epilogue, "swiglu") == 0, residual = strcmp(epilogue, "residual") == 0;
    const int64_t width = swiglu ? n / 2 : n;
    const kiln_dtype xt = norm ? st : t, yt = residual ? st : f32_out ? KILN_DTYPE_F32 : t;
    /* the product as the reference stores it: rounded to t, or not */
    const kiln_dtype pt = f32_out ? KILN_DTYPE_F32 : t;
    kiln_field f[7] = {fi32("n", &n),
                       fi32("k", &k),
                       fi32("norm", &norm),
                       ff32("epsilon", &eps),
                       fstr("epilogue", epilogue),
                       fstr("output_dtype", f32_out ? "f32" : "default"),
                       fstr("weights", "fp8")};
    kiln_field fn[2] = {ff32("epsilon", &eps), fstr("output_dtype", dtype_field(t))};
    kiln_field fq[3] = {fi32("n", &n), fi32("k", &k), fstr("output_dtype", dtype_field(pt))};
    kiln_plugin *p = make("FusedMatMul", f, 6 + fp8), *rms = make("RMSNorm", fn, 2), *sw = make("SwiGLU", NULL, 0),
                *q8 = fp8 ? make("Fp8MatMul", fq, 3) : NULL;
    size_t es = esize(t);
    void *x = random_buf(xt, rows * k), *w = random_buf(t, (int64_t)n * k), *nw = random_buf(t, k);
    uint8_t *codes = malloc((size_t)(n * k));
    float *scales = malloc((size_t)n * sizeof(float));
    quantize_fp8_rows(w, t, n, k, codes, scales);
    void *res = random_buf(yt, rows * n), *h = malloc((size_t)(rows * k) * es),
         *prod = malloc((size_t)(rows * n) * esize(pt));
    void *ref = malloc((size_t)(rows * width) * esize(yt)), *y = malloc((size_t)(rows * width) * esize(yt));
    if (p && rms && sw && (q8 || !fp8)) {
        /* the reference: h = RMSNorm(x) (or x), prod = h · wᵀ */
        if (norm) {
            kiln_tensor_desc dn[3] = {DESC(xt, rows, k), DESC(t, k), DESC(t, rows, k)};
            const void *in_n[2] = {x, nw};
            void *out_n[1] = {h};
            CHECK_OK(run(rms, dn, in_n, 2, out_n, 1));
        } else {
            memcpy(h, x, (size_t)(rows * k) * es);
        }
        if (fp8) {
            kiln_tensor_desc dq[4] = {DESC(t, rows, k), DESC(KILN_DTYPE_U8, n, k), DESC(KILN_DTYPE_F32, n),
                                      DESC(pt, rows, n)};
            const void *in_q[3] = {h, codes, scales};
            void *out_q[1] = {prod};
            CHECK(q8->ops->supports(q8, KILN_BACKEND_CPU, dq, 3, 1));
            void *qws = malloc(q8->ops->workspace_size(q8, dq, 3, dq + 3, 1));
            CHECK_OK(q8->ops->enqueue(q8, KILN_BACKEND_CPU, dq, in_q, 3, dq + 3, out_q, 1, qws, pool));
            free(qws);
        } else {
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < n; c++) {
                    float acc = 0.0f;
                    for (int64_t i = 0; i < k; i++)
                        acc += load(h, t, r * k + i) * load(w, t, c * k + i);
                    store(prod, pt, r * n + c, acc);
                }
        }
        if (swiglu) {
            /* rows 2i and 2i + 1 of w are gate_i and up_i: even and odd columns */
            void *g = malloc((size_t)(rows * width) * es), *u = malloc((size_t)(rows * width) * es);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < width; c++) {
                    store(g, t, r * width + c, load(prod, t, r * n + 2 * c));
                    store(u, t, r * width + c, load(prod, t, r * n + 2 * c + 1));
                }
            kiln_tensor_desc ds[3] = {DESC(t, rows, width), DESC(t, rows, width), DESC(t, rows, width)};
            const void *in_s[2] = {g, u};
            void *out_s[1] = {ref};
            CHECK_OK(run(sw, ds, in_s, 2, out_s, 1));
            free(g), free(u);
        } else {
            for (int64_t i = 0; i < rows * n; i++)
                store(ref, yt, i, load(prod, pt, i) + (residual ? load(res, yt, i) : 0.0f));
        }
        kiln_tensor_desc d[6];
        const void *in[5] = {x, w};
        int32_t n_in = 2;
        d[0] = DESC(xt, rows, k), d[1] = DESC(t, n, k);
        if (fp8) {
            in[1] = codes, d[1] = DESC(KILN_DTYPE_U8, n, k);
            d[n_in] = DESC(KILN_DTYPE_F32, n), in[n_in++] = scales;
        }
        if (norm)
            d[n_in] = DESC(t, k), in[n_in++] = nw;
        if (residual)
            d[n_in] = DESC(yt, rows, n), in[n_in++] = res;
        d[n_in] = DESC(yt, rows, width);
        kiln_dtype dt[5] = {d[0].dtype, d[1].dtype, d[2].dtype, d[3].dtype, d[4].dtype}, out_t;
        CHECK_OK(p->ops->output_dtypes(p, dt, n_in, &out_t, 1));
        CHECK(out_t == yt);
        void *out[1] = {y};
        CHECK(p->ops->supports(p, KILN_BACKEND_CPU, d, n_in, 1));
        size_t wsz = p->ops->workspace_size(p, d, n_in, d + n_in, 1);
        void *ws = malloc(wsz);
        CHECK_OK(p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, n_in, d + n_in, out, 1, ws, pool));
        free(ws);
        /* the same f32 arithmetic in the same order: a difference is at
         * most one rounding of the dtype, from contracted multiply-adds */
        const float tol = t == KILN_DTYPE_F32 ? 1e-5f : t == KILN_DTYPE_F16 ? 2e-3f : 1.6e-2f;
        float worst = 0.0f, scale = 0.0f;
        for (int64_t i = 0; i < rows * width; i++) {
            worst = fmaxf(worst, fabsf(load(y, yt, i) - load(ref, yt, i)));
            scale = fmaxf(scale, fabsf(load(ref, yt, i)));
        }
        CHECK(scale > 0.0f && worst <= tol * scale);
        /* the residual and y differ in dtype: refused */
        if (residual && st != t) {
            d[n_in] = DESC(t, rows, width);
            CHECK(!p->ops->supports(p, KILN_BACKEND_CPU, d, n_in, 1));
            d[n_in] = DESC(yt, rows, width);
        }
        /* a residual input of the wrong size is refused */
        if (residual) {
            d[n_in - 1] = DESC(yt, rows, n - 1);
            CHECK(p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, n_in, d + n_in, out, 1, y, pool) == KILN_ERROR_SHAPE);
            d[n_in - 1] = DESC(yt, rows, n);
        }
        /* E4M3 weights: w of another dtype than u8, a scale of another
         * dtype than f32 or of the wrong length are refused */
        if (fp8) {
            d[1] = DESC(t, n, k);
            CHECK(!p->ops->supports(p, KILN_BACKEND_CPU, d, n_in, 1));
            d[1] = DESC(KILN_DTYPE_U8, n, k), d[2] = DESC(KILN_DTYPE_I32, n);
            CHECK(!p->ops->supports(p, KILN_BACKEND_CPU, d, n_in, 1));
            d[2] = DESC(KILN_DTYPE_F32, n - 1);
            CHECK(p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, n_in, d + n_in, out, 1, y, pool) == KILN_ERROR_SHAPE);
        }
    }
    if (q8)
        q8->ops->destroy(q8);
    free(codes), free(scales);
    if (p)
        p->ops->destroy(p);
    if (rms)
        rms->ops->destroy(rms);
    if (sw)
        sw->ops->destroy(sw);
    free(x), free(w), free(nw), free(res), free(h), free(prod), free(ref), free(y);
}

/* FusedMatMul's rope epilogue against RMSNorm, a plain matmul and RoPE on
 * the packed row; the plugin gets W with each rotated pair's rows side by
 * side (half-split pairs; interleaved pairs are adjacent as stored). */
static void check_fused_rope(kiln_dtype t, int32_t interleaved, int32_t rotary_dim, int64_t rows)
{
    const int32_t nh = 4, nkv = 2, hd = 16, k = 24, n = (nh + 2 * nkv) * hd, one = 1;
    const float eps = 1e-5f, theta = 10000.0f, factor = 8.0f;
    kiln_field f[14] = {fi32("n", &n),
                        fi32("k", &k),
                        fi32("norm", &one),
                        ff32("epsilon", &eps),
                        fstr("epilogue", "rope"),
                        fi32("n_heads", &nh),
                        fi32("n_kv_heads", &nkv),
                        fi32("head_dim", &hd),
                        ff32("theta", &theta),
                        fi32("rotary_dim", &rotary_dim),
                        fi32("interleaved", &interleaved),
                        fstr("scaling", "llama3"),
                        ff32("factor", &factor)};
    kiln_field fn = ff32("epsilon", &eps);
    kiln_plugin *p = make("FusedMatMul", f, 13), *rms = make("RMSNorm", &fn, 1), *rope = make("RoPE", f + 5, 8);
    size_t es = esize(t);
    void *x = random_buf(t, rows * k), *w = random_buf(t, (int64_t)n * k), *nw = random_buf(t, k);
    void *wp = malloc((size_t)(n * k) * es), *h = malloc((size_t)(rows * k) * es);
    void *prod = malloc((size_t)(rows * n) * es), *ref = malloc((size_t)(rows * n) * es),
         *y = malloc((size_t)(rows * n) * es);
    int32_t pos[3] = {5, 1000, 0};
    /* the plugin's weight: rows j and j + rotary_dim / 2 of each q and k head side by side */
    memcpy(wp, w, (size_t)(n * k) * es);
    for (int32_t hh = 0; hh < nh + nkv && !interleaved; hh++)
        for (int32_t j = 0; j < rotary_dim / 2; j++)
            for (int32_t pr = 0; pr < 2; pr++)
                memcpy((char *)wp + (size_t)((hh * hd + 2 * j + pr) * k) * es,
                       (const char *)w + (size_t)((hh * hd + j + pr * rotary_dim / 2) * k) * es, (size_t)k * es);
    if (p && rms && rope) {
        kiln_tensor_desc dn[3] = {DESC(t, rows, k), DESC(t, k), DESC(t, rows, k)};
        const void *in_n[2] = {x, nw};
        void *out_n[1] = {h};
        CHECK_OK(run(rms, dn, in_n, 2, out_n, 1));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < n; c++) {
                float acc = 0.0f;
                for (int64_t i = 0; i < k; i++)
                    acc += load(h, t, r * k + i) * load(w, t, c * k + i);
                store(prod, t, r * n + c, acc);
            }
        kiln_tensor_desc dr[3] = {DESC(t, rows, n), DESC(KILN_DTYPE_I32, rows), DESC(t, rows, n)};
        const void *in_r[2] = {prod, pos};
        void *out_r[1] = {ref};
        CHECK_OK(run(rope, dr, in_r, 2, out_r, 1));
        kiln_tensor_desc d[5] = {DESC(t, rows, k), DESC(t, n, k), DESC(t, k), DESC(KILN_DTYPE_I32, rows),
                                 DESC(t, rows, n)};
        const void *in[4] = {x, wp, nw, pos};
        void *out[1] = {y};
        CHECK(p->ops->supports(p, KILN_BACKEND_CPU, d, 4, 1));
        void *ws = malloc(p->ops->workspace_size(p, d, 4, d + 4, 1));
        CHECK_OK(p->ops->enqueue(p, KILN_BACKEND_CPU, d, in, 4, d + 4, out, 1, ws, pool));
        free(ws);
        const float tol = t == KILN_DTYPE_F32 ? 1e-5f : t == KILN_DTYPE_F16 ? 2e-3f : 1.6e-2f;
        float worst = 0.0f, scale = 0.0f;
        for (int64_t i = 0; i < rows * n; i++) {
            worst = fmaxf(worst, fabsf(load(y, t, i) - load(ref, t, i)));
            scale = fmaxf(scale, fabsf(load(ref, t, i)));
        }
        CHECK(scale > 0.0f && worst <= tol * scale);
        /* the rotation did happen: the reference differs from the plain product */
        CHECK(memcmp(ref, prod, (size_t)(rows * n) * es) != 0);
    }
    if (p)
        p->ops->destroy(p);
    if (rms)
        rms->ops->destroy(rms);
    if (rope)
        rope->ops->destroy(rope);
    free(x), free(w), free(nw), free(wp), free(h), free(prod), free(ref), free(y);
}

static void check_fused_matmul(kiln_dtype t, kiln_dtype st, int32_t norm, const char *epilogue, int64_t rows,
                               int f32_out)
{
    check_fused_matmul_w(t, st, norm, epilogue, rows, f32_out, 0);
    check_fused_matmul_w(t, st, norm, epilogue, rows, f32_out, 1);
}

static void test_fused_matmul(void)
{
    for (int ti = 0; ti < 3; ti++)
        for (int64_t rows = 1; rows <= 3; rows += 2) {
            const kiln_dtype t = float_types[ti];
            check_fused_matmul(t, t, 1, "none", rows, 0);
            check_fused_matmul(t, t, 1, "swiglu", rows, 0);
            check_fused_matmul(t, t, 0, "residual", rows, 0);
            check_fused_matmul(t, t, 0, "none", rows, 0);
            /* the f32 residual stream of a bf16/f16 engine */
            check_fused_matmul(t, KILN_DTYPE_F32, 1, "none", rows, 0);
            check_fused_matmul(t, KILN_DTYPE_F32, 1, "swiglu", rows, 0);
            check_fused_matmul(t, KILN_DTYPE_F32, 0, "residual", rows, 0);
            check_fused_matmul(t, KILN_DTYPE_F32, 1, "residual", rows, 0);
            /* an LLM's head: the f32 stream's norm into unrounded f32 logits */
            check_fused_matmul(t, KILN_DTYPE_F32, 1, "none", rows, 1);
            check_fused_rope(float_types[ti], 0, 16, rows);
            check_fused_rope(float_types[ti], 0, 8, rows);
            check_fused_rope(float_types[ti], 1, 16, rows);
        }
    /* refused: an unknown epilogue, swiglu over an odd n, norm without epsilon */
    const int32_t n = 9, k = 8, one = 1;
    const float zero = 0.0f;
    const kiln_plugin_creator *c = kiln_registry_find(reg, "FusedMatMul", "1", "kiln", NULL);
    kiln_plugin *p = NULL;
    kiln_field bad[2][4] = {{fi32("n", &n), fi32("k", &k), fstr("epilogue", "gelu"), fi32("norm", &one)},
                            {fi32("n", &n), fi32("k", &k), fstr("epilogue", "swiglu"), ff32("epsilon", &zero)}};
    CHECK_FAILS(kiln_plugin_create(c, bad[0], 3, &p), KILN_ERROR_INVALID_ARGUMENT, "epilogue");
    CHECK_FAILS(kiln_plugin_create(c, bad[1], 3, &p), KILN_ERROR_INVALID_ARGUMENT, "swiglu");
    bad[0][2] = fstr("epilogue", "none");
    CHECK_FAILS(kiln_plugin_create(c, bad[0], 4, &p), KILN_ERROR_INVALID_ARGUMENT, "epsilon");
    /* output_dtype: f32, and only without an epilogue */
    kiln_field od[4] = {fi32("n", &n), fi32("k", &k), fstr("epilogue", "residual"), fstr("output_dtype", "f32")};
    CHECK_FAILS(kiln_plugin_create(c, od, 4, &p), KILN_ERROR_INVALID_ARGUMENT, "output dtype");
    od[2] = fstr("epilogue", "none"), od[3] = fstr("output_dtype", "bf16");
    CHECK_FAILS(kiln_plugin_create(c, od, 4, &p), KILN_ERROR_INVALID_ARGUMENT, "output_dtype");
    /* weights: dtype or fp8, and fp8 only with k a multiple of 16 */
    kiln_field wf[3] = {fi32("n", &n), fi32("k", &k), fstr("weights", "int4")};
    CHECK_FAILS(kiln_plugin_create(c, wf, 3, &p), KILN_ERROR_INVALID_ARGUMENT, "weights");
    wf[2] = fstr("weights", "fp8");
    CHECK_FAILS(kiln_plugin_create(c, wf, 3, &p), KILN_ERROR_INVALID_ARGUMENT, "multiple of 16");
    /* a static scale x_amax: finite, >= 0, and only over E4M3 weights */
    const float amax = 2.0f, neg = -1.0f;
    kiln_field af[4] = {fi32("n", &n), fi32("k", &k), ff32("x_amax", &amax), fstr("weights", "dtype")};
    CHECK_FAILS(kiln_plugin_create(c, af, 3, &p), KILN_ERROR_INVALID_ARGUMENT, "without weights = fp8");
    af[2] = ff32("x_amax", &neg);
    CHECK_FAILS(kiln_plugin_create(c, af, 3, &p), KILN_ERROR_INVALID_ARGUMENT, "x_amax");
    /* a v3 blob (before x_amax), a v2 blob (before weights) and a v1 blob
     * (before output_dtype: 4, 8 and 12 bytes shorter) load */
    od[3] = fstr("output_dtype", "f32");
    CHECK_OK(kiln_plugin_create(c, od, 4, &p));
    size_t size = 0;
    if (p) {
        CHECK_OK(p->ops->serialize(p, NULL, &size));
        check_blob(p, "FusedMatMul", 3, size - sizeof(float));
        check_blob(p, "FusedMatMul", 2, size - sizeof(float) - sizeof(int32_t));
        check_blob(p, "FusedMatMul", 1, size - sizeof(float) - 2 * sizeof(int32_t));
        p->ops->destroy(p);
    }
}

static const test_case_ tests[] = {TEST(setup),
                                   TEST(test_add_rmsnorm),
                                   TEST(test_add_rmsnorm_mixed),
                                   TEST(test_rope_packed),
                                   TEST(test_swiglu_packed),
                                   TEST(test_attention_packed),
                                   TEST(test_attention_reference),
                                   TEST(test_attention_decode_isa),
                                   TEST(test_attention_fp8),
                                   TEST(test_quant_gather),
                                   TEST(test_fused_matmul),
                                   TEST(teardown)};
TEST_MAIN(tests)
