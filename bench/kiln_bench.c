/* kiln_bench: the CUDA backend's benchmarks, each beside a peer measured in
 * the same run and reported as a fraction of its floor (bench/README.md).
 *
 *   kiln_bench [--json FILE] [--reps N]
 *
 * Needs a GPU (exits 77 without one) and the ScaleBias example plugin
 * (build/lib/libkiln_scale_bias.so, found through $KILN_BUILD_DIR or next
 * to this program). Every timing: warm-up runs, then the median of --reps
 * (>= 20) runs measured with CUDA events. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <jansson.h>
#include <kiln/kiln.h>
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"

static char failure[512];

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failure, sizeof failure, fmt, ap);
    va_end(ap);
    return -1;
}

#define CU(call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) \
            return fail("%s: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#define KT(call) \
    do { \
        if ((call) != KILN_OK) \
            return fail("%s: %s", #call, kiln_last_error()); \
    } while (0)
#define LT(call) \
    do { \
        cublasStatus_t s_ = (call); \
        if (s_ != CUBLAS_STATUS_SUCCESS) \
            return fail("%s: cublas status %d (%s:%d)", #call, (int)s_, __FILE__, __LINE__); \
    } while (0)

static int reps = 30;
static const int warmup = 3;
static kiln_registry *reg;
static cudaStream_t stream;
static cudaEvent_t ev0, ev1;

/* ---- timing ------------------------------------------------------------------------------ */

typedef int (*work_fn)(void *arg);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Median GPU milliseconds of one call of fn (which enqueues on `stream`),
 * timed over `inner` calls back to back so that host work between calls
 * (e.g. a cuBLASLt heuristic query) overlaps the GPU as in a real loop;
 * *host_ms, if given, receives the median host time of one call. */
static int time_gpu(work_fn fn, void *arg, int inner, double *ms, double *host_ms)
{
    double *t = calloc((size_t)reps, sizeof *t), *h = calloc((size_t)reps, sizeof *h);
    if (!t || !h) {
        free(t);
        free(h);
        return fail("out of memory");
    }
    int rc = 0;
    for (int i = 0; i < warmup && rc == 0; i++)
        rc = fn(arg);
    if (rc == 0 && cudaStreamSynchronize(stream) != cudaSuccess)
        rc = fail("warm-up: %s", cudaGetErrorString(cudaGetLastError()));
    for (int i = 0; i < reps && rc == 0; i++) {
        float f = 0;
        if (cudaEventRecord(ev0, stream) != cudaSuccess)
            rc = fail("cudaEventRecord failed");
        double h0 = now_ms();
        for (int k = 0; k < inner && rc == 0; k++)
            rc = fn(arg);
        h[i] = (now_ms() - h0) / inner;
        if (rc == 0 && (cudaEventRecord(ev1, stream) != cudaSuccess || cudaEventSynchronize(ev1) != cudaSuccess ||
                        cudaEventElapsedTime(&f, ev0, ev1) != cudaSuccess))
            rc = fail("timing: %s", cudaGetErrorString(cudaGetLastError()));
        t[i] = (double)f / inner;
    }
    if (rc == 0) {
        *ms = median(t, reps);
        if (host_ms)
            *host_ms = median(h, reps);
    }
    free(t);
    free(h);
    return rc;
}

/* ---- results ------------------------------------------------------------------------------ */

typedef struct result {
    const char *name;
    char kiln[64], peer[64];
    double fraction;    /* of the floor; < 0: not measured */
    const char *target; /* what the issue asks */
    int meets;
    char note[160];
    char error[512];
} result;

#define MAX_RESULTS 96
static result results[MAX_RESULTS];
static int n_results;
static json_t *json_out;

static result *new_result(const char *name, const char *target)
{
    result *r = &results[n_results++];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->target = target;
    r->fraction = -1;
    return r;
}

/* ---- engines ------------------------------------------------------------------------------ */

typedef struct engine_run {
    kiln_engine *engine;
    kiln_context *ctx;
    void *in[2], *out;
    int n_in;
} engine_run;

static void engine_run_free(engine_run *r)
{
    kiln_context_destroy(r->ctx);
    kiln_engine_destroy(r->engine);
    for (int i = 0; i < r->n_in; i++)
        cudaFree(r->in[i]);
    cudaFree(r->out);
    memset(r, 0, sizeof *r);
}

static int build_engine(kiln_network *net, uint32_t flags, engine_run *r)
{
    kiln_build_config cfg;
    kiln_build_config_init(&cfg);
    cfg.backend = KILN_BACKEND_CUDA;
    cfg.flags = flags;
    kiln_buffer buf = {NULL, 0};
    KT(kiln_build(net, &cfg, &buf));
    kiln_status s = kiln_engine_load_memory(reg, buf.data, buf.size, &r->engine);
    kiln_buffer_free(&buf);
    if (s != KILN_OK)
        return fail("loading the engine: %s", kiln_last_error());
    KT(kiln_context_create(r->engine, &r->ctx));
    return 0;
}

/* Device buffers bound to the engine's I/O (inputs filled with small
 * values so nothing overflows). */
static int bind_io(engine_run *r, size_t in_bytes, size_t in2_bytes, size_t out_bytes)
{
    int32_t n = kiln_engine_num_io_tensors(r->engine);
    for (int32_t i = 0; i < n; i++) {
        const char *name = kiln_engine_io_tensor_name(r->engine, i);
        int32_t is_input = 0;
        KT(kiln_engine_io_tensor_info(r->engine, name, NULL, &is_input, NULL));
        void **slot = is_input ? &r->in[r->n_in] : &r->out;
        size_t bytes = is_input ? (r->n_in == 0 ? in_bytes : in2_bytes) : out_bytes;
        CU(cudaMalloc(slot, bytes));
        CU(cudaMemset(*slot, is_input ? 0x3c : 0, bytes));
        if (is_input)
            r->n_in++;
        KT(kiln_context_set_tensor_address(r->ctx, name, *slot));
    }
    return 0;
}

