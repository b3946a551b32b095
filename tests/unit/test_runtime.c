/* The runtime: loading engines (plugins, targets), contexts (shapes,
 * profiles, memory pool), execution against values computed naively here,
 * and several threads sharing one engine. */
#include "test.h"

#include <jansson.h>
#include <pthread.h>

#include "runtime/runtime_internal.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* The network: y = ScaleBias(softmax(tanh(x·W + b)), scale 2, bias 0.5),
 * x: f32 [batch, 8] with batch in [1, 4] (opt 2). */
#define K 8
#define N 4
#define MAX_BATCH 4
#define SB_SCALE 2.0f
#define SB_BIAS 0.5f

static float weight(int k, int j) { return 0.1f * (float)(k - 2 * j) + 0.03f * (float)j; }
static const float bias_values[N] = {0.1f, -0.2f, 0.3f, -0.4f};

static void input_values(float *x, int batch, int seed)
{
    for (int i = 0; i < batch * K; i++)
        x[i] = (float)((i * 7 + seed * 13) % 17) / 8.0f - 1.0f;
}

/* The same computation in double, straight from the definitions. */
static void expected(const float *x, int batch, double *y)
{
    for (int r = 0; r < batch; r++) {
        double act[N], sum = 0, mx = -1e300;
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += (double)x[r * K + k] * (double)weight(k, j);
            act[j] = tanh(acc + (double)bias_values[j]);
            mx = fmax(mx, act[j]);
        }
        for (int j = 0; j < N; j++)
            sum += exp(act[j] - mx);
        for (int j = 0; j < N; j++)
            y[r * N + j] = SB_SCALE * (exp(act[j] - mx) / sum) + SB_BIAS;
    }
}

static char plugin_path[4096];

static const char *example_library(void)
{
    const char *dir = getenv("KILN_BUILD_DIR");
    snprintf(plugin_path, sizeof plugin_path, "%s/lib/libkiln_scale_bias.so", dir ? dir : "build");
    return plugin_path;
}

static const char *test_library(const char *name, char *buf, size_t size)
{
    const char *dir = getenv("KILN_BUILD_DIR");
    snprintf(buf, size, "%s/tests/plugins/%s", dir ? dir : "build", name);
    return buf;
}

static kiln_registry *registry_with(const char *lib)
{
    kiln_registry *reg = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    if (reg && lib)
        CHECK_OK(kiln_registry_load_library(reg, lib));
    return reg;
}

/* Builds the network above; with_plugin 0 stops at the softmax. */
static int build_engine(kiln_registry *reg, kiln_backend backend, int with_plugin, kiln_buffer *out)
{
    kiln_network *net = NULL;
    if (kiln_network_create(reg, &net) != KILN_OK)
        return 0;
    float w[K * N];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++)
            w[k * N + j] = weight(k, j);
    kiln_dims xd = {.rank = 2, .d = {-1, K}}, wd = {.rank = 2, .d = {K, N}}, bd = {.rank = 1, .d = {N}};
    kiln_dims mn = {.rank = 2, .d = {1, K}}, op = {.rank = 2, .d = {2, K}}, mx = {.rank = 2, .d = {MAX_BATCH, K}};
    kiln_tensor x, wt, bt, mm, add, act, sm, y;
    int32_t profile = -1, n_out = 0;
    int ok = kiln_network_add_input(net, "x", KILN_DTYPE_F32, &xd, &x) == KILN_OK &&
             kiln_network_add_profile(net, &profile) == KILN_OK &&
             kiln_network_set_profile_shape(net, profile, "x", &mn, &op, &mx) == KILN_OK &&
             kiln_network_add_constant(net, "w", KILN_DTYPE_F32, &wd, w, &wt) == KILN_OK &&
             kiln_network_add_constant(net, "b", KILN_DTYPE_F32, &bd, bias_values, &bt) == KILN_OK &&
             kiln_network_add_matmul(net, "fc", x, 0, wt, 0, &mm) == KILN_OK &&
             kiln_network_add_binary(net, "fc_bias", KILN_BINARY_ADD, mm, bt, &add) == KILN_OK &&
             kiln_network_add_unary(net, "act", KILN_UNARY_TANH, add, &act) == KILN_OK &&
             kiln_network_add_softmax(net, "probs", act, -1, &sm) == KILN_OK;
    if (ok && with_plugin) {
        float scale = SB_SCALE, bias = SB_BIAS;
        kiln_field fields[2] = {
            {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "scale", KILN_FIELD_F32, 1, &scale},
            {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "bias", KILN_FIELD_F32, 1, &bias},
        };
        ok = kiln_network_add_plugin(net, "sb", "ScaleBias", "1", "", fields, 2, &sm, 1, &y, 1, &n_out) == KILN_OK;
    } else {
        y = sm;
    }
    ok = ok && kiln_network_mark_output(net, y, "y") == KILN_OK;
    kiln_build_config config;
    kiln_build_config_init(&config);
    config.backend = backend;
    ok = ok && kiln_build(net, &config, out) == KILN_OK;
    if (!ok)
        fprintf(stderr, "build_engine: %s\n", kiln_last_error());
    kiln_network_destroy(net);
    return ok;
}

