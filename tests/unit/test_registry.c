/* The plugin registry, library loading, field schemas and the ScaleBias
 * example plugin, through the public API plus the internal wrappers the
 * engine reader and runtime use. Libraries come from the build tree
 * (KILN_BUILD_DIR): lib/libkiln_scale_bias.so and tests/plugins/lib*.so. */
#include "test.h"

#include "core/expr.h"
#include "plugin/plugin_internal.h"

#include <unistd.h>

static char build_dir[512];
static int32_t n_builtin; /* creators every new registry starts with */

/* Path of a library in the build tree, in a static ring so a test can hold
 * a few at once. */
static const char *lib_path(const char *rel)
{
    static char bufs[4][1024];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", build_dir, rel);
    return b;
}

#define EXAMPLE "lib/libkiln_scale_bias.so"
#define TEST_PLUGIN(name) "tests/plugins/lib" name ".so"

static kiln_registry *registry_with(const char *rel)
{
    kiln_registry *reg = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    if (reg && rel)
        CHECK_OK(kiln_registry_load_library(reg, lib_path(rel)));
    return reg;
}

static kiln_field f32_field(const char *name, const float *v, int64_t count)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_F32, count, v};
}

static const kiln_plugin_creator *scale_bias_creator(const kiln_registry *reg)
{
    return kiln_registry_find(reg, "ScaleBias", "1", "", NULL);
}

static kiln_plugin *make_scale_bias(const kiln_plugin_creator *c, float scale, float bias)
{
    kiln_field f[2] = {f32_field("scale", &scale, 1), f32_field("bias", &bias, 1)};
    kiln_plugin *p = NULL;
    CHECK_OK(kiln_plugin_create(c, f, 2, &p));
    return p;
}

static kiln_tensor_desc desc_1d(kiln_dtype t, int64_t n)
{
    kiln_tensor_desc d = {sizeof(kiln_tensor_desc), KILN_PLUGIN_ABI_VERSION, t, KILN_FORMAT_LINEAR, {0}};
    d.dims.rank = 1;
    d.dims.d[0] = n;
    return d;
}

/* Runs a one-input, one-output plugin on the CPU, inline (stream NULL). */
static kiln_status run_cpu(kiln_plugin *p, kiln_dtype t, const void *x, void *y, int64_t n, void *ws)
{
    kiln_tensor_desc in = desc_1d(t, n), out = desc_1d(t, n);
    const void *ins[1] = {x};
    void *outs[1] = {y};
    return p->ops->enqueue(p, KILN_BACKEND_CPU, &in, ins, 1, &out, outs, 1, ws, NULL);
}

/* ---- loading --------------------------------------------------------------- */

static void test_load_example(void)
{
    kiln_registry *reg = registry_with(NULL);
    CHECK(kiln_registry_count(reg) == n_builtin);
    for (int32_t i = 0; i < n_builtin; i++) {
        const char *lib = NULL;
        CHECK(kiln_registry_get(reg, i, &lib) != NULL && lib && strcmp(lib, KILN_BUILTIN_LIBRARY) == 0);
    }
    const char *path = lib_path(EXAMPLE);
    CHECK_OK(kiln_registry_load_library(reg, path));
    CHECK(kiln_registry_count(reg) == n_builtin + 1);
    const char *lib = NULL;
    const kiln_plugin_creator *c = kiln_registry_find(reg, "ScaleBias", "1", "", &lib);
    CHECK(c != NULL);
    CHECK(lib && strcmp(lib, path) == 0);
    if (c) {
        CHECK(c->n_fields == 2 && c->blob_version == 1);
        CHECK(c->description != NULL);
    }
    /* Exact triple only. */
    CHECK(kiln_registry_find(reg, "ScaleBias", "2", "", NULL) == NULL);
    CHECK(kiln_registry_find(reg, "ScaleBias", "1", "x", NULL) == NULL);
    CHECK(kiln_registry_find(reg, "scalebias", "1", "", NULL) == NULL);

    lib = NULL;
    CHECK(kiln_registry_get(reg, n_builtin, &lib) == c && lib && strcmp(lib, path) == 0);
    CHECK(kiln_registry_get(reg, n_builtin + 1, NULL) == NULL);
    CHECK(kiln_registry_get(reg, -1, NULL) == NULL);
    kiln_registry_destroy(reg);
    kiln_registry_destroy(NULL);
}

