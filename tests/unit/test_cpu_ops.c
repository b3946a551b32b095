/* CPU backend kernels on small shapes with values worked out by hand (or
 * from the op's formula in f64), f16/bf16 storage against f32, and the
 * fast path against the reference path on larger random shapes. */
#include "test.h"

#include "backend/cpu/cpu_internal.h"
#include "core/dtype.h"
#include "core/error.h"

#include <limits.h>

/* ---- helpers ---------------------------------------------------------------------- */

static kiln_dims make_dims(const int64_t *d, int rank)
{
    kiln_dims r = {.rank = rank};
    for (int i = 0; i < rank; i++)
        r.d[i] = d[i];
    return r;
}
#define DIMS(...) \
    make_dims((const int64_t[]){__VA_ARGS__}, (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

static kiln_exec_tensor ten(void *data, kiln_dtype t, kiln_dims d)
{
    return (kiln_exec_tensor){.data = data, .dtype = t, .dims = d};
}

static kiln_layer layer(const char *name, kiln_op op, int n_in, int n_out)
{
    kiln_layer l;
    memset(&l, 0, sizeof l);
    l.name = (char *)name;
    l.op = op;
    l.n_inputs = n_in;
    l.n_outputs = n_out;
    l.tactic = -1;
    return l;
}

static kiln_threadpool *test_pool;

static kiln_status run_mode(const kiln_layer *l, const kiln_exec_tensor *in, kiln_exec_tensor *out, int reference,
                            kiln_threadpool *pool)
{
    kiln_cpu_args a = {.layer = l, .inputs = in, .outputs = out, .pool = pool, .reference = reference};
    return kiln_cpu_run_layer(&a);
}

/* Runs on the fast path with the test pool. */
static kiln_status run(const kiln_layer *l, const kiln_exec_tensor *in, kiln_exec_tensor *out)
{
    return run_mode(l, in, out, 0, test_pool);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}
static uint32_t urand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 32);
}
static float *rand_f32(int64_t n)
{
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

/* ‖x − y‖ / ‖y‖ */
static double rel_err(const float *x, const float *y, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)y[i] * y[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- matmul ------------------------------------------------------------------------ */

static void test_matmul_by_hand(void)
{
    /* [[1,2,3],[4,5,6]] · [[7,8],[9,10],[11,12]] = [[58,64],[139,154]] */
    float A[] = {1, 2, 3, 4, 5, 6}, B[] = {7, 8, 9, 10, 11, 12}, C[4];
    float At[] = {1, 4, 2, 5, 3, 6}, Bt[] = {7, 9, 11, 8, 10, 12};
    const float want[] = {58, 64, 139, 154};
    for (int ref = 0; ref <= 1; ref++)
        for (int ta = 0; ta <= 1; ta++)
            for (int tb = 0; tb <= 1; tb++) {
                kiln_layer l = layer("mm", KILN_OP_MATMUL, 2, 1);
                l.p.matmul.transpose_a = ta;
                l.p.matmul.transpose_b = tb;
                kiln_exec_tensor in[2] = {ta ? ten(At, KILN_DTYPE_F32, DIMS(3, 2)) : ten(A, KILN_DTYPE_F32, DIMS(2, 3)),
                                          tb ? ten(Bt, KILN_DTYPE_F32, DIMS(2, 3))
                                             : ten(B, KILN_DTYPE_F32, DIMS(3, 2))};
                kiln_exec_tensor out = ten(C, KILN_DTYPE_F32, DIMS(2, 2));
                memset(C, 0, sizeof C);
                CHECK_OK(run_mode(&l, in, &out, ref, test_pool));
                for (int i = 0; i < 4; i++)
                    CHECK_NEAR(C[i], want[i], 1e-4);
            }
}

static void test_matmul_batch_broadcast(void)
{
    /* A: [2,2,3] = (A0, 2·A0); B: [3,2] shared → C[1] = 2·C[0]. */
    float A[] = {1, 2, 3, 4, 5, 6, 2, 4, 6, 8, 10, 12}, B[] = {7, 8, 9, 10, 11, 12}, C[8];
    const float want[] = {58, 64, 139, 154, 116, 128, 278, 308};
    for (int ref = 0; ref <= 1; ref++) {
        kiln_layer l = layer("mm", KILN_OP_MATMUL, 2, 1);
        kiln_exec_tensor in[2] = {ten(A, KILN_DTYPE_F32, DIMS(2, 2, 3)), ten(B, KILN_DTYPE_F32, DIMS(3, 2))};
        kiln_exec_tensor out = ten(C, KILN_DTYPE_F32, DIMS(2, 2, 2));
        CHECK_OK(run_mode(&l, in, &out, ref, test_pool));
        for (int i = 0; i < 8; i++)
            CHECK_NEAR(C[i], want[i], 1e-4);
    }
    /* A: [1,2,3] broadcast against B: [2,3,2] = (B0, −B0) → C[1] = −C[0]. */
    float B2[] = {7, 8, 9, 10, 11, 12, -7, -8, -9, -10, -11, -12};
    const float want2[] = {58, 64, 139, 154, -58, -64, -139, -154};
    for (int ref = 0; ref <= 1; ref++) {
        kiln_layer l = layer("mm", KILN_OP_MATMUL, 2, 1);
        kiln_exec_tensor in[2] = {ten(A, KILN_DTYPE_F32, DIMS(1, 2, 3)), ten(B2, KILN_DTYPE_F32, DIMS(2, 3, 2))};
        kiln_exec_tensor out = ten(C, KILN_DTYPE_F32, DIMS(2, 2, 2));
        CHECK_OK(run_mode(&l, in, &out, ref, test_pool));
        for (int i = 0; i < 8; i++)
            CHECK_NEAR(C[i], want2[i], 1e-4);
    }
    /* A batch [2,1] against B batch [3]: output batch [2,3]; C[i][j] = (i+1)(j+1)·(1·1) */
    float a1[] = {1, 2}, b1[] = {1, 2, 3}, C6[6];
    kiln_layer l = layer("mm", KILN_OP_MATMUL, 2, 1);
    kiln_exec_tensor in[2] = {ten(a1, KILN_DTYPE_F32, DIMS(2, 1, 1, 1)), ten(b1, KILN_DTYPE_F32, DIMS(3, 1, 1))};
    kiln_exec_tensor out = ten(C6, KILN_DTYPE_F32, DIMS(2, 3, 1, 1));
    CHECK_OK(run(&l, in, &out));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            CHECK_NEAR(C6[i * 3 + j], (i + 1) * (j + 1), 0);
}

static void test_matmul_vectors(void)
{
    float A[] = {1, 2, 3, 4, 5, 6}, B[] = {7, 8, 9, 10, 11, 12}, v[] = {1, 2, 3}, ones[] = {1, 1, 1};
    float C[2], d[1];
    for (int ref = 0; ref <= 1; ref++) {
        kiln_layer l = layer("mv", KILN_OP_MATMUL, 2, 1);
        /* [3] · [3,2] = [58, 64] */
        kiln_exec_tensor in[2] = {ten(v, KILN_DTYPE_F32, DIMS(3)), ten(B, KILN_DTYPE_F32, DIMS(3, 2))};
        kiln_exec_tensor out = ten(C, KILN_DTYPE_F32, DIMS(2));
        CHECK_OK(run_mode(&l, in, &out, ref, test_pool));
        CHECK_NEAR(C[0], 58, 1e-4);
        CHECK_NEAR(C[1], 64, 1e-4);
        /* [2,3] · [3] of ones = row sums [6, 15] */
        kiln_exec_tensor in2[2] = {ten(A, KILN_DTYPE_F32, DIMS(2, 3)), ten(ones, KILN_DTYPE_F32, DIMS(3))};
        CHECK_OK(run_mode(&l, in2, &out, ref, test_pool));
        CHECK_NEAR(C[0], 6, 1e-4);
        CHECK_NEAR(C[1], 15, 1e-4);
        /* [3] · [3] = 1+2+3 */
        kiln_exec_tensor in3[2] = {ten(v, KILN_DTYPE_F32, DIMS(3)), ten(ones, KILN_DTYPE_F32, DIMS(3))};
        kiln_exec_tensor out3 = ten(d, KILN_DTYPE_F32, DIMS(0));
        out3.dims.rank = 0;
        CHECK_OK(run_mode(&l, in3, &out3, ref, test_pool));
        CHECK_NEAR(d[0], 6, 1e-4);
    }
}

static void test_matmul_shape_errors(void)
{
    float A[6] = {0}, B[6] = {0}, C[4];
    kiln_layer l = layer("mm_bad", KILN_OP_MATMUL, 2, 1);
    kiln_exec_tensor in[2] = {ten(A, KILN_DTYPE_F32, DIMS(2, 3)), ten(B, KILN_DTYPE_F32, DIMS(2, 3))};
    kiln_exec_tensor out = ten(C, KILN_DTYPE_F32, DIMS(2, 2));
    CHECK_FAILS(run(&l, in, &out), KILN_ERROR_SHAPE, "mm_bad");
    in[0].dtype = KILN_DTYPE_I32;
    CHECK_FAILS(run(&l, in, &out), KILN_ERROR_UNSUPPORTED, "mm_bad");
}

/* Fast (OpenBLAS, batching, pool) vs the naive f64 reference. */
static void matmul_fast_vs_ref(kiln_dims da, kiln_dims db, kiln_dims dc, int ta, int tb, kiln_dtype t)
{
    int64_t na = 1, nb = 1, nc = 1;
    for (int i = 0; i < da.rank; i++)
        na *= da.d[i];
    for (int i = 0; i < db.rank; i++)
        nb *= db.d[i];
    for (int i = 0; i < dc.rank; i++)
        nc *= dc.d[i];
    float *a = rand_f32(na), *b = rand_f32(nb);
    size_t es = kiln_dtype_size(t);
    void *as = malloc((size_t)na * es), *bs = malloc((size_t)nb * es);
    void *c1 = malloc((size_t)nc * es), *c2 = malloc((size_t)nc * es);
    kiln_convert(as, t, a, KILN_DTYPE_F32, na);
    kiln_convert(bs, t, b, KILN_DTYPE_F32, nb);
    kiln_layer l = layer("mm_rand", KILN_OP_MATMUL, 2, 1);
    l.p.matmul.transpose_a = ta;
    l.p.matmul.transpose_b = tb;
    kiln_exec_tensor in[2] = {ten(as, t, da), ten(bs, t, db)};
    kiln_exec_tensor o1 = ten(c1, t, dc), o2 = ten(c2, t, dc);
    CHECK_OK(run_mode(&l, in, &o1, 0, test_pool));
    CHECK_OK(run_mode(&l, in, &o2, 1, NULL));
    float *f1 = malloc((size_t)nc * 4), *f2 = malloc((size_t)nc * 4);
    kiln_convert(f1, KILN_DTYPE_F32, c1, t, nc);
    kiln_convert(f2, KILN_DTYPE_F32, c2, t, nc);
    /* f32: summation order only. f16/bf16: the outputs are rounded to storage
     * from slightly different f32 sums, at most one ulp apart. */
    double tol = t == KILN_DTYPE_F32 ? 1e-5 : t == KILN_DTYPE_F16 ? 1e-3 : 8e-3;
    double e = rel_err(f1, f2, nc);
    CHECK(e <= tol);
    if (e > tol)
        fprintf(stderr, "  matmul %s rank %d: rel err %g\n", kiln_dtype_name(t), dc.rank, e);
    free(a);
    free(b);
    free(as);
    free(bs);
    free(c1);
    free(c2);
    free(f1);
    free(f2);
}

static void test_matmul_fast_vs_reference(void)
{
    kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        kiln_dtype t = types[i];
        matmul_fast_vs_ref(DIMS(3, 17, 65), DIMS(65, 29), DIMS(3, 17, 29), 0, 0, t);         /* folded */
        matmul_fast_vs_ref(DIMS(3, 65, 17), DIMS(29, 65), DIMS(3, 17, 29), 1, 1, t);         /* batched */
        matmul_fast_vs_ref(DIMS(2, 1, 8, 16), DIMS(2, 6, 8, 16), DIMS(2, 6, 8, 8), 0, 1, t); /* heads */
        matmul_fast_vs_ref(DIMS(130, 70), DIMS(70, 90), DIMS(130, 90), 0, 0, t);
        matmul_fast_vs_ref(DIMS(70), DIMS(4, 70, 33), DIMS(4, 33), 0, 0, t);
        /* many rows against one f16/bf16 B: panels of B, several of them here */
        matmul_fast_vs_ref(DIMS(9, 4096), DIMS(4096, 300), DIMS(9, 300), 0, 0, t);
        matmul_fast_vs_ref(DIMS(3, 3, 4096), DIMS(300, 4096), DIMS(3, 3, 300), 0, 1, t);
        /* few rows against one B: the direct (non-BLAS) kernel */
        matmul_fast_vs_ref(DIMS(1, 3, 300), DIMS(300, 513), DIMS(1, 3, 513), 0, 0, t);
        matmul_fast_vs_ref(DIMS(2, 3, 300), DIMS(513, 300), DIMS(2, 3, 513), 0, 1, t);
        matmul_fast_vs_ref(DIMS(300), DIMS(300, 77), DIMS(77), 0, 0, t);
        matmul_fast_vs_ref(DIMS(1, 1, 7), DIMS(9, 7), DIMS(1, 1, 9), 0, 1, t);
    }
}

/* f16/bf16 storage against the f32 result of the same (rounded) inputs. */
static void test_matmul_half_storage(void)
{
    float A[] = {1, 2, 3, 4, 5, 6}, B[] = {7, 8, 9, 10, 11, 12};
    const float want[] = {58, 64, 139, 154};
    kiln_dtype types[] = {KILN_DTYPE_F16, KILN_DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        uint16_t a[6], b[6], c[4];
        kiln_convert(a, types[i], A, KILN_DTYPE_F32, 6);
        kiln_convert(b, types[i], B, KILN_DTYPE_F32, 6);
        for (int ref = 0; ref <= 1; ref++) {
            kiln_layer l = layer("mm16", KILN_OP_MATMUL, 2, 1);
            kiln_exec_tensor in[2] = {ten(a, types[i], DIMS(2, 3)), ten(b, types[i], DIMS(3, 2))};
            kiln_exec_tensor out = ten(c, types[i], DIMS(2, 2));
            CHECK_OK(run_mode(&l, in, &out, ref, test_pool));
            /* Inputs and results are integers below 256: exact in f16 and bf16. */
            for (int k = 0; k < 4; k++)
                CHECK_NEAR(kiln_load_f32(c, types[i], k), want[k], 0);
        }
    }
}

/* The kernels' inline and vector conversions against the dtype.h ones. */
static void test_conversions_bit_exact(void)
{
    static uint16_t h[65536];
    static float wide[65536];
    int bad = 0;
    /* every f16 against its value by the IEEE 754 definition (NaNs: the
     * payload moves to the top of the f32 mantissa, sign kept) */
    for (uint32_t i = 0; i < 65536; i++) {
        h[i] = (uint16_t)i;
        uint32_t e = (i >> 10) & 31u, m = i & 1023u;
        float a = kiln_f16_to_f32((uint16_t)i), b;
        if (e == 31 && m) {
            uint32_t u = ((i & 0x8000u) << 16) | 0x7f800000u | (m << 13);
            memcpy(&b, &u, 4);
        } else {
            b = e == 31 ? INFINITY : e == 0 ? ldexpf((float)m, -24) : ldexpf(1.0f + (float)m / 1024.0f, (int)e - 15);
            if (i & 0x8000u)
                b = -b;
        }
        bad += memcmp(&a, &b, 4) != 0;
    }
    CHECK(bad == 0);
    /* the portable 8-lane widening (used where F16C is missing), exact */
    bad = 0;
    for (uint32_t i = 0; i < 65536; i += 8) {
        float w8[8], b8[8];
        cpu_f16x8(w8, h + i);
        cpu_bf16x8(b8, h + i);
        for (int k = 0; k < 8; k++) {
            float a = kiln_half_to_float(h[i + k]), b = kiln_bf16_to_float(h[i + k]);
            bad += memcmp(&w8[k], &a, 4) != 0 || memcmp(&b8[k], &b, 4) != 0;
        }
    }
    CHECK(bad == 0);
    kiln_dtype ts[] = {KILN_DTYPE_F16, KILN_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        cpu_widen(wide, h, ts[t], 65536);
        bad = 0;
        for (uint32_t i = 0; i < 65536; i++) {
            float b = kiln_load_f32(h, ts[t], i);
            /* F16C quiets signalling NaNs: a NaN only has to stay NaN */
            bad += isnan(b) ? !isnan(wide[i]) : memcmp(&wide[i], &b, 4) != 0;
        }
        CHECK(bad == 0);
    }
    /* f32 -> bf16: ties, NaN, Inf, subnormals and random values */
    float v[4096];
    uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u, 0x00000001u,
                           0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x80000000u};
    for (int i = 0; i < 4096; i++) {
        uint32_t u = i < 10 ? specials[i] : urand();
        memcpy(&v[i], &u, 4);
    }
    uint16_t n16[4096];
    cpu_narrow_bf16(n16, v, 4096);
    bad = 0;
    for (int i = 0; i < 4096; i++)
        bad += n16[i] != kiln_float_to_bf16(v[i]) || kiln_f32_to_bf16(v[i]) != kiln_float_to_bf16(v[i]);
    CHECK(bad == 0);
    /* f32 -> f16 over a sweep of bit patterns (every exponent, both signs)
     * plus the boundaries of the half range */
    static float sweep[1 << 16];
    static uint16_t hs[1 << 16];
    uint32_t edges[] = {0x477ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u,
                        0x33000001u, 0x32ffffffu, 0x7f800000u, 0x7fc12345u, 0x477fe000u};
    for (uint32_t i = 0; i < (1u << 16); i++) {
        uint32_t u = i < 10 ? edges[i] : i * 65537u + (i >> 3);
        memcpy(&sweep[i], &u, 4);
    }
    cpu_narrow_f16(hs, sweep, 1 << 16);
    bad = 0;
    for (uint32_t i = 0; i < (1u << 16); i++)
        bad += hs[i] != kiln_float_to_half(sweep[i]);
    CHECK(bad == 0);
}