static kiln_status run_batch(kiln_context *ctx, const float *x, int batch, float *y)
{
    kiln_dims d = {.rank = 2, .d = {batch, K}};
    kiln_status s = kiln_context_set_input_shape(ctx, "x", &d);
    if (s == KILN_OK)
        s = kiln_context_set_tensor_address(ctx, "x", (void *)x);
    if (s == KILN_OK)
        s = kiln_context_set_tensor_address(ctx, "y", y);
    if (s == KILN_OK)
        s = kiln_context_enqueue(ctx, NULL);
    if (s == KILN_OK)
        s = kiln_context_synchronize(ctx);
    return s;
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_run_matches_naive(void)
{
    kiln_registry *reg = registry_with(example_library());
    kiln_buffer buf = {0};
    CHECK(build_engine(reg, KILN_BACKEND_CPU, 1, &buf));
    kiln_engine *e = NULL;
    CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    if (!e) {
        kiln_registry_destroy(reg);
        return;
    }
    CHECK(kiln_engine_backend(e) == KILN_BACKEND_CPU);
    CHECK(kiln_engine_num_io_tensors(e) == 2);
    CHECK(kiln_engine_io_tensor_name(e, 0) && !strcmp(kiln_engine_io_tensor_name(e, 0), "x"));
    CHECK(kiln_engine_io_tensor_name(e, 1) && !strcmp(kiln_engine_io_tensor_name(e, 1), "y"));
    CHECK(kiln_engine_io_tensor_name(e, 2) == NULL);
    kiln_dtype dt;
    int32_t is_in = -1;
    kiln_dims dims;
    CHECK_OK(kiln_engine_io_tensor_info(e, "x", &dt, &is_in, &dims));
    CHECK(dt == KILN_DTYPE_F32 && is_in == 1 && dims.rank == 2 && dims.d[0] == -1 && dims.d[1] == K);
    CHECK(kiln_engine_num_profiles(e) == 1);
    kiln_dims mn, op, mx;
    CHECK_OK(kiln_engine_profile_shape(e, 0, "x", &mn, &op, &mx));
    CHECK(mn.d[0] == 1 && op.d[0] == 2 && mx.d[0] == MAX_BATCH);

    kiln_context *ctx = NULL;
    CHECK_OK(kiln_context_create(e, &ctx));
    for (int batch = 1; ctx && batch <= MAX_BATCH; batch++) {
        float x[MAX_BATCH * K], y[MAX_BATCH * N], yr[MAX_BATCH * N];
        double want[MAX_BATCH * N];
        input_values(x, batch, batch);
        expected(x, batch, want);
        CHECK_OK(run_batch(ctx, x, batch, y));
        kiln_dims yd;
        CHECK_OK(kiln_context_tensor_shape(ctx, "y", &yd));
        CHECK(yd.rank == 2 && yd.d[0] == batch && yd.d[1] == N);
        for (int i = 0; i < batch * N; i++)
            CHECK_NEAR(y[i], want[i], 1e-5);
        /* The reference path computes the same values. */
        CHECK_OK(kiln_context_set_tensor_address(ctx, "y", yr));
        CHECK_OK(kiln_context_run_reference(ctx));
        for (int i = 0; i < batch * N; i++)
            CHECK_NEAR(yr[i], want[i], 1e-5);
    }
    /* Unbound I/O uses the context's own memory. */
    if (ctx) {
        float *xin = NULL, *yout = NULL;
        kiln_dims d = {.rank = 2, .d = {3, K}};
        CHECK_OK(kiln_context_set_tensor_address(ctx, "x", NULL));
        CHECK_OK(kiln_context_set_tensor_address(ctx, "y", NULL));
        CHECK_OK(kiln_context_set_input_shape(ctx, "x", &d));
        CHECK_OK(kiln_context_tensor_address(ctx, "x", (void **)&xin));
        CHECK_OK(kiln_context_tensor_address(ctx, "y", (void **)&yout));
        CHECK(xin && yout && xin != yout);
        if (xin && yout) {
            double want[3 * N];
            input_values(xin, 3, 5);
            expected(xin, 3, want);
            CHECK_OK(kiln_context_enqueue(ctx, NULL));
            for (int i = 0; i < 3 * N; i++)
                CHECK_NEAR(yout[i], want[i], 1e-5);
        }
    }
    kiln_context_destroy(ctx);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

typedef struct thread_job {
    kiln_engine *engine;
    int batch, seed, ok;
    float single[MAX_BATCH * N];
} thread_job;

static void *thread_main(void *arg)
{
    thread_job *j = arg;
    kiln_context *ctx = NULL;
    float x[MAX_BATCH * K], y[MAX_BATCH * N];
    input_values(x, j->batch, j->seed);
    j->ok = kiln_context_create(j->engine, &ctx) == KILN_OK;
    for (int it = 0; j->ok && it < 50; it++) {
        memset(y, 0, sizeof y);
        j->ok = run_batch(ctx, x, j->batch, y) == KILN_OK &&
                memcmp(y, j->single, sizeof(float) * (size_t)(j->batch * N)) == 0;
    }
    kiln_context_destroy(ctx);
    return NULL;
}

static void test_threads_share_engine(void)
{
    kiln_registry *reg = registry_with(example_library());
    kiln_buffer buf = {0};
    CHECK(build_engine(reg, KILN_BACKEND_CPU, 1, &buf));
    kiln_engine *e = NULL;
    CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    if (!e) {
        kiln_registry_destroy(reg);
        return;
    }
    thread_job jobs[4];
    kiln_context *ctx = NULL;
    CHECK_OK(kiln_context_create(e, &ctx));
    for (int t = 0; t < 4 && ctx; t++) {
        jobs[t] = (thread_job){.engine = e, .batch = t + 1, .seed = 10 + t};
        float x[MAX_BATCH * K];
        input_values(x, jobs[t].batch, jobs[t].seed);
        CHECK_OK(run_batch(ctx, x, jobs[t].batch, jobs[t].single));
    }
    kiln_context_destroy(ctx);
    pthread_t th[4];
    for (int t = 0; t < 4; t++)
        CHECK(pthread_create(&th[t], NULL, thread_main, &jobs[t]) == 0);
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        CHECK(jobs[t].ok);
    }
    /* Four contexts were alive at once at most. */
    CHECK(kiln_engine_pool_blocks(e) <= 4);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

static void test_context_pool_does_not_grow(void)
{
    kiln_registry *reg = registry_with(example_library());
    kiln_buffer buf = {0};
    CHECK(build_engine(reg, KILN_BACKEND_CPU, 1, &buf));
    kiln_engine *e = NULL;
    CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    if (!e) {
        kiln_registry_destroy(reg);
        return;
    }
    kiln_context *live[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        CHECK_OK(kiln_context_create(e, &live[i]));
    CHECK(kiln_engine_pool_blocks(e) == 3);
    kiln_context_destroy(live[1]);
    int max_blocks = 0;
    for (int i = 0; i < 1000; i++) {
        kiln_context *c = NULL;
        CHECK_OK(kiln_context_create(e, &c));
        int n = kiln_engine_pool_blocks(e);
        max_blocks = n > max_blocks ? n : max_blocks;
        kiln_context_destroy(c);
    }
    CHECK(max_blocks == 3);
    kiln_context_destroy(live[0]);
    kiln_context_destroy(live[2]);
    CHECK(kiln_engine_pool_blocks(e) == 3);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

static void test_shape_errors(void)
{
    kiln_registry *reg = registry_with(example_library());
    kiln_buffer buf = {0};
    CHECK(build_engine(reg, KILN_BACKEND_CPU, 1, &buf));
    kiln_engine *e = NULL;
    CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    kiln_context *ctx = NULL;
    if (e)
        CHECK_OK(kiln_context_create(e, &ctx));
    if (!ctx) {
        kiln_engine_destroy(e);
        kiln_registry_destroy(reg);
        return;
    }
    /* Nothing set yet: the dynamic input is named. */
    kiln_dims out;
    CHECK_FAILS(kiln_context_enqueue(ctx, NULL), KILN_ERROR_SHAPE, "input \"x\"");
    CHECK_FAILS(kiln_context_tensor_shape(ctx, "y", &out), KILN_ERROR_SHAPE, "not set");
    CHECK_FAILS(kiln_context_run_reference(ctx), KILN_ERROR_SHAPE, "input \"x\"");

    kiln_dims big = {.rank = 2, .d = {MAX_BATCH + 1, K}};
    CHECK_FAILS(kiln_context_set_input_shape(ctx, "x", &big), KILN_ERROR_SHAPE,
                "input \"x\" dim 0 = 5 is outside profile 0 [1, 4]");
    kiln_dims zero = {.rank = 2, .d = {0, K}};
    CHECK_FAILS(kiln_context_set_input_shape(ctx, "x", &zero), KILN_ERROR_SHAPE,
                "input \"x\" dim 0 = 0 is outside profile 0 [1, 4]");
    kiln_dims wrong_static = {.rank = 2, .d = {2, K + 1}};
    CHECK_FAILS(kiln_context_set_input_shape(ctx, "x", &wrong_static), KILN_ERROR_SHAPE, "dim 1 = 9");
    kiln_dims rank3 = {.rank = 3, .d = {2, K, 1}};
    CHECK_FAILS(kiln_context_set_input_shape(ctx, "x", &rank3), KILN_ERROR_SHAPE, "rank 2");
    kiln_dims ok = {.rank = 2, .d = {2, K}};
    CHECK_FAILS(kiln_context_set_input_shape(ctx, "nope", &ok), KILN_ERROR_NOT_FOUND, "\"nope\"");
    CHECK_FAILS(kiln_context_set_input_shape(ctx, "y", &ok), KILN_ERROR_NOT_FOUND, "\"y\"");
    CHECK_FAILS(kiln_context_set_tensor_address(ctx, "fc", NULL), KILN_ERROR_NOT_FOUND, "\"fc\"");
    CHECK_FAILS(kiln_context_set_profile(ctx, 1), KILN_ERROR_INVALID_ARGUMENT, "profile 1");
    /* Failed calls left the context unset; a good shape then works. */
    CHECK_FAILS(kiln_context_enqueue(ctx, NULL), KILN_ERROR_SHAPE, "input \"x\"");
    CHECK_OK(kiln_context_set_input_shape(ctx, "x", &ok));
    CHECK_OK(kiln_context_tensor_shape(ctx, "y", &out));
    CHECK(out.rank == 2 && out.d[0] == 2 && out.d[1] == N);
    /* A rejected shape keeps the previous one. */
    CHECK_FAILS(kiln_context_set_input_shape(ctx, "x", &big), KILN_ERROR_SHAPE, "outside profile");
    CHECK_OK(kiln_context_tensor_shape(ctx, "y", &out));
    CHECK(out.d[0] == 2);
    CHECK_OK(kiln_context_enqueue(ctx, NULL));
    kiln_context_destroy(ctx);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

static void test_missing_plugins_reported_together(void)
{
    char v2[4096];
    kiln_registry *reg = registry_with(example_library());
    if (reg)
        CHECK_OK(kiln_registry_load_library(reg, test_library("libtest_scale_bias_v2.so", v2, sizeof v2)));
    /* Two plugin layers, ScaleBias 1 and ScaleBias 2. */
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(reg, &net));
    kiln_dims xd = {.rank = 1, .d = {4}};
    kiln_tensor x, a, b;
    int32_t n_out;
    float one = 1.0f;
    kiln_field fields[2] = {
        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "scale", KILN_FIELD_F32, 1, &one},
        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "bias", KILN_FIELD_F32, 1, &one},
    };
    kiln_buffer buf = {0};
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &xd, &x));
    CHECK_OK(kiln_network_add_plugin(net, "sb1", "ScaleBias", "1", "", fields, 2, &x, 1, &a, 1, &n_out));
    CHECK_OK(kiln_network_add_plugin(net, "sb2", "ScaleBias", "2", "", fields, 2, &a, 1, &b, 1, &n_out));
    CHECK_OK(kiln_network_mark_output(net, b, "y"));
    kiln_build_config config;
    kiln_build_config_init(&config);
    CHECK_OK(kiln_build(net, &config, &buf));
    kiln_network_destroy(net);

    kiln_engine *e = NULL;
    kiln_registry *empty = registry_with(NULL);
    CHECK_FAILS(kiln_engine_load_memory(empty, buf.data, buf.size, &e), KILN_ERROR_PLUGIN,
                "engine needs 2 plugins that are not registered: \"ScaleBias\" version \"1\" namespace \"\"");
    CHECK(strstr(kiln_last_error(), "\"ScaleBias\" version \"2\" namespace \"\""));
    CHECK(strstr(kiln_last_error(), "libkiln_scale_bias.so"));
    CHECK(strstr(kiln_last_error(), "libtest_scale_bias_v2.so"));
    CHECK(e == NULL);
    /* With only version 2 loaded, version 1 is missing and 2 is its near miss. */
    kiln_registry *only_v2 = registry_with(v2);
    CHECK_FAILS(kiln_engine_load_memory(only_v2, buf.data, buf.size, &e), KILN_ERROR_PLUGIN,
                "engine needs 1 plugin that is not registered: \"ScaleBias\" version \"1\"");
    CHECK(strstr(kiln_last_error(), "near misses:"));
    /* Both loaded: it runs, (x*1+1)*1+1 = x + 2. */
    CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_context *ctx = NULL;
    if (e)
        CHECK_OK(kiln_context_create(e, &ctx));
    if (ctx) {
        float xi[4] = {1, -2, 3.5f, 0}, yo[4] = {0};
        CHECK_OK(kiln_context_set_tensor_address(ctx, "x", xi));
        CHECK_OK(kiln_context_set_tensor_address(ctx, "y", yo));
        CHECK_OK(kiln_context_enqueue(ctx, NULL));
        for (int i = 0; i < 4; i++)
            CHECK_NEAR(yo[i], xi[i] + 2.0f, 0);
    }
    kiln_context_destroy(ctx);
    kiln_engine_destroy(e);
    kiln_buffer_free(&buf);
    kiln_registry_destroy(only_v2);
    kiln_registry_destroy(empty);
    kiln_registry_destroy(reg);
}