static void test_load_twice_and_symlink(void)
{
    kiln_registry *reg = registry_with(EXAMPLE);
    const char *path = lib_path(EXAMPLE);
    CHECK_OK(kiln_registry_load_library(reg, path));
    CHECK(kiln_registry_count(reg) == n_builtin + 1);

    char dir[] = "/tmp/kiln_test_registry_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char link_path[600];
    snprintf(link_path, sizeof link_path, "%s/other_name.so", dir);
    CHECK(symlink(path, link_path) == 0);
    CHECK_OK(kiln_registry_load_library(reg, link_path));
    CHECK(kiln_registry_count(reg) == n_builtin + 1);
    const char *lib = NULL;
    CHECK(kiln_registry_find(reg, "ScaleBias", "1", "", &lib) != NULL);
    CHECK(lib && strcmp(lib, path) == 0); /* the first path stays the name */
    unlink(link_path);
    rmdir(dir);
    kiln_registry_destroy(reg);
}

static void test_conflict_names_both_files(void)
{
    kiln_registry *reg = registry_with(EXAMPLE);
    char expected[2048];
    snprintf(expected, sizeof expected,
             "plugin \"ScaleBias\" version \"1\" namespace \"\" from %s is already registered by %s",
             lib_path(TEST_PLUGIN("test_conflict")), lib_path(EXAMPLE));
    CHECK_FAILS(kiln_registry_load_library(reg, lib_path(TEST_PLUGIN("test_conflict"))), KILN_ERROR_PLUGIN, expected);
    CHECK(strcmp(kiln_last_error(), expected) == 0);
    CHECK(kiln_registry_count(reg) == n_builtin + 1);
    const char *lib = NULL;
    CHECK(kiln_registry_find(reg, "ScaleBias", "1", "", &lib) != NULL);
    CHECK(lib && strcmp(lib, lib_path(EXAMPLE)) == 0);
    kiln_registry_destroy(reg);
}

static void test_bad_libraries(void)
{
    kiln_registry *reg = registry_with(NULL);
    char expected[2048];

    snprintf(expected, sizeof expected, "plugin library %s: no symbol kiln_plugin_library_init (is it a kiln plugin?)",
             lib_path(TEST_PLUGIN("test_noinit")));
    CHECK_FAILS(kiln_registry_load_library(reg, lib_path(TEST_PLUGIN("test_noinit"))), KILN_ERROR_PLUGIN, expected);

    const char *missing = lib_path("tests/plugins/libdoes_not_exist.so");
    snprintf(expected, sizeof expected, "plugin library %s: cannot open shared object file", missing);
    CHECK_FAILS(kiln_registry_load_library(reg, missing), KILN_ERROR_IO, expected);
    CHECK_FAILS(kiln_registry_load_library(reg, ""), KILN_ERROR_INVALID_ARGUMENT, "empty path");

    /* A creator from a newer ABI: refused, naming the library and both
     * versions. */
    const char *abi_new = lib_path(TEST_PLUGIN("test_abi_new"));
    snprintf(expected, sizeof expected,
             "plugin library %s: plugin \"FutureAbi\" uses plugin ABI version 2, newer than this kiln supports (1)",
             abi_new);
    CHECK_FAILS(kiln_registry_load_library(reg, abi_new), KILN_ERROR_VERSION, expected);
    CHECK(kiln_registry_count(reg) == n_builtin);
    kiln_registry_destroy(reg);
}

static void test_init_failure_rolls_back(void)
{
    kiln_registry *reg = registry_with(EXAMPLE);
    const char *path = lib_path(TEST_PLUGIN("test_initfail"));
    char expected[2048];
    snprintf(expected, sizeof expected,
             "plugin library %s: init failed: test_initfail: the device this plugin needs is missing", path);
    CHECK_FAILS(kiln_registry_load_library(reg, path), KILN_ERROR_PLUGIN, expected);
    /* Both creators it registered before failing are gone; the earlier
     * library's are not. */
    CHECK(kiln_registry_count(reg) == n_builtin + 1);
    CHECK(kiln_registry_find(reg, "InitFailA", "1", "test", NULL) == NULL);
    CHECK(kiln_registry_find(reg, "InitFailB", "1", "test", NULL) == NULL);
    CHECK(scale_bias_creator(reg) != NULL);
    /* It was not recorded as loaded: a second attempt runs init again. */
    CHECK_FAILS(kiln_registry_load_library(reg, path), KILN_ERROR_PLUGIN, expected);
    /* Other libraries still load after the failure. */
    CHECK_OK(kiln_registry_load_library(reg, lib_path(TEST_PLUGIN("test_workspace"))));
    CHECK(kiln_registry_count(reg) == n_builtin + 2);
    kiln_registry_destroy(reg);
}