/* The vector exp: within 2 ulp of exp() over the whole f32 range it
 * covers, 0 below ln(FLT_MIN), inf above ln(FLT_MAX), NaN kept. */
static void test_vector_exp(void)
{
    int bad = 0;
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f + (float)i * (175.5f / 200000.0f);
        cpu_v8 v = {x, -x * 0.5f, x * 1e-3f, x * 1e-6f, 0, 1, -1, 0.5f};
        cpu_v8 e;
        cpu_exp8(&e, &v);
        for (int k = 0; k < 8; k++) {
            if (v[k] < -87.0f || v[k] > 88.5f)
                continue;
            double w = exp((double)v[k]), r = fabs(e[k] - w) / w;
            worst = r > worst ? r : worst;
            bad += r > 2.5e-7; /* ~2 ulp */
        }
    }
    CHECK(bad == 0);
    if (bad)
        fprintf(stderr, "  worst relative error %g\n", worst);
    cpu_v8 sp = {-INFINITY, INFINITY, NAN, -100, 100, 88.7f, -87.3f, 0};
    cpu_v8 e;
    cpu_exp8(&e, &sp);
    CHECK(e[0] == 0 && isinf(e[1]) && e[1] > 0 && isnan(e[2]) && e[3] == 0 && isinf(e[4]));
    CHECK_NEAR(e[5] / exp((double)sp[5]), 1, 3e-7);
    CHECK_NEAR(e[6] / exp((double)sp[6]), 1, 3e-7);
    CHECK(e[7] == 1);
}