static int enqueue_fn(void *arg)
{
    engine_run *r = arg;
    KT(kiln_context_enqueue(r->ctx, stream));
    return 0;
}

/* ---- 1. device copy ------------------------------------------------------------------------ */

typedef struct copy_arg {
    void *dst, *src;
    size_t bytes;
} copy_arg;

static int copy_fn(void *arg)
{
    copy_arg *c = arg;
    CU(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, stream));
    return 0;
}

static const size_t GIB = (size_t)1 << 30;

/* Bytes read + written per second by a 1 GiB device-to-device copy. */
static int bench_copy(double *bw)
{
    copy_arg c = {NULL, NULL, GIB};
    CU(cudaMalloc(&c.src, GIB));
    CU(cudaMalloc(&c.dst, GIB));
    CU(cudaMemset(c.src, 1, GIB));
    double ms = 0;
    int rc = time_gpu(copy_fn, &c, 4, &ms, NULL);
    cudaFree(c.src);
    cudaFree(c.dst);
    if (rc)
        return rc;
    *bw = 2.0 * (double)GIB / (ms * 1e-3);
    return 0;
}

/* ---- 2. ScaleBias and 3. a fused chain over 1 GiB of bf16 ------------------------------------- */

static const int64_t ROWS = 64, COLS = 8388608; /* 64 x 8 Mi bf16 = 1 GiB */

static int bench_scale_bias(double copy_bw, result *res)
{
    kiln_network *net = NULL;
    engine_run r;
    memset(&r, 0, sizeof r);
    KT(kiln_network_create(reg, &net));
    kiln_dims d = {.rank = 2, .d = {ROWS, COLS}};
    kiln_tensor x, y;
    float scale = 2.0f, bias = 0.5f;
    kiln_field fields[2] = {
        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "scale", KILN_FIELD_F32, 1, &scale},
        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "bias", KILN_FIELD_F32, 1, &bias},
    };
    int32_t n_out = 0;
    int rc = 0;
    if (kiln_network_add_input(net, "input", KILN_DTYPE_BF16, &d, &x) != KILN_OK ||
        kiln_network_add_plugin(net, "scale_bias", "ScaleBias", "1", "", fields, 2, &x, 1, &y, 1, &n_out) != KILN_OK ||
        kiln_network_mark_output(net, y, "output") != KILN_OK)
        rc = fail("network: %s", kiln_last_error());
    if (rc == 0)
        rc = build_engine(net, 0, &r);
    kiln_network_destroy(net);
    if (rc == 0)
        rc = bind_io(&r, GIB, 0, GIB);
    double ms = 0;
    if (rc == 0)
        rc = time_gpu(enqueue_fn, &r, 4, &ms, NULL);
    engine_run_free(&r);
    if (rc)
        return rc;
    double bw = 2.0 * (double)GIB / (ms * 1e-3);
    snprintf(res->kiln, sizeof res->kiln, "%.0f GB/s (%.3f ms)", bw / 1e9, ms);
    snprintf(res->peer, sizeof res->peer, "copy %.0f GB/s", copy_bw / 1e9);
    res->fraction = bw / copy_bw;
    res->meets = res->fraction >= 0.85;
    snprintf(res->note, sizeof res->note, "moves 2 GiB (1 GiB read + 1 GiB written)");
    return 0;
}

/* y = silu(x * a + b) * c with [1, 1] constants: four elementwise ops the
 * builder fuses into one kernel, so the floor is one read and one write. */
static int bench_fused(double copy_bw, result *res)
{
    kiln_network *net = NULL;
    engine_run r;
    memset(&r, 0, sizeof r);
    KT(kiln_network_create(reg, &net));
    kiln_dims d = {.rank = 2, .d = {ROWS, COLS}}, one = {.rank = 2, .d = {1, 1}};
    /* bf16 bit patterns: 1.5, 0.25, 0.75 */
    uint16_t va = 0x3fc0, vb = 0x3e80, vc = 0x3f40;
    kiln_tensor x, a, b, c, t1, t2, t3, y;
    int rc = 0;
    if (kiln_network_add_input(net, "x", KILN_DTYPE_BF16, &d, &x) != KILN_OK ||
        kiln_network_add_constant(net, "a", KILN_DTYPE_BF16, &one, &va, &a) != KILN_OK ||
        kiln_network_add_constant(net, "b", KILN_DTYPE_BF16, &one, &vb, &b) != KILN_OK ||
        kiln_network_add_constant(net, "c", KILN_DTYPE_BF16, &one, &vc, &c) != KILN_OK ||
        kiln_network_add_binary(net, "mul", KILN_BINARY_MUL, x, a, &t1) != KILN_OK ||
        kiln_network_add_binary(net, "add", KILN_BINARY_ADD, t1, b, &t2) != KILN_OK ||
        kiln_network_add_unary(net, "silu", KILN_UNARY_SILU, t2, &t3) != KILN_OK ||
        kiln_network_add_binary(net, "scale", KILN_BINARY_MUL, t3, c, &y) != KILN_OK ||
        kiln_network_mark_output(net, y, "y") != KILN_OK)
        rc = fail("network: %s", kiln_last_error());
    if (rc == 0)
        rc = build_engine(net, 0, &r);
    kiln_network_destroy(net);
    int32_t layers = rc == 0 ? kiln_context_num_layers(r.ctx) : 0;
    if (rc == 0)
        rc = bind_io(&r, GIB, 0, GIB);
    double ms = 0;
    if (rc == 0)
        rc = time_gpu(enqueue_fn, &r, 4, &ms, NULL);
    engine_run_free(&r);
    if (rc)
        return rc;
    double bw = 2.0 * (double)GIB / (ms * 1e-3);
    snprintf(res->kiln, sizeof res->kiln, "%.0f GB/s (%.3f ms)", bw / 1e9, ms);
    snprintf(res->peer, sizeof res->peer, "copy %.0f GB/s", copy_bw / 1e9);
    res->fraction = bw / copy_bw;
    res->meets = res->fraction >= 0.85;
    snprintf(res->note, sizeof res->note, "mul, add, silu, mul in %d layer%s; moves 2 GiB", (int)layers,
             layers == 1 ? "" : "s");
    return 0;
}

