/* The built-in LLM plugins on the GPU against their CPU reference (the
 * same plugin instance enqueued on KILN_BACKEND_CPU; on the GPU it runs as
 * a plugin layer through the CUDA backend, as an engine runs it), on
 * random inputs:
 * RMSNorm and AddRMSNorm (also with an f32 x and sum, the residual
 * stream of a bf16/f16 engine, beside a 16-bit residual, weight and y), RoPE (no/linear/llama3 scaling, half-split and
 * interleaved pairs, partial rotary, the packed qkv row, in place), SwiGLU
 * (apart and packed), QuantMatMul (Q8_0, Q4_0, Q4_1; T = 1 … 512; k a
 * multiple of 256, where the GEMV loads 16 bytes at a time, and not; the K
 * formats Q4_K, Q5_K, Q6_K, T = 1 … 200),
 * WeightOnlyMatMul (int8 and int4, per channel and in groups; T = 1 … 300,
 * the GEMV at every T up to 8, each of them: the pipelined tensor-core
 * one, the older tensor-core one and the f32 one, also at the 8B decode
 * layers' sizes; the tensor-core one over groups of 8 rows up to 32, and
 * past that (f32 x: past 8) W dequantized to x's dtype and cuBLASLt's
 * GEMM, also in two slices of W; the tensor-core GEMV's error, about 1e-5 of y, is far
 * below the bf16 and f16 tolerances, which stand for the rounding of y;
 * the GEMM path rounds each weight to bf16 (f16) as well, at most 2^-8
 * (2^-11) relative, so ‖Δy‖ / ‖y‖ ≈ 1.5e-3 (2e-4) on random data: still
 * several times inside 1e-2 (1e-3), while a wrong weight, scale, zero
 * or column of y is far outside; with f32 x it dequantizes exactly and
 * keeps the f32 tolerance), Fp8MatMul (the
 * per-token quantization, the GEMV up to 8 rows, one kernel (4, 2 or 1
 * warps a row group) or after a quantizing one (KILN_FP8_GEMV=split),
 * cuBLASLt's FP8 GEMM past
 * it with the scales in its epilogue and with KILN_FP8_GEMM=f32's f32
 * result and scale kernel, and the GEMV over row groups where n is not a
 * multiple of 4; f32
 * within 1e-3, as Hopper's FP8 tensor cores add in fewer bits than f32;
 * also on x given as E4M3 codes and row scales, as the FP8 engine's norms
 * and SwiGLU write them with quantize = fp8, those checked code by code),
 * FusedMatMul (every prologue and epilogue, RoPE's half-split and
 * interleaved pairs, partial rotary, the GEMV at 1, 2, 4, 8 rows
 * and cuBLASLt past it or where the GEMV does not apply; with bf16/f16
 * weights also an f32 x into the norm and an f32 residual and y, the
 * f32 outputs then within the weights' dtype's tolerance; and over E4M3
 * weights, test_fused_matmul_fp8).
 * f32, f16 and bf16; odd sizes; T = 1 and T = 512.
 *
 * test_graph_capture runs each plugin again inside a CUDA graph capture
 * (the plugins are flagged capture-safe: no allocation, no synchronization)
 * and replays the graph.
 *
 * GPU outputs are poisoned with NaN (all bits set) before each launch, so
 * an unwritten element fails. Tolerance on ‖gpu − cpu‖ / ‖cpu‖ by dtype:
 * f32 1e-5 (summation order and sin/cos differ in the last bits), f16 1e-3,
 * bf16 1e-2 (an element may round to the neighbouring value); any NaN or
 * infinity on one side only fails.
 *
 * Without a GPU (or without the CUDA backend) it exits 77: skipped. */
#include "test.h"

#ifdef KILN_HAVE_CUDA

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/threadpool.h"

#include <cuda_runtime.h>
#include <kiln/plugin.h>
#include <kiln/registry.h>
#include <stdint.h>

static kiln_cuda_device *dev;
static cudaStream_t stream;
static kiln_registry *reg;
static int use_graph;    /* run_both enqueues inside a stream capture, then replays it */
static double tol_floor; /* > 0: the least tolerance run_both uses */
static int report_err;   /* compare prints every relative error it finds */
/* the CPU reference's threads (its enqueue's stream; NULL: this thread).
 * Set only around plugins whose CPU path splits independent outputs
 * over threads and keeps no per-thread state in the workspace: Fp8MatMul,
 * whose reference otherwise takes minutes of one core here. */
static kiln_threadpool *cpu_pool;

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_float(float lo, float hi) { return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0)); }

static double tol_for(kiln_dtype t) { return t == KILN_DTYPE_F16 ? 1e-3 : t == KILN_DTYPE_BF16 ? 1e-2 : 1e-5; }

static const char *dtype_name(kiln_dtype t)
{
    return t == KILN_DTYPE_F16 ? "f16" : t == KILN_DTYPE_BF16 ? "bf16" : t == KILN_DTYPE_F32 ? "f32" : "int";
}

/* ---- tensors on both sides --------------------------------------------------------------- */

typedef struct buf {
    kiln_tensor_desc desc;
    void *host, *dev;
    size_t bytes;
} buf;

static kiln_tensor_desc make_desc(kiln_dtype t, int64_t d0, int64_t d1)
{
    kiln_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.abi_version = KILN_PLUGIN_ABI_VERSION;
    d.dtype = t;
    d.dims.rank = d1 ? 2 : 1;
    d.dims.d[0] = d0;
    d.dims.d[1] = d1;
    return d;
}

static int64_t count(const buf *b) { return b->desc.dims.d[0] * (b->desc.dims.rank == 2 ? b->desc.dims.d[1] : 1); }

static buf buf_new(kiln_dtype t, int64_t d0, int64_t d1)
{
    buf b = {.desc = make_desc(t, d0, d1)};
    b.bytes = (size_t)count(&b) * kiln_dtype_size(t);
    b.host = calloc(1, b.bytes ? b.bytes : 1);
    if (cudaMalloc(&b.dev, b.bytes ? b.bytes : 1) != cudaSuccess) {
        fprintf(stderr, "cannot allocate %zu bytes on the GPU\n", b.bytes);
        exit(1);
    }
    return b;
}

static void buf_upload(buf *b)
{
    if (cudaMemcpy(b->dev, b->host, b->bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "cannot copy %zu bytes to the GPU\n", b->bytes);
        exit(1);
    }
}

/* Random floats in [lo, hi), on both sides. */
static buf buf_random(kiln_dtype t, int64_t d0, int64_t d1, float lo, float hi)
{
    buf b = buf_new(t, d0, d1);
    for (int64_t i = 0; i < count(&b); i++)
        kiln_store_f32(b.host, t, i, rng_float(lo, hi));
    buf_upload(&b);
    return b;
}

/* An output: zeros on the host, NaN (all bits set) on the device. */
static buf buf_output(kiln_dtype t, int64_t d0, int64_t d1)
{
    buf b = buf_new(t, d0, d1);
    cudaMemset(b.dev, 0xff, b.bytes);
    return b;
}

static void buf_free(buf *b)
{
    free(b->host);
    cudaFree(b->dev);
}

/* ‖gpu − cpu‖ / ‖cpu‖ over a float output, failing on NaN or infinity on
 * one side only. */
static void compare(const char *what, const buf *o, double tol)
{
    int64_t n = count(o);
    void *g = malloc(o->bytes ? o->bytes : 1);
    test_checks_++;
    if (cudaMemcpy(g, o->dev, o->bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        test_failures_++;
        fprintf(stderr, "%s: copying the result back failed\n", what);
        free(g);
        return;
    }
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        double c = kiln_load_f32(o->host, o->desc.dtype, i), v = kiln_load_f32(g, o->desc.dtype, i);
        if (!isfinite(c) || !isfinite(v)) {
            if (!(isnan(c) && isnan(v)) && c != v) {
                test_failures_++;
                fprintf(stderr, "%s: element %lld of %lld: gpu %g, cpu %g\n", what, (long long)i, (long long)n, v, c);
                free(g);
                return;
            }
            continue;
        }
        diff += (v - c) * (v - c);
        ref += c * c;
    }
    double rel = ref > 0 ? sqrt(diff / ref) : sqrt(diff);
    if (report_err)
        printf("  %s: relative error %.3g\n", what, rel);
    if (!(rel <= tol)) {
        test_failures_++;
        fprintf(stderr, "%s: relative error %.3g > %g\n", what, rel, tol);
    }
    free(g);
}

/* E4M3 rows (codes o, a scale a row in sc: RMSNorm, AddRMSNorm and
 * SwiGLU with quantize = fp8) against the CPU's: each code equal or one
 * step from it with the same sign (y's values may round to a neighbour
 * where the sums of squares run in another order, and with them a row's
 * max), and the dequantized rows within tol (relative, as compare). */
