/* Every native layer and the ScaleBias plugin on the GPU against the CPU
 * reference backend (reference mode: one thread, f64 matmul sums) on the
 * same inputs, over random shapes (odd sizes, one element, a few million
 * elements) in f32, f16 and bf16, plus the integer dtypes the CPU takes.
 *
 * GPU outputs are poisoned before each launch (all bits set: NaN in every
 * float dtype; 0xA5 bytes for integers) so an unwritten element fails.
 *
 * Tolerances, |gpu - cpu| <= tol * max(1, |cpu|), by output dtype:
 *   f32: 1e-5 for elementwise, cast and data movement (which are exact),
 *        1e-4 for matmul, softmax and reduce (summation order differs);
 *   f16: 1e-3 (one f16 ulp: f32 results that differ in the last bits may
 *        round to neighbouring halves);
 *   bf16: 1e-2 (one bf16 ulp, likewise).
 * Integer results must be identical; NaN must meet NaN.
 *
 * Without a GPU (or without the CUDA backend) it exits 77: skipped. */
#include "test.h"

#ifdef KILN_HAVE_CUDA

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
#include "core/dtype.h"

#include <cuda_runtime.h>
#include <kiln/registry.h>
#include <limits.h>
#include <stdint.h>
#include <unistd.h>

static kiln_cuda_device *dev;
static cudaStream_t stream;

/* ---- random data ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* uniform in [lo, hi) */
static float rng_float(float lo, float hi) { return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0)); }

static int64_t rng_int(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1)); }

/* ---- tensors on both sides ------------------------------------------------------------ */

typedef struct pair {
    kiln_exec_tensor host, dev;
    size_t bytes;
} pair;

static kiln_dims dims_of(int32_t rank, const int64_t *d)
{
    kiln_dims r = {.rank = rank};
    for (int32_t i = 0; i < rank; i++)
        r.d[i] = d[i];
    return r;
}

static int64_t numel(const kiln_dims *d)
{
    int64_t n = 1;
    for (int32_t i = 0; i < d->rank; i++)
        n *= d->d[i];
    return n;
}

static int is_float(kiln_dtype t) { return kiln_dtype_is_float(t); }

/* An input filled with values in [lo, hi] (integers: rounded), copied to
 * the device. */
static pair pair_input(kiln_dtype t, kiln_dims d, float lo, float hi)
{
    pair p = {.host = {.dtype = t, .dims = d}, .dev = {.dtype = t, .dims = d}};
    int64_t n = numel(&d);
    p.bytes = (size_t)(n > 0 ? n : 1) * kiln_dtype_size(t);
    p.host.data = malloc(p.bytes);
    for (int64_t i = 0; i < n; i++) {
        if (is_float(t))
            kiln_store_f32(p.host.data, t, i, rng_float(lo, hi));
        else
            kiln_store_f32(p.host.data, t, i, (float)rng_int((int64_t)lo, (int64_t)hi));
    }
    if (cudaMalloc(&p.dev.data, p.bytes) != cudaSuccess ||
        cudaMemcpy(p.dev.data, p.host.data, p.bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "cannot place a %zu-byte input on the GPU\n", p.bytes);
        exit(1);
    }
    return p;
}

/* An output: host buffer for the CPU, poisoned device buffer for the GPU. */
static pair pair_output(kiln_dtype t, kiln_dims d)
{
    pair p = {.host = {.dtype = t, .dims = d}, .dev = {.dtype = t, .dims = d}};
    int64_t n = numel(&d);
    p.bytes = (size_t)(n > 0 ? n : 1) * kiln_dtype_size(t);
    p.host.data = calloc(1, p.bytes);
    if (cudaMalloc(&p.dev.data, p.bytes) != cudaSuccess ||
        cudaMemset(p.dev.data, is_float(t) ? 0xff : 0xa5, p.bytes) != cudaSuccess) {
        fprintf(stderr, "cannot place a %zu-byte output on the GPU\n", p.bytes);
        exit(1);
    }
    return p;
}

static void pair_free(pair *p)
{
    free(p->host.data);
    cudaFree(p->dev.data);
}

static int nan_f(float v) { return v != v; }

/* Compares the GPU output with the CPU's; prints the first mismatch. */
static void compare(const char *what, const pair *o, double tol)
{
    int64_t n = numel(&o->host.dims);
    void *g = malloc(o->bytes);
    test_checks_++;
    if (cudaMemcpy(g, o->dev.data, o->bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        test_failures_++;
        fprintf(stderr, "%s: copying the result back failed\n", what);
        free(g);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        int bad;
        double c, v;
        if (is_float(o->host.dtype)) {
            c = kiln_load_f32(o->host.data, o->host.dtype, i);
            v = kiln_load_f32(g, o->host.dtype, i);
            if (nan_f((float)c) || nan_f((float)v))
                bad = !(nan_f((float)c) && nan_f((float)v));
            else if (isinf(c) || isinf(v))
                bad = c != v;
            else
                bad = !(fabs(v - c) <= tol * (fabs(c) > 1.0 ? fabs(c) : 1.0));
        } else {
            size_t es = kiln_dtype_size(o->host.dtype);
            bad = memcmp((char *)g + (size_t)i * es, (char *)o->host.data + (size_t)i * es, es) != 0;
            c = kiln_load_f32(o->host.data, o->host.dtype, i);
            v = kiln_load_f32(g, o->host.dtype, i);
        }
        if (bad) {
            test_failures_++;
            fprintf(stderr, "%s: element %lld of %lld: gpu %.9g, cpu %.9g (tol %g)\n", what, (long long)i, (long long)n,
                    v, c, tol);
            break;
        }
    }
    free(g);
}

/* Tolerance for an output dtype; `f32_tol` is the class's f32 value. */
static double tol_for(kiln_dtype t, double f32_tol)
{
    return t == KILN_DTYPE_F16 ? 1e-3 : t == KILN_DTYPE_BF16 ? 1e-2 : f32_tol;
}

static kiln_layer layer_new(const char *name, kiln_op op, int32_t n_inputs)
{
    kiln_layer l;
    memset(&l, 0, sizeof l);
    l.name = (char *)name;
    l.op = op;
    l.n_inputs = n_inputs;
    l.n_outputs = 1;
    l.tactic = -1;
    return l;
}

/* Runs `l` on both backends over n inputs into one output and compares. */
static void run_both(const char *what, const kiln_layer *l, pair *in, int32_t n, pair *out, kiln_plugin *plugin,
                     double tol)
{
    kiln_exec_tensor hin[16], din[16];
    for (int32_t i = 0; i < n; i++) {
        hin[i] = in[i].host;
        din[i] = in[i].dev;
    }
    kiln_cpu_args ca = {.layer = l, .inputs = hin, .outputs = &out->host, .plugin = plugin, .reference = 1};
    CHECK_OK(kiln_cpu_run_layer(&ca));
    kiln_cuda_args ga = {
        .layer = l, .inputs = din, .outputs = &out->dev, .plugin = plugin, .device = dev, .stream = stream};
    /* The poison (cudaMemset) and input copies ran on the legacy default
     * stream, which does not order a non-blocking stream: without this the
     * poison may land after the kernel has written the output. */
    cudaDeviceSynchronize();
    kiln_status st = kiln_cuda_run_layer(&ga);
    test_checks_++;
    if (st != KILN_OK) {
        test_failures_++;
        fprintf(stderr, "%s: kiln_cuda_run_layer: %s\n", what, kiln_last_error());
        return;
    }
    cudaError_t e = cudaStreamSynchronize(stream);
    test_checks_++;
    if (e != cudaSuccess) {
        test_failures_++;
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        return;
    }
    compare(what, out, tol);
}

static const kiln_dtype float_types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};