static void test_cuda_engine_refused_here(void)
{
    kiln_registry *reg = registry_with(NULL);
    kiln_buffer buf = {0};
    CHECK(build_engine(reg, KILN_BACKEND_CUDA, 0, &buf));
    kiln_engine *e = NULL;
#ifdef KILN_HAVE_CUDA
    /* Where a GPU is, the engine runs: tests/ops/test_cuda_runtime.c. */
    int32_t arch = 0;
    if (kiln_cuda_available(&arch)) {
        kiln_buffer_free(&buf);
        kiln_registry_destroy(reg);
        return;
    }
#endif
    if (buf.data)
        CHECK_FAILS(kiln_engine_load_memory(reg, buf.data, buf.size, &e), KILN_ERROR_TARGET,
                    "engine targets cuda (sm_");
    CHECK(strstr(kiln_last_error(), "but no CUDA GPU is available") ||
          strstr(kiln_last_error(), "but this kiln was built without CUDA"));
    CHECK(e == NULL);
    kiln_buffer_free(&buf);
    kiln_registry_destroy(reg);
}

static void test_bad_images(void)
{
    kiln_registry *reg = registry_with(example_library());
    kiln_buffer buf = {0};
    CHECK(build_engine(reg, KILN_BACKEND_CPU, 1, &buf));
    kiln_engine *e = NULL;
    if (buf.data) {
        /* Truncations and flipped bytes all over the file fail cleanly:
         * checksums, bounds and padding checks leave nothing unchecked. */
        for (size_t n = 0; n < buf.size; n += buf.size / 64 + 1)
            CHECK(kiln_engine_load_memory(reg, buf.data, n, &e) != KILN_OK && e == NULL);
        unsigned char *p = buf.data;
        for (size_t i = 0; i < buf.size; i += i < 1024 ? 7 : buf.size / 256 + 1) {
            p[i] ^= 0x40;
            CHECK(kiln_engine_load_memory(reg, buf.data, buf.size, &e) != KILN_OK && e == NULL);
            p[i] ^= 0x40;
        }
        CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    }
    kiln_engine_destroy(e);
    CHECK_FAILS(kiln_engine_load(reg, "/nonexistent/x.engine", &e), KILN_ERROR_IO, "/nonexistent/x.engine");
    kiln_buffer_free(&buf);
    kiln_registry_destroy(reg);
}