/* ---- binary --------------------------------------------------------------------------- */

static void test_binary_broadcast(void)
{
    /* [2,3] + [3] */
    float x[] = {1, 2, 3, 4, 5, 6}, row[] = {10, 20, 30}, o[6];
    kiln_layer l = layer("add", KILN_OP_BINARY, 2, 1);
    l.p.binary.op = KILN_BINARY_ADD;
    kiln_exec_tensor in[2] = {ten(x, KILN_DTYPE_F32, DIMS(2, 3)), ten(row, KILN_DTYPE_F32, DIMS(3))};
    kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(2, 3));
    CHECK_OK(run(&l, in, &out));
    const float w1[] = {11, 22, 33, 14, 25, 36};
    for (int i = 0; i < 6; i++)
        CHECK_NEAR(o[i], w1[i], 0);
    /* [2,1] * [1,3] = outer product */
    float c[] = {2, 3}, r[] = {1, 10, 100};
    l.p.binary.op = KILN_BINARY_MUL;
    kiln_exec_tensor in2[2] = {ten(c, KILN_DTYPE_F32, DIMS(2, 1)), ten(r, KILN_DTYPE_F32, DIMS(1, 3))};
    CHECK_OK(run(&l, in2, &out));
    const float w2[] = {2, 20, 200, 3, 30, 300};
    for (int i = 0; i < 6; i++)
        CHECK_NEAR(o[i], w2[i], 0);
    /* [2,3] - scalar (rank 0) */
    float s[] = {1};
    l.p.binary.op = KILN_BINARY_SUB;
    kiln_exec_tensor in3[2] = {ten(x, KILN_DTYPE_F32, DIMS(2, 3)), ten(s, KILN_DTYPE_F32, DIMS(1))};
    in3[1].dims.rank = 0;
    CHECK_OK(run(&l, in3, &out));
    for (int i = 0; i < 6; i++)
        CHECK_NEAR(o[i], x[i] - 1, 0);
    /* incompatible dims */
    kiln_exec_tensor in4[2] = {ten(x, KILN_DTYPE_F32, DIMS(2, 3)), ten(c, KILN_DTYPE_F32, DIMS(2))};
    CHECK_FAILS(run(&l, in4, &out), KILN_ERROR_SHAPE, "add");
}

static void test_binary_ops(void)
{
    float a[] = {2, -3, 9, 0.5f}, b[] = {3, 2, 0.5f, -4}, o[4];
    struct {
        kiln_binary_op op;
        float w[4];
    } cases[] = {
        {KILN_BINARY_ADD, {5, -1, 9.5f, -3.5f}}, {KILN_BINARY_SUB, {-1, -5, 8.5f, 4.5f}},
        {KILN_BINARY_MUL, {6, -6, 4.5f, -2}},    {KILN_BINARY_DIV, {2.0f / 3.0f, -1.5f, 18, -0.125f}},
        {KILN_BINARY_POW, {8, 9, 3, 16}},        {KILN_BINARY_MAX, {3, 2, 9, 0.5f}},
        {KILN_BINARY_MIN, {2, -3, 0.5f, -4}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kiln_layer l = layer("bin", KILN_OP_BINARY, 2, 1);
        l.p.binary.op = cases[c].op;
        kiln_exec_tensor in[2] = {ten(a, KILN_DTYPE_F32, DIMS(4)), ten(b, KILN_DTYPE_F32, DIMS(4))};
        kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(4));
        CHECK_OK(run(&l, in, &out));
        for (int i = 0; i < 4; i++)
            CHECK_NEAR(o[i], cases[c].w[i], 1e-6);
    }
}

static void test_binary_int(void)
{
    int32_t a[] = {7, -7, 5, INT32_MAX}, b[] = {2, 2, 0, 1}, o[4];
    kiln_layer l = layer("ibin", KILN_OP_BINARY, 2, 1);
    kiln_exec_tensor in[2] = {ten(a, KILN_DTYPE_I32, DIMS(4)), ten(b, KILN_DTYPE_I32, DIMS(4))};
    kiln_exec_tensor out = ten(o, KILN_DTYPE_I32, DIMS(4));
    l.p.binary.op = KILN_BINARY_DIV; /* truncation; x / 0 gives 0 */
    CHECK_OK(run(&l, in, &out));
    CHECK(o[0] == 3 && o[1] == -3 && o[2] == 0 && o[3] == INT32_MAX);
    l.p.binary.op = KILN_BINARY_ADD; /* wraps at the storage width */
    CHECK_OK(run(&l, in, &out));
    CHECK(o[0] == 9 && o[1] == -5 && o[2] == 5 && o[3] == INT32_MIN);
    l.p.binary.op = KILN_BINARY_POW;
    CHECK_OK(run(&l, in, &out));
    CHECK(o[0] == 49 && o[1] == 49 && o[2] == 1 && o[3] == INT32_MAX);
    /* i64 with broadcasting: [2,2] * [2] */
    int64_t x[] = {1, 2, 3, 4}, y[] = {10, 100}, z[4];
    l.p.binary.op = KILN_BINARY_MUL;
    kiln_exec_tensor in64[2] = {ten(x, KILN_DTYPE_I64, DIMS(2, 2)), ten(y, KILN_DTYPE_I64, DIMS(2))};
    kiln_exec_tensor out64 = ten(z, KILN_DTYPE_I64, DIMS(2, 2));
    CHECK_OK(run(&l, in64, &out64));
    CHECK(z[0] == 10 && z[1] == 200 && z[2] == 30 && z[3] == 400);
    /* mixed dtypes are refused */
    in64[1].dtype = KILN_DTYPE_I32;
    CHECK_FAILS(run(&l, in64, &out64), KILN_ERROR_INVALID_ARGUMENT, "ibin");
}