/* ---- registering directly (how built-in plugins register) ------------------ */

static kiln_status silent_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    return KILN_ERROR_INVALID_ARGUMENT; /* without host->fail: the host must supply a message */
}

static kiln_status no_ops_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    static kiln_plugin bare = {sizeof(kiln_plugin), KILN_PLUGIN_ABI_VERSION, NULL};
    *out = &bare;
    return KILN_OK;
}

static kiln_status never_deserialize(const kiln_plugin_creator *c, uint32_t v, const void *b, size_t s,
                                     kiln_plugin **out)
{
    return kiln_host()->fail(KILN_ERROR_UNSUPPORTED, "never");
}

static void test_register_builtin(void)
{
    static const kiln_plugin_creator silent = {sizeof(kiln_plugin_creator),
                                               KILN_PLUGIN_ABI_VERSION,
                                               "Silent",
                                               "1",
                                               "test",
                                               NULL,
                                               0,
                                               1,
                                               silent_create,
                                               never_deserialize,
                                               NULL,
                                               NULL};
    static const kiln_plugin_creator no_ops = {sizeof(kiln_plugin_creator),
                                               KILN_PLUGIN_ABI_VERSION,
                                               "NoOps",
                                               "1",
                                               "test",
                                               NULL,
                                               0,
                                               1,
                                               no_ops_create,
                                               never_deserialize,
                                               NULL,
                                               NULL};
    static const kiln_plugin_creator too_small = {40, KILN_PLUGIN_ABI_VERSION, "TooSmall",        "1",  "test", NULL, 0,
                                                  1,  silent_create,           never_deserialize, NULL, NULL};
    static const float one = 1.0f;
    static const kiln_field_spec twice_specs[2] = {
        {sizeof(kiln_field_spec), 1, "a", KILN_FIELD_F32, 1, 0, 0, &one, 1, NULL},
        {sizeof(kiln_field_spec), 1, "a", KILN_FIELD_F32, 1, 0, 0, &one, 1, NULL},
    };
    static const kiln_field_spec short_default_spec[1] = {
        {sizeof(kiln_field_spec), 1, "pair", KILN_FIELD_F32, 2, 0, 0, &one, 1, NULL},
    };
    static const kiln_plugin_creator short_default = {sizeof(kiln_plugin_creator),
                                                      KILN_PLUGIN_ABI_VERSION,
                                                      "ShortDefault",
                                                      "1",
                                                      "test",
                                                      short_default_spec,
                                                      1,
                                                      1,
                                                      silent_create,
                                                      never_deserialize,
                                                      NULL,
                                                      NULL};
    static const kiln_plugin_creator twice = {sizeof(kiln_plugin_creator),
                                              KILN_PLUGIN_ABI_VERSION,
                                              "Twice",
                                              "1",
                                              "test",
                                              twice_specs,
                                              2,
                                              1,
                                              silent_create,
                                              never_deserialize,
                                              NULL,
                                              NULL};

    kiln_registry *reg = registry_with(NULL);
    const kiln_host_api *h = kiln_host();
    CHECK_OK(h->register_creator(reg, &silent));
    const char *lib = NULL;
    CHECK(kiln_registry_find(reg, "Silent", "1", "test", &lib) == &silent);
    CHECK(lib && strcmp(lib, KILN_BUILTIN_LIBRARY) == 0);
    CHECK_FAILS(h->register_creator(reg, &silent), KILN_ERROR_PLUGIN,
                "plugin \"Silent\" version \"1\" namespace \"test\" from builtin is already registered by builtin");
    CHECK_FAILS(h->register_creator(reg, &too_small), KILN_ERROR_VERSION, "struct_size 40");
    CHECK_FAILS(h->register_creator(reg, &twice), KILN_ERROR_PLUGIN, "field \"a\" is declared twice");
    CHECK_FAILS(h->register_creator(reg, &short_default), KILN_ERROR_PLUGIN,
                "field \"pair\" has a default of 1 values");
    CHECK_FAILS(h->register_creator(reg, NULL), KILN_ERROR_INVALID_ARGUMENT, "creator is NULL");
    CHECK_OK(h->register_creator(reg, &no_ops));
    CHECK(kiln_registry_count(reg) == n_builtin + 2);

    kiln_plugin *p = (kiln_plugin *)0x1;
    CHECK_FAILS(kiln_plugin_create(&silent, NULL, 0, &p), KILN_ERROR_INVALID_ARGUMENT,
                "plugin Silent 1 \"test\": create failed with KILN_ERROR_INVALID_ARGUMENT and gave no message");
    CHECK_FAILS(kiln_plugin_create(&no_ops, NULL, 0, &p), KILN_ERROR_PLUGIN,
                "plugin NoOps 1 \"test\": create returned an instance without ops");
    CHECK(p == (kiln_plugin *)0x1); /* outputs untouched on failure */
    float v = 1.0f;
    kiln_field f = f32_field("x", &v, 1);
    CHECK_FAILS(kiln_plugin_create(&silent, &f, 1, &p), KILN_ERROR_INVALID_ARGUMENT,
                "plugin Silent 1 \"test\": unknown field \"x\" (it takes no fields)");
    CHECK_FAILS(kiln_plugin_deserialize(&silent, 1, NULL, 0, &p), KILN_ERROR_UNSUPPORTED,
                "plugin Silent 1 \"test\": never");
    kiln_registry_destroy(reg);
}