static void compare_codes(const char *what, const buf *o, const buf *sc, double tol)
{
    const int64_t n = count(o), rows = count(sc), k = rows ? n / rows : 0;
    uint8_t *g = malloc(o->bytes ? o->bytes : 1);
    float *gs = malloc(sc->bytes ? sc->bytes : 1);
    test_checks_ += 2;
    if (cudaMemcpy(g, o->dev, o->bytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(gs, sc->dev, sc->bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        test_failures_++;
        fprintf(stderr, "%s: copying the codes back failed\n", what);
        free(g), free(gs);
        return;
    }
    const uint8_t *c = o->host;
    const float *cs = sc->host;
    int64_t far = 0, first = -1;
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        const int dc = (c[i] & 0x7F) - (g[i] & 0x7F);
        if (g[i] != c[i] && ((g[i] ^ c[i]) & 0x80 || dc > 1 || dc < -1) && far++ == 0)
            first = i;
        const double v = (double)kiln_e4m3_to_f32(g[i]) * gs[i / k], r = (double)kiln_e4m3_to_f32(c[i]) * cs[i / k];
        diff += (v - r) * (v - r);
        ref += r * r;
    }
    const double rel = ref > 0 ? sqrt(diff / ref) : sqrt(diff);
    if (far) {
        test_failures_++;
        fprintf(stderr,
                "%s: %lld codes more than a step from the CPU's (first: element %lld, gpu 0x%02x, cpu 0x%02x)\n", what,
                (long long)far, (long long)first, g[first], c[first]);
    }
    if (!(rel <= tol)) {
        test_failures_++;
        fprintf(stderr, "%s: dequantized rows' relative error %.3g > %g\n", what, rel, tol);
    }
    free(g), free(gs);
}

/* Runs the plugin on the CPU (host buffers, `ws` as workspace) and as a
 * plugin layer on the CUDA backend (device buffers, ws_dev as workspace),
 * then compares every output. */
static void run_both_ws(const char *what, kiln_plugin *p, buf *in, int32_t n_in, buf *out, int32_t n_out, void *ws,
                        void *ws_dev)
{
    kiln_tensor_desc d[9];
    const void *hin[6];
    void *hout[3];
    kiln_exec_tensor din[6], dout[3];
    for (int32_t i = 0; i < n_in; i++) {
        d[i] = in[i].desc;
        hin[i] = in[i].host;
        din[i] = (kiln_exec_tensor){.data = in[i].dev, .dtype = in[i].desc.dtype, .dims = in[i].desc.dims};
    }
    for (int32_t i = 0; i < n_out; i++) {
        d[n_in + i] = out[i].desc;
        hout[i] = out[i].host;
        dout[i] = (kiln_exec_tensor){.data = out[i].dev, .dtype = out[i].desc.dtype, .dims = out[i].desc.dims};
    }
    kiln_layer layer;
    memset(&layer, 0, sizeof layer);
    layer.name = (char *)what;
    layer.op = KILN_OP_PLUGIN;
    layer.n_inputs = n_in;
    layer.n_outputs = n_out;
    layer.tactic = -1;
    kiln_cuda_args ga = {.layer = &layer,
                         .inputs = din,
                         .outputs = dout,
                         .plugin = p,
                         .device = dev,
                         .stream = stream,
                         .workspace = ws_dev};
    test_checks_ += 3;
    if (!p->ops->supports(p, KILN_BACKEND_CUDA, d, n_in, n_out) ||
        !(p->ops->backends & KILN_BACKEND_BIT(KILN_BACKEND_CUDA)) || !(p->ops->flags & KILN_PLUGIN_FLAG_CAPTURE_SAFE)) {
        test_failures_++;
        fprintf(stderr, "%s: the plugin does not take this case on CUDA\n", what);
        return;
    }
    if (p->ops->enqueue(p, KILN_BACKEND_CPU, d, hin, n_in, d + n_in, hout, n_out, ws, cpu_pool) != KILN_OK) {
        test_failures_++;
        fprintf(stderr, "%s: CPU: %s\n", what, kiln_last_error());
        return;
    }
    /* the poison and uploads went through the legacy default stream */
    cudaDeviceSynchronize();
    cudaError_t e = cudaSuccess;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (use_graph)
        e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    kiln_status st = kiln_cuda_run_layer(&ga);
    if (use_graph) {
        cudaError_t end = cudaStreamEndCapture(stream, &graph);
        if (e == cudaSuccess)
            e = end;
        if (e == cudaSuccess)
            e = cudaGraphInstantiate(&exec, graph, 0);
        if (e == cudaSuccess)
            e = cudaGraphLaunch(exec, stream);
    }
    cudaError_t sync = cudaStreamSynchronize(stream);
    if (e == cudaSuccess)
        e = sync;
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    if (st != KILN_OK || e != cudaSuccess) {
        test_failures_++;
        fprintf(stderr, "%s: GPU: %s\n", what, st != KILN_OK ? kiln_last_error() : cudaGetErrorString(e));
        return;
    }
    for (int32_t i = 0; i < n_out; i++) {
        if (out[i].desc.dtype == KILN_DTYPE_U8 && i + 1 < n_out && out[i + 1].desc.dtype == KILN_DTYPE_F32) {
            compare_codes(what, &out[i], &out[i + 1], 1e-2);
            i++;
            continue;
        }
        compare(what, &out[i], tol_for(out[i].desc.dtype) > tol_floor ? tol_for(out[i].desc.dtype) : tol_floor);
    }
}

/* run_both_ws for plugins that need no device workspace. */
static void run_both(const char *what, kiln_plugin *p, buf *in, int32_t n_in, buf *out, int32_t n_out, void *ws)
{
    run_both_ws(what, p, in, n_in, out, n_out, ws, NULL);
}

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
    kiln_plugin *p = NULL;
    test_checks_++;
    if (!c || kiln_plugin_create(c, f, n, &p) != KILN_OK) {
        test_failures_++;
        fprintf(stderr, "cannot create %s: %s\n", name, kiln_last_error());
        return NULL;
    }
    return p;
}

static const kiln_dtype float_types[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
static const int64_t token_counts[] = {1, 512};

/* ---- RMSNorm, AddRMSNorm ------------------------------------------------------------------ */

static void test_rmsnorm(void)
{
    const int64_t hs[] = {7, 2048, 4099};
    const float eps = 1e-5f;
    kiln_field f = ff32("epsilon", &eps);
    kiln_plugin *norm = make("RMSNorm", &f, 1), *add = make("AddRMSNorm", &f, 1);
    if (!norm || !add)
        return;
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t hi = 0; hi < 3; hi++)
            for (size_t ri = 0; ri < 2; ri++) {
                kiln_dtype t = float_types[ti];
                int64_t h = hs[hi], rows = token_counts[ri];
                /* weight in the activation dtype, and once in f32 */
                kiln_dtype wt = hi == 0 ? KILN_DTYPE_F32 : t;
                buf in[3] = {buf_random(t, rows, h, -3, 3), buf_random(t, rows, h, -3, 3),
                             buf_random(wt, h, 0, 0.5f, 1.5f)};
                buf out[2] = {buf_output(t, rows, h), buf_output(t, rows, h)};
                char what[96];
                snprintf(what, sizeof what, "RMSNorm %s rows %lld h %lld", dtype_name(t), (long long)rows,
                         (long long)h);
                buf nin[2] = {in[0], in[2]};
                run_both(what, norm, nin, 2, &out[1], 1, NULL);
                cudaMemset(out[1].dev, 0xff, out[1].bytes);
                snprintf(what, sizeof what, "AddRMSNorm %s rows %lld h %lld", dtype_name(t), (long long)rows,
                         (long long)h);
                run_both(what, add, in, 3, out, 2, NULL);
                for (int i = 0; i < 3; i++)
                    buf_free(&in[i]);
                buf_free(&out[0]);
                buf_free(&out[1]);
            }
    norm->ops->destroy(norm);
    add->ops->destroy(add);
}

/* The residual stream in f32 beside 16-bit layer outputs: x and sum f32,
 * the residual, weight and y in t (the vector kernel), and once the
 * residual in f32 too (the generic kernel). */