/* ---- elementwise ------------------------------------------------------------------------ */

typedef struct bshape {
    int32_t ra, rb, ro;
    int64_t a[4], b[4], o[4];
} bshape;

static const bshape binary_shapes[] = {
    {1, 1, 1, {1}, {1}, {1}},
    {1, 1, 1, {1000003}, {1000003}, {1000003}},
    {2, 1, 2, {37, 129}, {1}, {37, 129}},
    {3, 2, 3, {5, 1, 33}, {7, 1}, {5, 7, 33}},
    {2, 2, 2, {1, 17}, {19, 1}, {19, 17}},
};

static void test_binary(void)
{
    for (size_t t = 0; t < 3; t++)
        for (int op = 0; op < KILN_BINARY_OP_COUNT; op++)
            for (size_t s = 0; s < sizeof binary_shapes / sizeof binary_shapes[0]; s++) {
                const bshape *sh = &binary_shapes[s];
                kiln_dtype dt = float_types[t];
                int positive = op == KILN_BINARY_DIV || op == KILN_BINARY_POW;
                pair in[2] = {pair_input(dt, dims_of(sh->ra, sh->a), positive ? 0.25f : -3.0f, 3.0f),
                              pair_input(dt, dims_of(sh->rb, sh->b), positive ? 0.25f : -3.0f, 3.0f)};
                pair out = pair_output(dt, dims_of(sh->ro, sh->o));
                kiln_layer l = layer_new("binary", KILN_OP_BINARY, 2);
                l.p.binary.op = (kiln_binary_op)op;
                char what[96];
                snprintf(what, sizeof what, "binary %s %s shape %zu", kiln_binary_op_name((kiln_binary_op)op),
                         kiln_dtype_name(dt), s);
                run_both(what, &l, in, 2, &out, NULL, tol_for(dt, 1e-5));
                pair_free(&in[0]);
                pair_free(&in[1]);
                pair_free(&out);
            }
}

static void test_binary_int(void)
{
    const kiln_dtype types[] = {KILN_DTYPE_I8, KILN_DTYPE_U8, KILN_DTYPE_I32, KILN_DTYPE_I64};
    int64_t a[2] = {13, 31}, b[1] = {31};
    for (size_t t = 0; t < 4; t++)
        for (int op = 0; op < KILN_BINARY_OP_COUNT; op++) {
            kiln_dtype dt = types[t];
            /* includes zero divisors and values that overflow i8 products */
            pair in[2] = {pair_input(dt, dims_of(2, a), dt == KILN_DTYPE_U8 ? 0 : -100, 100),
                          pair_input(dt, dims_of(1, b), dt == KILN_DTYPE_U8 ? 0 : -5, 5)};
            pair out = pair_output(dt, dims_of(2, a));
            kiln_layer l = layer_new("binary_int", KILN_OP_BINARY, 2);
            l.p.binary.op = (kiln_binary_op)op;
            char what[96];
            snprintf(what, sizeof what, "binary %s %s", kiln_binary_op_name((kiln_binary_op)op), kiln_dtype_name(dt));
            run_both(what, &l, in, 2, &out, NULL, 0);
            pair_free(&in[0]);
            pair_free(&in[1]);
            pair_free(&out);
        }
}

static void test_unary(void)
{
    const int64_t sizes[] = {1, 7, 4099, 1 << 20};
    for (size_t t = 0; t < 3; t++)
        for (int op = 0; op < KILN_UNARY_OP_COUNT; op++)
            for (size_t s = 0; s < 4; s++) {
                kiln_dtype dt = float_types[t];
                int positive = op == KILN_UNARY_LOG || op == KILN_UNARY_SQRT || op == KILN_UNARY_RSQRT;
                pair in = pair_input(dt, dims_of(1, &sizes[s]), positive ? 0.01f : -6.0f, 6.0f);
                pair out = pair_output(dt, dims_of(1, &sizes[s]));
                kiln_layer l = layer_new("unary", KILN_OP_UNARY, 1);
                l.p.unary.op = (kiln_unary_op)op;
                char what[96];
                snprintf(what, sizeof what, "unary %s %s n=%lld", kiln_unary_op_name((kiln_unary_op)op),
                         kiln_dtype_name(dt), (long long)sizes[s]);
                run_both(what, &l, &in, 1, &out, NULL, tol_for(dt, 1e-5));
                pair_free(&in);
                pair_free(&out);
            }
    /* integer neg/abs/relu, wrapping at the storage width */
    int64_t n = 301;
    kiln_unary_op iops[] = {KILN_UNARY_NEG, KILN_UNARY_ABS, KILN_UNARY_RELU};
    for (int i = 0; i < 3; i++) {
        pair in = pair_input(KILN_DTYPE_I8, dims_of(1, &n), -128, 127);
        pair out = pair_output(KILN_DTYPE_I8, dims_of(1, &n));
        kiln_layer l = layer_new("unary_int", KILN_OP_UNARY, 1);
        l.p.unary.op = iops[i];
        run_both("unary i8", &l, &in, 1, &out, NULL, 0);
        pair_free(&in);
        pair_free(&out);
    }
}

static void set_step(kiln_layer *l, int s, int is_binary, int op, int a, int b)
{
    l->p.fused.steps[s] = (kiln_fused_step){.is_binary = is_binary, .op = op, .a = a, .b = b, .src_layer = -1};
    if (s + 1 > l->p.fused.n_steps)
        l->p.fused.n_steps = s + 1;
}

