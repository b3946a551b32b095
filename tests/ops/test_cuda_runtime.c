/* The CUDA runtime: an engine of several layers against values computed
 * here in double and against the CPU reference path; CUDA-graph replay
 * equal to plain launches (also after new input data and a shape change);
 * enqueue captured by the caller under cudaStreamCaptureModeGlobal, which
 * rejects any allocation or synchronization; two contexts on two streams
 * at once; the device pool over 100 create/destroy; a plugin that is not
 * capture-safe refusing graph mode by name. Skipped (77) without a GPU. */
#ifdef KILN_HAVE_CUDA

#include "test.h"

#include <cuda_runtime_api.h>
#include <pthread.h>

#include "backend/cuda/cuda_backend.h"
#include "runtime/runtime_internal.h"

/* y = 2 * softmax(tanh(x·W + b)) over rows; x: f32 [batch, K], batch in
 * [1, MAX_BATCH]. */
#define K 64
#define N 48
#define MAX_BATCH 256

static float weight(int k, int j) { return 0.02f * (float)((k * 5 + j * 3) % 17 - 8); }
static float bias_value(int j) { return 0.05f * (float)(j % 7 - 3); }

static void input_values(float *x, int batch, int seed)
{
    for (int i = 0; i < batch * K; i++)
        x[i] = (float)((i * 7 + seed * 13) % 23) / 11.0f - 1.0f;
}

static void expected(const float *x, int batch, double *y)
{
    for (int r = 0; r < batch; r++) {
        double act[N], sum = 0, mx = -1e300;
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += (double)x[r * K + k] * (double)weight(k, j);
            act[j] = tanh(acc + (double)bias_value(j));
            mx = fmax(mx, act[j]);
        }
        for (int j = 0; j < N; j++)
            sum += exp(act[j] - mx);
        for (int j = 0; j < N; j++)
            y[r * N + j] = 2.0 * exp(act[j] - mx) / sum;
    }
}

static kiln_registry *registry(void)
{
    kiln_registry *reg = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    return reg;
}

static kiln_engine *build_engine(kiln_registry *reg)
{
    static float w[K * N], b[N];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++)
            w[k * N + j] = weight(k, j);
    for (int j = 0; j < N; j++)
        b[j] = bias_value(j);
    float two = 2.0f;
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(reg, &net));
    kiln_dims xd = {.rank = 2, .d = {-1, K}}, wd = {.rank = 2, .d = {K, N}}, bd = {.rank = 2, .d = {1, N}},
              sd = {.rank = 2, .d = {1, 1}};
    kiln_tensor x, wt, bt, st, mm, add, th, sm, y;
    int32_t prof = 0;
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &xd, &x));
    CHECK_OK(kiln_network_add_profile(net, &prof));
    kiln_dims mn = {.rank = 2, .d = {1, K}}, op = {.rank = 2, .d = {32, K}}, mx = {.rank = 2, .d = {MAX_BATCH, K}};
    CHECK_OK(kiln_network_set_profile_shape(net, prof, "x", &mn, &op, &mx));
    CHECK_OK(kiln_network_add_constant(net, "W", KILN_DTYPE_F32, &wd, w, &wt));
    CHECK_OK(kiln_network_add_constant(net, "b", KILN_DTYPE_F32, &bd, b, &bt));
    CHECK_OK(kiln_network_add_constant(net, "two", KILN_DTYPE_F32, &sd, &two, &st));
    CHECK_OK(kiln_network_add_matmul(net, "matmul", x, 0, wt, 0, &mm));
    CHECK_OK(kiln_network_add_binary(net, "add_bias", KILN_BINARY_ADD, mm, bt, &add));
    CHECK_OK(kiln_network_add_unary(net, "tanh", KILN_UNARY_TANH, add, &th));
    CHECK_OK(kiln_network_add_softmax(net, "softmax", th, -1, &sm));
    CHECK_OK(kiln_network_add_binary(net, "times_two", KILN_BINARY_MUL, sm, st, &y));
    CHECK_OK(kiln_network_mark_output(net, y, "y"));
    kiln_build_config cfg;
    kiln_build_config_init(&cfg);
    cfg.backend = KILN_BACKEND_CUDA;
    kiln_buffer buf = {NULL, 0};
    kiln_engine *e = NULL;
    CHECK_OK(kiln_build(net, &cfg, &buf));
    kiln_network_destroy(net);
    if (buf.data)
        CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    return e;
}