/* ---- field schemas ----------------------------------------------------------- */

static void test_field_schema_errors(void)
{
    kiln_registry *reg = registry_with(EXAMPLE);
    const kiln_plugin_creator *c = scale_bias_creator(reg);
    if (!c) {
        kiln_registry_destroy(reg);
        return;
    }
    float two[2] = {2.0f, 3.0f}, half = 0.5f, nan_v = NAN;
    int32_t i2 = 2;
    kiln_plugin *p = (kiln_plugin *)0x1;

    kiln_field misspelled[2] = {f32_field("scal", two, 1), f32_field("bias", &half, 1)};
    CHECK_FAILS(kiln_plugin_create(c, misspelled, 2, &p), KILN_ERROR_INVALID_ARGUMENT,
                "plugin ScaleBias 1 \"\": unknown field \"scal\" (fields: scale, bias)");

    kiln_field wrong_type[2] = {{sizeof(kiln_field), 1, "scale", KILN_FIELD_I32, 1, &i2}, f32_field("bias", &half, 1)};
    CHECK_FAILS(kiln_plugin_create(c, wrong_type, 2, &p), KILN_ERROR_INVALID_ARGUMENT,
                "plugin ScaleBias 1 \"\": field \"scale\" has type i32, expected f32");

    kiln_field wrong_count[2] = {f32_field("scale", two, 2), f32_field("bias", &half, 1)};
    CHECK_FAILS(kiln_plugin_create(c, wrong_count, 2, &p), KILN_ERROR_INVALID_ARGUMENT,
                "plugin ScaleBias 1 \"\": field \"scale\" has 2 values, expected 1");

    kiln_field missing[1] = {f32_field("scale", two, 1)};
    CHECK_FAILS(kiln_plugin_create(c, missing, 1, &p), KILN_ERROR_INVALID_ARGUMENT,
                "plugin ScaleBias 1 \"\": missing required field \"bias\"");

    kiln_field dup[3] = {f32_field("scale", two, 1), f32_field("bias", &half, 1), f32_field("scale", two, 1)};
    CHECK_FAILS(kiln_plugin_create(c, dup, 3, &p), KILN_ERROR_INVALID_ARGUMENT,
                "plugin ScaleBias 1 \"\": field \"scale\" is given twice");

    kiln_field no_data[2] = {f32_field("scale", NULL, 1), f32_field("bias", &half, 1)};
    CHECK_FAILS(kiln_plugin_create(c, no_data, 2, &p), KILN_ERROR_INVALID_ARGUMENT, "field \"scale\" has no data");

    /* The plugin's own check of a value, prefixed with the triple. */
    kiln_field not_finite[2] = {f32_field("scale", two, 1), f32_field("bias", &nan_v, 1)};
    CHECK_FAILS(kiln_plugin_create(c, not_finite, 2, &p), KILN_ERROR_INVALID_ARGUMENT,
                "plugin ScaleBias 1 \"\": ScaleBias: field \"bias\" must be finite");
    CHECK(p == (kiln_plugin *)0x1);

    /* Order does not matter. */
    kiln_field swapped[2] = {f32_field("bias", &half, 1), f32_field("scale", two, 1)};
    p = NULL;
    CHECK_OK(kiln_plugin_create(c, swapped, 2, &p));
    if (p) {
        float x[2] = {1.0f, -2.0f}, y[2] = {0};
        CHECK_OK(run_cpu(p, KILN_DTYPE_F32, x, y, 2, NULL));
        CHECK(y[0] == 2.5f && y[1] == -3.5f); /* 2*1+0.5, 2*-2+0.5 */
        p->ops->destroy(p);
    }
    kiln_registry_destroy(reg);
}