static void test_fused(void)
{
    /* sizes: tail only, vectors plus a tail, large */
    const int64_t sizes[] = {5, 1031, (1 << 22) + 3};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < 3; s++) {
            kiln_dtype dt = float_types[t];
            int64_t n = sizes[s], one = 1;
            /* inputs: x, y full size, scale and bias one element:
             * ((x * scale + bias) -> gelu_tanh) * y -> max with x */
            pair in[4] = {pair_input(dt, dims_of(1, &n), -3, 3), pair_input(dt, dims_of(1, &n), -3, 3),
                          pair_input(dt, dims_of(1, &one), 0.5f, 2), pair_input(dt, dims_of(1, &one), -1, 1)};
            pair out = pair_output(dt, dims_of(1, &n));
            kiln_layer l = layer_new("fused", KILN_OP_FUSED, 4);
            set_step(&l, 0, 1, KILN_BINARY_MUL, 0, 2);
            set_step(&l, 1, 1, KILN_BINARY_ADD, 4, 3);
            set_step(&l, 2, 0, KILN_UNARY_GELU_TANH, 5, 0);
            set_step(&l, 3, 1, KILN_BINARY_MUL, 6, 1);
            set_step(&l, 4, 1, KILN_BINARY_MAX, 7, 0);
            char what[96];
            snprintf(what, sizeof what, "fused chain %s n=%lld", kiln_dtype_name(dt), (long long)n);
            run_both(what, &l, in, 4, &out, NULL, tol_for(dt, 1e-5));

            /* five values live at once: more than the vectorized kernel's
             * registers, so the generic kernel runs it */
            kiln_layer w = layer_new("fused_wide", KILN_OP_FUSED, 2);
            set_step(&w, 0, 0, KILN_UNARY_EXP, 0, 0);  /* 2 */
            set_step(&w, 1, 0, KILN_UNARY_SILU, 1, 0); /* 3 */
            set_step(&w, 2, 1, KILN_BINARY_SUB, 0, 1); /* 4 */
            set_step(&w, 3, 0, KILN_UNARY_ABS, 1, 0);  /* 5 */
            set_step(&w, 4, 0, KILN_UNARY_TANH, 0, 0); /* 6 */
            set_step(&w, 5, 1, KILN_BINARY_ADD, 2, 3); /* 7 */
            set_step(&w, 6, 1, KILN_BINARY_MUL, 4, 5); /* 8 */
            set_step(&w, 7, 1, KILN_BINARY_ADD, 7, 8); /* 9 */
            set_step(&w, 8, 1, KILN_BINARY_MIN, 9, 6); /* 10 */
            snprintf(what, sizeof what, "fused wide %s n=%lld", kiln_dtype_name(dt), (long long)n);
            pair_free(&out);
            out = pair_output(dt, dims_of(1, &n));
            run_both(what, &w, in, 2, &out, NULL, tol_for(dt, 1e-5));
            for (int i = 0; i < 4; i++)
                pair_free(&in[i]);
            pair_free(&out);
        }
    /* a chain that needs the vectorized kernel's saved register and takes
     * the accumulator as the right operand of sub, div and max (the
     * swapped forms); x in [1.5, 3] keeps x - sigmoid(y) >= 0.5 */
    const int64_t saved_sizes[] = {1031, (1 << 20) + 5};
    for (size_t t = 0; t < 3; t++)
        for (size_t z = 0; z < 2; z++) {
            kiln_dtype dt = float_types[t];
            int64_t n = saved_sizes[z], one = 1;
            pair in[3] = {pair_input(dt, dims_of(1, &n), 1.5f, 3), pair_input(dt, dims_of(1, &n), -3, 3),
                          pair_input(dt, dims_of(1, &one), 0.5f, 2)};
            pair out = pair_output(dt, dims_of(1, &n));
            kiln_layer l = layer_new("fused_saved", KILN_OP_FUSED, 3);
            set_step(&l, 0, 1, KILN_BINARY_MUL, 0, 2);    /* 3 = x * s */
            set_step(&l, 1, 0, KILN_UNARY_SIGMOID, 1, 0); /* 4 = sigmoid(y) */
            set_step(&l, 2, 1, KILN_BINARY_SUB, 0, 4);    /* 5 = x - 4 */
            set_step(&l, 3, 1, KILN_BINARY_DIV, 3, 5);    /* 6 = 3 / 5 */
            set_step(&l, 4, 1, KILN_BINARY_MAX, 2, 6);    /* 7 = max(s, 6) */
            set_step(&l, 5, 1, KILN_BINARY_SUB, 7, 3);    /* 8 = 7 - 3 */
            char what[96];
            snprintf(what, sizeof what, "fused saved %s n=%lld", kiln_dtype_name(dt), (long long)n);
            run_both(what, &l, in, 3, &out, NULL, tol_for(dt, 1e-5));
            /* a program starting from the one-element input */
            kiln_layer f = layer_new("fused_scalar_first", KILN_OP_FUSED, 3);
            set_step(&f, 0, 1, KILN_BINARY_SUB, 2, 0); /* 3 = s - x */
            set_step(&f, 1, 1, KILN_BINARY_MUL, 3, 1); /* 4 = 3 * y */
            snprintf(what, sizeof what, "fused scalar first %s n=%lld", kiln_dtype_name(dt), (long long)n);
            pair_free(&out);
            out = pair_output(dt, dims_of(1, &n));
            run_both(what, &f, in, 3, &out, NULL, tol_for(dt, 1e-5));
            for (int i = 0; i < 3; i++)
                pair_free(&in[i]);
            pair_free(&out);
        }
    /* broadcast operands and mixed dtypes go through the strided path */
    int64_t a[3] = {3, 1, 65}, b[2] = {9, 1}, o[3] = {3, 9, 65};
    pair in[2] = {pair_input(KILN_DTYPE_BF16, dims_of(3, a), -2, 2), pair_input(KILN_DTYPE_F32, dims_of(2, b), -2, 2)};
    pair out = pair_output(KILN_DTYPE_F16, dims_of(3, o));
    kiln_layer l = layer_new("fused_bcast", KILN_OP_FUSED, 2);
    set_step(&l, 0, 1, KILN_BINARY_SUB, 0, 1);
    set_step(&l, 1, 0, KILN_UNARY_SIGMOID, 2, 0);
    run_both("fused broadcast", &l, in, 2, &out, NULL, tol_for(KILN_DTYPE_F16, 1e-5));
    pair_free(&in[0]);
    pair_free(&in[1]);
    pair_free(&out);
}

/* ---- matmul -------------------------------------------------------------------------------- */

typedef struct mshape {
    int32_t ra, rb, rc, ta, tb;
    int64_t a[4], b[4], c[4];
} mshape;