static void test_describe_json(void)
{
    kiln_registry *reg = registry_with(example_library());
    kiln_buffer buf = {0};
    CHECK(build_engine(reg, KILN_BACKEND_CPU, 1, &buf));
    kiln_engine *e = NULL;
    CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    char *text = NULL;
    if (e)
        CHECK_OK(kiln_engine_describe_json(e, &text));
    json_t *root = text ? json_loads(text, 0, NULL) : NULL;
    CHECK(root != NULL);
    if (root) {
        CHECK(!strcmp(json_string_value(json_object_get(json_object_get(root, "target"), "backend")), "cpu"));
        json_t *plugins = json_object_get(root, "plugins");
        CHECK(json_array_size(plugins) == 1);
        json_t *p0 = json_array_get(plugins, 0);
        CHECK(p0 && !strcmp(json_string_value(json_object_get(p0, "name")), "ScaleBias"));
        CHECK(p0 && json_integer_value(json_object_get(p0, "blob_version")) == 1);
        CHECK(p0 && json_integer_value(json_object_get(p0, "blob_bytes")) == 8);
        CHECK(p0 && strstr(json_string_value(json_object_get(p0, "library")), "libkiln_scale_bias.so"));
        json_t *mem = json_object_get(root, "memory");
        CHECK((size_t)json_integer_value(json_object_get(mem, "arena_bytes")) == e->graph.arena_size);
        /* a context: the arena less the I/O tensors (here x and y, planned
         * inside it), plus the workspace */
        size_t ctx_bytes = (size_t)json_integer_value(json_object_get(mem, "context_bytes"));
        CHECK(ctx_bytes == e->pool.block_bytes);
        CHECK(ctx_bytes >= e->graph.workspace_size && ctx_bytes < e->graph.arena_size + e->graph.workspace_size);
        CHECK(json_array_size(json_object_get(root, "layers")) == (size_t)e->graph.n_layers);
        json_t *prof = json_object_get(json_array_get(json_object_get(root, "profiles"), 0), "x");
        CHECK(json_integer_value(json_array_get(json_object_get(prof, "max"), 0)) == MAX_BATCH);
        /* x's first dim is a symbol, its second the constant 8. */
        size_t i;
        json_t *t;
        int seen = 0;
        json_array_foreach(json_object_get(root, "tensors"), i, t)
        {
            if (strcmp(json_string_value(json_object_get(t, "name")), "x"))
                continue;
            seen = 1;
            json_t *dims = json_object_get(t, "dims");
            CHECK(json_array_size(dims) == 2);
            CHECK(!strcmp(json_string_value(json_array_get(dims, 1)), "8"));
            CHECK(strcmp(json_string_value(json_array_get(dims, 0)), "8") != 0);
        }
        CHECK(seen);
    }
    json_decref(root);
    free(text);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

/* TestWorkspace reverses its input through its workspace and writes
 * every workspace byte it asked for: a workspace too small, or overlapping
 * live tensors, shows up as wrong values (or an ASan report). */
static void test_plugin_workspace(void)
{
    char lib[4096];
    kiln_registry *reg = registry_with(test_library("libtest_workspace.so", lib, sizeof lib));
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(reg, &net));
    kiln_dims xd = {.rank = 2, .d = {-1, 16}};
    kiln_dims mn = {.rank = 2, .d = {1, 16}}, op = {.rank = 2, .d = {2, 16}}, mx = {.rank = 2, .d = {6, 16}};
    kiln_tensor x, r, y;
    int32_t profile, n_out;
    int64_t extra = 100;
    kiln_field field = {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "extra_bytes", KILN_FIELD_I64, 1, &extra};
    kiln_buffer buf = {0};
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &xd, &x));
    CHECK_OK(kiln_network_add_profile(net, &profile));
    CHECK_OK(kiln_network_set_profile_shape(net, profile, "x", &mn, &op, &mx));
    CHECK_OK(kiln_network_add_plugin(net, "rev", "TestWorkspace", "1", "test", &field, 1, &x, 1, &r, 1, &n_out));
    CHECK_OK(kiln_network_add_unary(net, "neg", KILN_UNARY_NEG, r, &y));
    CHECK_OK(kiln_network_mark_output(net, y, "y"));
    kiln_build_config config;
    kiln_build_config_init(&config);
    CHECK_OK(kiln_build(net, &config, &buf));
    kiln_network_destroy(net);
    kiln_engine *e = NULL;
    if (buf.data)
        CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    kiln_context *ctx = NULL;
    if (e) {
        CHECK(e->graph.workspace_size >= 6 * 16 * 4 + 100);
        CHECK_OK(kiln_context_create(e, &ctx));
    }
    for (int batch = 1; ctx && batch <= 6; batch += 5) {
        float *xin = NULL, *yout = NULL;
        kiln_dims d = {.rank = 2, .d = {batch, 16}};
        CHECK_OK(kiln_context_set_input_shape(ctx, "x", &d));
        CHECK_OK(kiln_context_tensor_address(ctx, "x", (void **)&xin));
        CHECK_OK(kiln_context_tensor_address(ctx, "y", (void **)&yout));
        if (!xin || !yout)
            break;
        int n = batch * 16;
        for (int i = 0; i < n; i++)
            xin[i] = (float)i * 0.5f + 1.0f;
        CHECK_OK(kiln_context_enqueue(ctx, NULL));
        for (int i = 0; i < n; i++)
            CHECK_NEAR(yout[i], -((float)(n - 1 - i) * 0.5f + 1.0f), 0);
        CHECK_OK(kiln_context_run_reference(ctx));
        for (int i = 0; i < n; i++)
            CHECK_NEAR(yout[i], -((float)(n - 1 - i) * 0.5f + 1.0f), 0);
    }
    kiln_context_destroy(ctx);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