/* f16 / bf16 storage against f32, across broadcasting and the parallel path. */
static void test_binary_half_and_parallel(void)
{
    int64_t R = 300, C = 257; /* ragged last block */
    float *x = rand_f32(R * C), *y = rand_f32(C), *want = malloc((size_t)(R * C) * 4);
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++)
            want[i * C + j] = x[i * C + j] * y[j];
    kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    double tols[] = {0, 1.5 / 1024, 1.5 / 128}; /* ~3 roundings of 2^-11 / 2^-8 relative */
    for (int t = 0; t < 3; t++) {
        size_t es = kiln_dtype_size(types[t]);
        void *xs = malloc((size_t)(R * C) * es), *ys = malloc((size_t)C * es), *os = malloc((size_t)(R * C) * es);
        kiln_convert(xs, types[t], x, KILN_DTYPE_F32, R * C);
        kiln_convert(ys, types[t], y, KILN_DTYPE_F32, C);
        kiln_layer l = layer("mulb", KILN_OP_BINARY, 2, 1);
        l.p.binary.op = KILN_BINARY_MUL;
        kiln_exec_tensor in[2] = {ten(xs, types[t], DIMS(R, C)), ten(ys, types[t], DIMS(1, C))};
        kiln_exec_tensor out = ten(os, types[t], DIMS(R, C));
        CHECK_OK(run(&l, in, &out));
        int bad = 0;
        for (int64_t i = 0; i < R * C; i++)
            bad += fabs(kiln_load_f32(os, types[t], i) - want[i]) > tols[t] * fabs(want[i]) + 1e-7; /* f16 subnormals */
        CHECK(bad == 0);
        if (bad)
            fprintf(stderr, "  %s: %d elements off\n", kiln_dtype_name(types[t]), bad);
        free(xs);
        free(ys);
        free(os);
    }
    free(x);
    free(y);
    free(want);
}

/* ---- unary ----------------------------------------------------------------------------- */

static double gelu_erf_ref(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double gelu_tanh_ref(double x) { return 0.5 * x * (1 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

static void test_unary_ops(void)
{
    float x[] = {-2, -0.5f, 0.25f, 1, 4};
    float o[5];
    for (int op = 0; op < KILN_UNARY_OP_COUNT; op++) {
        kiln_layer l = layer("un", KILN_OP_UNARY, 1, 1);
        l.p.unary.op = op;
        float xin[5];
        memcpy(xin, x, sizeof x);
        if (op == KILN_UNARY_LOG || op == KILN_UNARY_SQRT || op == KILN_UNARY_RSQRT)
            for (int i = 0; i < 5; i++)
                xin[i] = fabsf(x[i]);
        kiln_exec_tensor in = ten(xin, KILN_DTYPE_F32, DIMS(5)), out = ten(o, KILN_DTYPE_F32, DIMS(5));
        CHECK_OK(run(&l, &in, &out));
        for (int i = 0; i < 5; i++) {
            double v = xin[i], w = 0;
            switch (op) {
            case KILN_UNARY_NEG: w = -v; break;
            case KILN_UNARY_ABS: w = fabs(v); break;
            case KILN_UNARY_EXP: w = exp(v); break;
            case KILN_UNARY_LOG: w = log(v); break;
            case KILN_UNARY_SQRT: w = sqrt(v); break;
            case KILN_UNARY_RSQRT: w = 1 / sqrt(v); break;
            case KILN_UNARY_TANH: w = tanh(v); break;
            case KILN_UNARY_SIGMOID: w = 1 / (1 + exp(-v)); break;
            case KILN_UNARY_RELU: w = v > 0 ? v : 0; break;
            case KILN_UNARY_GELU_ERF: w = gelu_erf_ref(v); break;
            case KILN_UNARY_GELU_TANH: w = gelu_tanh_ref(v); break;
            case KILN_UNARY_SILU: w = v / (1 + exp(-v)); break;
            }
            CHECK_NEAR(o[i], w, 2e-6 * (1 + fabs(w)));
        }
    }
    /* Known constants. */
    float one = 1, r;
    kiln_exec_tensor in = ten(&one, KILN_DTYPE_F32, DIMS(1)), out = ten(&r, KILN_DTYPE_F32, DIMS(1));
    kiln_layer l = layer("un", KILN_OP_UNARY, 1, 1);
    l.p.unary.op = KILN_UNARY_GELU_ERF;
    CHECK_OK(run(&l, &in, &out));
    CHECK_NEAR(r, 0.8413447460685429, 1e-6); /* Φ(1) */
    l.p.unary.op = KILN_UNARY_SIGMOID;
    CHECK_OK(run(&l, &in, &out));
    CHECK_NEAR(r, 0.7310585786300049, 1e-6); /* 1/(1+e^-1) */
    l.p.unary.op = KILN_UNARY_GELU_TANH;
    CHECK_OK(run(&l, &in, &out));
    CHECK_NEAR(r, 0.8411919906082768, 1e-6);
}

static void test_unary_int_and_half(void)
{
    int32_t xi[] = {-3, 0, 5}, oi[3];
    kiln_layer l = layer("iun", KILN_OP_UNARY, 1, 1);
    l.p.unary.op = KILN_UNARY_ABS;
    kiln_exec_tensor in = ten(xi, KILN_DTYPE_I32, DIMS(3)), out = ten(oi, KILN_DTYPE_I32, DIMS(3));
    CHECK_OK(run(&l, &in, &out));
    CHECK(oi[0] == 3 && oi[1] == 0 && oi[2] == 5);
    l.p.unary.op = KILN_UNARY_EXP;
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_UNSUPPORTED, "iun");
    /* bf16 silu over many elements (parallel path) against f64 math */
    int64_t n = 100000;
    float *x = rand_f32(n);
    uint16_t *xs = malloc((size_t)n * 2), *os = malloc((size_t)n * 2);
    kiln_convert(xs, KILN_DTYPE_BF16, x, KILN_DTYPE_F32, n);
    l.p.unary.op = KILN_UNARY_SILU;
    in = ten(xs, KILN_DTYPE_BF16, DIMS(n));
    out = ten(os, KILN_DTYPE_BF16, DIMS(n));
    CHECK_OK(run(&l, &in, &out));
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = kiln_bf16_to_float(xs[i]), w = v / (1 + exp(-v));
        bad += fabs(kiln_bf16_to_float(os[i]) - w) > fabs(w) / 256 + 1e-7;
    }
    CHECK(bad == 0);
    free(x);
    free(xs);
    free(os);
}

/* ---- reduce ------------------------------------------------------------------------------ */

static void test_reduce(void)
{
    float x[24], o[24];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i; /* x[a][b][c] = 12a + 4b + c, dims [2,3,4] */
    kiln_layer l = layer("red", KILN_OP_REDUCE, 1, 1);
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(2, 3, 4));
    /* sum over axes 0 and 2: Σ_a Σ_c (12a + 4b + c) = 48 + 32b + 12 */
    l.p.reduce.op = KILN_REDUCE_SUM;
    l.p.reduce.axes = 0x5;
    l.p.reduce.keep_dims = 1;
    kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(1, 3, 1));
    for (int ref = 0; ref <= 1; ref++) {
        CHECK_OK(run_mode(&l, &in, &out, ref, test_pool));
        CHECK(o[0] == 60 && o[1] == 92 && o[2] == 124);
    }
    l.p.reduce.op = KILN_REDUCE_MEAN;
    l.p.reduce.keep_dims = 0;
    out = ten(o, KILN_DTYPE_F32, DIMS(3));
    CHECK_OK(run(&l, &in, &out));
    CHECK(o[0] == 7.5f && o[1] == 11.5f && o[2] == 15.5f);
    /* max over axis 1: 12a + 8 + c */
    l.p.reduce.op = KILN_REDUCE_MAX;
    l.p.reduce.axes = 0x2;
    out = ten(o, KILN_DTYPE_F32, DIMS(2, 4));
    CHECK_OK(run(&l, &in, &out));
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 4; c++)
            CHECK(o[a * 4 + c] == 12 * a + 8 + c);
    /* min over everything, and over axes 1,2 (trailing, merged) */
    l.p.reduce.op = KILN_REDUCE_MIN;
    l.p.reduce.axes = 0x7;
    out = ten(o, KILN_DTYPE_F32, DIMS(1));
    out.dims.rank = 0;
    CHECK_OK(run(&l, &in, &out));
    CHECK(o[0] == 0);
    l.p.reduce.axes = 0x6;
    out = ten(o, KILN_DTYPE_F32, DIMS(2));
    CHECK_OK(run(&l, &in, &out));
    CHECK(o[0] == 0 && o[1] == 12);
    /* wrong output size and bad axes name the layer */
    out = ten(o, KILN_DTYPE_F32, DIMS(3));
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_SHAPE, "red");
    l.p.reduce.axes = 0x8;
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_INVALID_ARGUMENT, "red");
}