static const mshape matmul_shapes[] = {
    {2, 2, 2, 0, 0, {1, 1}, {1, 1}, {1, 1}},
    {2, 2, 2, 0, 0, {37, 61}, {61, 19}, {37, 19}},
    {2, 2, 2, 1, 0, {61, 37}, {61, 19}, {37, 19}},
    {2, 2, 2, 0, 1, {37, 61}, {19, 61}, {37, 19}},
    {2, 2, 2, 1, 1, {61, 37}, {19, 61}, {37, 19}},
    {3, 2, 3, 0, 0, {4, 13, 70}, {70, 33}, {4, 13, 33}},         /* folds into one GEMM */
    {3, 3, 3, 0, 1, {5, 17, 40}, {5, 23, 40}, {5, 17, 23}},      /* strided batch */
    {2, 3, 3, 0, 0, {17, 40}, {3, 40, 9}, {3, 17, 9}},           /* A broadcast */
    {4, 4, 4, 0, 0, {2, 1, 9, 21}, {1, 3, 21, 7}, {2, 3, 9, 7}}, /* mixed: one launch per batch */
    {1, 2, 1, 0, 0, {45}, {45, 11}, {11}},                       /* row vector A */
    {2, 1, 1, 0, 0, {11, 45}, {45}, {11}},                       /* column vector B */
    {2, 2, 2, 0, 0, {256, 1024}, {1024, 512}, {256, 512}},
    /* few rows against a [N, K] weight: the GEMV path (gemv.cu), with N
     * not a multiple of its rows per block, and K past its unrolled chunk */
    {2, 2, 2, 0, 1, {1, 4096}, {1001, 4096}, {1, 1001}},
    {2, 2, 2, 0, 1, {3, 264}, {77, 264}, {3, 77}},
    {2, 2, 2, 0, 1, {1, 264}, {77, 264}, {1, 77}},
    {2, 2, 2, 0, 1, {8, 1032}, {2500, 1032}, {8, 2500}},
    {3, 2, 3, 0, 1, {1, 5, 2056}, {33, 2056}, {1, 5, 33}},
    {2, 2, 2, 0, 1, {2, 13}, {9, 13}, {2, 9}},       /* K too short for 16-byte rows: cuBLASLt */
    {2, 2, 2, 0, 1, {300, 72}, {40, 72}, {300, 40}}, /* tuned over buckets 4..512 rows */
};

static void test_matmul(void)
{
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof matmul_shapes / sizeof matmul_shapes[0]; s++) {
            const mshape *sh = &matmul_shapes[s];
            kiln_dtype dt = float_types[t];
            pair in[2] = {pair_input(dt, dims_of(sh->ra, sh->a), -1, 1), pair_input(dt, dims_of(sh->rb, sh->b), -1, 1)};
            pair out = pair_output(dt, dims_of(sh->rc, sh->c));
            kiln_layer l = layer_new("matmul", KILN_OP_MATMUL, 2);
            l.p.matmul.transpose_a = sh->ta;
            l.p.matmul.transpose_b = sh->tb;
            char what[96];
            snprintf(what, sizeof what, "matmul %s shape %zu", kiln_dtype_name(dt), s);
            run_both(what, &l, in, 2, &out, NULL, tol_for(dt, 1e-4));
            /* the tuned tactic must run and agree too (each tuned
             * shape is one tall GEMM: the buckets' candidates are set) */
            if (s == 1 || s >= sizeof matmul_shapes / sizeof matmul_shapes[0] - 2) {
                int64_t tactic = -2;
                CHECK_OK(kiln_cuda_matmul_tune(dev, &l, &in[0].dev, &in[1].dev, &out.dev, &tactic));
                CHECK(tactic >= 0 && (tactic & KILN_CUDA_TACTIC_TUNED));
                l.tactic = tactic;
                cudaMemset(out.dev.data, 0xff, out.bytes);
                snprintf(what, sizeof what, "matmul %s shape %zu tactic %lld", kiln_dtype_name(dt), s,
                         (long long)tactic);
                /* the fastest tactic may split k and add the partial
                 * products in the output type: f16 rounds twice there (2
                 * ulps seen on the H200 in one of several runs) */
                run_both(what, &l, in, 2, &out, NULL, dt == KILN_DTYPE_F16 ? 2e-3 : tol_for(dt, 1e-4));
            }
            pair_free(&in[0]);
            pair_free(&in[1]);
            pair_free(&out);
        }
    /* the GEMV's other block shapes (1 and 4 weight rows a block) on the
     * one-row products */
    const int32_t rows[2] = {1, 4};
    for (size_t v = 0; v < 2; v++) {
        kcu_gemv_set_rows(rows[v]);
        for (size_t t = 0; t < 3; t++)
            for (size_t s = 0; s < sizeof matmul_shapes / sizeof matmul_shapes[0]; s++) {
                const mshape *sh = &matmul_shapes[s];
                if (!sh->tb || sh->ta || sh->ra != 2 || sh->a[0] != 1)
                    continue;
                kiln_dtype dt = float_types[t];
                pair in[2] = {pair_input(dt, dims_of(sh->ra, sh->a), -1, 1),
                              pair_input(dt, dims_of(sh->rb, sh->b), -1, 1)};
                pair out = pair_output(dt, dims_of(sh->rc, sh->c));
                kiln_layer l = layer_new("matmul", KILN_OP_MATMUL, 2);
                l.p.matmul.transpose_b = 1;
                char what[96];
                snprintf(what, sizeof what, "matmul %s shape %zu, GEMV %d rows a block", kiln_dtype_name(dt), s,
                         (int)rows[v]);
                run_both(what, &l, in, 2, &out, NULL, tol_for(dt, 1e-4));
                pair_free(&in[0]);
                pair_free(&in[1]);
                pair_free(&out);
            }
    }
    kcu_gemv_set_rows(2);
}

/* ---- reduce and softmax ---------------------------------------------------------------------- */

static void test_reduce(void)
{
    int64_t d[3] = {7, 33, 129};
    const uint32_t masks[] = {0x1, 0x2, 0x4, 0x5, 0x6, 0x7};
    const kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I32};
    for (size_t t = 0; t < 4; t++)
        for (int op = 0; op < KILN_REDUCE_OP_COUNT; op++)
            for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
                kiln_dtype dt = types[t];
                kiln_dims od = {.rank = 3};
                for (int i = 0; i < 3; i++)
                    od.d[i] = (masks[m] & (1u << i)) ? 1 : d[i];
                pair in = pair_input(dt, dims_of(3, d), -10, 10);
                pair out = pair_output(dt, od);
                kiln_layer l = layer_new("reduce", KILN_OP_REDUCE, 1);
                l.p.reduce.op = (kiln_reduce_op)op;
                l.p.reduce.axes = masks[m];
                l.p.reduce.keep_dims = 1;
                char what[96];
                snprintf(what, sizeof what, "reduce %s %s axes 0x%x", kiln_reduce_op_name((kiln_reduce_op)op),
                         kiln_dtype_name(dt), masks[m]);
                /* i32 sums of integers are exact; the mean rounds through f32 */
                run_both(what, &l, &in, 1, &out, NULL, dt == KILN_DTYPE_I32 ? 0 : tol_for(dt, 1e-4));
                pair_free(&in);
                pair_free(&out);
            }
    /* a long reduction: one output over 3 million elements */
    int64_t big = 3000017, one = 1;
    pair in = pair_input(KILN_DTYPE_F32, dims_of(1, &big), -1, 1);
    pair out = pair_output(KILN_DTYPE_F32, dims_of(1, &one));
    kiln_layer l = layer_new("reduce_all", KILN_OP_REDUCE, 1);
    l.p.reduce.op = KILN_REDUCE_SUM;
    l.p.reduce.axes = 1;
    run_both("reduce sum 3M", &l, &in, 1, &out, NULL, 1e-4);
    pair_free(&in);
    pair_free(&out);
}