static void test_field_defaults(void)
{
    kiln_registry *reg = registry_with(TEST_PLUGIN("test_workspace"));
    const kiln_plugin_creator *c = kiln_registry_find(reg, "TestWorkspace", "1", "test", NULL);
    CHECK(c != NULL);
    if (!c) {
        kiln_registry_destroy(reg);
        return;
    }
    kiln_tensor_desc in = desc_1d(KILN_DTYPE_F32, 10), out = in;
    kiln_plugin *p = NULL;
    /* extra_bytes left out: its default 0 is filled in by the host. */
    CHECK_OK(kiln_plugin_create(c, NULL, 0, &p));
    if (p) {
        CHECK(p->ops->workspace_size(p, &in, 1, &out, 1) == 40);
        p->ops->destroy(p);
    }
    int64_t extra = 24;
    kiln_field f = {sizeof(kiln_field), 1, "extra_bytes", KILN_FIELD_I64, 1, &extra};
    p = NULL;
    CHECK_OK(kiln_plugin_create(c, &f, 1, &p));
    if (p) {
        CHECK(p->ops->workspace_size(p, &in, 1, &out, 1) == 64);
        float x[10], y[10], ws[16];
        for (int i = 0; i < 10; i++)
            x[i] = (float)i;
        CHECK_OK(run_cpu(p, KILN_DTYPE_F32, x, y, 10, ws));
        CHECK(y[0] == 9.0f && y[9] == 0.0f);
        p->ops->destroy(p);
    }
    kiln_registry_destroy(reg);
}

/* ---- the ScaleBias plugin ---------------------------------------------------- */

static void test_scale_bias_compute(void)
{
    kiln_registry *reg = registry_with(EXAMPLE);
    const kiln_plugin_creator *c = scale_bias_creator(reg);
    kiln_plugin *p = c ? make_scale_bias(c, 2.0f, 0.5f) : NULL;
    if (!p) {
        kiln_registry_destroy(reg);
        return;
    }
    CHECK(p->ops->flags & KILN_PLUGIN_FLAG_CAPTURE_SAFE);
#ifdef KILN_HAVE_CUDA
    /* Built with CUDA, the example library carries its CUDA kernel too. */
    const uint32_t backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU) | KILN_BACKEND_BIT(KILN_BACKEND_CUDA);
#else
    const uint32_t backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU);