/* Random [37, 300]: contiguous (vector) and strided reductions against f64
 * sums, and NaN propagating through max. */
static void test_reduce_random(void)
{
    int64_t R = 37, C = 300;
    float *x = rand_f32(R * C), o[300];
    kiln_layer l = layer("redr", KILN_OP_REDUCE, 1, 1);
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(R, C));
    for (int axis = 0; axis < 2; axis++) {
        l.p.reduce.op = KILN_REDUCE_SUM;
        l.p.reduce.axes = 1u << axis;
        int64_t n_out = axis ? R : C;
        kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(n_out));
        CHECK_OK(run(&l, &in, &out));
        int bad = 0;
        for (int64_t k = 0; k < n_out; k++) {
            double s = 0;
            for (int64_t i = 0; i < (axis ? C : R); i++)
                s += axis ? x[k * C + i] : x[i * C + k];
            bad += fabs(o[k] - s) > 1e-5 * (1 + fabs(s));
        }
        CHECK(bad == 0);
        l.p.reduce.op = KILN_REDUCE_MAX;
        CHECK_OK(run(&l, &in, &out));
        bad = 0;
        for (int64_t k = 0; k < n_out; k++) {
            float m = -INFINITY;
            for (int64_t i = 0; i < (axis ? C : R); i++)
                m = fmaxf(m, axis ? x[k * C + i] : x[i * C + k]);
            bad += o[k] != m;
        }
        CHECK(bad == 0);
    }
    x[5 * C + 123] = NAN;
    l.p.reduce.op = KILN_REDUCE_MAX;
    l.p.reduce.axes = 0x2;
    kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(R));
    CHECK_OK(run(&l, &in, &out));
    CHECK(isnan(o[5]) && !isnan(o[4]) && !isnan(o[6]));
    free(x);
}

static void test_reduce_half_and_parallel(void)
{
    /* mean over the last axis of [64, 1000] f16 filled with row index / 64:
     * exact in f16 for these values. */
    int64_t R = 64, C = 1000;
    uint16_t *x = malloc((size_t)(R * C) * 2), o[64];
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++)
            x[i * C + j] = kiln_float_to_half((float)i / 64.0f + (j % 2 ? 0.25f : -0.25f));
    kiln_layer l = layer("redh", KILN_OP_REDUCE, 1, 1);
    l.p.reduce.op = KILN_REDUCE_MEAN;
    l.p.reduce.axes = 0x2;
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F16, DIMS(R, C)), out = ten(o, KILN_DTYPE_F16, DIMS(R));
    CHECK_OK(run(&l, &in, &out));
    for (int64_t i = 0; i < R; i++)
        CHECK_NEAR(kiln_half_to_float(o[i]), (double)i / 64.0, 1e-3);
    free(x);
}

/* ---- softmax -------------------------------------------------------------------------------- */

static void test_softmax(void)
{
    /* softmax([1,2,3]) = e^{i} / (e + e^2 + e^3) */
    const double w[] = {0.09003057317038046, 0.24472847105479764, 0.6652409557748219};
    float x[] = {1, 2, 3}, o[3];
    kiln_layer l = layer("sm", KILN_OP_SOFTMAX, 1, 1);
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(1, 3)), out = ten(o, KILN_DTYPE_F32, DIMS(1, 3));
    l.p.softmax.axis = 1;
    for (int ref = 0; ref <= 1; ref++) {
        CHECK_OK(run_mode(&l, &in, &out, ref, test_pool));
        for (int i = 0; i < 3; i++)
            CHECK_NEAR(o[i], w[i], 1e-6);
    }
    /* stable for large inputs: [1001,1002,1003] gives the same */
    float big[] = {1001, 1002, 1003};
    in.data = big;
    CHECK_OK(run(&l, &in, &out));
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(o[i], w[i], 1e-6);
    /* along axis 0 of [3,2]: column 0 is [1,2,3], column 1 is constant */
    float x2[] = {1, 5, 2, 5, 3, 5}, o2[6];
    l.p.softmax.axis = 0;
    in = ten(x2, KILN_DTYPE_F32, DIMS(3, 2));
    out = ten(o2, KILN_DTYPE_F32, DIMS(3, 2));
    CHECK_OK(run(&l, &in, &out));
    for (int i = 0; i < 3; i++) {
        CHECK_NEAR(o2[i * 2], w[i], 1e-6);
        CHECK_NEAR(o2[i * 2 + 1], 1.0 / 3.0, 1e-6);
    }
    /* bf16 storage */
    uint16_t xb[3], ob[3];
    kiln_convert(xb, KILN_DTYPE_BF16, x, KILN_DTYPE_F32, 3);
    l.p.softmax.axis = 0;
    in = ten(xb, KILN_DTYPE_BF16, DIMS(3));
    out = ten(ob, KILN_DTYPE_BF16, DIMS(3));
    CHECK_OK(run(&l, &in, &out));
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(kiln_bf16_to_float(ob[i]), w[i], w[i] / 128);
}

static void test_softmax_parallel_rows(void)
{
    int64_t R = 128, C = 513;
    float *x = rand_f32(R * C), *o1 = malloc((size_t)(R * C) * 4), *o2 = malloc((size_t)(R * C) * 4);
    kiln_layer l = layer("smp", KILN_OP_SOFTMAX, 1, 1);
    l.p.softmax.axis = 1;
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(R, C));
    kiln_exec_tensor a = ten(o1, KILN_DTYPE_F32, DIMS(R, C)), b = ten(o2, KILN_DTYPE_F32, DIMS(R, C));
    CHECK_OK(run(&l, &in, &a));
    CHECK_OK(run_mode(&l, &in, &b, 1, NULL));
    CHECK(memcmp(o1, o2, (size_t)(R * C) * 4) == 0);
    /* rows sum to 1, each entry exp(x - max)/Σ in f64 */
    int bad = 0;
    for (int64_t i = 0; i < R; i++) {
        double m = -INFINITY, s = 0, t = 0;
        for (int64_t j = 0; j < C; j++)
            m = fmax(m, x[i * C + j]);
        for (int64_t j = 0; j < C; j++)
            s += exp(x[i * C + j] - m);
        for (int64_t j = 0; j < C; j++) {
            t += o1[i * C + j];
            bad += fabs(o1[i * C + j] - exp(x[i * C + j] - m) / s) > 1e-7;
        }
        bad += fabs(t - 1) > 1e-5;
    }
    CHECK(bad == 0);
    free(x);
    free(o1);
    free(o2);
}

/* ---- data movement ------------------------------------------------------------------------------ */