static void test_softmax(void)
{
    typedef struct {
        int32_t rank, axis;
        int64_t d[3];
    } sshape;
    const sshape shapes[] = {
        {1, 0, {1}}, {2, 1, {13, 5001}}, {3, 1, {3, 77, 10}}, {3, 2, {2, 9, 31}}, {2, 0, {129, 3}}};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            kiln_dtype dt = float_types[t];
            pair in = pair_input(dt, dims_of(shapes[s].rank, shapes[s].d), -8, 8);
            pair out = pair_output(dt, dims_of(shapes[s].rank, shapes[s].d));
            kiln_layer l = layer_new("softmax", KILN_OP_SOFTMAX, 1);
            l.p.softmax.axis = shapes[s].axis;
            char what[96];
            snprintf(what, sizeof what, "softmax %s shape %zu", kiln_dtype_name(dt), s);
            run_both(what, &l, &in, 1, &out, NULL, tol_for(dt, 1e-4));
            pair_free(&in);
            pair_free(&out);
        }
}

/* ---- data movement ------------------------------------------------------------------------ */

static void test_concat(void)
{
    const kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I8, KILN_DTYPE_I64};
    for (size_t t = 0; t < 5; t++)
        for (int axis = 0; axis < 3; axis++) {
            kiln_dtype dt = types[t];
            int64_t base[3] = {3, 5, 7}, widths[3] = {1, 4, 9}, total = 14;
            pair in[3];
            for (int k = 0; k < 3; k++) {
                int64_t d[3] = {base[0], base[1], base[2]};
                d[axis] = widths[k];
                in[k] = pair_input(dt, dims_of(3, d), -50, 50);
            }
            int64_t od[3] = {base[0], base[1], base[2]};
            od[axis] = total;
            pair out = pair_output(dt, dims_of(3, od));
            kiln_layer l = layer_new("concat", KILN_OP_CONCAT, 3);
            l.p.concat.axis = axis;
            char what[96];
            snprintf(what, sizeof what, "concat %s axis %d", kiln_dtype_name(dt), axis);
            run_both(what, &l, in, 3, &out, NULL, tol_for(dt, 1e-5));
            for (int k = 0; k < 3; k++)
                pair_free(&in[k]);
            pair_free(&out);
        }
}

static void test_slice(void)
{
    int64_t d[3] = {9, 17, 31};
    const int64_t starts[][3] = {{0, 0, 0}, {1, 2, 3}, {8, 16, 30}, {2, 0, 5}};
    const int64_t strides[][3] = {{1, 1, 1}, {2, 3, 1}, {1, 1, 1}, {3, 1, 4}};
    for (size_t t = 0; t < 3; t++)
        for (size_t c = 0; c < 4; c++) {
            kiln_dtype dt = float_types[t];
            int64_t od[3];
            for (int i = 0; i < 3; i++)
                od[i] = (d[i] - starts[c][i] + strides[c][i] - 1) / strides[c][i];
            pair in = pair_input(dt, dims_of(3, d), -5, 5);
            pair out = pair_output(dt, dims_of(3, od));
            kiln_layer l = layer_new("slice", KILN_OP_SLICE, 1);
            for (int i = 0; i < 3; i++) {
                l.p.slice.start[i] = starts[c][i];
                l.p.slice.stride[i] = strides[c][i];
            }
            char what[96];
            snprintf(what, sizeof what, "slice %s case %zu", kiln_dtype_name(dt), c);
            run_both(what, &l, &in, 1, &out, NULL, tol_for(dt, 1e-5));
            pair_free(&in);
            pair_free(&out);
        }
}

static void test_shuffle(void)
{
    int64_t d[3] = {6, 35, 12};
    for (size_t t = 0; t < 3; t++)
        for (int c = 0; c < 4; c++) {
            kiln_dtype dt = float_types[t];
            kiln_layer l = layer_new("shuffle", KILN_OP_SHUFFLE, 1);
            kiln_dims od = {.rank = 3};
            switch (c) {
            case 0: /* transpose (2, 0, 1) */
                l.p.shuffle.has_first = 1;
                l.p.shuffle.first[0] = 2, l.p.shuffle.first[1] = 0, l.p.shuffle.first[2] = 1;
                od = dims_of(3, (int64_t[]){12, 6, 35});
                break;
            case 1: /* reshape only: a copy */ od = dims_of(2, (int64_t[]){210, 12}); break;
            case 2: /* transpose (1, 0, 2), reshape to 35x3x24, transpose (2, 1, 0) */
                l.p.shuffle.has_first = 1;
                l.p.shuffle.first[0] = 1, l.p.shuffle.first[1] = 0, l.p.shuffle.first[2] = 2;
                l.p.shuffle.has_second = 1;
                l.p.shuffle.second[0] = 2, l.p.shuffle.second[1] = 1, l.p.shuffle.second[2] = 0;
                od = dims_of(3, (int64_t[]){24, 3, 35});
                break;
            default: /* reshape to 70x6x6, transpose (0, 2, 1) */
                l.p.shuffle.has_second = 1;
                l.p.shuffle.second[0] = 0, l.p.shuffle.second[1] = 2, l.p.shuffle.second[2] = 1;
                od = dims_of(3, (int64_t[]){70, 6, 6});
                break;
            }
            pair in = pair_input(dt, dims_of(3, d), -5, 5);
            pair out = pair_output(dt, od);
            char what[96];
            snprintf(what, sizeof what, "shuffle %s case %d", kiln_dtype_name(dt), c);
            run_both(what, &l, &in, 1, &out, NULL, tol_for(dt, 1e-5));
            pair_free(&in);
            pair_free(&out);
        }
}

static void test_gather(void)
{
    int64_t d[3] = {11, 13, 5}, ni = 17;
    for (size_t t = 0; t < 3; t++)
        for (int axis = 0; axis < 3; axis++)
            for (int wide = 0; wide < 2; wide++) {
                kiln_dtype dt = float_types[t];
                pair in[2] = {
                    pair_input(dt, dims_of(3, d), -5, 5),
                    pair_input(wide ? KILN_DTYPE_I64 : KILN_DTYPE_I32, dims_of(1, &ni), 0, (float)(d[axis] - 1))};
                int64_t od[3] = {d[0], d[1], d[2]};
                od[axis] = ni;
                pair out = pair_output(dt, dims_of(3, od));
                kiln_layer l = layer_new("gather", KILN_OP_GATHER, 2);
                l.p.gather.axis = axis;
                char what[96];
                snprintf(what, sizeof what, "gather %s axis %d %s", kiln_dtype_name(dt), axis, wide ? "i64" : "i32");
                run_both(what, &l, in, 2, &out, NULL, tol_for(dt, 1e-5));
                pair_free(&in[0]);
                pair_free(&in[1]);
                pair_free(&out);
            }
}