#endif
    CHECK(p->ops->backends == backends);
    CHECK(p->ops->num_outputs(p) == 1);

    /* f32 over enough elements that a thread pool would split the range. */
    enum { N = 100000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    for (int i = 0; i < N; i++)
        x[i] = (float)(i % 1000) - 500.0f;
    CHECK_OK(run_cpu(p, KILN_DTYPE_F32, x, y, N, NULL));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += y[i] != 2.0f * x[i] + 0.5f;
    CHECK(bad == 0);
    free(x);
    free(y);

    /* f16 and bf16 by bit pattern (IEEE binary16 / bfloat16):
     * 1.5 -> 3.5, -2 -> -3.5, 0 -> 0.5. */
    uint16_t h_in[3] = {0x3E00, 0xC000, 0x0000}, h_out[3] = {0};
    CHECK_OK(run_cpu(p, KILN_DTYPE_F16, h_in, h_out, 3, NULL));
    CHECK(h_out[0] == 0x4300 && h_out[1] == 0xC300 && h_out[2] == 0x3800);
    uint16_t b_in[3] = {0x3FC0, 0xC000, 0x0000}, b_out[3] = {0};
    CHECK_OK(run_cpu(p, KILN_DTYPE_BF16, b_in, b_out, 3, NULL));
    CHECK(b_out[0] == 0x4060 && b_out[1] == 0xC060 && b_out[2] == 0x3F00);

    /* Types and backends it accepts. */
    kiln_tensor_desc d[2] = {desc_1d(KILN_DTYPE_F32, 4), desc_1d(KILN_DTYPE_F32, 4)};
    CHECK(p->ops->supports(p, KILN_BACKEND_CPU, d, 1, 1));
    CHECK(!p->ops->supports(p, KILN_BACKEND_CUDA, d, 1, 1) == !(backends & KILN_BACKEND_BIT(KILN_BACKEND_CUDA)));
    d[1].dtype = KILN_DTYPE_F16;
    CHECK(!p->ops->supports(p, KILN_BACKEND_CPU, d, 1, 1));
    d[0].dtype = d[1].dtype = KILN_DTYPE_I32;
    CHECK(!p->ops->supports(p, KILN_BACKEND_CPU, d, 1, 1));
    kiln_dtype in_t = KILN_DTYPE_BF16, out_t = KILN_DTYPE_F32;
    CHECK_OK(p->ops->output_dtypes(p, &in_t, 1, &out_t, 1));
    CHECK(out_t == KILN_DTYPE_BF16);
    in_t = KILN_DTYPE_I32;
    CHECK_FAILS(p->ops->output_dtypes(p, &in_t, 1, &out_t, 1), KILN_ERROR_UNSUPPORTED, "ScaleBias");
    CHECK_FAILS(p->ops->enqueue(p, KILN_BACKEND_COUNT, d, NULL, 1, d, NULL, 1, NULL, NULL), KILN_ERROR_UNSUPPORTED,
                "backend");

    /* Output shape = input shape, as expressions. */
    kiln_expr_pool pool;
    kiln_expr_pool_init(&pool);
    kiln_shape_expr in_shape = {2, {kiln_expr_symbol(&pool, 0), kiln_expr_const(&pool, 1024)}}, out_shape;
    memset(&out_shape, 0, sizeof out_shape);
    CHECK_OK(p->ops->output_shapes(p, &in_shape, 1, &out_shape, 1, &pool));
    CHECK(out_shape.rank == 2 && out_shape.d[0] == in_shape.d[0] && out_shape.d[1] == in_shape.d[1]);
    CHECK_FAILS(p->ops->output_shapes(p, &in_shape, 2, &out_shape, 1, &pool), KILN_ERROR_SHAPE, "1 input");
    kiln_expr_pool_free(&pool);

    p->ops->destroy(p);
    kiln_registry_destroy(reg);
}