static void test_concat(void)
{
    int32_t a[] = {1, 2}, b[] = {3, 4, 5, 6}, o[6];
    kiln_layer l = layer("cat", KILN_OP_CONCAT, 2, 1);
    l.p.concat.axis = 1;
    kiln_exec_tensor in[2] = {ten(a, KILN_DTYPE_I32, DIMS(2, 1)), ten(b, KILN_DTYPE_I32, DIMS(2, 2))};
    kiln_exec_tensor out = ten(o, KILN_DTYPE_I32, DIMS(2, 3));
    CHECK_OK(run(&l, in, &out));
    const int32_t w[] = {1, 3, 4, 2, 5, 6};
    for (int i = 0; i < 6; i++)
        CHECK(o[i] == w[i]);
    /* axis 0 on bf16 */
    uint16_t h1[] = {1, 2}, h2[] = {3, 4, 5, 6}, ho[6];
    l.p.concat.axis = 0;
    kiln_exec_tensor in2[2] = {ten(h1, KILN_DTYPE_BF16, DIMS(1, 2)), ten(h2, KILN_DTYPE_BF16, DIMS(2, 2))};
    kiln_exec_tensor out2 = ten(ho, KILN_DTYPE_BF16, DIMS(3, 2));
    CHECK_OK(run(&l, in2, &out2));
    for (int i = 0; i < 6; i++)
        CHECK(ho[i] == i + 1);
    out2.dims.d[0] = 4;
    CHECK_FAILS(run(&l, in2, &out2), KILN_ERROR_SHAPE, "cat");
}

static void test_slice(void)
{
    float x[12], o[4];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i; /* [3,4] */
    kiln_layer l = layer("sl", KILN_OP_SLICE, 1, 1);
    l.p.slice.start[0] = 1;
    l.p.slice.stride[0] = 1;
    l.p.slice.start[1] = 0;
    l.p.slice.stride[1] = 2;
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(3, 4)), out = ten(o, KILN_DTYPE_F32, DIMS(2, 2));
    CHECK_OK(run(&l, &in, &out));
    CHECK(o[0] == 4 && o[1] == 6 && o[2] == 8 && o[3] == 10);
    /* i64, last column */
    int64_t xi[12], oi[3];
    for (int i = 0; i < 12; i++)
        xi[i] = 100 + i;
    l.p.slice.start[0] = 0;
    l.p.slice.start[1] = 3;
    l.p.slice.stride[1] = 1;
    in = ten(xi, KILN_DTYPE_I64, DIMS(3, 4));
    out = ten(oi, KILN_DTYPE_I64, DIMS(3, 1));
    CHECK_OK(run(&l, &in, &out));
    CHECK(oi[0] == 103 && oi[1] == 107 && oi[2] == 111);
    /* past the end */
    l.p.slice.start[1] = 2;
    l.p.slice.stride[1] = 2;
    out.dims.d[1] = 2; /* would read columns 2 and 4 */
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_SHAPE, "sl");
}

static void test_shuffle(void)
{
    /* plain transpose [2,3] -> [3,2] */
    float x[12], o[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i;
    kiln_layer l = layer("sh", KILN_OP_SHUFFLE, 1, 1);
    l.p.shuffle.has_first = 1;
    l.p.shuffle.first[0] = 1;
    l.p.shuffle.first[1] = 0;
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(2, 3)), out = ten(o, KILN_DTYPE_F32, DIMS(3, 2));
    CHECK_OK(run(&l, &in, &out));
    const float w[] = {0, 3, 1, 4, 2, 5};
    for (int i = 0; i < 6; i++)
        CHECK(o[i] == w[i]);
    /* reshape [2,6] -> mid [2,3,2], second perm (1,0,2): out[i][j][k] = mid[j][i][k] = 6j + 2i + k */
    memset(&l.p, 0, sizeof l.p);
    l.p.shuffle.has_second = 1;
    l.p.shuffle.second[0] = 1;
    l.p.shuffle.second[1] = 0;
    l.p.shuffle.second[2] = 2;
    l.p.shuffle.mid_rank = 3;
    in = ten(x, KILN_DTYPE_F32, DIMS(2, 6));
    out = ten(o, KILN_DTYPE_F32, DIMS(3, 2, 2));
    CHECK_OK(run(&l, &in, &out));
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 2; k++)
                CHECK(o[(i * 2 + j) * 2 + k] == 6 * j + 2 * i + k);
    /* both: input [6,2] (x[b][a] = 2b + a), first (1,0) -> [2,6], reshape to
     * [2,3,2], second (1,0,2): out[i][j][k] = t1[j][2i+k] = 2(2i+k) + j */
    l.p.shuffle.has_first = 1;
    l.p.shuffle.first[0] = 1;
    l.p.shuffle.first[1] = 0;
    in = ten(x, KILN_DTYPE_F32, DIMS(6, 2));
    CHECK_OK(run(&l, &in, &out));
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 2; k++)
                CHECK(o[(i * 2 + j) * 2 + k] == 2 * (2 * i + k) + j);
    /* reshape only, u8 */
    uint8_t b[6] = {1, 2, 3, 4, 5, 6}, bo[6];
    memset(&l.p, 0, sizeof l.p);
    in = ten(b, KILN_DTYPE_U8, DIMS(2, 3));
    out = ten(bo, KILN_DTYPE_U8, DIMS(3, 2));
    CHECK_OK(run(&l, &in, &out));
    CHECK(memcmp(b, bo, 6) == 0);
    /* a bad permutation names the layer */
    l.p.shuffle.has_first = 1;
    l.p.shuffle.first[0] = 1;
    l.p.shuffle.first[1] = 1;
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_INVALID_ARGUMENT, "sh");
}

static void test_shuffle_large_f16(void)
{
    /* [B=2, S=64, H=8, D=32] -> [B, H, S, D] (the attention-head transpose) */
    int64_t B = 2, S = 640, H = 8, D = 32, n = B * S * H * D; /* > 1 MiB: parallel copy */
    uint16_t *x = malloc((size_t)n * 2), *o = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        x[i] = (uint16_t)(i * 2654435761u >> 7);
    kiln_layer l = layer("heads", KILN_OP_SHUFFLE, 1, 1);
    l.p.shuffle.has_first = 1;
    l.p.shuffle.first[0] = 0;
    l.p.shuffle.first[1] = 2;
    l.p.shuffle.first[2] = 1;
    l.p.shuffle.first[3] = 3;
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F16, DIMS(B, S, H, D)), out = ten(o, KILN_DTYPE_F16, DIMS(B, H, S, D));
    CHECK_OK(run(&l, &in, &out));
    int bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t d = 0; d < D; d++)
                    bad += o[((b * H + h) * S + s) * D + d] != x[((b * S + s) * H + h) * D + d];
    CHECK(bad == 0);
    free(x);
    free(o);
}

/* Batched 2-D transposes (the tiled copy) on ragged sizes and every element
 * size; the largest runs in parallel. */
static void test_transpose_tiled(void)
{
    kiln_dtype ts[] = {KILN_DTYPE_U8, KILN_DTYPE_BF16, KILN_DTYPE_I32, KILN_DTYPE_I64};
    int64_t shapes[][3] = {{3, 37, 45}, {1, 1, 70}, {2, 33, 1}, {4, 300, 257}};
    for (int t = 0; t < 4; t++)
        for (int sh = 0; sh < 4; sh++) {
            int64_t B = shapes[sh][0], M = shapes[sh][1], N = shapes[sh][2], n = B * M * N;
            size_t es = kiln_dtype_size(ts[t]);
            unsigned char *x = malloc((size_t)n * es), *o = malloc((size_t)n * es);
            for (size_t i = 0; i < (size_t)n * es; i++)
                x[i] = (unsigned char)(urand() >> 24);
            kiln_layer l = layer("tt", KILN_OP_SHUFFLE, 1, 1);
            l.p.shuffle.has_first = 1;
            l.p.shuffle.first[0] = 0;
            l.p.shuffle.first[1] = 2;
            l.p.shuffle.first[2] = 1;
            kiln_exec_tensor in = ten(x, ts[t], DIMS(B, M, N)), out = ten(o, ts[t], DIMS(B, N, M));
            CHECK_OK(run(&l, &in, &out));
            int bad = 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < N; i++)
                    for (int64_t j = 0; j < M; j++)
                        bad += memcmp(o + (size_t)((b * N + i) * M + j) * es, x + (size_t)((b * M + j) * N + i) * es,
                                      es) != 0;
            CHECK(bad == 0);
            free(x);
            free(o);
        }
}