/* ---- 4. matmul 8192^3 bf16: kiln vs cuBLASLt --------------------------------------------------- */

static const int64_t MM = 8192;

typedef struct lt_arg {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    void *a, *b, *c, *ws;
    size_t ws_bytes;
} lt_arg;

static int lt_fn(void *arg)
{
    lt_arg *l = arg;
    float alpha = 1.0f, beta = 0.0f;
    LT(cublasLtMatmul(l->lt, l->op, &alpha, l->a, l->la, l->b, l->lb, &beta, l->c, l->lc, l->c, l->lc, &l->algo, l->ws,
                      l->ws_bytes, stream));
    return 0;
}

/* One bf16 problem through cuBLASLt, column-major: out = op(first) . second
 * (first transposed when transa), f32 accumulation, the heuristic's first
 * algorithm (kiln's default tactic), timed `inner` calls back to back. */
typedef struct lt_shape {
    uint64_t rows, cols;
    int64_t ld;
} lt_shape;

static int cublaslt_time(void *first, void *second, void *out, lt_shape sf, int transa, lt_shape ss, lt_shape so,
                         int inner, double *ms)
{
    lt_arg l;
    memset(&l, 0, sizeof l);
    l.a = first;
    l.b = second;
    l.c = out;
    l.ws_bytes = KILN_CUDA_CUBLASLT_WORKSPACE;
    CU(cudaMalloc(&l.ws, l.ws_bytes));
    int rc = 0;
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    if (cublasLtCreate(&l.lt) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&l.la, CUDA_R_16BF, sf.rows, sf.cols, sf.ld) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&l.lb, CUDA_R_16BF, ss.rows, ss.cols, ss.ld) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&l.lc, CUDA_R_16BF, so.rows, so.cols, so.ld) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &l.ws_bytes,
                                             sizeof l.ws_bytes) != CUBLAS_STATUS_SUCCESS)
        rc = fail("cuBLASLt setup failed");
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (rc == 0 && (cublasLtMatmulAlgoGetHeuristic(l.lt, l.op, l.la, l.lb, l.lc, l.lc, pref, 1, &heur, &found) !=
                        CUBLAS_STATUS_SUCCESS ||
                    found < 1))
        rc = fail("cuBLASLt heuristic found no algorithm");
    if (rc == 0) {
        l.algo = heur.algo;
        rc = time_gpu(lt_fn, &l, inner, ms, NULL);
    }
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (l.lc)
        cublasLtMatrixLayoutDestroy(l.lc);
    if (l.lb)
        cublasLtMatrixLayoutDestroy(l.lb);
    if (l.la)
        cublasLtMatrixLayoutDestroy(l.la);
    if (l.op)
        cublasLtMatmulDescDestroy(l.op);
    if (l.lt)
        cublasLtDestroy(l.lt);
    cudaFree(l.ws);
    return rc;
}

/* Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T = B^T A^T: cuBLASLt
 * gets B as its first operand. */
static int cublaslt_matmul(void *a, void *b, void *c, double *ms)
{
    const lt_shape sq = {MM, MM, MM};
    return cublaslt_time(b, a, c, sq, 0, sq, sq, 4, ms);
}

static int bench_matmul(result *res)
{
    kiln_network *net = NULL;
    engine_run r;
    memset(&r, 0, sizeof r);
    KT(kiln_network_create(reg, &net));
    kiln_dims d = {.rank = 2, .d = {MM, MM}};
    kiln_tensor a, b, c;
    size_t bytes = (size_t)MM * (size_t)MM * 2;
    int rc = 0;
    if (kiln_network_add_input(net, "a", KILN_DTYPE_BF16, &d, &a) != KILN_OK ||
        kiln_network_add_input(net, "b", KILN_DTYPE_BF16, &d, &b) != KILN_OK ||
        kiln_network_add_matmul(net, "matmul", a, 0, b, 0, &c) != KILN_OK ||
        kiln_network_mark_output(net, c, "c") != KILN_OK)
        rc = fail("network: %s", kiln_last_error());
    if (rc == 0)
        rc = build_engine(net, 0, &r);
    kiln_network_destroy(net);
    if (rc == 0)
        rc = bind_io(&r, bytes, bytes, bytes);
    double ms = 0, peer_ms = 0;
    if (rc == 0)
        rc = time_gpu(enqueue_fn, &r, 4, &ms, NULL);
    if (rc == 0)
        rc = cublaslt_matmul(r.in[0], r.in[1], r.out, &peer_ms);
    engine_run_free(&r);
    if (rc)
        return rc;
    double flops = 2.0 * (double)MM * (double)MM * (double)MM;
    snprintf(res->kiln, sizeof res->kiln, "%.0f TFLOP/s (%.3f ms)", flops / (ms * 1e-3) / 1e12, ms);
    snprintf(res->peer, sizeof res->peer, "cuBLASLt %.0f TFLOP/s", flops / (peer_ms * 1e-3) / 1e12);
    res->fraction = peer_ms / ms;
    res->meets = res->fraction >= 0.95;
    snprintf(res->note, sizeof res->note, "floor: cuBLASLt's time for the same GEMM in this run");
    return 0;
}