static void test_serialize_round_trip_and_clone(void)
{
    kiln_registry *reg = registry_with(EXAMPLE);
    const kiln_plugin_creator *c = scale_bias_creator(reg);
    kiln_plugin *p = c ? make_scale_bias(c, 2.0f, 0.5f) : NULL;
    if (!p) {
        kiln_registry_destroy(reg);
        return;
    }
    size_t size = 0;
    CHECK_OK(p->ops->serialize(p, NULL, &size));
    CHECK(size == 8);
    unsigned char blob[16];
    size = sizeof blob;
    CHECK_OK(p->ops->serialize(p, blob, &size));
    CHECK(size == 8);
    /* 2.0f = 0x40000000, 0.5f = 0x3F000000, little-endian. */
    static const unsigned char expected[8] = {0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x3F};
    CHECK(memcmp(blob, expected, 8) == 0);
    size = 4;
    CHECK_FAILS(p->ops->serialize(p, blob, &size), KILN_ERROR_INVALID_ARGUMENT, "needs 8");

    kiln_plugin *q = NULL;
    CHECK_OK(kiln_plugin_deserialize(c, 1, blob, 8, &q));
    if (q) {
        float x[2] = {1.0f, 4.0f}, y[2] = {0};
        CHECK_OK(run_cpu(q, KILN_DTYPE_F32, x, y, 2, NULL));
        CHECK(y[0] == 2.5f && y[1] == 8.5f);
        q->ops->destroy(q);
    }

    kiln_plugin *r = (kiln_plugin *)0x1;
    CHECK_FAILS(kiln_plugin_deserialize(c, 2, blob, 8, &r), KILN_ERROR_VERSION,
                "ScaleBias blob schema version 2 is newer than this plugin reads (1)");
    CHECK_FAILS(kiln_plugin_deserialize(c, 0, blob, 8, &r), KILN_ERROR_VERSION,
                "ScaleBias blob schema version 0 is older than this plugin reads (1)");
    CHECK_FAILS(kiln_plugin_deserialize(c, 1, blob, 7, &r), KILN_ERROR_FORMAT, "7 bytes, expected 8");
    unsigned char inf_blob[8] = {0x00, 0x00, 0x80, 0x7F, 0, 0, 0, 0}; /* scale = +inf */
    CHECK_FAILS(kiln_plugin_deserialize(c, 1, inf_blob, 8, &r), KILN_ERROR_INVALID_ARGUMENT, "must be finite");
    CHECK(r == (kiln_plugin *)0x1);

    /* A clone outlives its source and computes the same. */
    kiln_plugin *k = NULL;
    CHECK_OK(kiln_plugin_clone(c, p, &k));
    CHECK(k != NULL && k != p);
    p->ops->destroy(p);
    if (k) {
        float x[1] = {3.0f}, y[1] = {0};
        CHECK_OK(run_cpu(k, KILN_DTYPE_F32, x, y, 1, NULL));
        CHECK(y[0] == 6.5f);
        k->ops->destroy(k);
    }
    kiln_registry_destroy(reg);
}

/* An engine built with a plugin that writes another blob version, loaded
 * where the example plugin is registered: the example refuses the blob. */
static void test_blob_versions_across_libraries(void)
{
    static const struct {
        const char *lib;
        uint32_t version;
        const char *message;
    } cases[] = {
        {TEST_PLUGIN("test_blob_v0"), 0, "ScaleBias blob schema version 0 is older than this plugin reads (1)"},
        {TEST_PLUGIN("test_blob_v2"), 2, "ScaleBias blob schema version 2 is newer than this plugin reads (1)"},
    };
    kiln_registry *reader = registry_with(EXAMPLE);
    const kiln_plugin_creator *rc = scale_bias_creator(reader);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_registry *writer = registry_with(cases[i].lib);
        const kiln_plugin_creator *wc = scale_bias_creator(writer);
        kiln_plugin *p = wc ? make_scale_bias(wc, 2.0f, 0.5f) : NULL;
        if (p && rc) {
            CHECK(wc->blob_version == cases[i].version);
            unsigned char blob[8];
            size_t size = sizeof blob;
            CHECK_OK(p->ops->serialize(p, blob, &size));
            kiln_plugin *q = NULL;
            CHECK_FAILS(kiln_plugin_deserialize(rc, wc->blob_version, blob, size, &q), KILN_ERROR_VERSION,
                        cases[i].message);
            CHECK(q == NULL);
            /* The writer itself reads its own blob back. */
            CHECK_OK(kiln_plugin_deserialize(wc, wc->blob_version, blob, size, &q));
            if (q)
                q->ops->destroy(q);
        }
        if (p)
            p->ops->destroy(p);
        kiln_registry_destroy(writer);
    }
    kiln_registry_destroy(reader);
}