static void test_gather(void)
{
    float data[] = {1, 2, 3, 4, 5, 6}, o[4]; /* [3,2] */
    int64_t idx64[] = {2, 0};
    kiln_layer l = layer("gth", KILN_OP_GATHER, 2, 1);
    kiln_exec_tensor in[2] = {ten(data, KILN_DTYPE_F32, DIMS(3, 2)), ten(idx64, KILN_DTYPE_I64, DIMS(2))};
    kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(2, 2));
    CHECK_OK(run(&l, in, &out));
    CHECK(o[0] == 5 && o[1] == 6 && o[2] == 1 && o[3] == 2);
    /* axis 1 with i32 indices of shape [1,1]: column 1 -> [3,1,1] */
    int32_t idx32[] = {1};
    l.p.gather.axis = 1;
    kiln_exec_tensor in2[2] = {ten(data, KILN_DTYPE_F32, DIMS(3, 2)), ten(idx32, KILN_DTYPE_I32, DIMS(1, 1))};
    out = ten(o, KILN_DTYPE_F32, DIMS(3, 1, 1));
    CHECK_OK(run(&l, in2, &out));
    CHECK(o[0] == 2 && o[1] == 4 && o[2] == 6);
    /* i8 data (any dtype) */
    int8_t d8[] = {-1, -2, -3}, o8[2];
    int32_t i8idx[] = {2, 1};
    l.p.gather.axis = 0;
    kiln_exec_tensor in3[2] = {ten(d8, KILN_DTYPE_I8, DIMS(3)), ten(i8idx, KILN_DTYPE_I32, DIMS(2))};
    kiln_exec_tensor out3 = ten(o8, KILN_DTYPE_I8, DIMS(2));
    CHECK_OK(run(&l, in3, &out3));
    CHECK(o8[0] == -3 && o8[1] == -2);
    /* out of range and negative indices name the layer and the index */
    int64_t bad[] = {0, 3};
    in[1].data = bad;
    out = ten(o, KILN_DTYPE_F32, DIMS(2, 2));
    CHECK_FAILS(run(&l, in, &out), KILN_ERROR_INVALID_ARGUMENT, "gth");
    CHECK_FAILS(run(&l, in, &out), KILN_ERROR_INVALID_ARGUMENT, "index 3");
    int64_t neg[] = {-1, 0};
    in[1].data = neg;
    CHECK_FAILS(run(&l, in, &out), KILN_ERROR_INVALID_ARGUMENT, "index -1");
    in[1].dtype = KILN_DTYPE_F32;
    CHECK_FAILS(run(&l, in, &out), KILN_ERROR_INVALID_ARGUMENT, "gth");
}

/* Large enough to split across the pool: an embedding lookup and a concat
 * of two halves of a row. */
static void test_gather_concat_large(void)
{
    int64_t V = 50, D = 4096, T = 70; /* 70 rows of 16 KiB */
    float *emb = malloc((size_t)(V * D) * 4), *o = malloc((size_t)(T * D) * 4);
    int32_t ids[70];
    for (int64_t i = 0; i < V * D; i++)
        emb[i] = (float)i;
    for (int i = 0; i < T; i++)
        ids[i] = (i * 7) % (int)V;
    kiln_layer l = layer("emb", KILN_OP_GATHER, 2, 1);
    kiln_exec_tensor in[2] = {ten(emb, KILN_DTYPE_F32, DIMS(V, D)), ten(ids, KILN_DTYPE_I32, DIMS(T))};
    kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(T, D));
    CHECK_OK(run(&l, in, &out));
    int bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < D; d++)
            bad += o[t * D + d] != (float)(ids[t] * D + d);
    CHECK(bad == 0);
    /* concat [T, 1000] and [T, 3096] along axis 1 rebuilds rows of width D */
    float *a = malloc((size_t)(T * 1000) * 4), *b = malloc((size_t)(T * 3096) * 4);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t d = 0; d < 1000; d++)
            a[t * 1000 + d] = (float)(t * D + d);
        for (int64_t d = 0; d < 3096; d++)
            b[t * 3096 + d] = (float)(t * D + 1000 + d);
    }
    kiln_layer c = layer("catl", KILN_OP_CONCAT, 2, 1);
    c.p.concat.axis = 1;
    kiln_exec_tensor cin[2] = {ten(a, KILN_DTYPE_F32, DIMS(T, 1000)), ten(b, KILN_DTYPE_F32, DIMS(T, 3096))};
    CHECK_OK(run(&c, cin, &out));
    bad = 0;
    for (int64_t i = 0; i < T * D; i++)
        bad += o[i] != (float)i;
    CHECK(bad == 0);
    free(emb);
    free(o);
    free(a);
    free(b);
}

static void test_cast(void)
{
    float x[] = {-1.7f, 2.9f, 3e10f, -3e10f, NAN, 0};
    int32_t oi[6];
    kiln_layer l = layer("cast", KILN_OP_CAST, 1, 1);
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(6)), out = ten(oi, KILN_DTYPE_I32, DIMS(6));
    CHECK_OK(run(&l, &in, &out));
    CHECK(oi[0] == -1 && oi[1] == 2 && oi[2] == INT32_MAX && oi[3] == INT32_MIN && oi[4] == 0 && oi[5] == 0);
    uint8_t ob[6];
    out = ten(ob, KILN_DTYPE_BOOL, DIMS(6));
    CHECK_OK(run(&l, &in, &out));
    CHECK(ob[0] == 1 && ob[1] == 1 && ob[2] == 1 && ob[5] == 0);
    /* i32 -> i8 saturates; i64 -> f16; f16 -> bf16 */
    int32_t xi[] = {300, -300, 5};
    int8_t o8[3];
    in = ten(xi, KILN_DTYPE_I32, DIMS(3));
    out = ten(o8, KILN_DTYPE_I8, DIMS(3));
    CHECK_OK(run(&l, &in, &out));
    CHECK(o8[0] == 127 && o8[1] == -128 && o8[2] == 5);
    int64_t x64[] = {2048, -3};
    uint16_t h[2], bf[2];
    in = ten(x64, KILN_DTYPE_I64, DIMS(2));
    out = ten(h, KILN_DTYPE_F16, DIMS(2));
    CHECK_OK(run(&l, &in, &out));
    CHECK(h[0] == 0x6800 && h[1] == 0xc200); /* 2048 = 2^11; -3 = -1.5·2^1 */
    in = ten(h, KILN_DTYPE_F16, DIMS(2));
    out = ten(bf, KILN_DTYPE_BF16, DIMS(2));
    CHECK_OK(run(&l, &in, &out));
    CHECK(bf[0] == 0x4500 && bf[1] == 0xc040);
    /* large (parallel) f32 -> bf16 */
    int64_t n = 70000;
    float *xl = rand_f32(n);
    uint16_t *ol = malloc((size_t)n * 2);
    in = ten(xl, KILN_DTYPE_F32, DIMS(n));
    out = ten(ol, KILN_DTYPE_BF16, DIMS(n));
    CHECK_OK(run(&l, &in, &out));
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += ol[i] != kiln_float_to_bf16(xl[i]);
    CHECK(bad == 0);
    free(xl);
    free(ol);
    in.dtype = KILN_DTYPE_FP8_E4M3;
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_UNSUPPORTED, "cast");
}

/* ---- fused ----------------------------------------------------------------------------------- */

/* out = silu(x + b) * x, x: [R,C], b: [C] */
static kiln_layer fused_layer(void)
{
    kiln_layer l = layer("fz", KILN_OP_FUSED, 2, 1);
    l.p.fused.n_steps = 3;
    l.p.fused.steps[0] = (kiln_fused_step){.is_binary = 1, .op = KILN_BINARY_ADD, .a = 0, .b = 1};
    l.p.fused.steps[1] = (kiln_fused_step){.is_binary = 0, .op = KILN_UNARY_SILU, .a = 2};
    l.p.fused.steps[2] = (kiln_fused_step){.is_binary = 1, .op = KILN_BINARY_MUL, .a = 3, .b = 0};
    return l;
}