static void test_rmsnorm_mixed(void)
{
    const int64_t hs[] = {7, 2048, 4099};
    const float eps = 1e-5f;
    const kiln_dtype half[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (size_t ti = 0; ti < 2; ti++) {
        const kiln_dtype t = half[ti];
        kiln_field f[2] = {ff32("epsilon", &eps), fstr("output_dtype", dtype_name(t))};
        kiln_plugin *norm = make("RMSNorm", f, 2), *add = make("AddRMSNorm", f, 2);
        if (!norm || !add)
            return;
        for (size_t hi = 0; hi < 3; hi++)
            for (size_t ri = 0; ri < 2; ri++)
                for (int rf = 0; rf < 1 + (hi == 1); rf++) {
                    const int64_t h = hs[hi], rows = token_counts[ri];
                    const kiln_dtype rt = rf ? KILN_DTYPE_F32 : t;
                    buf in[3] = {buf_random(KILN_DTYPE_F32, rows, h, -30, 30), buf_random(rt, rows, h, -3, 3),
                                 buf_random(t, h, 0, 0.5f, 1.5f)};
                    buf out[2] = {buf_output(KILN_DTYPE_F32, rows, h), buf_output(t, rows, h)};
                    char what[128];
                    snprintf(what, sizeof what, "RMSNorm f32 -> %s rows %lld h %lld", dtype_name(t), (long long)rows,
                             (long long)h);
                    buf nin[2] = {in[0], in[2]};
                    if (!rf)
                        run_both(what, norm, nin, 2, &out[1], 1, NULL);
                    cudaMemset(out[1].dev, 0xff, out[1].bytes);
                    snprintf(what, sizeof what, "AddRMSNorm f32 + %s -> %s rows %lld h %lld", dtype_name(rt),
                             dtype_name(t), (long long)rows, (long long)h);
                    run_both(what, add, in, 3, out, 2, NULL);
                    for (int i = 0; i < 3; i++)
                        buf_free(&in[i]);
                    buf_free(&out[0]);
                    buf_free(&out[1]);
                }
        norm->ops->destroy(norm);
        add->ops->destroy(add);
    }
}

/* ---- RoPE ----------------------------------------------------------------------------------- */

static void check_rope_heads(const char *scaling, int32_t interleaved, int32_t rotary_dim, int32_t n_heads,
                             int32_t n_kv_heads, int32_t head_dim, kiln_dtype t, int64_t tokens, int in_place)
{
    const float theta = 500000.0f, factor = 8.0f;
    kiln_field f[8] = {fi32("n_heads", &n_heads),       fi32("head_dim", &head_dim),       ff32("theta", &theta),
                       fi32("rotary_dim", &rotary_dim), fi32("interleaved", &interleaved), fstr("scaling", scaling),
                       ff32("factor", &factor),         fi32("n_kv_heads", &n_kv_heads)};
    kiln_plugin *p = make("RoPE", f, 8);
    if (!p)
        return;
    int64_t width = (int64_t)(n_heads + 2 * n_kv_heads) * head_dim;
    buf in[2] = {buf_random(t, tokens, width, -2, 2), buf_new(KILN_DTYPE_I32, tokens, 0)};
    for (int64_t i = 0; i < tokens; i++)
        ((int32_t *)in[1].host)[i] = tokens == 1 ? 4093 : (int32_t)(rng_next() % 8192);
    buf_upload(&in[1]);
    buf out = buf_output(t, tokens, width);
    char what[128];
    const char *mode = getenv("KILN_ROPE");
    snprintf(what, sizeof what, "RoPE %s interleaved %d rotary %d heads %d/%d x %d %s T %lld%s%s%s", scaling,
             interleaved, rotary_dim, n_heads, n_kv_heads, head_dim, dtype_name(t), (long long)tokens,
             in_place ? " in place" : "", mode ? ", KILN_ROPE=" : "", mode ? mode : "");
    if (in_place) {
        /* y is x: the device output is a copy of the input */
        memcpy(out.host, in[0].host, in[0].bytes);
        buf x = {.desc = in[0].desc, .host = out.host, .dev = out.dev, .bytes = out.bytes};
        cudaMemcpy(out.dev, in[0].host, in[0].bytes, cudaMemcpyHostToDevice);
        buf xin[2] = {x, in[1]};
        run_both(what, p, xin, 2, &out, 1, NULL);
    } else {
        run_both(what, p, in, 2, &out, 1, NULL);
    }
    buf_free(&in[0]);
    buf_free(&in[1]);
    buf_free(&out);
    p->ops->destroy(p);
}

static void check_rope(const char *scaling, int32_t interleaved, int32_t rotary_dim, int32_t n_kv_heads, kiln_dtype t,
                       int64_t tokens, int in_place)
{
    check_rope_heads(scaling, interleaved, rotary_dim, 6, n_kv_heads, 64, t, tokens, in_place);
}

/* Every case with the kernel the launch picks (the scalar one under 128
 * tokens, the 16-byte one from there), then with each forced
 * (KILN_ROPE=vec, =scalar). */
static void test_rope(void)
{
    static const char *const modes[] = {NULL, "vec", "scalar"};
    const char *scalings[] = {"none", "linear", "llama3"};
    for (int mi = 0; mi < 3; mi++) {
        if (modes[mi])
            setenv("KILN_ROPE", modes[mi], 1);
        for (int s = 0; s < 3; s++)
            for (int32_t inter = 0; inter < 2; inter++)
                for (size_t ti = 0; ti < 3; ti++)
                    for (size_t ri = 0; ri < 2; ri++) {
                        check_rope(scalings[s], inter, 64, 0, float_types[ti], token_counts[ri], 0);
                        check_rope(scalings[s], inter, 32, 2, float_types[ti], token_counts[ri], 0);
                    }
        check_rope("llama3", 0, 64, 2, KILN_DTYPE_BF16, 7, 1);
        check_rope("none", 1, 48, 0, KILN_DTYPE_F32, 5, 1);
        /* more rotated heads than one block's group (256 threads / 32 pairs =
         * 8 heads): two groups, and the copy slice for the v heads / the dims
         * past rotary_dim */
        check_rope("llama3", 0, 64, 4, KILN_DTYPE_BF16, 33, 0);
        check_rope("linear", 1, 48, 4, KILN_DTYPE_F16, 1, 0);
        check_rope("none", 0, 64, 4, KILN_DTYPE_F32, 9, 1);
        /* the 8B's heads (40 rotated: more than the 16-byte kernel's 16
         * heads a pass at head_dim 128 in 16 bits, 8 a pass in f32; under
         * 256 tokens the passes in blocks of their own, from 256 on in one) */
        check_rope_heads("llama3", 0, 128, 32, 8, 128, KILN_DTYPE_BF16, 33, 0);
        check_rope_heads("llama3", 0, 128, 32, 8, 128, KILN_DTYPE_BF16, 300, 0);
        check_rope_heads("llama3", 0, 128, 32, 8, 128, KILN_DTYPE_BF16, 1, 0);
        check_rope_heads("none", 1, 64, 32, 8, 128, KILN_DTYPE_F16, 130, 0);
        check_rope_heads("linear", 0, 128, 32, 8, 128, KILN_DTYPE_F32, 5, 1);
        check_rope("linear", 1, 48, 4, KILN_DTYPE_F16, 3, 0);
        unsetenv("KILN_ROPE");
    }
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

static void test_swiglu(void)
{
    const int64_t widths[] = {1, 333, 8192};
    const int32_t one = 1;
    kiln_field f = fi32("packed", &one);
    kiln_plugin *apart = make("SwiGLU", NULL, 0), *packed = make("SwiGLU", &f, 1);
    if (!apart || !packed)
        return;
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t wi = 0; wi < 3; wi++)
            for (size_t ri = 0; ri < 2; ri++) {
                kiln_dtype t = float_types[ti];
                int64_t w = widths[wi], rows = token_counts[ri];
                char what[96];
                buf in[2] = {buf_random(t, rows, w, -6, 6), buf_random(t, rows, w, -3, 3)};
                buf out = buf_output(t, rows, w);
                snprintf(what, sizeof what, "SwiGLU %s rows %lld width %lld", dtype_name(t), (long long)rows,
                         (long long)w);
                run_both(what, apart, in, 2, &out, 1, NULL);
                buf gu = buf_random(t, rows, 2 * w, -6, 6), pout = buf_output(t, rows, w);
                snprintf(what, sizeof what, "SwiGLU packed %s rows %lld width %lld", dtype_name(t), (long long)rows,
                         (long long)w);
                run_both(what, packed, &gu, 1, &pout, 1, NULL);
                buf_free(&in[0]);
                buf_free(&in[1]);
                buf_free(&out);
                buf_free(&gu);
                buf_free(&pout);
            }
    apart->ops->destroy(apart);
    packed->ops->destroy(packed);
}

/* ---- QuantMatMul ---------------------------------------------------------------------------- */

typedef struct qfmt {
    const char *name;
    size_t block_bytes;
    int has_min;
} qfmt;

/* n rows of k / 32 blocks: random quants, f16 scales as trained weights
 * have them (Q4_1's min negative). */
static buf random_blocks(const qfmt *f, int32_t n, int32_t k)
{
    const kiln_host_api *h = kiln_host();
    int64_t row = (int64_t)(k / 32) * (int64_t)f->block_bytes;
    buf b = buf_new(KILN_DTYPE_U8, n, row);
    uint8_t *p = b.host;
    for (int64_t i = 0; i < (int64_t)n * (k / 32); i++) {
        uint8_t *blk = p + i * (int64_t)f->block_bytes;
        for (size_t j = 0; j < f->block_bytes; j++)
            blk[j] = (uint8_t)rng_next();
        uint16_t d = h->float_to_half(rng_float(0.001f, 0.05f));
        blk[0] = (uint8_t)d, blk[1] = (uint8_t)(d >> 8);
        if (f->has_min) {
            uint16_t m = h->float_to_half(rng_float(-0.4f, 0.0f));
            blk[2] = (uint8_t)m, blk[3] = (uint8_t)(m >> 8);
        }
    }
    buf_upload(&b);
    return b;
}

/* n rows of k / 256 K-format super-blocks: random bytes (quants, packed
 * sub-scales, Q6_K's int8 sub-scales) with f16 super-block scales of
 * trained magnitudes (Q4_K/Q5_K: d, dmin at bytes 0-3; Q6_K: d last). */
static buf random_kblocks(const qfmt *f, int32_t n, int32_t k)
{
    const kiln_host_api *h = kiln_host();
    int64_t row = (int64_t)(k / 256) * (int64_t)f->block_bytes;
    buf b = buf_new(KILN_DTYPE_U8, n, row);
    uint8_t *p = b.host;
    for (int64_t i = 0; i < (int64_t)n * (k / 256); i++) {
        uint8_t *blk = p + i * (int64_t)f->block_bytes;
        for (size_t j = 0; j < f->block_bytes; j++)
            blk[j] = (uint8_t)rng_next();
        size_t at = f->block_bytes == 210 ? 208 : 0;
        uint16_t d = h->float_to_half(rng_float(0.0005f, 0.003f));
        blk[at] = (uint8_t)d, blk[at + 1] = (uint8_t)(d >> 8);
        if (f->has_min) {
            uint16_t m = h->float_to_half(rng_float(0.0005f, 0.003f));
            blk[2] = (uint8_t)m, blk[3] = (uint8_t)(m >> 8);
        }
    }
    buf_upload(&b);
    return b;
}

/* The K formats: k a multiple of 256; the K GEMV up to 16 rows (in groups
 * of 8) and the tiled kernel past it. */
static void test_qmatmul_k(void)
{
    const qfmt fmts[] = {{"Q4_K", 144, 1}, {"Q5_K", 176, 1}, {"Q6_K", 210, 0}};
    const int32_t shapes[][2] = {{7, 256}, {257, 2048}, {130, 4352}};
    const int64_t ts[] = {1, 3, 9, 16, 17, 200};
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t si = 0; si < 3; si++) {
            int32_t n = shapes[si][0], k = shapes[si][1];
            kiln_field f[3] = {fstr("format", fmts[fi].name), fi32("n", &n), fi32("k", &k)};
            kiln_plugin *p = make("QuantMatMul", f, 3);
            if (!p)
                continue;
            buf w = random_kblocks(&fmts[fi], n, k);
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t ri = 0; ri < sizeof ts / sizeof ts[0]; ri++) {
                    kiln_dtype t = float_types[ti];
                    int64_t rows = ts[ri];
                    buf in[2] = {buf_random(t, rows, k, -1, 1), w};
                    buf out = buf_output(t, rows, n);
                    kiln_tensor_desc d[3] = {in[0].desc, w.desc, out.desc};
                    size_t wsz = p->ops->workspace_size ? p->ops->workspace_size(p, d, 2, d + 2, 1) : 0;
                    void *ws = malloc(wsz ? wsz : 1);
                    char what[96];
                    snprintf(what, sizeof what, "QuantMatMul %s %s T %lld n %d k %d", fmts[fi].name, dtype_name(t),
                             (long long)rows, n, k);
                    run_both(what, p, in, 2, &out, 1, ws);
                    free(ws);
                    buf_free(&in[0]);
                    buf_free(&out);
                }
            buf_free(&w);
            p->ops->destroy(p);
        }
}

static void test_qmatmul(void)
{
    const qfmt fmts[] = {{"Q8_0", 34, 0}, {"Q4_0", 18, 0}, {"Q4_1", 20, 1}};
    /* k = 2048 (rows of 16-byte multiples: the GEMV's vector loads), k = 96
     * and 4128 (not a multiple of 256: byte loads); n odd and not a
     * multiple of the rows per warp or block */
    const int32_t shapes[][2] = {{7, 96}, {257, 2048}, {130, 4128}};
    const int64_t ts[] = {1, 3, 16, 17, 512};
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t si = 0; si < 3; si++) {
            int32_t n = shapes[si][0], k = shapes[si][1];
            kiln_field f[3] = {fstr("format", fmts[fi].name), fi32("n", &n), fi32("k", &k)};
            kiln_plugin *p = make("QuantMatMul", f, 3);
            if (!p)
                continue;
            buf w = random_blocks(&fmts[fi], n, k);
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t ri = 0; ri < sizeof ts / sizeof ts[0]; ri++) {
                    kiln_dtype t = float_types[ti];
                    int64_t rows = ts[ri];
                    buf in[2] = {buf_random(t, rows, k, -1, 1), w};
                    buf out = buf_output(t, rows, n);
                    kiln_tensor_desc d[3] = {in[0].desc, w.desc, out.desc};
                    size_t wsz = p->ops->workspace_size ? p->ops->workspace_size(p, d, 2, d + 2, 1) : 0;
                    void *ws = malloc(wsz ? wsz : 1);
                    char what[96];
                    snprintf(what, sizeof what, "QuantMatMul %s %s T %lld n %d k %d", fmts[fi].name, dtype_name(t),
                             (long long)rows, n, k);
                    run_both(what, p, in, 2, &out, 1, ws);
                    free(ws);
                    buf_free(&in[0]);
                    buf_free(&out);
                }
            buf_free(&w);
            p->ops->destroy(p);
        }
}

/* ---- WeightOnlyMatMul ------------------------------------------------------------------------ */

/* Random quantized weights in WeightOnlyMatMul's layout: q all bytes, f32
 * scales of trained magnitudes, int4 zeros 0..15. */
static void random_woq(int32_t bits, int32_t group, int32_t n, int32_t k, buf *q, buf *s, buf *z)
{
    int32_t ng = k / group;
    *q = buf_new(KILN_DTYPE_U8, n, (int64_t)k * bits / 8);
    for (size_t i = 0; i < q->bytes; i++)
        ((uint8_t *)q->host)[i] = (uint8_t)rng_next();
    *s = buf_new(KILN_DTYPE_F32, n, ng);
    for (int64_t i = 0; i < (int64_t)n * ng; i++)
        ((float *)s->host)[i] = rng_float(0.001f, 0.05f);
    *z = buf_new(KILN_DTYPE_U8, n, ng);
    for (int64_t i = 0; i < (int64_t)n * ng; i++)
        ((uint8_t *)z->host)[i] = (uint8_t)(rng_next() % 16);
    buf_upload(q);
    buf_upload(s);
    buf_upload(z);
}

/* One WeightOnlyMatMul case: x [rows, k] of dtype t on both sides, with
 * KILN_WOQ_GEMV, KILN_WOQ_GEMV_SPLIT and KILN_WOQ_GEMV_SUMROW set to
 * env[0], env[1] and env[2] where not NULL. */