static void test_near_misses(void)
{
    kiln_registry *reg = registry_with(EXAMPLE);
    CHECK_OK(kiln_registry_load_library(reg, lib_path(TEST_PLUGIN("test_scale_bias_v2"))));
    CHECK_OK(kiln_registry_load_library(reg, lib_path(TEST_PLUGIN("test_scale_bias_ns"))));
    CHECK(kiln_registry_count(reg) == n_builtin + 3);

    char buf[4096], want_v2[1200], want_ns[1200], want_v1[1200];
    snprintf(want_v2, sizeof want_v2, "ScaleBias 2 (namespace \"\") from %s",
             lib_path(TEST_PLUGIN("test_scale_bias_v2")));
    snprintf(want_ns, sizeof want_ns, "ScaleBias 1 (namespace \"test\") from %s",
             lib_path(TEST_PLUGIN("test_scale_bias_ns")));
    snprintf(want_v1, sizeof want_v1, "ScaleBias 1 (namespace \"\") from %s", lib_path(EXAMPLE));

    /* Looking for version 3: all three are near misses. */
    kiln_registry_near_misses(reg, "ScaleBias", "3", "", buf, sizeof buf);
    CHECK(strstr(buf, want_v1) && strstr(buf, want_v2) && strstr(buf, want_ns));
    /* The exact match is not a near miss. */
    kiln_registry_near_misses(reg, "ScaleBias", "1", "", buf, sizeof buf);
    CHECK(strstr(buf, want_v2) && strstr(buf, want_ns) && !strstr(buf, want_v1));
    kiln_registry_near_misses(reg, "Softmax", "1", "", buf, sizeof buf);
    CHECK(buf[0] == '\0');
    /* Truncated, still terminated. */
    char small[12];
    kiln_registry_near_misses(reg, "ScaleBias", "3", "", small, sizeof small);
    CHECK(strlen(small) == sizeof small - 1 && strncmp(small, "ScaleBias 1", 11) == 0);
    kiln_registry_destroy(reg);
}

/* ---- the host API ------------------------------------------------------------ */

static void sum_range(void *arg, int64_t begin, int64_t end)
{
    int64_t *hits = arg;
    for (int64_t i = begin; i < end; i++)
        hits[i]++;
}

static void test_host_api(void)
{
    const kiln_host_api *h = kiln_host();
    CHECK(h->fail(KILN_ERROR_SHAPE, "bad dim %d", 7) == KILN_ERROR_SHAPE);
    CHECK(strcmp(kiln_last_error(), "bad dim 7") == 0);

    int64_t hits[1000] = {0};
    h->parallel_for(NULL, 1000, sum_range, hits);
    int ok = 1;
    for (int i = 0; i < 1000; i++)
        ok &= hits[i] == 1;
    CHECK(ok);

    CHECK(h->float_to_half(1.5f) == 0x3E00 && h->half_to_float(0xC300) == -3.5f);
    CHECK(h->float_to_bf16(1.5f) == 0x3FC0 && h->bf16_to_float(0x4060) == 3.5f);

    kiln_expr_pool pool;
    kiln_expr_pool_init(&pool);
    kiln_expr a = h->expr_constant(&pool, 6), b = h->expr_constant(&pool, 4);
    int64_t v = 0;
    CHECK(h->expr_is_constant(&pool, h->expr_operation(&pool, KILN_EXPR_CEIL_DIV, a, b), &v) && v == 2);
    CHECK(h->expr_operation(&pool, KILN_EXPR_OP_COUNT, a, b) < 0);
    kiln_expr s = kiln_expr_symbol(&pool, 0);
    CHECK(!h->expr_is_constant(&pool, h->expr_operation(&pool, KILN_EXPR_MUL, s, b), &v));
    kiln_expr_pool_free(&pool);
}

/* Runs first: without the build tree there is nothing to load. */
static void test_environment(void)
{
    const char *dir = getenv("KILN_BUILD_DIR");
    if (!dir || !dir[0]) {
        printf("skipped: KILN_BUILD_DIR is not set (run through ctest)\n");
        exit(77);
    }
    snprintf(build_dir, sizeof build_dir, "%s", dir);
    kiln_registry *reg = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    n_builtin = kiln_registry_count(reg);
    kiln_registry_destroy(reg);
}

static const test_case_ tests[] = {
    TEST(test_environment),
    TEST(test_load_example),
    TEST(test_load_twice_and_symlink),
    TEST(test_conflict_names_both_files),
    TEST(test_bad_libraries),
    TEST(test_init_failure_rolls_back),
    TEST(test_register_builtin),
    TEST(test_field_schema_errors),
    TEST(test_field_defaults),
    TEST(test_scale_bias_compute),
    TEST(test_serialize_round_trip_and_clone),
    TEST(test_blob_versions_across_libraries),
    TEST(test_near_misses),
    TEST(test_host_api),
};

TEST_MAIN(tests)