/* Max |got - want| relative to max(|want|, 1e-3); f32 throughout. */
static double max_error(const float *got, const double *want, int n)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / fmax(fabs(want[i]), 1e-3);
        if (!(d <= worst))
            worst = d;
    }
    return worst;
}

static void set_batch(kiln_context *ctx, int batch)
{
    kiln_dims d = {.rank = 2, .d = {batch, K}};
    CHECK_OK(kiln_context_set_input_shape(ctx, "x", &d));
}

/* Runs one inference through staging and returns the output on the host. */
static void run_once(kiln_context *ctx, const float *x, int batch, float *y)
{
    CHECK_OK(kiln_context_copy_input(ctx, "x", x, sizeof(float) * (size_t)batch * K));
    CHECK_OK(kiln_context_enqueue(ctx, NULL));
    CHECK_OK(kiln_context_copy_output(ctx, "y", y, sizeof(float) * (size_t)batch * N));
    CHECK_OK(kiln_context_synchronize(ctx));
}

static float xs[MAX_BATCH * K], ys[MAX_BATCH * N], ys2[MAX_BATCH * N];
static double want[MAX_BATCH * N];

/* ---- tests ------------------------------------------------------------------------------- */

static void test_against_math_and_reference(void)
{
    kiln_registry *reg = registry();
    kiln_engine *e = build_engine(reg);
    CHECK(e != NULL);
    if (!e) {
        kiln_registry_destroy(reg);
        return;
    }
    CHECK(kiln_engine_backend(e) == KILN_BACKEND_CUDA);
    kiln_context *ctx = NULL;
    CHECK_OK(kiln_context_create(e, &ctx));
    static const int batches[] = {1, 37, MAX_BATCH};
    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
        int batch = batches[b];
        set_batch(ctx, batch);
        input_values(xs, batch, (int)b);
        expected(xs, batch, want);
        /* Poison: an element the GPU leaves unwritten shows up. */
        for (int i = 0; i < batch * N; i++)
            ys[i] = ys2[i] = NAN;
        run_once(ctx, xs, batch, ys);
        CHECK(max_error(ys, want, batch * N) < 1e-4);
        CHECK_OK(kiln_context_run_reference(ctx));
        CHECK_OK(kiln_context_copy_output(ctx, "y", ys2, sizeof(float) * (size_t)batch * N));
        CHECK_OK(kiln_context_synchronize(ctx));
        CHECK(max_error(ys2, want, batch * N) < 1e-5);
        float ms = -1;
        CHECK_OK(kiln_context_enqueue(ctx, NULL));
        CHECK_OK(kiln_context_gpu_time(ctx, &ms));
        CHECK(ms >= 0);
    }
    /* A host pointer is refused by name, before any kernel could fault. */
    CHECK_FAILS(kiln_context_set_tensor_address(ctx, "x", xs), KILN_ERROR_INVALID_ARGUMENT, "tensor \"x\"");
    /* Bound device memory instead of staging. */
    void *dx = NULL, *dy = NULL;
    CHECK(cudaMalloc(&dx, sizeof xs) == cudaSuccess && cudaMalloc(&dy, sizeof ys) == cudaSuccess);
    set_batch(ctx, 5);
    input_values(xs, 5, 9);
    expected(xs, 5, want);
    CHECK(cudaMemcpy(dx, xs, sizeof(float) * 5 * K, cudaMemcpyHostToDevice) == cudaSuccess);
    /* a pageable copy may still be in flight; the context's stream does not wait for it */
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK_OK(kiln_context_set_tensor_address(ctx, "x", dx));
    CHECK_OK(kiln_context_set_tensor_address(ctx, "y", dy));
    void *got = NULL;
    CHECK_OK(kiln_context_tensor_address(ctx, "y", &got));
    CHECK(got == dy);
    CHECK_OK(kiln_context_enqueue(ctx, NULL));
    CHECK_OK(kiln_context_synchronize(ctx));
    CHECK(cudaMemcpy(ys, dy, sizeof(float) * 5 * N, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(max_error(ys, want, 5 * N) < 1e-4);
    /* Per-layer times: one entry per layer, non-negative. */
    CHECK_OK(kiln_context_set_profiling(ctx, 1));
    CHECK_OK(kiln_context_enqueue(ctx, NULL));
    CHECK_OK(kiln_context_synchronize(ctx));
    double total = 0;
    for (int32_t l = 0; l < kiln_context_num_layers(ctx); l++) {
        const char *name = NULL, *op = NULL;
        double lms = -1;
        CHECK_OK(kiln_context_layer_time(ctx, l, &name, &op, &lms));
        CHECK(name && op && lms >= 0);
        total += lms;
    }
    CHECK(total > 0);
    kiln_context_destroy(ctx);
    cudaFree(dx);
    cudaFree(dy);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

static void test_graph_replay(void)
{
    kiln_registry *reg = registry();
    kiln_engine *e = build_engine(reg);
    if (!e) {
        kiln_registry_destroy(reg);
        return;
    }
    kiln_context *plain = NULL, *graph = NULL;
    CHECK_OK(kiln_context_create(e, &plain));
    CHECK_OK(kiln_context_create(e, &graph));
    CHECK_OK(kiln_context_set_cuda_graph(graph, 1));
    static const int batches[] = {37, 37, 64, 37};
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        int batch = batches[i];
        set_batch(plain, batch);
        set_batch(graph, batch);
        /* New data each time: a replay must read it, not the captured run's. */
        input_values(xs, batch, 100 + (int)i);
        expected(xs, batch, want);
        run_once(plain, xs, batch, ys);
        for (int k = 0; k < batch * N; k++)
            ys2[k] = NAN;
        run_once(graph, xs, batch, ys2);
        CHECK(memcmp(ys, ys2, sizeof(float) * (size_t)batch * N) == 0);
        CHECK(max_error(ys2, want, batch * N) < 1e-4);
        float ms = -1;
        CHECK_OK(kiln_context_gpu_time(graph, &ms));
        CHECK(ms >= 0);
    }
    kiln_context_destroy(plain);
    kiln_context_destroy(graph);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

/* Global capture mode makes any cudaMalloc, cudaFree or synchronizing call
 * of any thread fail the capture: enqueue must only launch. */
static void test_enqueue_captures_under_global_mode(void)
{
    kiln_registry *reg = registry();
    kiln_engine *e = build_engine(reg);
    if (!e) {
        kiln_registry_destroy(reg);
        return;
    }
    kiln_context *ctx = NULL;
    CHECK_OK(kiln_context_create(e, &ctx));
    int batch = 19;
    set_batch(ctx, batch);
    input_values(xs, batch, 3);
    expected(xs, batch, want);
    CHECK_OK(kiln_context_copy_input(ctx, "x", xs, sizeof(float) * (size_t)batch * K));
    CHECK_OK(kiln_context_synchronize(ctx));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK_OK(kiln_context_enqueue(ctx, s));
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(g != NULL);
    cudaGraphExec_t exec = NULL;
    if (g) {
        CHECK(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
        CHECK(cudaGraphLaunch(exec, s) == cudaSuccess);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    }
    CHECK_OK(kiln_context_copy_output(ctx, "y", ys, sizeof(float) * (size_t)batch * N));
    CHECK_OK(kiln_context_synchronize(ctx));
    CHECK(max_error(ys, want, batch * N) < 1e-4);
    if (exec)
        cudaGraphExecDestroy(exec);
    if (g)
        cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    kiln_context_destroy(ctx);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

typedef struct worker {
    kiln_engine *engine;
    int seed, batch, ok;
    float x[MAX_BATCH * K], y[MAX_BATCH * N];
    double want[MAX_BATCH * N];
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    kiln_context *ctx = NULL;
    w->ok = kiln_context_create(w->engine, &ctx) == KILN_OK;
    kiln_dims d = {.rank = 2, .d = {w->batch, K}};
    w->ok = w->ok && kiln_context_set_input_shape(ctx, "x", &d) == KILN_OK;
    input_values(w->x, w->batch, w->seed);
    expected(w->x, w->batch, w->want);
    for (int it = 0; it < 50 && w->ok; it++) {
        w->ok = kiln_context_copy_input(ctx, "x", w->x, sizeof(float) * (size_t)w->batch * K) == KILN_OK &&
                kiln_context_enqueue(ctx, NULL) == KILN_OK &&
                kiln_context_copy_output(ctx, "y", w->y, sizeof(float) * (size_t)w->batch * N) == KILN_OK &&
                kiln_context_synchronize(ctx) == KILN_OK && max_error(w->y, w->want, w->batch * N) < 1e-4;
    }
    kiln_context_destroy(ctx);
    return NULL;
}

static void test_two_contexts_two_streams(void)
{
    kiln_registry *reg = registry();
    kiln_engine *e = build_engine(reg);
    if (!e) {
        kiln_registry_destroy(reg);
        return;
    }
    static worker w[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        w[i].engine = e;
        w[i].seed = 40 + i;
        w[i].batch = i ? MAX_BATCH : 77;
        CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].ok);
    }
    CHECK(kiln_engine_pool_blocks(e) <= 2);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

static void test_device_pool_does_not_grow(void)
{
    kiln_registry *reg = registry();
    kiln_engine *e = build_engine(reg);
    if (!e) {
        kiln_registry_destroy(reg);
        return;
    }
    /* Device memory figures would be noise here (other GPU tests run at
     * the same time): the pool's block count is the measure. */
    for (int i = 0; i < 100; i++) {
        kiln_context *ctx = NULL;
        CHECK_OK(kiln_context_create(e, &ctx));
        set_batch(ctx, 1 + i % MAX_BATCH);
        kiln_context_destroy(ctx);
    }
    CHECK(kiln_engine_pool_blocks(e) == 1);
    kiln_context *a = NULL, *b = NULL;
    CHECK_OK(kiln_context_create(e, &a));
    CHECK_OK(kiln_context_create(e, &b));
    CHECK(kiln_engine_pool_blocks(e) == 2);
    kiln_context_destroy(a);
    kiln_context_destroy(b);
    CHECK(kiln_engine_pool_blocks(e) == 2);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

static void test_plugin_not_capture_safe(void)
{
    kiln_registry *reg = registry();
    char path[4096];
    const char *dir = getenv("KILN_BUILD_DIR");
    snprintf(path, sizeof path, "%s/tests/plugins/libtest_no_capture.so", dir ? dir : "build");
    CHECK_OK(kiln_registry_load_library(reg, path));
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(reg, &net));
    kiln_dims d = {.rank = 2, .d = {4, 16}};
    kiln_tensor x, y;
    int32_t n_out = 0;
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &d, &x));
    CHECK_OK(kiln_network_add_plugin(net, "uncapturable", "TestNoCapture", "1", "test", NULL, 0, &x, 1, &y, 1, &n_out));
    CHECK_OK(kiln_network_mark_output(net, y, "y"));
    kiln_build_config cfg;
    kiln_build_config_init(&cfg);
    cfg.backend = KILN_BACKEND_CUDA;
    kiln_buffer buf = {NULL, 0};
    CHECK_OK(kiln_build(net, &cfg, &buf));
    kiln_network_destroy(net);
    kiln_engine *e = NULL;
    if (buf.data)
        CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    if (e) {
        kiln_context *ctx = NULL;
        CHECK_OK(kiln_context_create(e, &ctx));
        CHECK_FAILS(kiln_context_set_cuda_graph(ctx, 1), KILN_ERROR_UNSUPPORTED, "TestNoCapture");
        CHECK(strstr(kiln_last_error(), "uncapturable") != NULL);
        CHECK_OK(kiln_context_set_cuda_graph(ctx, 0));
        kiln_context_destroy(ctx);
        kiln_engine_destroy(e);
    }
    kiln_registry_destroy(reg);
}

static const test_case_ tests[] = {
    TEST(test_against_math_and_reference),         TEST(test_graph_replay),
    TEST(test_enqueue_captures_under_global_mode), TEST(test_two_contexts_two_streams),
    TEST(test_device_pool_does_not_grow),          TEST(test_plugin_not_capture_safe),
};

static int run_tests(void)
{
    test_run_cases(tests, sizeof tests / sizeof tests[0]);
    return test_failures_ ? 1 : 0;
}

int main(void)
{
    int32_t arch = 0;
    if (!kiln_cuda_available(&arch)) {
        printf("skipped: no CUDA GPU is available\n");
        return 77;
    }
    return run_tests();
}

#else

#include <stdio.h>

int main(void)
{
    printf("skipped: this kiln was built without CUDA\n");
    return 77;
}

#endif