static void run_woq(kiln_plugin *p, int32_t bits, int32_t g, int32_t n, int32_t k, buf q, buf s, buf z, kiln_dtype t,
                    int64_t rows, const char *const env[3])
{
    static const char *const names[3] = {"KILN_WOQ_GEMV", "KILN_WOQ_GEMV_SPLIT", "KILN_WOQ_GEMV_SUMROW"};
    int32_t n_in = bits == 4 ? 4 : 3;
    buf in[4] = {buf_random(t, rows, k, -1, 1), q, s, z};
    buf out = buf_output(t, rows, n);
    kiln_tensor_desc d[5] = {in[0].desc, q.desc, s.desc, z.desc};
    d[n_in] = out.desc;
    size_t wsz = p->ops->workspace_size(p, d, n_in, d + n_in, 1);
    void *ws = malloc(wsz ? wsz : 1), *ws_dev = NULL;
    if (cudaMalloc(&ws_dev, wsz ? wsz : 1) != cudaSuccess) {
        fprintf(stderr, "cannot allocate the workspace\n");
        exit(1);
    }
    char what[224];
    int len = snprintf(what, sizeof what, "WeightOnlyMatMul int%d g%d %s T %lld n %d k %d", bits, g, dtype_name(t),
                       (long long)rows, n, k);
    for (int i = 0; i < 3; i++)
        if (env[i]) {
            len += snprintf(what + len, sizeof what - (size_t)len, " %s=%s", names[i], env[i]);
            setenv(names[i], env[i], 1);
        }
    run_both_ws(what, p, in, n_in, &out, 1, ws, ws_dev);
    for (int i = 0; i < 3; i++)
        unsetenv(names[i]);
    free(ws);
    cudaFree(ws_dev);
    buf_free(&in[0]);
    buf_free(&out);
}

static void test_woq(void)
{
    /* n odd, below and past the 16 rows of the tensor-core GEMV's warp
     * tile; k from one warp's share of a vector up to 14336 (there that
     * GEMV splits k over 16 warps of 7 chunks, past its 4 in flight); groups
     * of 32 and 64 (int4: the f32 GEMV, as a chunk of the tensor-core one
     * spans 128 weights; int8 64 is the tensor-core one's), 128 and the
     * whole row (per channel) */
    const int32_t shapes[][3] = {{7, 96, 32},   {257, 2048, 128}, {130, 4096, 4096}, {33, 640, 128},
                                 {9, 256, 128}, {5, 192, 64},     {61, 14336, 128}};
    /* past 8 rows: the tensor-core GEMV over groups of 8 up to 32 rows
     * (bf16/f16 x, groups of whole chunks), else (and from 33) W
     * dequantized into the workspace and cuBLASLt's GEMM */
    const int64_t ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 32, 33, 64, 128, 300};
    /* the GEMVs (KILN_WOQ_GEMV) for bf16 and f16 x at T 1, 5 and 8 (the
     * default choice, the pipelined tensor-core one, at every T): the f32
     * one, the older tensor-core one with 32 rows a warp, and with 16 warps
     * a block (KILN_WOQ_GEMV_SPLIT), which leaves some without chunks, and
     * the pipelined one with 16 rows a warp over 16 warps and with 32 rows
     * over 3 (runs of unequal length), with and without the sum row
     * (KILN_WOQ_GEMV_SUMROW) */
    const char *const gemv[][3] = {{NULL, NULL, NULL},   {"f32", NULL, NULL},   {"tc32", NULL, NULL},
                                   {"tc16", "16", NULL}, {"pipe16", "16", "0"}, {"pipe16", "16", "1"},
                                   {"pipe32", "3", "0"}, {"pipe32", "3", "1"}};
    const int32_t bits_of[] = {8, 4};
    for (size_t bi = 0; bi < 2; bi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int32_t bits = bits_of[bi], n = shapes[si][0], k = shapes[si][1], g = shapes[si][2];
            kiln_field f[4] = {fi32("bits", &bits), fi32("group_size", &g), fi32("n", &n), fi32("k", &k)};
            kiln_plugin *p = make("WeightOnlyMatMul", f, 4);
            if (!p)
                continue;
            buf q, s, z;
            random_woq(bits, g, n, k, &q, &s, &z);
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t ri = 0; ri < sizeof ts / sizeof ts[0]; ri++)
                    for (size_t v = 0; v < sizeof gemv / sizeof gemv[0]; v++) {
                        kiln_dtype t = float_types[ti];
                        int64_t rows = ts[ri];
                        if (v > 0 && (t == KILN_DTYPE_F32 || (rows != 1 && rows != 5 && rows != 8)))
                            continue;
                        run_woq(p, bits, g, n, k, q, s, z, t, rows, gemv[v]);
                    }
            buf_free(&q);
            buf_free(&s);
            buf_free(&z);
            p->ops->destroy(p);
        }
    /* the decode GEMV at the 8B engine's layer sizes, where the pipelined
     * one picks its tile and k split as on the real layers (on an H200,
     * int4: n 6000 is 194 tiles of 31 rows and the sum row with k split
     * over 8 warps, as the qkv projection; 4096, the o projection, 128
     * whole tiles of 32 rows over 16 warps; 1000 is 67 tiles of 15 rows and
     * the sum row with k 14336 over 16); n not a multiple of the tiles;
     * int4 g128 and int8 per channel; T 1, 2, 4 and 8 (bf16; f16 at 1 and
     * 8); and at T 1 and 8 (bf16) each tile with and without the sum row */
    const int32_t decode[][2] = {{6000, 4096}, {4096, 4096}, {1000, 14336}};
    const char *const forced[][3] = {
        {"pipe16", NULL, "0"}, {"pipe16", NULL, "1"}, {"pipe32", NULL, "0"}, {"pipe32", NULL, "1"}};
    const char *const plain[3] = {NULL, NULL, NULL};
    const int64_t dts[] = {1, 2, 4, 8};
    for (size_t bi = 0; bi < 2; bi++)
        for (size_t si = 0; si < sizeof decode / sizeof decode[0]; si++) {
            int32_t bits = bits_of[bi], n = decode[si][0], k = decode[si][1], g = bits == 4 ? 128 : k;
            kiln_field f[4] = {fi32("bits", &bits), fi32("group_size", &g), fi32("n", &n), fi32("k", &k)};
            kiln_plugin *p = make("WeightOnlyMatMul", f, 4);
            if (!p)
                continue;
            buf q, s, z;
            random_woq(bits, g, n, k, &q, &s, &z);
            for (size_t ri = 0; ri < sizeof dts / sizeof dts[0]; ri++) {
                run_woq(p, bits, g, n, k, q, s, z, KILN_DTYPE_BF16, dts[ri], plain);
                if (dts[ri] == 1 || dts[ri] == 8)
                    run_woq(p, bits, g, n, k, q, s, z, KILN_DTYPE_F16, dts[ri], plain);
            }
            for (size_t v = 0; v < sizeof forced / sizeof forced[0]; v++)
                for (size_t ri = 0; ri < sizeof dts / sizeof dts[0]; ri += 3)
                    run_woq(p, bits, g, n, k, q, s, z, KILN_DTYPE_BF16, dts[ri], forced[v]);
            buf_free(&q);
            buf_free(&s);
            buf_free(&z);
            p->ops->destroy(p);
        }
    /* W past KILN_WOQ_SLICE_BYTES in x's dtype: dequantized and multiplied
     * in two slices, the second's columns of y from 8320 on (f32 x, whose
     * dequantized weights are the CPU's exactly, so the tolerance is the
     * summation order's) */
    for (size_t bi = 0; bi < 2; bi++) {
        int32_t bits = bits_of[bi], n = 16500, k = 4096, g = bits == 4 ? 128 : k;
        kiln_field f[4] = {fi32("bits", &bits), fi32("group_size", &g), fi32("n", &n), fi32("k", &k)};
        kiln_plugin *p = make("WeightOnlyMatMul", f, 4);
        if (!p)
            continue;
        buf in[4];
        in[0] = buf_random(KILN_DTYPE_F32, 9, k, -1, 1);
        random_woq(bits, g, n, k, &in[1], &in[2], &in[3]);
        int32_t n_in = bits == 4 ? 4 : 3;
        buf out = buf_output(KILN_DTYPE_F32, 9, n);
        kiln_tensor_desc d[5] = {in[0].desc, in[1].desc, in[2].desc, in[3].desc};
        d[n_in] = out.desc;
        size_t wsz = p->ops->workspace_size(p, d, n_in, d + n_in, 1);
        void *ws_dev = NULL;
        if (cudaMalloc(&ws_dev, wsz ? wsz : 1) != cudaSuccess) {
            fprintf(stderr, "cannot allocate the workspace\n");
            exit(1);
        }
        char what[96];
        snprintf(what, sizeof what, "WeightOnlyMatMul int%d g%d f32 T 9 n %d k %d (two slices)", bits, g, n, k);
        run_both_ws(what, p, in, n_in, &out, 1, NULL, ws_dev);
        cudaFree(ws_dev);
        for (int i = 0; i < 4; i++)
            buf_free(&in[i]);
        buf_free(&out);
        p->ops->destroy(p);
    }
}

/* ---- Fp8MatMul --------------------------------------------------------------------------------- */

/* E4M3 codes of every finite value (NaN codes nudged to their neighbour)
 * and per-channel scales. */
static void random_fp8(int32_t n, int32_t k, buf *w, buf *s)
{
    *w = buf_new(KILN_DTYPE_U8, n, k);
    uint8_t *p = w->host;
    for (size_t i = 0; i < w->bytes; i++) {
        p[i] = (uint8_t)rng_next();
        if ((p[i] & 0x7F) == 0x7F)
            p[i] ^= 1;
    }
    *s = buf_new(KILN_DTYPE_F32, n, 0);
    for (int32_t i = 0; i < n; i++)
        ((float *)s->host)[i] = rng_float(0.001f, 0.01f);
    buf_upload(w);
    buf_upload(s);
}

static void workspaces(size_t bytes, void **host, void **dev);