/* ---- 4b. decode-shaped matmuls: one token against a bf16 weight [N, K] --------------------------- */

/* y[1, N] = x[1, K] . W[N, K]^T is column-major y^T = W' . x^T with W read
 * as K x N and transposed; 20 calls back to back, as bench_gemv times kiln. */
static int cublaslt_gemv(void *x, void *w, void *y, int64_t n, int64_t k, double *ms)
{
    const lt_shape sw = {(uint64_t)k, (uint64_t)n, k}, sx = {(uint64_t)k, 1, k}, sy = {(uint64_t)n, 1, n};
    return cublaslt_time(w, x, y, sw, 1, sx, sy, 20, ms);
}

/* The weight is far larger than the 60 MB L2 at these shapes, so repeated
 * runs stream it from memory each time. Floor: the weight's bytes at the
 * copy bandwidth. */
static int bench_gemv(double copy_bw, int64_t n, int64_t k, result *res)
{
    kiln_network *net = NULL;
    engine_run r;
    memset(&r, 0, sizeof r);
    KT(kiln_network_create(reg, &net));
    kiln_dims dx = {.rank = 2, .d = {1, k}}, dw = {.rank = 2, .d = {n, k}};
    kiln_tensor x, w, y;
    int rc = 0;
    if (kiln_network_add_input(net, "x", KILN_DTYPE_BF16, &dx, &x) != KILN_OK ||
        kiln_network_add_input(net, "w", KILN_DTYPE_BF16, &dw, &w) != KILN_OK ||
        kiln_network_add_matmul(net, "matmul", x, 0, w, 1, &y) != KILN_OK ||
        kiln_network_mark_output(net, y, "y") != KILN_OK)
        rc = fail("network: %s", kiln_last_error());
    if (rc == 0)
        rc = build_engine(net, 0, &r);
    kiln_network_destroy(net);
    size_t wbytes = (size_t)n * (size_t)k * 2;
    if (rc == 0)
        rc = bind_io(&r, (size_t)k * 2, wbytes, (size_t)n * 2);
    double ms = 0, peer_ms = 0;
    /* 20 back to back, as a decode step's matmuls run: the first launch's
     * ramp and the host's enqueue latency spread over them */
    if (rc == 0)
        rc = time_gpu(enqueue_fn, &r, 20, &ms, NULL);
    if (rc == 0)
        rc = cublaslt_gemv(r.in[0], r.in[1], r.out, n, k, &peer_ms);
    engine_run_free(&r);
    if (rc)
        return rc;
    double floor_ms = (double)wbytes / copy_bw * 1e3;
    snprintf(res->kiln, sizeof res->kiln, "%.0f GB/s (%.1f us)", (double)wbytes / (ms * 1e-3) / 1e9, ms * 1e3);
    snprintf(res->peer, sizeof res->peer, "cuBLASLt %.3f of floor", floor_ms / peer_ms);
    res->fraction = floor_ms / ms;
    res->meets = res->fraction >= 0.93;
    snprintf(res->note, sizeof res->note, "floor: weight bytes at the copy bandwidth; peer: cuBLASLt heuristic #1");
    return 0;
}

/* ---- 4b. quantized decode matmuls (issue 10) ----------------------------------------------------- */

/* Adds a u8 or f32 constant of `count` elements: random bytes, or scales
 * of a trained weight's size. */
static int add_random_constant(kiln_network *net, const char *name, kiln_dtype t, int64_t d0, int64_t d1,
                               kiln_tensor *out)
{
    int64_t count = d0 * (d1 ? d1 : 1);
    size_t bytes = (size_t)count * (t == KILN_DTYPE_F32 ? 4 : 1);
    unsigned char *h = malloc(bytes);
    if (!h)
        return fail("out of memory for %s", name);
    uint32_t s = 12345;
    for (int64_t i = 0; i < count; i++) {
        s = s * 1664525u + 1013904223u;
        if (t == KILN_DTYPE_F32)
            ((float *)h)[i] = 0.001f + (float)(s >> 8) / 16777216.0f * 0.01f;
        else
            h[i] = (unsigned char)((s >> 24) & 0x7E); /* never an E4M3 NaN */
    }
    kiln_dims d = {.rank = d1 ? 2 : 1, .d = {d0, d1}};
    kiln_status st = kiln_network_add_constant(net, name, t, &d, h, out);
    free(h);
    return st == KILN_OK ? 0 : fail("%s: %s", name, kiln_last_error());
}

enum { QB_FP8 = 0, QB_INT4 = 4, QB_INT8 = 8 };

/* An engine of one plugin layer, y[m, N] = x[m, K] · Wᵀ with W int8 (per
 * channel), int4 (groups of 128) or FP8 E4M3 (per channel, x quantized
 * per token), bf16 x and y, W a constant of random codes, its I/O bound.
 * `bits` is a QB_*. */