/* An index out of range: the CPU refuses; the GPU clamps and records it,
 * and the check after synchronizing names the layer. */
static void test_gather_error(void)
{
    int64_t d[2] = {4, 3}, ni = 2;
    pair data = pair_input(KILN_DTYPE_F32, dims_of(2, d), -1, 1);
    pair idx = pair_input(KILN_DTYPE_I32, dims_of(1, &ni), 0, 0);
    int32_t bad[2] = {1, 9};
    cudaMemcpy(idx.dev.data, bad, sizeof bad, cudaMemcpyHostToDevice);
    int64_t od[2] = {2, 3};
    pair out = pair_output(KILN_DTYPE_F32, dims_of(2, od));
    kiln_layer l = layer_new("bad_gather", KILN_OP_GATHER, 2);
    kiln_graph g;
    memset(&g, 0, sizeof g);
    g.layers = &l;
    g.n_layers = 1;
    kiln_exec_tensor din[2] = {data.dev, idx.dev};
    kiln_cuda_args ga = {.graph = &g, .layer = &l, .inputs = din, .outputs = &out.dev, .device = dev, .stream = stream};
    cudaDeviceSynchronize(); /* the index copy above is on the legacy stream */
    CHECK_OK(kiln_cuda_run_layer(&ga));
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK_FAILS(kiln_cuda_device_check(dev, &g), KILN_ERROR_INVALID_ARGUMENT, "bad_gather");
    CHECK(strstr(kiln_last_error(), "index 9") != NULL);
    CHECK_OK(kiln_cuda_device_check(dev, &g)); /* cleared */
    pair_free(&data);
    pair_free(&idx);
    pair_free(&out);
}

static void test_cast(void)
{
    const kiln_dtype types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_I8,
                                KILN_DTYPE_U8,  KILN_DTYPE_I32, KILN_DTYPE_I64,  KILN_DTYPE_BOOL};
    int64_t n = 1027;
    for (size_t s = 0; s < 8; s++)
        for (size_t d = 0; d < 8; d++) {
            /* wide range: saturation on the way to small integers */
            pair in = pair_input(types[s], dims_of(1, &n), types[s] == KILN_DTYPE_BOOL ? 0 : -300,
                                 types[s] == KILN_DTYPE_BOOL ? 1 : 300);
            pair out = pair_output(types[d], dims_of(1, &n));
            kiln_layer l = layer_new("cast", KILN_OP_CAST, 1);
            l.p.cast.to = types[d];
            char what[96];
            snprintf(what, sizeof what, "cast %s to %s", kiln_dtype_name(types[s]), kiln_dtype_name(types[d]));
            run_both(what, &l, &in, 1, &out, NULL, tol_for(types[d], 1e-5));
            pair_free(&in);
            pair_free(&out);
        }
    /* the edges: NaN, infinities, beyond the integer ranges, halves */
    const float edge[] = {NAN, INFINITY, -INFINITY, 3e9f, -3e9f, 2.5f, -2.5f, 65520.0f, 1e-8f, 255.9f, -0.9f};
    int64_t ne = (int64_t)(sizeof edge / sizeof edge[0]);
    for (size_t d = 1; d < 8; d++) {
        pair in = pair_input(KILN_DTYPE_F32, dims_of(1, &ne), 0, 0);
        memcpy(in.host.data, edge, sizeof edge);
        cudaMemcpy(in.dev.data, edge, sizeof edge, cudaMemcpyHostToDevice);
        pair out = pair_output(types[d], dims_of(1, &ne));
        kiln_layer l = layer_new("cast_edges", KILN_OP_CAST, 1);
        l.p.cast.to = types[d];
        char what[96];
        snprintf(what, sizeof what, "cast edges f32 to %s", kiln_dtype_name(types[d]));
        run_both(what, &l, &in, 1, &out, NULL, 0);
        pair_free(&in);
        pair_free(&out);
    }
}

/* ---- the ScaleBias plugin ------------------------------------------------------------------- */

/* The plugin library sits in the build tree's lib/ beside this test's
 * tests/ folder. */
static kiln_registry *load_scale_bias(const kiln_plugin_creator **creator)
{
    char exe[4096], path[4200];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return NULL;
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = 0;
    snprintf(path, sizeof path, "%s/../lib/libkiln_scale_bias.so", exe);
    kiln_registry *reg = NULL;
    if (kiln_registry_create(&reg) != KILN_OK)
        return NULL;
    if (kiln_registry_load_library(reg, path) != KILN_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, kiln_last_error());
        kiln_registry_destroy(reg);
        return NULL;
    }
    *creator = kiln_registry_find(reg, "ScaleBias", "1", "", NULL);
    return reg;
}

static void test_scale_bias(void)
{
    const kiln_plugin_creator *creator = NULL;
    kiln_registry *reg = load_scale_bias(&creator);
    CHECK(reg != NULL && creator != NULL);
    if (!reg || !creator) {
        kiln_registry_destroy(reg);
        return;
    }
    float scale = 1.75f, bias = -0.375f;
    kiln_field fields[2] = {
        {.struct_size = sizeof(kiln_field),
         .abi_version = KILN_PLUGIN_ABI_VERSION,
         .name = "scale",
         .type = KILN_FIELD_F32,
         .count = 1,
         .data = &scale},
        {.struct_size = sizeof(kiln_field),
         .abi_version = KILN_PLUGIN_ABI_VERSION,
         .name = "bias",
         .type = KILN_FIELD_F32,
         .count = 1,
         .data = &bias},
    };
    kiln_plugin *pl = NULL;
    CHECK_OK(kiln_plugin_create(creator, fields, 2, &pl));
    if (!pl) {
        kiln_registry_destroy(reg);
        return;
    }
    CHECK(pl->ops->backends & KILN_BACKEND_BIT(KILN_BACKEND_CUDA));
    const int64_t sizes[] = {1, 7, 4103, (1 << 22) + 5};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 0; s < 4; s++) {
            kiln_dtype dt = float_types[t];
            pair in = pair_input(dt, dims_of(1, &sizes[s]), -100, 100);
            pair out = pair_output(dt, dims_of(1, &sizes[s]));
            kiln_layer l = layer_new("scale_bias", KILN_OP_PLUGIN, 1);
            char what[96];
            snprintf(what, sizeof what, "ScaleBias %s n=%lld", kiln_dtype_name(dt), (long long)sizes[s]);
            /* bit-exact by design; the dtype tolerance still applies */
            run_both(what, &l, &in, 1, &out, pl, tol_for(dt, 1e-5));
            /* an unaligned view takes the scalar path */
            if (sizes[s] > 1) {
                kiln_exec_tensor hin = in.host, din = in.dev, hout = out.host, dout = out.dev;
                size_t es = kiln_dtype_size(dt);
                hin.data = (char *)hin.data + es;
                din.data = (char *)din.data + es;
                hout.data = (char *)hout.data + es;
                dout.data = (char *)dout.data + es;
                hin.dims.d[0] = hout.dims.d[0] = dout.dims.d[0] = din.dims.d[0] = sizes[s] - 1;
                pair vin = {.host = hin, .dev = din, .bytes = in.bytes - es};
                pair vout = {.host = hout, .dev = dout, .bytes = out.bytes - es};
                cudaMemset(out.dev.data, 0xff, out.bytes);
                snprintf(what, sizeof what, "ScaleBias unaligned %s n=%lld", kiln_dtype_name(dt), (long long)sizes[s]);
                run_both(what, &l, &vin, 1, &vout, pl, tol_for(dt, 1e-5));
            }
            pair_free(&in);
            pair_free(&out);
        }
    pl->ops->destroy(pl);
    kiln_registry_destroy(reg);
}