static void test_fp8(void)
{
    /* n a multiple of 4 (cuBLASLt's GEMM past 8 rows) and not (the GEMV
     * over row groups); k past 32,768 (40,000): the quantization's scalar
     * kernel, 8,192 and 28,672: its 16-byte kernel with 2 and 8 pieces a
     * thread */
    const int32_t shapes[][2] = {{16, 64},   {5, 48},       {256, 2048}, {100, 4096}, {40, 8192},
                                 {33, 4096}, {1000, 14336}, {12, 28672}, {8, 40000}};
    const int64_t ts[] = {1, 2, 5, 8, 9, 64, 300};
    const int nts = (int)(sizeof ts / sizeof ts[0]);
    /* decode rows through the one-kernel GEMV (the default) and the
     * quantize-then-GEMV pair (KILN_FP8_GEMV=split, 1, 2, 5, 8 rows); past
     * 8 rows the GEMM with its scales in cuBLASLt's epilogue (the
     * default), with the f32 result and the scale kernel
     * (KILN_FP8_GEMM=f32) and with the scalar quantization kernel
     * (KILN_FP8_QUANT=scalar) and with cuBLASLt's fast accumulation
     * (KILN_FP8_FAST_ACCUM=1: the tensor cores' own precision, so the
     * tolerance is 1e-2 of the result's norm, which still tells a wrong
     * layout or scale from rounding) */
    static const struct {
        const char *env, *value;
        int first;  /* the first of ts the variant runs */
        double tol; /* > 0: the least tolerance */
    } variants[] = {{"KILN_FP8_GEMV", "split", 0, 0},
                    {"KILN_FP8_GEMM", "f32", 4, 0},
                    {"KILN_FP8_QUANT", "scalar", 4, 0},
                    {"KILN_FP8_FAST_ACCUM", "1", 4, 1e-2}};
    const int nv = (int)(sizeof variants / sizeof variants[0]);
    cpu_pool = kiln_threadpool_global();
    tol_floor = 1e-3;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int32_t n = shapes[si][0], k = shapes[si][1];
        kiln_field f[2] = {fi32("n", &n), fi32("k", &k)};
        kiln_plugin *p = make("Fp8MatMul", f, 2);
        if (!p)
            continue;
        buf w, s;
        random_fp8(n, k, &w, &s);
        for (size_t ti = 0; ti < 3; ti++)
            for (int vi = -1; vi < nv; vi++) {
                const int from = vi < 0 ? 0 : variants[vi].first, to = vi < 0 || from + 4 > nts ? nts : from + 4;
                for (int ri = from; ri < to; ri++) {
                    kiln_dtype t = float_types[ti];
                    int64_t rows = ts[ri];
                    if (n * (int64_t)k > 4096 * 4096 && rows > 8)
                        continue; /* the large shape is a decode shape */
                    if (vi >= 0)
                        setenv(variants[vi].env, variants[vi].value, 1);
                    tol_floor = vi >= 0 && variants[vi].tol > 0 ? variants[vi].tol : 1e-3;
                    buf in[3] = {buf_random(t, rows, k, -2, 2), w, s};
                    buf out = buf_output(t, rows, n);
                    kiln_tensor_desc d[4] = {in[0].desc, w.desc, s.desc, out.desc};
                    size_t wsz = p->ops->workspace_size(p, d, 3, d + 3, 1);
                    void *ws_host = malloc(wsz ? wsz : 1), *ws_dev = NULL;
                    if (cudaMalloc(&ws_dev, wsz ? wsz : 1) != cudaSuccess) {
                        fprintf(stderr, "cannot allocate the workspace\n");
                        exit(1);
                    }
                    char what[112];
                    snprintf(what, sizeof what, "Fp8MatMul %s T %lld n %d k %d%s%s%s%s", dtype_name(t), (long long)rows,
                             n, k, vi >= 0 ? ", " : "", vi >= 0 ? variants[vi].env : "", vi >= 0 ? "=" : "",
                             vi >= 0 ? variants[vi].value : "");
                    run_both_ws(what, p, in, 3, &out, 1, ws_host, ws_dev);
                    if (vi >= 0)
                        unsetenv(variants[vi].env);
                    free(ws_host);
                    cudaFree(ws_dev);
                    buf_free(&in[0]);
                    buf_free(&out);
                }
            }
        buf_free(&w);
        buf_free(&s);
        p->ops->destroy(p);
    }
    tol_floor = 1e-3;
    /* a wide weight (n >= 16,384) past 2,048 rows: the GEMM in pieces of
     * 2,048 rows and a remainder (the default), and whole
     * (KILN_FP8_GEMM_PIECES=0) */
    {
        int32_t n = 16384, k = 64;
        kiln_field f[2] = {fi32("n", &n), fi32("k", &k)};
        kiln_plugin *p = make("Fp8MatMul", f, 2);
        buf w, s;
        if (p)
            random_fp8(n, k, &w, &s);
        const int64_t wide_rows[2] = {2148, 4103};
        for (int ri = 0; p && ri < 2; ri++)
            for (int whole = 0; whole < 2; whole++) {
                const kiln_dtype t = ri ? KILN_DTYPE_F32 : KILN_DTYPE_BF16;
                if (whole)
                    setenv("KILN_FP8_GEMM_PIECES", "0", 1);
                buf in[3] = {buf_random(t, wide_rows[ri], k, -2, 2), w, s};
                buf out = buf_output(t, wide_rows[ri], n);
                kiln_tensor_desc d[4] = {in[0].desc, w.desc, s.desc, out.desc};
                size_t wsz = p->ops->workspace_size(p, d, 3, d + 3, 1);
                void *ws_host = NULL, *ws_dev = NULL;
                workspaces(wsz, &ws_host, &ws_dev);
                char what[112];
                snprintf(what, sizeof what, "Fp8MatMul %s T %lld n %d k %d%s", dtype_name(t), (long long)wide_rows[ri],
                         n, k, whole ? ", KILN_FP8_GEMM_PIECES=0" : ", in pieces");
                run_both_ws(what, p, in, 3, &out, 1, ws_host, ws_dev);
                unsetenv("KILN_FP8_GEMM_PIECES");
                free(ws_host);
                cudaFree(ws_dev);
                buf_free(&in[0]);
                buf_free(&out);
            }
        if (p) {
            buf_free(&w);
            buf_free(&s);
            p->ops->destroy(p);
        }
    }
    tol_floor = 0;
    cpu_pool = NULL;
}

/* ---- E4M3 activations handed to Fp8MatMul ---------------------------------------------------- */

/* A device and a host workspace of `bytes` (at least 1). */
/* What cuBLASLt's fast FP8 accumulation (KILN_FP8_FAST_ACCUM=1) costs at
 * the 8B's down and qkv shapes, 512 rows: the relative error against the
 * CPU reference printed beside the default's (partial sums promoted to
 * f32), for bench/README.md's question whether it can be the default;
 * checked only against the op tests' 1e-2 for it. x and y in f32, so that
 * the rounding of a 16-bit y does not hide the sums' error (both sides
 * quantize x to the same codes); an outlier (20x) every 97th element of
 * x, as LLM activations have. */
static void test_fp8_accum(void)
{
    const int32_t shapes[][2] = {{4096, 14336}, {6144, 4096}};
    const double floor0 = tol_floor;
    cpu_pool = kiln_threadpool_global();
    report_err = 1;
    for (int si = 0; si < 2; si++) {
        int32_t n = shapes[si][0], k = shapes[si][1];
        kiln_field f[2] = {fi32("n", &n), fi32("k", &k)};
        kiln_plugin *p = make("Fp8MatMul", f, 2);
        if (!p)
            continue;
        buf w, sc;
        random_fp8(n, k, &w, &sc);
        buf x = buf_random(KILN_DTYPE_F32, 512, k, -2, 2);
        for (int64_t i = 0; i < count(&x); i += 97)
            ((float *)x.host)[i] *= 20.0f;
        buf_upload(&x);
        for (int fast = 0; fast < 2; fast++) {
            if (fast)
                setenv("KILN_FP8_FAST_ACCUM", "1", 1);
            tol_floor = 1e-2;
            buf in[3] = {x, w, sc};
            buf out = buf_output(KILN_DTYPE_F32, 512, n);
            kiln_tensor_desc d[4] = {x.desc, w.desc, sc.desc, out.desc};
            void *ws_host = NULL, *ws_dev = NULL;
            workspaces(p->ops->workspace_size(p, d, 3, d + 3, 1), &ws_host, &ws_dev);
            char what[112];
            snprintf(what, sizeof what, "Fp8MatMul f32 T 512 n %d k %d, %s", n, k,
                     fast ? "fast accumulation" : "partial sums promoted to f32");
            run_both_ws(what, p, in, 3, &out, 1, ws_host, ws_dev);
            unsetenv("KILN_FP8_FAST_ACCUM");
            free(ws_host);
            cudaFree(ws_dev);
            buf_free(&out);
        }
        buf_free(&x);
        buf_free(&w);
        buf_free(&sc);
        p->ops->destroy(p);
    }
    report_err = 0;
    tol_floor = floor0;
    cpu_pool = NULL;
}

static void workspaces(size_t bytes, void **host, void **dev)
{
    *host = malloc(bytes ? bytes : 1);
    if (cudaMalloc(dev, bytes ? bytes : 1) != cudaSuccess) {
        fprintf(stderr, "cannot allocate the workspace\n");
        exit(1);
    }
}

/* RMSNorm / AddRMSNorm with quantize = fp8, x of xt, y's values in yt;
 * amax > 0: a static scale (field x_amax; y's values pass it, saturating). */
static void check_norm_q8(int add, kiln_dtype xt, kiln_dtype yt, int64_t rows, int64_t h, float amax)
{
    const float eps = 1e-5f;
    kiln_field f[4] = {ff32("epsilon", &eps), fstr("output_dtype", dtype_name(yt)), fstr("quantize", "fp8"),
                       ff32("x_amax", &amax)};
    kiln_plugin *p = make(add ? "AddRMSNorm" : "RMSNorm", f, amax > 0.0f ? 4 : 3);
    if (!p)
        return;
    buf in[3] = {buf_random(xt, rows, h, -30, 30), buf_random(yt, rows, h, -3, 3), buf_random(yt, h, 0, 0.5f, 1.5f)};
    buf out[3] = {buf_output(xt, rows, h), buf_output(KILN_DTYPE_U8, rows, h), buf_output(KILN_DTYPE_F32, rows, 1)};
    buf nin[2] = {in[0], in[2]};
    kiln_tensor_desc d[6] = {in[0].desc, in[add].desc, in[2].desc};
    if (!add)
        d[1] = in[2].desc;
    for (int i = 0; i < 2 + add; i++)
        d[2 + add + i] = out[i + !add].desc;
    void *wh, *wd;
    workspaces(p->ops->workspace_size(p, d, 2 + add, d + 2 + add, 2 + add), &wh, &wd);
    char what[112];
    snprintf(what, sizeof what, "%s %s -> %s quantize fp8 rows %lld h %lld amax %g", add ? "AddRMSNorm" : "RMSNorm",
             dtype_name(xt), dtype_name(yt), (long long)rows, (long long)h, (double)amax);
    run_both_ws(what, p, add ? in : nin, 2 + add, out + !add, 2 + add, wh, wd);
    free(wh);
    cudaFree(wd);
    for (int i = 0; i < 3; i++) {
        buf_free(&in[i]);
        buf_free(&out[i]);
    }
    p->ops->destroy(p);
}

/* SwiGLU with quantize = fp8, apart or packed; amax > 0 as check_norm_q8. */
static void check_swiglu_q8(int packed, kiln_dtype t, int64_t rows, int64_t width, float amax)
{
    const int32_t pk = packed;
    kiln_field f[3] = {fi32("packed", &pk), fstr("quantize", "fp8"), ff32("x_amax", &amax)};
    kiln_plugin *p = make("SwiGLU", f, amax > 0.0f ? 3 : 2);
    if (!p)
        return;
    buf in[2] = {buf_random(t, rows, packed ? 2 * width : width, -6, 6), buf_random(t, rows, width, -6, 6)};
    buf out[2] = {buf_output(KILN_DTYPE_U8, rows, width), buf_output(KILN_DTYPE_F32, rows, 1)};
    const int32_t ni = packed ? 1 : 2;
    kiln_tensor_desc d[4] = {in[0].desc, in[1].desc};
    d[ni] = out[0].desc, d[ni + 1] = out[1].desc;
    void *wh, *wd;
    workspaces(p->ops->workspace_size(p, d, ni, d + ni, 2), &wh, &wd);
    char what[112];
    snprintf(what, sizeof what, "SwiGLU%s %s quantize fp8 rows %lld width %lld amax %g", packed ? " packed" : "",
             dtype_name(t), (long long)rows, (long long)width, (double)amax);
    run_both_ws(what, p, in, ni, out, 2, wh, wd);
    free(wh);
    cudaFree(wd);
    for (int i = 0; i < 2; i++) {
        buf_free(&in[i]);
        buf_free(&out[i]);
    }
    p->ops->destroy(p);
}

/* Fp8MatMul quantizing its x with a static scale (x_amax 1.5, x in
 * [-2, 2]: some values saturate). */