static int quant_engine(int bits, int64_t m, int64_t n, int64_t k, engine_run *r)
{
    kiln_network *net = NULL;
    KT(kiln_network_create(reg, &net));
    kiln_dims dx = {.rank = 2, .d = {m, k}};
    kiln_tensor in[4], y;
    int32_t nn = (int32_t)n, kk = (int32_t)k, b = bits, g = bits == 4 ? 128 : (int32_t)k, n_out = 0;
    int64_t ng = k / g;
    int rc = kiln_network_add_input(net, "x", KILN_DTYPE_BF16, &dx, &in[0]) == KILN_OK ? 0 : fail("network");
    if (rc == 0)
        rc = add_random_constant(net, "q", KILN_DTYPE_U8, n, bits == 4 ? k / 2 : k, &in[1]);
    if (rc == 0)
        rc = add_random_constant(net, "scales", KILN_DTYPE_F32, n, bits == QB_FP8 ? 0 : ng, &in[2]);
    if (rc == 0 && bits == 4)
        rc = add_random_constant(net, "zeros", KILN_DTYPE_U8, n, ng, &in[3]);
    if (rc == 0) {
        kiln_field woq[4] = {{sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "bits", KILN_FIELD_I32, 1, &b},
                             {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "group_size", KILN_FIELD_I32, 1, &g},
                             {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "n", KILN_FIELD_I32, 1, &nn},
                             {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "k", KILN_FIELD_I32, 1, &kk}};
        kiln_status st = bits == QB_FP8 ? kiln_network_add_plugin(net, "mm", "Fp8MatMul", "1", "kiln", woq + 2, 2, in,
                                                                  3, &y, 1, &n_out)
                                        : kiln_network_add_plugin(net, "mm", "WeightOnlyMatMul", "1", "kiln", woq, 4,
                                                                  in, bits == 4 ? 4 : 3, &y, 1, &n_out);
        if (st != KILN_OK || kiln_network_mark_output(net, y, "y") != KILN_OK)
            rc = fail("network: %s", kiln_last_error());
    }
    if (rc == 0)
        rc = build_engine(net, 0, r);
    kiln_network_destroy(net);
    if (rc == 0)
        rc = bind_io(r, (size_t)(m * k) * 2, 0, (size_t)(m * n) * 2);
    return rc;
}

/* y[1, N] = x[1, K] · Wᵀ (quant_engine), 20 back to back. Floor: the bytes
 * of the quantized weight, its scales and zero points at the copy
 * bandwidth. */
static int bench_quant_gemv(double copy_bw, int bits, int64_t n, int64_t k, double target, result *res)
{
    engine_run r;
    memset(&r, 0, sizeof r);
    int64_t ng = k / (bits == 4 ? 128 : k);
    size_t wbytes = bits == 4 ? (size_t)(n * k / 2) + (size_t)(n * ng) * 5 : (size_t)(n * k) + (size_t)n * 4;
    int rc = quant_engine(bits, 1, n, k, &r);
    double ms = 0;
    if (rc == 0)
        rc = time_gpu(enqueue_fn, &r, 20, &ms, NULL);
    engine_run_free(&r);
    if (rc)
        return rc;
    double floor_ms = (double)wbytes / copy_bw * 1e3;
    snprintf(res->kiln, sizeof res->kiln, "%.0f GB/s (%.1f us)", (double)wbytes / (ms * 1e-3) / 1e9, ms * 1e3);
    snprintf(res->peer, sizeof res->peer, "-");
    res->fraction = floor_ms / ms;
    res->meets = res->fraction >= target;
    snprintf(res->note, sizeof res->note, "floor: the quantized weight's bytes (with scales%s) at the copy bandwidth",
             bits == 4 ? " and zero points" : "");
    return 0;
}

/* y[m, N] = x[m, K] · Wᵀ with W int4 (groups of 128) or int8 past the
 * GEMVs' rows (prefill: W dequantized to bf16 in the workspace, then
 * cuBLASLt), 4 back to back. Floor: cuBLASLt's bf16 GEMM of the same shape
 * (heuristic #1, a bf16 W) in this run, what a bf16 engine's matmul runs. */
static int bench_woq_prefill(int bits, int64_t m, int64_t n, int64_t k, double target, result *res)
{
    engine_run r;
    memset(&r, 0, sizeof r);
    int rc = quant_engine(bits, m, n, k, &r);
    void *w = NULL;
    if (rc == 0 && cudaMalloc(&w, (size_t)(n * k) * 2) != cudaSuccess)
        rc = fail("cannot allocate a bf16 weight of %lld x %lld", (long long)n, (long long)k);
    if (rc == 0 && cudaMemset(w, 0x3c, (size_t)(n * k) * 2) != cudaSuccess)
        rc = fail("cudaMemset failed");
    double ms = 0, peer_ms = 0;
    if (rc == 0)
        rc = time_gpu(enqueue_fn, &r, 4, &ms, NULL);
    const lt_shape sw = {(uint64_t)k, (uint64_t)n, k}, sx = {(uint64_t)k, (uint64_t)m, k},
                   sy = {(uint64_t)n, (uint64_t)m, n};
    if (rc == 0)
        rc = cublaslt_time(w, r.in[0], r.out, sw, 1, sx, sy, 4, &peer_ms);
    cudaFree(w);
    engine_run_free(&r);
    if (rc)
        return rc;
    double flops = 2.0 * (double)m * (double)n * (double)k;
    snprintf(res->kiln, sizeof res->kiln, "%.0f TFLOP/s (%.3f ms)", flops / (ms * 1e-3) / 1e12, ms);
    snprintf(res->peer, sizeof res->peer, "bf16 cuBLASLt %.0f TFLOP/s", flops / (peer_ms * 1e-3) / 1e12);
    res->fraction = peer_ms / ms;
    res->meets = res->fraction >= target;
    snprintf(res->note, sizeof res->note, "floor: cuBLASLt's bf16 GEMM of the same shape in this run");
    return 0;
}

/* ---- 5. 200 small layers: plain enqueue vs CUDA graph ------------------------------------------ */

enum { CHAIN = 200, BATCH = 20 };

/* BATCH inferences back to back: per-inference time includes whatever the
 * host cannot hide, as in a serving loop. */