/* An output that is a constant: layers read the constant from the engine,
 * and memory the caller bound to the output receives a copy. */
static void test_constant_output(void)
{
    kiln_registry *reg = registry_with(NULL);
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(reg, &net));
    kiln_dims d = {.rank = 1, .d = {3}};
    const float c[3] = {1.5f, -2.0f, 4.0f};
    kiln_tensor x, ct, y;
    kiln_buffer buf = {0};
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &d, &x));
    CHECK_OK(kiln_network_add_constant(net, "c", KILN_DTYPE_F32, &d, c, &ct));
    CHECK_OK(kiln_network_add_binary(net, "y", KILN_BINARY_MUL, x, ct, &y));
    CHECK_OK(kiln_network_mark_output(net, y, NULL));
    CHECK_OK(kiln_network_mark_output(net, ct, NULL));
    kiln_build_config config;
    kiln_build_config_init(&config);
    CHECK_OK(kiln_build(net, &config, &buf));
    kiln_network_destroy(net);
    kiln_engine *e = NULL;
    kiln_context *ctx = NULL;
    if (buf.data)
        CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_buffer_free(&buf);
    if (e)
        CHECK_OK(kiln_context_create(e, &ctx));
    if (ctx) {
        float xi[3] = {2, 3, -1}, yo[3] = {0}, co[3] = {0};
        const float *cp = NULL;
        CHECK_OK(kiln_context_tensor_address(ctx, "c", (void **)&cp));
        CHECK(cp && cp[0] == 1.5f && cp[1] == -2.0f && cp[2] == 4.0f);
        CHECK_OK(kiln_context_set_tensor_address(ctx, "x", xi));
        CHECK_OK(kiln_context_set_tensor_address(ctx, "y", yo));
        CHECK_OK(kiln_context_set_tensor_address(ctx, "c", co));
        CHECK_OK(kiln_context_enqueue(ctx, NULL));
        for (int i = 0; i < 3; i++) {
            CHECK_NEAR(yo[i], xi[i] * c[i], 0);
            CHECK_NEAR(co[i], c[i], 0);
        }
        memset(co, 0, sizeof co);
        memset(yo, 0, sizeof yo);
        CHECK_OK(kiln_context_run_reference(ctx));
        for (int i = 0; i < 3; i++) {
            CHECK_NEAR(yo[i], xi[i] * c[i], 0);
            CHECK_NEAR(co[i], c[i], 0);
        }
    }
    kiln_context_destroy(ctx);
    kiln_engine_destroy(e);
    kiln_registry_destroy(reg);
}