static void check_fp8_static(kiln_dtype t, int32_t n, int32_t k, int64_t rows)
{
    const float amax = 1.5f;
    kiln_field f[3] = {fi32("n", &n), fi32("k", &k), ff32("x_amax", &amax)};
    kiln_plugin *p = make("Fp8MatMul", f, 3);
    if (!p)
        return;
    buf in[3];
    random_fp8(n, k, &in[1], &in[2]);
    in[0] = buf_random(t, rows, k, -2, 2);
    buf y = buf_output(t, rows, n);
    kiln_tensor_desc d[4] = {in[0].desc, in[1].desc, in[2].desc, y.desc};
    void *wh, *wd;
    workspaces(p->ops->workspace_size(p, d, 3, d + 3, 1), &wh, &wd);
    char what[112];
    snprintf(what, sizeof what, "Fp8MatMul x_amax %g %s T %lld n %d k %d", (double)amax, dtype_name(t), (long long)rows,
             n, k);
    tol_floor = 1e-3;
    cpu_pool = kiln_threadpool_global();
    run_both_ws(what, p, in, 3, &y, 1, wh, wd);
    tol_floor = 0;
    cpu_pool = NULL;
    free(wh);
    cudaFree(wd);
    for (int i = 0; i < 3; i++)
        buf_free(&in[i]);
    buf_free(&y);
    p->ops->destroy(p);
}

/* Fp8MatMul with x given as E4M3 codes and row scales (its fourth input),
 * y in yt. */
static void check_fp8_q8(kiln_dtype yt, int32_t n, int32_t k, int64_t rows)
{
    kiln_field f[3] = {fi32("n", &n), fi32("k", &k), fstr("output_dtype", dtype_name(yt))};
    kiln_plugin *p = make("Fp8MatMul", f, 3);
    if (!p)
        return;
    buf in[4];
    random_fp8(n, k, &in[1], &in[2]);
    in[0] = buf_new(KILN_DTYPE_U8, rows, k);
    in[3] = buf_new(KILN_DTYPE_F32, rows, 1);
    uint8_t *q = in[0].host;
    for (size_t i = 0; i < in[0].bytes; i++) {
        q[i] = (uint8_t)rng_next();
        if ((q[i] & 0x7F) == 0x7F)
            q[i] ^= 1;
    }
    for (int64_t r = 0; r < rows; r++)
        ((float *)in[3].host)[r] = rng_float(0.001f, 0.05f);
    buf_upload(&in[0]);
    buf_upload(&in[3]);
    buf y = buf_output(yt, rows, n);
    kiln_tensor_desc d[5] = {in[0].desc, in[1].desc, in[2].desc, in[3].desc, y.desc};
    void *wh, *wd;
    workspaces(p->ops->workspace_size(p, d, 4, d + 4, 1), &wh, &wd);
    char what[112];
    snprintf(what, sizeof what, "Fp8MatMul on E4M3 x -> %s T %lld n %d k %d", dtype_name(yt), (long long)rows, n, k);
    tol_floor = 1e-3;
    cpu_pool = kiln_threadpool_global();
    run_both_ws(what, p, in, 4, &y, 1, wh, wd);
    tol_floor = 0;
    cpu_pool = NULL;
    free(wh);
    cudaFree(wd);
    for (int i = 0; i < 4; i++)
        buf_free(&in[i]);
    buf_free(&y);
    p->ops->destroy(p);
}

/* The FP8 engine's layers: norms and SwiGLU quantize the y they write
 * (in registers: rows up to 8,192 values in 16 bits, 4,096 in f32 for
 * the norm; SwiGLU's rows over clusters of 1 (width 200) to 8 blocks (all
 * widths here but 333); at widths not a multiple of a vector, and rows
 * past the norm's registers, y in the workspace and Fp8MatMul's
 * quantization kernels), and Fp8MatMul takes the codes (the GEMV up to 8 rows, the GEMM
 * past it). Each also inside a graph. */
static void test_fp8_input(void)
{
    const int64_t hs[] = {7, 2048, 4096, 12288}, ws_[] = {333, 8192, 14336, 20000, 200};
    const kiln_dtype pairs[][2] = {{KILN_DTYPE_F32, KILN_DTYPE_BF16},
                                   {KILN_DTYPE_F32, KILN_DTYPE_F16},
                                   {KILN_DTYPE_BF16, KILN_DTYPE_BF16},
                                   {KILN_DTYPE_F32, KILN_DTYPE_F32}};
    for (int g = 0; g < 2; g++) {
        use_graph = g;
        for (int add = 0; add < 2; add++)
            for (size_t pi = 0; pi < 4; pi++)
                for (size_t hi = 0; hi < 4; hi++)
                    for (size_t ri = 0; ri < 2; ri++)
                        if (!g || (pi == 0 && hi == 2))
                            check_norm_q8(add, pairs[pi][0], pairs[pi][1], token_counts[ri], hs[hi], 0.0f);
        for (int packed = 0; packed < 2; packed++)
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t wi = 0; wi < 5; wi++)
                    for (size_t ri = 0; ri < 2; ri++)
                        if (!g || (packed && ti == 2 && wi == 2))
                            check_swiglu_q8(packed, float_types[ti], token_counts[ri], ws_[wi], 0.0f);
        /* the row's blocks forced (KILN_SWIGLU_Q8_BLOCKS): a block a row
         * with up to 8 vectors a thread, and clusters the width alone
         * would not choose */
        for (int nb = 1; nb <= 3 && !g; nb++) {
            char v[4];
            snprintf(v, sizeof v, "%d", nb);
            setenv("KILN_SWIGLU_Q8_BLOCKS", v, 1);
            for (size_t wi = 0; wi < 5; wi++)
                for (size_t ri = 0; ri < 2; ri++)
                    check_swiglu_q8(1, KILN_DTYPE_BF16, token_counts[ri], ws_[wi], 0.0f);
            unsetenv("KILN_SWIGLU_Q8_BLOCKS");
        }
        /* static scales (calibration): y's values pass them and saturate */
        for (size_t ri = 0; ri < 2; ri++) {
            check_norm_q8(1, KILN_DTYPE_F32, KILN_DTYPE_BF16, token_counts[ri], 4096, 1.5f);
            check_norm_q8(0, KILN_DTYPE_F32, KILN_DTYPE_BF16, token_counts[ri], 7, 1.5f);
            check_swiglu_q8(1, KILN_DTYPE_BF16, token_counts[ri], 14336, 10.0f);
            check_swiglu_q8(1, KILN_DTYPE_BF16, token_counts[ri], 333, 10.0f);
            for (int32_t k = 2048; k <= 14336 && !g; k *= 7)
                check_fp8_static(KILN_DTYPE_BF16, 256, k, token_counts[ri]);
        }
        const int32_t shapes[][2] = {{256, 2048}, {33, 4096}, {1000, 14336}, {12, 28672}};
        const int64_t ts[] = {1, 2, 5, 8, 9, 64, 300};
        for (size_t si = 0; si < 4; si++)
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t ri = 0; ri < sizeof ts / sizeof ts[0]; ri++) {
                    if ((int64_t)shapes[si][0] * shapes[si][1] > 4096 * 4096 && ts[ri] > 8)
                        continue; /* the large shapes are decode shapes */
                    if (!g || (si == 0 && ti == 2 && (ts[ri] == 1 || ts[ri] == 64)))
                        check_fp8_q8(float_types[ti], shapes[si][0], shapes[si][1], ts[ri]);
                }
    }
    use_graph = 0;
}

/* ---- FusedMatMul ---------------------------------------------------------------------------- */

/* 1: the FusedMatMul cases below take W as E4M3 codes with row scales
 * (weights = fp8; random_fp8) instead of values of t */
static int fused_fp8;
/* with fused_fp8: > 0, a static max |x| (the field x_amax) */
static float fused_amax;

static void random_fp8(int32_t n, int32_t k, buf *w, buf *s);

/* One FusedMatMul case: the GEMV at 1, 2, 4 and 8 rows (the RMSNorm with
 * no epilogue or with SwiGLU, the residual add without the norm), the
 * unfused kernels with cuBLASLt at any other row count or form. w in t;
 * st is t or f32, the dtype of x with the norm and of the residual and y
 * with the residual add (an f32 residual stream); f32_out (epilogue
 * none): y in f32, unrounded (an LLM's logits). */
static void check_fused_matmul(kiln_dtype t, kiln_dtype st, int32_t n, int32_t k, int32_t norm, const char *epilogue,
                               int64_t rows, int f32_out)
{
    const float eps = 1e-5f;
    const int swiglu = strcmp(epilogue, "swiglu") == 0, residual = strcmp(epilogue, "residual") == 0;
    const kiln_dtype xt = norm ? st : t, yt = residual ? st : f32_out ? KILN_DTYPE_F32 : t;
    kiln_field f[8] = {fi32("n", &n),
                       fi32("k", &k),
                       fi32("norm", &norm),
                       ff32("epsilon", &eps),
                       fstr("epilogue", epilogue),
                       fstr("output_dtype", f32_out ? "f32" : "default"),
                       fstr("weights", "fp8"),
                       ff32("x_amax", &fused_amax)};
    kiln_plugin *p = make("FusedMatMul", f, 6 + fused_fp8 + (fused_fp8 && fused_amax > 0.0f));
    if (!p)
        return;
    const float wr = 1.0f / sqrtf((float)k);
    buf in[5] = {buf_random(xt, rows, k, -2, 2)};
    int32_t n_in = 2;
    if (fused_fp8)
        random_fp8(n, k, &in[1], &in[n_in++]);
    else
        in[1] = buf_random(t, n, k, -wr, wr);
    if (norm)
        in[n_in++] = buf_random(t, k, 0, 0.5f, 1.5f);
    if (residual)
        in[n_in++] = buf_random(yt, rows, n, -1, 1);
    buf y = buf_output(yt, rows, swiglu ? n / 2 : n);
    kiln_tensor_desc d[6];
    for (int32_t i = 0; i < n_in; i++)
        d[i] = in[i].desc;
    d[n_in] = y.desc;
    size_t wsz = p->ops->workspace_size(p, d, n_in, d + n_in, 1);
    void *wh = malloc(wsz), *wd = NULL;
    if (cudaMalloc(&wd, wsz) != cudaSuccess) {
        fprintf(stderr, "cannot allocate the workspace\n");
        exit(1);
    }
    char what[176];
    snprintf(what, sizeof what, "FusedMatMul %s%s%s%s%s norm %d %s T %lld n %d k %d%s%s%s", dtype_name(t),
             fused_fp8 ? (fused_amax > 0.0f ? " (E4M3 W, static x_amax)" : " (E4M3 W)") : "",
             st != t ? " (f32 stream)" : "", f32_out ? " (f32 y)" : "", use_graph ? " in a graph" : "", norm, epilogue,
             (long long)rows, n, k, getenv("KILN_FMM_EPILOGUE") ? ", KILN_FMM_EPILOGUE=" : "",
             getenv("KILN_FMM_EPILOGUE") ? getenv("KILN_FMM_EPILOGUE") : "",
             getenv("KILN_FMM_FP8_ADD") ? ", KILN_FMM_FP8_ADD=kernel" : "");
    /* an f32 y holds a product rounded (GEMV) or not (cuBLASLt's
     * epilogue) to t: t's tolerance; E4M3 weights at least Fp8MatMul's
     * (test_fp8: the FP8 tensor cores add in fewer bits than f32) */
    const double floor_was = tol_floor;
    if (tol_for(t) > tol_floor)
        tol_floor = tol_for(t);
    if (fused_fp8 && tol_floor < 1e-3)
        tol_floor = 1e-3;
    run_both_ws(what, p, in, n_in, &y, 1, wh, wd);
    tol_floor = floor_was;
    free(wh);
    cudaFree(wd);
    for (int32_t i = 0; i < n_in; i++)
        buf_free(&in[i]);
    buf_free(&y);
    p->ops->destroy(p);
}