static int chain_fn(void *arg)
{
    engine_run *r = arg;
    for (int i = 0; i < BATCH; i++)
        KT(kiln_context_enqueue(r->ctx, stream));
    return 0;
}

static int bench_chain(result *res)
{
    kiln_network *net = NULL;
    engine_run r;
    memset(&r, 0, sizeof r);
    KT(kiln_network_create(reg, &net));
    kiln_dims d = {.rank = 2, .d = {64, 64}}, one = {.rank = 2, .d = {1, 1}};
    float add = 0.001f, mul = 0.999f;
    kiln_tensor x, ca, cm;
    int rc = 0;
    if (kiln_network_add_input(net, "x", KILN_DTYPE_F32, &d, &x) != KILN_OK ||
        kiln_network_add_constant(net, "ca", KILN_DTYPE_F32, &one, &add, &ca) != KILN_OK ||
        kiln_network_add_constant(net, "cm", KILN_DTYPE_F32, &one, &mul, &cm) != KILN_OK)
        rc = fail("network: %s", kiln_last_error());
    for (int i = 0; i < CHAIN && rc == 0; i++) {
        char name[32];
        snprintf(name, sizeof name, "%s%d", i % 2 ? "mul" : "add", i);
        if (kiln_network_add_binary(net, name, i % 2 ? KILN_BINARY_MUL : KILN_BINARY_ADD, x, i % 2 ? cm : ca, &x) !=
            KILN_OK)
            rc = fail("network: %s", kiln_last_error());
    }
    if (rc == 0 && kiln_network_mark_output(net, x, "y") != KILN_OK)
        rc = fail("network: %s", kiln_last_error());
    /* No fusion: 200 layers must stay 200 launches. */
    if (rc == 0)
        rc = build_engine(net, KILN_BUILD_NO_FUSION, &r);
    kiln_network_destroy(net);
    int32_t layers = rc == 0 ? kiln_context_num_layers(r.ctx) : 0;
    if (rc == 0)
        rc = bind_io(&r, 64 * 64 * 4, 0, 64 * 64 * 4);
    double plain = 0, plain_host = 0, graph = 0, graph_host = 0;
    if (rc == 0)
        rc = time_gpu(chain_fn, &r, 1, &plain, &plain_host);
    if (rc == 0 && kiln_context_set_cuda_graph(r.ctx, 1) != KILN_OK)
        rc = fail("graph mode: %s", kiln_last_error());
    if (rc == 0)
        rc = time_gpu(chain_fn, &r, 1, &graph, &graph_host);
    engine_run_free(&r);
    if (rc)
        return rc;
    plain /= BATCH;
    graph /= BATCH;
    plain_host /= BATCH;
    graph_host /= BATCH;
    double n = layers > 0 ? layers : 1;
    snprintf(res->kiln, sizeof res->kiln, "graph %.1f us/inference", graph * 1e3);
    snprintf(res->peer, sizeof res->peer, "plain %.1f us/inference", plain * 1e3);
    res->fraction = plain / graph;
    res->meets = res->fraction >= 2.5;
    /* Plain: the GPU waits on the host, so the time per layer beyond the
     * graph's is the gap between kernels. */
    snprintf(res->note, sizeof res->note,
             "%d layers; per layer: plain %.2f us (host enqueue %.2f us, gap %.2f us), graph %.2f us", (int)layers,
             plain * 1e3 / n, plain_host * 1e3 / n, (plain - graph) * 1e3 / n, graph * 1e3 / n);
    if (json_out)
        json_object_set_new(json_out, "chain_detail",
                            json_pack("{s:i, s:f, s:f, s:f, s:f}", "layers", (int)layers, "plain_us_per_inference",
                                      plain * 1e3, "graph_us_per_inference", graph * 1e3,
                                      "plain_host_enqueue_us_per_layer", plain_host * 1e3 / n, "graph_host_launch_us",
                                      graph_host * 1e3));
    return 0;
}

/* ---- main ---------------------------------------------------------------------------------- */