/* ---- graph capture -------------------------------------------------------------------------- */

/* A sequence of launches captured under cudaStreamCaptureModeGlobal, which
 * fails any cudaMalloc, cudaFree or synchronization inside the capture;
 * the replayed graph must give the CPU's results. */
static void test_graph_capture(void)
{
    int64_t d[2] = {64, 96}, w[2] = {96, 40}, od[2] = {64, 40}, one = 1;
    pair x = pair_input(KILN_DTYPE_F16, dims_of(2, d), -1, 1);
    pair wt = pair_input(KILN_DTYPE_F16, dims_of(2, w), -1, 1);
    pair s = pair_input(KILN_DTYPE_F16, dims_of(1, &one), 0.5f, 1.5f);
    pair mm = pair_output(KILN_DTYPE_F16, dims_of(2, od));
    pair fu = pair_output(KILN_DTYPE_F16, dims_of(2, od));
    pair sm = pair_output(KILN_DTYPE_F16, dims_of(2, od));
    pair ca = pair_output(KILN_DTYPE_F32, dims_of(2, od));
    kiln_layer lm = layer_new("mm", KILN_OP_MATMUL, 2);
    kiln_layer lf = layer_new("fu", KILN_OP_FUSED, 2);
    set_step(&lf, 0, 1, KILN_BINARY_MUL, 0, 1);
    set_step(&lf, 1, 0, KILN_UNARY_SILU, 2, 0);
    kiln_layer ls = layer_new("sm", KILN_OP_SOFTMAX, 1);
    ls.p.softmax.axis = 1;
    kiln_layer lc = layer_new("ca", KILN_OP_CAST, 1);
    lc.p.cast.to = KILN_DTYPE_F32;

    /* the CPU chain */
    kiln_exec_tensor h_mm_in[2] = {x.host, wt.host}, h_fu_in[2] = {mm.host, s.host};
    kiln_cpu_args c1 = {.layer = &lm, .inputs = h_mm_in, .outputs = &mm.host, .reference = 1};
    kiln_cpu_args c2 = {.layer = &lf, .inputs = h_fu_in, .outputs = &fu.host, .reference = 1};
    kiln_cpu_args c3 = {.layer = &ls, .inputs = &fu.host, .outputs = &sm.host, .reference = 1};
    kiln_cpu_args c4 = {.layer = &lc, .inputs = &sm.host, .outputs = &ca.host, .reference = 1};
    CHECK_OK(kiln_cpu_run_layer(&c1));
    CHECK_OK(kiln_cpu_run_layer(&c2));
    CHECK_OK(kiln_cpu_run_layer(&c3));
    CHECK_OK(kiln_cpu_run_layer(&c4));

    kiln_exec_tensor d_mm_in[2] = {x.dev, wt.dev}, d_fu_in[2] = {mm.dev, s.dev};
    kiln_cuda_args g1 = {.layer = &lm, .inputs = d_mm_in, .outputs = &mm.dev, .device = dev, .stream = stream};
    kiln_cuda_args g2 = {.layer = &lf, .inputs = d_fu_in, .outputs = &fu.dev, .device = dev, .stream = stream};
    kiln_cuda_args g3 = {.layer = &ls, .inputs = &fu.dev, .outputs = &sm.dev, .device = dev, .stream = stream};
    kiln_cuda_args g4 = {.layer = &lc, .inputs = &sm.dev, .outputs = &ca.dev, .device = dev, .stream = stream};
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaDeviceSynchronize(); /* inputs were copied on the legacy stream */
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK_OK(kiln_cuda_run_layer(&g1));
    CHECK_OK(kiln_cuda_run_layer(&g2));
    CHECK_OK(kiln_cuda_run_layer(&g3));
    CHECK_OK(kiln_cuda_run_layer(&g4));
    cudaError_t e = cudaStreamEndCapture(stream, &graph);
    CHECK(e == cudaSuccess);
    if (e != cudaSuccess)
        fprintf(stderr, "capture failed: %s\n", cudaGetErrorString(e));
    if (graph) {
        CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
        /* replay twice: the second must give the same */
        for (int r = 0; r < 2 && exec; r++) {
            cudaMemset(ca.dev.data, 0xff, ca.bytes);
            cudaDeviceSynchronize(); /* the poison is on the legacy stream */
            CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
            CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
            compare("graph replay", &ca, 1e-2);
        }
    }
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    pair *all[] = {&x, &wt, &s, &mm, &fu, &sm, &ca};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(all[i]);
}

/* Random shapes: ranks 1-4, dims 1-37 with random broadcasting, random
 * ops, axes and dtypes, drawn from a fixed seed so failures reproduce. */