/* FusedMatMul's rope epilogue (RMSNorm, GEMV, RoPE of the packed row). */
static void check_fused_rope(kiln_dtype t, int32_t interleaved, int32_t rotary_dim, const char *scaling, int64_t rows)
{
    const int32_t nh = 8, nkv = 2, hd = 128, k = 1024, n = (nh + 2 * nkv) * hd, one = 1;
    const float eps = 1e-5f, theta = 500000.0f, factor = 8.0f;
    kiln_field f[14] = {fi32("n", &n),
                        fi32("k", &k),
                        fi32("norm", &one),
                        ff32("epsilon", &eps),
                        fstr("epilogue", "rope"),
                        fstr("weights", fused_fp8 ? "fp8" : "dtype"),
                        fi32("n_heads", &nh),
                        fi32("n_kv_heads", &nkv),
                        fi32("head_dim", &hd),
                        ff32("theta", &theta),
                        fi32("rotary_dim", &rotary_dim),
                        fi32("interleaved", &interleaved),
                        fstr("scaling", scaling),
                        ff32("factor", &factor)};
    kiln_plugin *p = make("FusedMatMul", f, 14);
    if (!p)
        return;
    const float wr = 1.0f / sqrtf((float)k);
    buf in[5] = {buf_random(t, rows, k, -2, 2)};
    int32_t n_in = 2;
    if (fused_fp8)
        random_fp8(n, k, &in[1], &in[n_in++]);
    else
        in[1] = buf_random(t, n, k, -wr, wr);
    in[n_in++] = buf_random(t, k, 0, 0.5f, 1.5f);
    buf *pos = &in[n_in++];
    *pos = buf_new(KILN_DTYPE_I32, rows, 0);
    for (int64_t r = 0; r < rows; r++)
        ((int32_t *)pos->host)[r] = (int32_t)((r * 977 + 3) % 8192);
    buf_upload(pos);
    buf y = buf_output(t, rows, n);
    kiln_tensor_desc d[6];
    for (int32_t i = 0; i < n_in; i++)
        d[i] = in[i].desc;
    d[n_in] = y.desc;
    size_t wsz = p->ops->workspace_size(p, d, n_in, d + n_in, 1);
    void *wh = malloc(wsz), *wd = NULL;
    if (cudaMalloc(&wd, wsz) != cudaSuccess) {
        fprintf(stderr, "cannot allocate the workspace\n");
        exit(1);
    }
    char what[144];
    snprintf(what, sizeof what, "FusedMatMul rope %s%s%s interleaved %d rotary %d %s T %lld%s%s", dtype_name(t),
             fused_fp8 ? " (E4M3 W)" : "", use_graph ? " in a graph" : "", interleaved, rotary_dim, scaling,
             (long long)rows, getenv("KILN_FMM_EPILOGUE") ? ", KILN_FMM_EPILOGUE=" : "",
             getenv("KILN_FMM_EPILOGUE") ? getenv("KILN_FMM_EPILOGUE") : "");
    const double floor_was = tol_floor;
    if (fused_fp8 && tol_floor < 1e-3)
        tol_floor = 1e-3;
    run_both_ws(what, p, in, n_in, &y, 1, wh, wd);
    tol_floor = floor_was;
    free(wh);
    cudaFree(wd);
    for (int32_t i = 0; i < n_in; i++)
        buf_free(&in[i]);
    buf_free(&y);
    p->ops->destroy(p);
}

static void test_fused_matmul(void)
{
    static const struct {
        int32_t norm;
        const char *epilogue;
    } forms[] = {{1, "none"}, {1, "swiglu"}, {0, "residual"}, {0, "none"}, {1, "residual"}};
    const int64_t big_rows[] = {1, 2, 4, 8, 9, 64}, small_rows[] = {1, 3, 8};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++) {
            const kiln_dtype t = float_types[ti];
            for (size_t ri = 0; ri < sizeof big_rows / sizeof big_rows[0]; ri++) {
                check_fused_matmul(t, t, 256, 2048, forms[fi].norm, forms[fi].epilogue, big_rows[ri], 0);
                /* the f32 residual stream: x into the norm, residual and y */
                if (t != KILN_DTYPE_F32 && (forms[fi].norm || fi == 2))
                    check_fused_matmul(t, KILN_DTYPE_F32, 256, 2048, forms[fi].norm, forms[fi].epilogue, big_rows[ri],
                                       0);
                /* an LLM's head: the f32 stream's norm into f32 logits */
                if (fi == 0)
                    check_fused_matmul(t, t == KILN_DTYPE_F32 ? t : KILN_DTYPE_F32, 256, 2048, 1, "none", big_rows[ri],
                                       1);
            }
            if (fi == 0)
                for (size_t ri = 0; ri < sizeof big_rows / sizeof big_rows[0]; ri++) {
                    check_fused_rope(float_types[ti], 0, 128, "llama3", big_rows[ri]);
                    check_fused_rope(float_types[ti], 1, 64, "none", big_rows[ri]);
                }
            /* k not a multiple of the 16-byte vector (the GEMM path), odd sizes */
            for (size_t ri = 0; ri < sizeof small_rows / sizeof small_rows[0]; ri++) {
                check_fused_matmul(t, t, 10, 36, forms[fi].norm, forms[fi].epilogue, small_rows[ri], 0);
                check_fused_matmul(t, t, 34, 64, forms[fi].norm, forms[fi].epilogue, small_rows[ri], 0);
                if (t != KILN_DTYPE_F32 && (forms[fi].norm || fi == 2))
                    check_fused_matmul(t, KILN_DTYPE_F32, 34, 64, forms[fi].norm, forms[fi].epilogue, small_rows[ri],
                                       0);
            }
        }
    /* past the GEMV's rows the epilogues run one element a thread under
     * 128 rows (above) and in 16-byte vectors from 128 on; each kernel
     * forced (KILN_FMM_EPILOGUE=vec, =scalar) at both sides of that, and
     * odd sizes in vectors (swiglu: a vector across two rows of y) */
    static const char *const modes[] = {"vec", "scalar"};
    for (int mi = 0; mi < 2; mi++) {
        setenv("KILN_FMM_EPILOGUE", modes[mi], 1);
        for (size_t ti = 0; ti < 3; ti++) {
            const kiln_dtype t = float_types[ti];
            check_fused_matmul(t, t, 256, 2048, 1, "swiglu", 64, 0);
            check_fused_matmul(t, t, 256, 2048, 1, "swiglu", 130, 0);
            check_fused_matmul(t, t, 34, 36, 1, "swiglu", 8, 0);
            check_fused_rope(t, 0, 128, "llama3", 64);
            check_fused_rope(t, 0, 128, "llama3", 130);
            check_fused_rope(t, 1, 64, "none", 9);
        }
    }
    unsetenv("KILN_FMM_EPILOGUE");
}

/* FusedMatMul over E4M3 weights (weights = fp8, fusedmm_fp8_cuda.cu):
 * the GEMV at 1, 2, 4 and 8 rows in each of a layer's forms (the norm
 * with no epilogue, SwiGLU or RoPE, over the f32 stream or x in the
 * dtype; the residual add into an f32 stream or one in the dtype), bf16
 * and f16 (an f32 engine takes the GEMM path at every row count); the
 * GEMM path (the norm's or Fp8MatMul's quantization, cuBLASLt's FP8 GEMM,
 * the epilogue kernels; the residual add in cuBLASLt's epilogue, and in a
 * kernel of its own with KILN_FMM_FP8_ADD=kernel) at 9, 64 and 130 rows, and
 * in a graph; the decode GEMVs at the 8B's layer shapes (k = 4,096 and
 * 14,336). The weights are random E4M3 codes (any finite value) with
 * scales of 0.001-0.01; tolerance as Fp8MatMul's, at least 1e-3. */
static void test_fused_matmul_fp8(void)
{
    fused_fp8 = 1;
    static const struct {
        int32_t norm;
        const char *epilogue;
    } forms[] = {{1, "none"}, {1, "swiglu"}, {0, "residual"}};
    const int64_t rows[] = {1, 2, 4, 8, 9, 64, 130};
    for (size_t ti = 0; ti < 3; ti++) {
        const kiln_dtype t = float_types[ti];
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
            for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++) {
                check_fused_matmul(t, t, 256, 2048, forms[fi].norm, forms[fi].epilogue, rows[ri], 0);
                if (t != KILN_DTYPE_F32)
                    check_fused_matmul(t, KILN_DTYPE_F32, 256, 2048, forms[fi].norm, forms[fi].epilogue, rows[ri], 0);
            }
            /* an f32 y without an epilogue, the norm without one */
            check_fused_matmul(t, t == KILN_DTYPE_F32 ? t : KILN_DTYPE_F32, 256, 2048, 1, "none", rows[ri], 1);
            /* k whose warps' quarters end inside a lane's 16 codes, and n
             * with a last block of fewer rows than it computes */
            check_fused_matmul(t, t, 36, 1040, 1, "swiglu", rows[ri], 0);
            check_fused_matmul(t, t, 20, 1040, 0, "residual", rows[ri], 0);
            check_fused_rope(t, 0, 128, "llama3", rows[ri]);
            check_fused_rope(t, 1, 64, "none", rows[ri]);
        }
    }
    /* a static scale (calibration; x in [-2, 2] normalized passes 1.0
     * and saturates): no max pass in the GEMV, the static quantization
     * past it */
    fused_amax = 1.0f;
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri += 3)
        for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++)
            check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 256, 2048, forms[fi].norm, forms[fi].epilogue, rows[ri],
                               0);
    fused_amax = 0.0f;
    /* the 8B's decode layers: qkv (with RoPE) and gate/up over the f32
     * stream, o and down adding into it */
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 6144, 4096, 1, "none", 1, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 28672, 4096, 1, "swiglu", 1, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 4096, 4096, 0, "residual", 1, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 4096, 14336, 0, "residual", 1, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 4096, 14336, 0, "residual", 8, 0);
    /* the GEMM path's residual add in a kernel after the GEMM (by default
     * in cuBLASLt's epilogue where it has that form) */
    setenv("KILN_FMM_FP8_ADD", "kernel", 1);
    for (size_t ti = 0; ti < 3; ti++)
        for (int64_t r = 9; r <= 130; r = r == 9 ? 64 : r * 2 + 2) {
            check_fused_matmul(float_types[ti], float_types[ti], 256, 2048, 0, "residual", r, 0);
            if (float_types[ti] != KILN_DTYPE_F32)
                check_fused_matmul(float_types[ti], KILN_DTYPE_F32, 256, 2048, 0, "residual", r, 0);
        }
    unsetenv("KILN_FMM_FP8_ADD");
    /* in a graph: the GEMV (1 row) and the GEMM path (64 rows) */
    use_graph = 1;
    for (int64_t r = 1; r <= 64; r += 63) {
        check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 256, 2048, 1, "swiglu", r, 0);
        check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 256, 2048, 0, "residual", r, 0);
        check_fused_rope(KILN_DTYPE_BF16, 0, 128, "llama3", r);
    }
    use_graph = 0;
    fused_fp8 = 0;
}