static void test_fused(void)
{
    float x[] = {-1, 0, 1, 2, 3, -4}, b[] = {0.5f, 1, -2}, o[6];
    for (int ref = 0; ref <= 1; ref++) {
        kiln_layer l = fused_layer();
        kiln_exec_tensor in[2] = {ten(x, KILN_DTYPE_F32, DIMS(2, 3)), ten(b, KILN_DTYPE_F32, DIMS(3))};
        kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(2, 3));
        CHECK_OK(run_mode(&l, in, &out, ref, test_pool));
        for (int i = 0; i < 6; i++) {
            double s = (double)x[i] + b[i % 3];
            CHECK_NEAR(o[i], s / (1 + exp(-s)) * x[i], 1e-5);
        }
    }
    /* a step reading a later step is refused */
    kiln_layer l = fused_layer();
    l.p.fused.steps[1].a = 3;
    kiln_exec_tensor in[2] = {ten(x, KILN_DTYPE_F32, DIMS(2, 3)), ten(b, KILN_DTYPE_F32, DIMS(3))};
    kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(2, 3));
    CHECK_FAILS(run(&l, in, &out), KILN_ERROR_INVALID_ARGUMENT, "fz");
}

static void test_fused_large_half(void)
{
    int64_t R = 200, C = 300, n = R * C;
    float *x = rand_f32(n), *b = rand_f32(C);
    uint16_t *xs = malloc((size_t)n * 2), *bs = malloc((size_t)C * 2);
    uint16_t *o1 = malloc((size_t)n * 2), *o2 = malloc((size_t)n * 2);
    kiln_convert(xs, KILN_DTYPE_F16, x, KILN_DTYPE_F32, n);
    kiln_convert(bs, KILN_DTYPE_F16, b, KILN_DTYPE_F32, C);
    kiln_layer l = fused_layer();
    kiln_exec_tensor in[2] = {ten(xs, KILN_DTYPE_F16, DIMS(R, C)), ten(bs, KILN_DTYPE_F16, DIMS(C))};
    kiln_exec_tensor a = ten(o1, KILN_DTYPE_F16, DIMS(R, C)), r = ten(o2, KILN_DTYPE_F16, DIMS(R, C));
    CHECK_OK(run(&l, in, &a));
    CHECK_OK(run_mode(&l, in, &r, 1, NULL));
    /* same f32 arithmetic per element either way */
    CHECK(memcmp(o1, o2, (size_t)n * 2) == 0);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double xv = kiln_half_to_float(xs[i]), s = xv + kiln_half_to_float(bs[i % C]);
        double w = s / (1 + exp(-s)) * xv;
        bad += fabs(kiln_half_to_float(o1[i]) - w) > fabs(w) / 1024 + 1e-4;
    }
    CHECK(bad == 0);
    free(x);
    free(b);
    free(xs);
    free(bs);
    free(o1);
    free(o2);
}

/* ---- plugins ----------------------------------------------------------------------------------- */

typedef struct doubler {
    kiln_plugin base;
    void *seen_stream;
    int calls;
} doubler;

static kiln_status doubler_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_d,
                                   const void *const *ins, int32_t n_in, const kiln_tensor_desc *out_d,
                                   void *const *outs, int32_t n_out, void *workspace, void *stream)
{
    doubler *d = (doubler *)self;
    d->calls++;
    d->seen_stream = stream;
    if (backend != KILN_BACKEND_CPU || n_in != 1 || n_out != 1 || in_d[0].struct_size != sizeof(kiln_tensor_desc) ||
        in_d[0].abi_version != KILN_PLUGIN_ABI_VERSION || in_d[0].dtype != KILN_DTYPE_F32 || out_d[0].dims.rank != 1)
        return kiln_fail(KILN_ERROR_PLUGIN, "doubler: unexpected descriptors");
    if (in_d[0].dims.d[0] == 0)
        return kiln_fail(KILN_ERROR_PLUGIN, "doubler: empty input");
    if (workspace == NULL)
        return kiln_fail(KILN_ERROR_PLUGIN, "doubler: no workspace");
    for (int64_t i = 0; i < in_d[0].dims.d[0]; i++)
        ((float *)outs[0])[i] = 2 * ((const float *)ins[0])[i];
    return KILN_OK;
}

static void test_plugin(void)
{
    static const kiln_plugin_ops ops = {.struct_size = sizeof(kiln_plugin_ops),
                                        .abi_version = KILN_PLUGIN_ABI_VERSION,
                                        .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
                                        .enqueue = doubler_enqueue};
    doubler d = {.base = {sizeof(kiln_plugin), KILN_PLUGIN_ABI_VERSION, &ops}};
    float x[] = {1, 2, 3}, o[3], ws[4];
    kiln_layer l = layer("plug", KILN_OP_PLUGIN, 1, 1);
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(3)), out = ten(o, KILN_DTYPE_F32, DIMS(3));
    kiln_cpu_args a = {
        .layer = &l, .inputs = &in, .outputs = &out, .plugin = &d.base, .workspace = ws, .pool = test_pool};
    CHECK_OK(kiln_cpu_run_layer(&a));
    CHECK(d.calls == 1 && d.seen_stream == test_pool);
    CHECK(o[0] == 2 && o[1] == 4 && o[2] == 6);
    a.reference = 1;
    CHECK_OK(kiln_cpu_run_layer(&a));
    CHECK(d.seen_stream == NULL);
    /* the plugin's own error gets the layer name in front */
    in.dims.d[0] = 0;
    CHECK_FAILS(kiln_cpu_run_layer(&a), KILN_ERROR_PLUGIN, "layer \"plug\": doubler: empty input");
    a.plugin = NULL;
    CHECK_FAILS(kiln_cpu_run_layer(&a), KILN_ERROR_PLUGIN, "plug");
}

static void test_bad_tensors(void)
{
    float x[4] = {0}, o[4];
    kiln_layer l = layer("badt", KILN_OP_UNARY, 1, 1);
    kiln_exec_tensor in = ten(x, KILN_DTYPE_F32, DIMS(4)), out = ten(o, KILN_DTYPE_F32, DIMS(4));
    in.dtype = KILN_DTYPE_COUNT;
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_INVALID_ARGUMENT, "badt");
    in.dtype = KILN_DTYPE_F32;
    out.dims.d[0] = -4;
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_INVALID_ARGUMENT, "output 0");
    out.dims.d[0] = 4;
    in.data = NULL;
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_INVALID_ARGUMENT, "input 0 has no memory");
    in.data = x;
    in.dims.rank = KILN_MAX_RANK + 1;
    CHECK_FAILS(run(&l, &in, &out), KILN_ERROR_INVALID_ARGUMENT, "badt");
}

static void test_constant_not_run(void)
{
    float o[1];
    kiln_layer l = layer("k", KILN_OP_CONSTANT, 0, 1);
    kiln_exec_tensor out = ten(o, KILN_DTYPE_F32, DIMS(1));
    CHECK_FAILS(run(&l, NULL, &out), KILN_ERROR_UNSUPPORTED, "\"k\"");
}

static void setup(void) { CHECK_OK(kiln_threadpool_create(4, &test_pool)); }
static void teardown(void) { kiln_threadpool_destroy(test_pool); }

static const test_case_ tests[] = {
    TEST(setup),
    TEST(test_matmul_by_hand),
    TEST(test_matmul_batch_broadcast),
    TEST(test_matmul_vectors),
    TEST(test_matmul_shape_errors),
    TEST(test_matmul_fast_vs_reference),
    TEST(test_matmul_half_storage),
    TEST(test_conversions_bit_exact),
    TEST(test_vector_exp),
    TEST(test_binary_broadcast),
    TEST(test_binary_ops),
    TEST(test_binary_int),
    TEST(test_binary_half_and_parallel),
    TEST(test_unary_ops),
    TEST(test_unary_int_and_half),
    TEST(test_reduce),
    TEST(test_reduce_random),
    TEST(test_reduce_half_and_parallel),
    TEST(test_softmax),
    TEST(test_softmax_parallel_rows),
    TEST(test_concat),
    TEST(test_slice),
    TEST(test_shuffle),
    TEST(test_shuffle_large_f16),
    TEST(test_transpose_tiled),
    TEST(test_gather),
    TEST(test_gather_concat_large),
    TEST(test_cast),
    TEST(test_fused),
    TEST(test_fused_large_half),
    TEST(test_plugin),
    TEST(test_bad_tensors),
    TEST(test_constant_not_run),
    TEST(teardown),
};
TEST_MAIN(tests)