static void test_random_shapes(void)
{
    char what[128];
    for (int it = 0; it < 60; it++) {
        kiln_dtype dt = float_types[it % 3];
        int32_t rank = (int32_t)rng_int(1, 4);
        int64_t o[4], a[4], b[4];
        for (int32_t i = 0; i < rank; i++) {
            o[i] = rng_int(1, 37);
            a[i] = rng_int(0, 3) ? o[i] : 1;
            b[i] = rng_int(0, 3) ? o[i] : 1;
            o[i] = a[i] > b[i] ? a[i] : b[i];
        }
        /* binary with broadcasting, then a fused chain over the same */
        int op = (int)rng_int(0, KILN_BINARY_OP_COUNT - 1);
        int positive = op == KILN_BINARY_DIV || op == KILN_BINARY_POW;
        pair in[2] = {pair_input(dt, dims_of(rank, a), positive ? 0.25f : -2, 2),
                      pair_input(dt, dims_of(rank, b), positive ? 0.25f : -2, 2)};
        pair out = pair_output(dt, dims_of(rank, o));
        kiln_layer l = layer_new("random_binary", KILN_OP_BINARY, 2);
        l.p.binary.op = (kiln_binary_op)op;
        snprintf(what, sizeof what, "random %d: binary %s %s", it, kiln_binary_op_name((kiln_binary_op)op),
                 kiln_dtype_name(dt));
        run_both(what, &l, in, 2, &out, NULL, tol_for(dt, 1e-5));
        pair_free(&out);
        out = pair_output(dt, dims_of(rank, o));
        kiln_layer f = layer_new("random_fused", KILN_OP_FUSED, 2);
        set_step(&f, 0, 1, op, 0, 1);
        /* unary ops defined on every real input */
        const int safe[] = {KILN_UNARY_NEG,      KILN_UNARY_ABS,       KILN_UNARY_EXP,
                            KILN_UNARY_TANH,     KILN_UNARY_SIGMOID,   KILN_UNARY_RELU,
                            KILN_UNARY_GELU_ERF, KILN_UNARY_GELU_TANH, KILN_UNARY_SILU};
        set_step(&f, 1, 0, safe[rng_int(0, (int64_t)(sizeof safe / sizeof safe[0]) - 1)], 2, 0);
        set_step(&f, 2, 1, KILN_BINARY_ADD, 3, 0);
        snprintf(what, sizeof what, "random %d: fused %s", it, kiln_dtype_name(dt));
        run_both(what, &f, in, 2, &out, NULL, tol_for(dt, 1e-5));
        pair_free(&out);

        /* softmax and reduce over a tensor of the output's shape */
        pair_free(&in[0]);
        pair_free(&in[1]);
        pair x = pair_input(dt, dims_of(rank, o), -4, 4);
        kiln_layer sm = layer_new("random_softmax", KILN_OP_SOFTMAX, 1);
        sm.p.softmax.axis = (int32_t)rng_int(0, rank - 1);
        out = pair_output(dt, dims_of(rank, o));
        snprintf(what, sizeof what, "random %d: softmax axis %d %s", it, (int)sm.p.softmax.axis, kiln_dtype_name(dt));
        run_both(what, &sm, &x, 1, &out, NULL, tol_for(dt, 1e-4));
        pair_free(&out);
        kiln_layer rd = layer_new("random_reduce", KILN_OP_REDUCE, 1);
        rd.p.reduce.op = (kiln_reduce_op)rng_int(0, KILN_REDUCE_OP_COUNT - 1);
        rd.p.reduce.axes = (uint32_t)rng_int(1, (1 << rank) - 1);
        rd.p.reduce.keep_dims = 1;
        int64_t rdims[4];
        for (int32_t i = 0; i < rank; i++)
            rdims[i] = (rd.p.reduce.axes & (1u << i)) ? 1 : o[i];
        out = pair_output(dt, dims_of(rank, rdims));
        snprintf(what, sizeof what, "random %d: reduce %s axes 0x%x %s", it, kiln_reduce_op_name(rd.p.reduce.op),
                 rd.p.reduce.axes, kiln_dtype_name(dt));
        run_both(what, &rd, &x, 1, &out, NULL, tol_for(dt, 1e-4));
        pair_free(&out);
        pair_free(&x);

        /* matmul with random batch broadcasting and transposes */
        int64_t m = rng_int(1, 70), n = rng_int(1, 70), k = rng_int(1, 70), bt = rng_int(1, 3);
        int ta = (int)rng_int(0, 1), tb = (int)rng_int(0, 1), ba = (int)rng_int(0, 1), bb = (int)rng_int(0, 1);
        int64_t ad[3] = {ba ? bt : 1, ta ? k : m, ta ? m : k}, bd[3] = {bb ? bt : 1, tb ? n : k, tb ? k : n};
        int64_t cd[3] = {(ba || bb) ? bt : 1, m, n};
        pair mi[2] = {pair_input(dt, dims_of(3, ad), -1, 1), pair_input(dt, dims_of(3, bd), -1, 1)};
        out = pair_output(dt, dims_of(3, cd));
        kiln_layer mm = layer_new("random_matmul", KILN_OP_MATMUL, 2);
        mm.p.matmul.transpose_a = ta;
        mm.p.matmul.transpose_b = tb;
        snprintf(what, sizeof what, "random %d: matmul %lldx%lldx%lld batch %lld/%d/%d t%d%d %s", it, (long long)m,
                 (long long)n, (long long)k, (long long)bt, ba, bb, ta, tb, kiln_dtype_name(dt));
        run_both(what, &mm, mi, 2, &out, NULL, tol_for(dt, 1e-4));
        pair_free(&mi[0]);
        pair_free(&mi[1]);
        pair_free(&out);
    }
}

/* Refusals come back as errors naming the layer, before any launch. */
static void test_errors(void)
{
    int64_t a[2] = {3, 4}, b[2] = {5, 6};
    pair in[2] = {pair_input(KILN_DTYPE_F32, dims_of(2, a), 0, 1), pair_input(KILN_DTYPE_F32, dims_of(2, b), 0, 1)};
    pair out = pair_output(KILN_DTYPE_F32, dims_of(2, a));
    kiln_layer l = layer_new("mismatch", KILN_OP_BINARY, 2);
    kiln_exec_tensor din[2] = {in[0].dev, in[1].dev};
    kiln_cuda_args ga = {.layer = &l, .inputs = din, .outputs = &out.dev, .device = dev, .stream = stream};
    CHECK_FAILS(kiln_cuda_run_layer(&ga), KILN_ERROR_SHAPE, "mismatch");
    kiln_layer m = layer_new("bad_matmul", KILN_OP_MATMUL, 2);
    ga.layer = &m;
    CHECK_FAILS(kiln_cuda_run_layer(&ga), KILN_ERROR_SHAPE, "bad_matmul");
    pair_free(&in[0]);
    pair_free(&in[1]);
    pair_free(&out);
}

static const test_case_ tests[] = {
    TEST(test_binary), TEST(test_binary_int), TEST(test_unary),         TEST(test_fused),
    TEST(test_matmul), TEST(test_reduce),     TEST(test_softmax),       TEST(test_concat),
    TEST(test_slice),  TEST(test_shuffle),    TEST(test_gather),        TEST(test_gather_error),
    TEST(test_cast),   TEST(test_scale_bias), TEST(test_graph_capture), TEST(test_random_shapes),
    TEST(test_errors),
};

int main(void)
{
    int32_t arch = 0;
    if (!kiln_cuda_available(&arch)) {
        printf("skipped: no CUDA GPU\n");
        return 77;
    }
    if (kiln_cuda_device_create(&dev) != KILN_OK ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "cannot set up the GPU: %s\n", kiln_last_error());
        return 1;
    }
    printf("GPU sm_%d\n", (int)arch);
    test_run_cases(tests, sizeof tests / sizeof tests[0]);
    cudaStreamDestroy(stream);
    kiln_cuda_device_destroy(dev);
    return test_failures_ ? 1 : 0;
}

#else

int main(void)
{
    printf("skipped: no CUDA GPU (built without the CUDA backend)\n");
    return 77 + test_failures_ + test_checks_; /* both 0: the harness is unused here */
}

#endif