/* host->upcoming_constants from a plugin's enqueue: the constants of the
 * layers after it, in the order they run, a small one (a bias) skipped,
 * cut at the budget. */
static void test_upcoming_constants(void)
{
    char lib[4096];
    kiln_registry *reg = registry_with(test_library("libtest_upcoming.so", lib, sizeof lib));
    enum { UK = 1024, UM = 8 };
    float *w1 = calloc(UK * UM, sizeof(float)), *w2 = calloc(UM * UK, sizeof(float)), bias[UM] = {0};
    w1[0] = 7.0f, w2[0] = 9.0f, bias[0] = 5.0f;
    const int64_t budgets[3] = {1 << 20, 40000, 1000};
    for (int bi = 0; bi < 3 && w1 && w2; bi++) {
        kiln_network *net = NULL;
        CHECK_OK(kiln_network_create(reg, &net));
        kiln_dims xd = {.rank = 2, .d = {1, UK}}, w1d = {.rank = 2, .d = {UK, UM}}, bd = {.rank = 1, .d = {UM}},
                  w2d = {.rank = 2, .d = {UM, UK}};
        kiln_tensor x, u, c1, c2, cb, y;
        int32_t n_out;
        kiln_field f = {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "budget", KILN_FIELD_I64, 1, &budgets[bi]};
        CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &xd, &x));
        CHECK_OK(kiln_network_add_plugin(net, "up", "TestUpcoming", "1", "test", &f, 1, &x, 1, &u, 1, &n_out));
        CHECK_OK(kiln_network_add_constant(net, "w1", KILN_DTYPE_F32, &w1d, w1, &c1));
        CHECK_OK(kiln_network_add_constant(net, "b", KILN_DTYPE_F32, &bd, bias, &cb));
        CHECK_OK(kiln_network_add_constant(net, "w2", KILN_DTYPE_F32, &w2d, w2, &c2));
        CHECK_OK(kiln_network_add_matmul(net, "mm1", x, 0, c1, 0, &y));
        CHECK_OK(kiln_network_add_binary(net, "add", KILN_BINARY_ADD, y, cb, &y));
        CHECK_OK(kiln_network_add_matmul(net, "mm2", y, 0, c2, 0, &y));
        CHECK_OK(kiln_network_mark_output(net, u, "u"));
        CHECK_OK(kiln_network_mark_output(net, y, "y"));
        kiln_build_config config;
        kiln_build_config_init(&config);
        kiln_buffer buf = {0};
        CHECK_OK(kiln_build(net, &config, &buf));
        kiln_network_destroy(net);
        kiln_engine *e = NULL;
        kiln_context *ctx = NULL;
        if (buf.data)
            CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
        kiln_buffer_free(&buf);
        if (e)
            CHECK_OK(kiln_context_create(e, &ctx));
        const float *uo = NULL;
        if (ctx) {
            CHECK_OK(kiln_context_enqueue(ctx, NULL));
            CHECK_OK(kiln_context_tensor_address(ctx, "u", (void **)&uo));
        }
        if (uo) {
            const float size = (float)(UK * UM * sizeof(float)); /* 32 KiB each; the bias's 32 bytes are skipped */
            if (bi == 0) {
                CHECK(uo[0] == 2 && uo[1] == 7.0f && uo[2] == size && uo[3] == 9.0f && uo[4] == size);
            } else if (bi == 1) {
                CHECK(uo[0] == 2 && uo[1] == 7.0f && uo[2] == size && uo[3] == 9.0f && uo[4] == 40000.0f - size);
            } else {
                CHECK(uo[0] == 1 && uo[1] == 7.0f && uo[2] == 1000.0f);
            }
        }
        kiln_context_destroy(ctx);
        kiln_engine_destroy(e);
    }
    free(w1), free(w2);
    kiln_registry_destroy(reg);
}

static const test_case_ tests[] = {
    TEST(test_run_matches_naive),          TEST(test_upcoming_constants), TEST(test_threads_share_engine),
    TEST(test_context_pool_does_not_grow), TEST(test_shape_errors),       TEST(test_missing_plugins_reported_together),
    TEST(test_cuda_engine_refused_here),   TEST(test_bad_images),         TEST(test_describe_json),
    TEST(test_plugin_workspace),           TEST(test_constant_output),
};

TEST_MAIN(tests)