/* FusedMatMul's GEMV through fmm_loop_kernel (resident blocks, group
 * after group of rows, the ring of weight loads running on into the next
 * group): KILN_FMM_LOOP=7 gives a launch at most 7 blocks, so each block
 * takes many groups and some one more than others. The kernel takes 1 or
 * 2 rows of x and up to two steps a warp: k = 2,048 (the 1B's; f32
 * weights need four steps there and fall back to fmm_gemv_kernel, as do
 * 4 and 8 rows of x), 576 (a quarter of the lanes' vectors past k) and
 * 1,000 (the last warp's quarter shorter); n with a last group of half
 * its rows. The residual form here at most 2 blocks an SM (its default: 3).
 * Last, the launch's own choice (KILN_FMM_LOOP unset) at the 1B's k: 700
 * and 500 groups against the H200's waves of 528 and 396 blocks (4 and 3
 * an SM), one or two groups a block. */
static void test_fused_matmul_loop(void)
{
    setenv("KILN_FMM_LOOP", "7", 1);
    static const int64_t rows[] = {1, 2, 4, 8};
    static const int32_t ks[] = {2048, 576, 1000};
    for (size_t ti = 0; ti < 3; ti++) {
        const kiln_dtype t = float_types[ti];
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                check_fused_matmul(t, t, 4100, ks[ki], 1, "swiglu", rows[ri], 0);
                check_fused_matmul(t, t == KILN_DTYPE_F32 ? t : KILN_DTYPE_F32, 260, ks[ki], 1, "none", rows[ri], 1);
                if (t != KILN_DTYPE_F32)
                    check_fused_matmul(t, KILN_DTYPE_F32, 1028, ks[ki], 1, "none", rows[ri], 0);
            }
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            check_fused_rope(t, ri % 2, ri % 2 ? 64 : 128, ri % 2 ? "none" : "llama3", rows[ri]);
        /* the residual form (KILN_FMM_LOOP_RESIDUAL: at most N blocks an SM) */
        setenv("KILN_FMM_LOOP_RESIDUAL", "2", 1);
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                check_fused_matmul(t, t, 1030, ks[ki], 0, "residual", rows[ri], 0);
                if (t != KILN_DTYPE_F32)
                    check_fused_matmul(t, KILN_DTYPE_F32, 1030, ks[ki], 0, "residual", rows[ri], 0);
            }
        unsetenv("KILN_FMM_LOOP_RESIDUAL");
    }
    unsetenv("KILN_FMM_LOOP");
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 8 * 700, 2048, 1, "swiglu", 1, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 4 * 500, 2048, 0, "residual", 1, 0);
}

/* Every plugin once more, each launch captured into a graph and replayed. */
static void test_graph_capture(void)
{
    use_graph = 1;
    const float eps = 1e-6f;
    kiln_field f = ff32("epsilon", &eps);
    kiln_plugin *add = make("AddRMSNorm", &f, 1);
    if (add) {
        buf in[3] = {buf_random(KILN_DTYPE_BF16, 1, 2048, -3, 3), buf_random(KILN_DTYPE_BF16, 1, 2048, -3, 3),
                     buf_random(KILN_DTYPE_BF16, 2048, 0, 0.5f, 1.5f)};
        buf out[2] = {buf_output(KILN_DTYPE_BF16, 1, 2048), buf_output(KILN_DTYPE_BF16, 1, 2048)};
        run_both("AddRMSNorm bf16 in a graph", add, in, 3, out, 2, NULL);
        for (int i = 0; i < 3; i++)
            buf_free(&in[i]);
        buf_free(&out[0]);
        buf_free(&out[1]);
        add->ops->destroy(add);
    }
    kiln_field fm[2] = {f, fstr("output_dtype", "bf16")};
    kiln_plugin *addm = make("AddRMSNorm", fm, 2);
    if (addm) {
        buf in[3] = {buf_random(KILN_DTYPE_F32, 1, 2048, -30, 30), buf_random(KILN_DTYPE_BF16, 1, 2048, -3, 3),
                     buf_random(KILN_DTYPE_BF16, 2048, 0, 0.5f, 1.5f)};
        buf out[2] = {buf_output(KILN_DTYPE_F32, 1, 2048), buf_output(KILN_DTYPE_BF16, 1, 2048)};
        run_both("AddRMSNorm f32 + bf16 -> bf16 in a graph", addm, in, 3, out, 2, NULL);
        for (int i = 0; i < 3; i++)
            buf_free(&in[i]);
        buf_free(&out[0]);
        buf_free(&out[1]);
        addm->ops->destroy(addm);
    }
    check_rope("llama3", 0, 64, 2, KILN_DTYPE_BF16, 1, 0);
    const int32_t one = 1, n = 257, k = 2048;
    kiln_field pf = fi32("packed", &one);
    kiln_plugin *sw = make("SwiGLU", &pf, 1);
    if (sw) {
        buf gu = buf_random(KILN_DTYPE_BF16, 1, 2 * 8192, -6, 6), y = buf_output(KILN_DTYPE_BF16, 1, 8192);
        run_both("SwiGLU packed bf16 in a graph", sw, &gu, 1, &y, 1, NULL);
        buf_free(&gu);
        buf_free(&y);
        sw->ops->destroy(sw);
    }
    const qfmt q4 = {"Q4_1", 20, 1};
    kiln_field qf[3] = {fstr("format", "Q4_1"), fi32("n", &n), fi32("k", &k)};
    kiln_plugin *qm = make("QuantMatMul", qf, 3);
    if (qm) {
        buf in[2] = {buf_random(KILN_DTYPE_BF16, 1, k, -1, 1), random_blocks(&q4, n, k)};
        buf y = buf_output(KILN_DTYPE_BF16, 1, n);
        float ws[16 * (2048 + 257)];
        run_both("QuantMatMul Q4_1 bf16 in a graph", qm, in, 2, &y, 1, ws);
        buf_free(&in[0]);
        buf_free(&in[1]);
        buf_free(&y);
        qm->ops->destroy(qm);
    }
    const int32_t four = 4, g128 = 128;
    kiln_field wf[4] = {fi32("bits", &four), fi32("group_size", &g128), fi32("n", &n), fi32("k", &k)};
    kiln_plugin *wq = make("WeightOnlyMatMul", wf, 4);
    /* the GEMV (1 row) and the dequantization with cuBLASLt (128 rows) */
    for (int64_t rows = 1; wq && rows <= 128; rows += 127) {
        buf in[4];
        in[0] = buf_random(KILN_DTYPE_BF16, rows, k, -1, 1);
        random_woq(4, 128, n, k, &in[1], &in[2], &in[3]);
        buf y = buf_output(KILN_DTYPE_BF16, rows, n);
        kiln_tensor_desc d[5] = {in[0].desc, in[1].desc, in[2].desc, in[3].desc, y.desc};
        size_t wsz = wq->ops->workspace_size(wq, d, 4, d + 4, 1);
        void *wh = malloc(wsz ? wsz : 1), *wd = NULL;
        if (cudaMalloc(&wd, wsz ? wsz : 1) != cudaSuccess) {
            fprintf(stderr, "cannot allocate the workspace\n");
            exit(1);
        }
        char what[96];
        snprintf(what, sizeof what, "WeightOnlyMatMul int4 bf16 T %lld in a graph", (long long)rows);
        run_both_ws(what, wq, in, 4, &y, 1, wh, wd);
        free(wh);
        cudaFree(wd);
        for (int i = 0; i < 4; i++)
            buf_free(&in[i]);
        buf_free(&y);
    }
    if (wq)
        wq->ops->destroy(wq);
    /* both FP8 paths: the GEMV (1 row) and cuBLASLt (64 rows) */
    const int32_t n16 = 256;
    kiln_field ff[2] = {fi32("n", &n16), fi32("k", &k)};
    kiln_plugin *f8 = make("Fp8MatMul", ff, 2);
    for (int64_t rows = 1; f8 && rows <= 64; rows += 63) {
        buf in[3];
        in[0] = buf_random(KILN_DTYPE_BF16, rows, k, -1, 1);
        random_fp8(n16, k, &in[1], &in[2]);
        buf y = buf_output(KILN_DTYPE_BF16, rows, n16);
        kiln_tensor_desc d[4] = {in[0].desc, in[1].desc, in[2].desc, y.desc};
        size_t wsz = f8->ops->workspace_size(f8, d, 3, d + 3, 1);
        void *wh = malloc(wsz), *wd = NULL;
        if (cudaMalloc(&wd, wsz) != cudaSuccess) {
            fprintf(stderr, "cannot allocate the workspace\n");
            exit(1);
        }
        tol_floor = 1e-3;
        run_both_ws(rows == 1 ? "Fp8MatMul bf16 T 1 in a graph" : "Fp8MatMul bf16 T 64 in a graph", f8, in, 3, &y, 1,
                    wh, wd);
        tol_floor = 0;
        free(wh);
        cudaFree(wd);
        for (int i = 0; i < 3; i++)
            buf_free(&in[i]);
        buf_free(&y);
    }
    if (f8)
        f8->ops->destroy(f8);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_BF16, 2048, 1024, 1, "swiglu", 1, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_BF16, 1024, 2048, 0, "residual", 8, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_BF16, 2048, 1024, 1, "none", 64, 0);
    /* a bf16 engine's layer: the f32 stream into the norm, out of the residual add */
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 2048, 1024, 1, "swiglu", 1, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 1024, 2048, 0, "residual", 8, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 1024, 2048, 0, "residual", 64, 0);
    check_fused_matmul(KILN_DTYPE_BF16, KILN_DTYPE_F32, 4096, 1024, 1, "none", 4, 1);
    check_fused_rope(KILN_DTYPE_BF16, 0, 128, "llama3", 1);
    check_fused_rope(KILN_DTYPE_BF16, 0, 128, "llama3", 64);
    use_graph = 0;
}

static const test_case_ tests[] = {
    TEST(test_rmsnorm),           TEST(test_rmsnorm_mixed), TEST(test_rope),         TEST(test_swiglu),
    TEST(test_qmatmul),           TEST(test_qmatmul_k),     TEST(test_woq),          TEST(test_fp8),
    TEST(test_fp8_accum),         TEST(test_fp8_input),     TEST(test_fused_matmul), TEST(test_fused_matmul_fp8),
    TEST(test_fused_matmul_loop), TEST(test_graph_capture)};

int main(void)
{
    int32_t arch = 0;
    if (!kiln_cuda_available(&arch)) {
        printf("skipped: no CUDA GPU\n");
        return 77;
    }
    if (kiln_cuda_device_create(&dev) != KILN_OK ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        kiln_registry_create(&reg) != KILN_OK) {
        fprintf(stderr, "cannot set up the GPU or the registry: %s\n", kiln_last_error());
        return 1;
    }
    printf("GPU sm_%d\n", (int)arch);
    /* QuantMatMul's CPU reference with f32 activations, the arithmetic of
     * the CUDA kernels (the CPU's default quantizes x to 8 bits) */
    setenv("KILN_QMATMUL_F32ACT", "1", 1);
    test_run_cases(tests, sizeof tests / sizeof tests[0]);
    kiln_registry_destroy(reg);
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