static const char *plugin_path(char *buf, size_t size)
{
    const char *dir = getenv("KILN_BUILD_DIR");
    if (dir) {
        snprintf(buf, size, "%s/lib/libkiln_scale_bias.so", dir);
        return buf;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return "build/lib/libkiln_scale_bias.so";
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(buf, size, "%s/../lib/libkiln_scale_bias.so", self);
    return buf;
}

/* --only STR (repeatable): run only the rows whose name contains one of
 * them (the device copy, every row's floor, always runs). */
static const char *only[8];
static int n_only;

static int wanted(const char *name)
{
    for (int i = 0; i < n_only; i++)
        if (strstr(name, only[i]))
            return 1;
    return n_only == 0;
}

/* An informational row: the quantized decode GEMV of `bits` at n x k with
 * environment variable `var` set to `value` for the run. */
static void quant_ab_row(double copy_bw, int bits, int64_t n, int64_t k, const char *var, const char *value)
{
    static char names[64][80];
    static int used;
    char *name = names[used < 63 ? used++ : 63];
    snprintf(name, sizeof names[0], "%s %lldx%lld, %s=%s",
             bits == QB_INT4   ? "int4 g128"
             : bits == QB_INT8 ? "int8"
                               : "fp8",
             (long long)n, (long long)k, var, value);
    if (!wanted(name))
        return;
    result *r = new_result(name, "(A/B)");
    setenv(var, value, 1);
    int st = copy_bw > 0 ? bench_quant_gemv(copy_bw, bits, n, k, 0, r) : fail("no copy bandwidth to compare with");
    unsetenv(var);
    if (st)
        snprintf(r->error, sizeof r->error, "%s", failure);
    r->meets = 1;
}

int main(int argc, char **argv)
{
    const char *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json_path = argv[++i];
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc && n_only < 8) {
            only[n_only++] = argv[++i];
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 20)
                reps = 20;
        } else {
            fprintf(stderr, "usage: kiln_bench [--json FILE] [--reps N (>= 20)] [--only NAME_PART]...\n");
            return 2;
        }
    }
    int32_t arch = 0;
    if (!kiln_cuda_available(&arch)) {
        printf("kiln_bench: skipped: no CUDA GPU is available\n");
        return 77;
    }
    char path[PATH_MAX + 64];
    if (kiln_registry_create(&reg) != KILN_OK ||
        kiln_registry_load_library(reg, plugin_path(path, sizeof path)) != KILN_OK) {
        fprintf(stderr, "kiln_bench: %s\n", kiln_last_error());
        return 1;
    }
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&ev0) != cudaSuccess || cudaEventCreate(&ev1) != cudaSuccess) {
        fprintf(stderr, "kiln_bench: cannot create a stream and events\n");
        return 1;
    }
    json_out = json_object();

    double copy_bw = 0;
    result *rc = new_result("device copy 1 GiB (floor)", "peer");
    if (bench_copy(&copy_bw) == 0) {
        snprintf(rc->kiln, sizeof rc->kiln, "%.0f GB/s", copy_bw / 1e9);
        snprintf(rc->peer, sizeof rc->peer, "-");
        rc->fraction = 1.0;
        rc->meets = 1;
        snprintf(rc->note, sizeof rc->note, "cudaMemcpyAsync D2D, bytes read + written");
    } else {
        snprintf(rc->error, sizeof rc->error, "%s", failure);
    }
    struct {
        const char *name, *target;
        int which;
    } list[] = {
        {"ScaleBias bf16 1 GiB", ">= 0.85 of copy", 0},
        {"fused 4-op chain bf16 1 GiB", ">= 0.85 of copy", 1},
        {"matmul 8192^3 bf16", ">= 0.95 of cuBLASLt", 2},
        {"decode matmul 1x4096 . 28672x4096", ">= 0.93 of copy", 4},
        {"decode matmul 1x14336 . 4096x14336", ">= 0.93 of copy", 5},
        {"decode matmul 1x4096 . 128256x4096", ">= 0.93 of copy", 6},
        {"int8 decode 1x4096 . 28672x4096", ">= 0.80 of copy", 7},
        {"int4 g128 decode 1x4096 . 28672x4096", ">= 0.80 of copy", 8},
        {"int4 g128 decode 1x14336 . 4096x14336", ">= 0.80 of copy", 9},
        {"fp8 decode 1x4096 . 28672x4096", ">= 0.90 of copy", 10},
        {"int4 g128 prefill 2048x14336 . 4096x14336", ">= 0.80 of bf16 GEMM", 11},
        {"int4 g128 prefill 2048x4096 . 28672x4096", ">= 0.80 of bf16 GEMM", 12},
        {"200-layer chain: graph vs plain", ">= 2.5x faster", 3},
    };
    /* GEMV variants (KILN_CUDA_GEMV_ROWS) at the decode shapes of
     * Llama-3.1-8B and Llama-3.2-1B: informational rows, none can fail */
    static const int64_t sweep[][2] = {{28672, 4096}, {4096, 14336}, {6144, 4096}, {4096, 4096},
                                       {16384, 2048}, {2048, 8192},  {3072, 2048}, {2048, 2048}};
    static const char *const rows_set[] = {"1", "2", "4"};
    static char names[sizeof sweep / sizeof sweep[0]][3][64]; /* results keep the name's pointer */
    for (size_t i = 0; i < sizeof sweep / sizeof sweep[0]; i++)
        for (size_t v = 0; v < 3; v++) {
            char *name = names[i][v];
            snprintf(name, sizeof names[i][v], "gemv %lldx%lld, %s rows/block", (long long)sweep[i][0],
                     (long long)sweep[i][1], rows_set[v]);
            if (!wanted(name))
                continue;
            result *r = new_result(name, "(sweep)");
            setenv("KILN_CUDA_GEMV_ROWS", rows_set[v], 1);
            int st = copy_bw > 0 ? bench_gemv(copy_bw, sweep[i][0], sweep[i][1], r)
                                 : fail("no copy bandwidth to compare with");
            unsetenv("KILN_CUDA_GEMV_ROWS");
            if (st)
                snprintf(r->error, sizeof r->error, "%s", failure);
            r->meets = 1;
        }
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        if (!wanted(list[i].name))
            continue;
        result *r = new_result(list[i].name, list[i].target);
        int st;
        if ((list[i].which < 2 || list[i].which >= 4) && copy_bw <= 0)
            st = fail("no copy bandwidth to compare with");
        else if (list[i].which == 4)
            st = bench_gemv(copy_bw, 28672, 4096, r);
        else if (list[i].which == 5)
            st = bench_gemv(copy_bw, 4096, 14336, r);
        else if (list[i].which == 6)
            st = bench_gemv(copy_bw, 128256, 4096, r);
        else if (list[i].which == 7)
            st = bench_quant_gemv(copy_bw, QB_INT8, 28672, 4096, 0.80, r);
        else if (list[i].which == 8)
            st = bench_quant_gemv(copy_bw, QB_INT4, 28672, 4096, 0.80, r);
        else if (list[i].which == 9)
            st = bench_quant_gemv(copy_bw, QB_INT4, 4096, 14336, 0.80, r);
        else if (list[i].which == 10)
            st = bench_quant_gemv(copy_bw, QB_FP8, 28672, 4096, 0.90, r);
        else if (list[i].which == 11)
            st = bench_woq_prefill(QB_INT4, 2048, 4096, 14336, 0.80, r);
        else if (list[i].which == 12)
            st = bench_woq_prefill(QB_INT4, 2048, 28672, 4096, 0.80, r);
        else if (list[i].which == 0)
            st = bench_scale_bias(copy_bw, r);
        else if (list[i].which == 1)
            st = bench_fused(copy_bw, r);
        else if (list[i].which == 2)
            st = bench_matmul(r);
        else
            st = bench_chain(r);
        if (st)
            snprintf(r->error, sizeof r->error, "%s", failure);
    }

    /* the WeightOnlyMatMul GEMVs (KILN_WOQ_GEMV) at the quantized rows'
     * shapes: the f32 one, the older tensor-core one (its own choice of
     * rows a warp: the default before the pipelined one) and the pipelined
     * one with 16 and 32 rows a warp; informational rows */
    static const struct {
        int bits;
        int64_t n, k;
    } woq_ab[] = {{QB_INT8, 28672, 4096}, {QB_INT4, 28672, 4096}, {QB_INT4, 4096, 14336}, {QB_INT4, 6144, 4096}};
    static const char *const woq_gemv[] = {"f32", "tc", "pipe16", "pipe32"};
    for (size_t i = 0; i < sizeof woq_ab / sizeof woq_ab[0]; i++)
        for (size_t v = 0; v < sizeof woq_gemv / sizeof woq_gemv[0]; v++)
            quant_ab_row(copy_bw, woq_ab[i].bits, woq_ab[i].n, woq_ab[i].k, "KILN_WOQ_GEMV", woq_gemv[v]);
    /* the default GEMV's k split (KILN_WOQ_GEMV_SPLIT warps a block) at the
     * three int4 shapes, and whether its tiles carry the sum row
     * (KILN_WOQ_GEMV_SUMROW) */
    static const char *const woq_split[] = {"1", "2", "4", "8", "16"}, *const woq_sr[] = {"0", "1"};
    for (size_t i = 1; i < 4; i++) {
        for (size_t v = 0; v < sizeof woq_split / sizeof woq_split[0]; v++)
            quant_ab_row(copy_bw, QB_INT4, woq_ab[i].n, woq_ab[i].k, "KILN_WOQ_GEMV_SPLIT", woq_split[v]);
        for (size_t v = 0; v < 2; v++)
            quant_ab_row(copy_bw, QB_INT4, woq_ab[i].n, woq_ab[i].k, "KILN_WOQ_GEMV_SUMROW", woq_sr[v]);
    }
    /* Fp8MatMul's decode: one kernel (the default) against quantize then
     * GEMV (KILN_FP8_GEMV=split) */
    static const char *const fp8_gemv[] = {"fused", "split"};
    for (size_t i = 0; i < 2; i++)
        for (size_t v = 0; v < sizeof fp8_gemv / sizeof fp8_gemv[0]; v++)
            quant_ab_row(copy_bw, QB_FP8, i ? 4096 : 28672, i ? 14336 : 4096, "KILN_FP8_GEMV", fp8_gemv[v]);

    /* where the tensor-core GEMV over groups of 8 rows (up to
     * KILN_WOQ_LOOP_MAX_ROWS = 32) hands over to dequantization and
     * cuBLASLt: the last row count of one and the first of the other,
     * against the bf16 GEMM; informational */
    static const int64_t woq_edge[] = {32, 33};
    static char edge_names[2][72];
    for (size_t v = 0; v < 2; v++) {
        snprintf(edge_names[v], sizeof edge_names[v], "int4 g128 %lldx4096 . 28672x4096", (long long)woq_edge[v]);
        if (!wanted(edge_names[v]))
            continue;
        result *r = new_result(edge_names[v], "(A/B)");
        if (bench_woq_prefill(QB_INT4, woq_edge[v], 28672, 4096, 0, r))
            snprintf(r->error, sizeof r->error, "%s", failure);
        r->meets = 1;
    }

    int all = 1;
    json_t *list_json = json_array();
    printf("%-34s %-28s %-26s %9s  %-20s %s\n", "benchmark", "kiln", "peer (same run)", "of floor", "target", "result");
    for (int i = 0; i < n_results; i++) {
        result *r = &results[i];
        if (r->error[0]) {
            printf("%-34s FAIL: %s\n", r->name, r->error);
            all = 0;
        } else {
            char frac[32];
            if (strstr(r->name, "chain: graph"))
                snprintf(frac, sizeof frac, "%.2fx", r->fraction);
            else
                snprintf(frac, sizeof frac, "%.3f", r->fraction);
            printf("%-34s %-28s %-26s %9s  %-20s %s\n", r->name, r->kiln, r->peer, frac, r->target,
                   r->meets ? "meets" : "BELOW");
            all &= r->meets;
        }
        json_array_append_new(list_json, json_pack("{s:s, s:s, s:s, s:f, s:s, s:b, s:s, s:s}", "name", r->name, "kiln",
                                                   r->kiln, "peer", r->peer, "fraction", r->fraction, "target",
                                                   r->target, "meets", r->meets, "note", r->note, "error", r->error));
    }
    for (int i = 0; i < n_results; i++)
        if (results[i].note[0] && !results[i].error[0])
            printf("  %s: %s\n", results[i].name, results[i].note);
    json_object_set_new(json_out, "gpu_arch", json_integer(arch));
    json_object_set_new(json_out, "reps", json_integer(reps));
    json_object_set_new(json_out, "results", list_json);
    json_object_set_new(json_out, "all_meet", json_boolean(all));
    if (json_path && json_dump_file(json_out, json_path, JSON_INDENT(2)) != 0)
        fprintf(stderr, "kiln_bench: cannot write %s\n", json_path);
    json_decref(json_out);
    kiln_registry_destroy(reg);
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaStreamDestroy(stream);
    return all ? 0 : 1;
}
