/* The network JSON format: example networks in tests/data/nets load with the
 * expected layers, shapes, dtypes and constant bytes; every malformed case
 * fails with a one-line message naming the place and the field. */
#include "test.h"

#include <unistd.h>

#include "core/expr.h"
#include "network/network_internal.h"
#include "plugin/plugin_internal.h"

#define NETS "tests/data/nets"

/* ---- helpers ------------------------------------------------------------------- */

static const kiln_tensor_rec *rec(const kiln_network *net, const char *name)
{
    kiln_tensor t;
    if (kiln_network_find_tensor(net, name, &t) != KILN_OK)
        return NULL;
    return &net->graph.tensors[t.id];
}

/* Checks a tensor's dtype and dims; -1 in want marks a dynamic dim. */
static int has_shape(const kiln_network *net, const char *name, kiln_dtype dtype, int32_t rank, const int64_t *want)
{
    const kiln_tensor_rec *r = rec(net, name);
    if (!r || r->dtype != dtype || r->rank != rank) {
        fprintf(stderr, "tensor %s: missing or wrong dtype/rank\n", name);
        return 0;
    }
    for (int32_t i = 0; i < rank; i++) {
        int64_t v;
        int is_const = kiln_expr_is_const(&net->graph.exprs, r->dims[i], &v);
        if (want[i] < 0 ? is_const : !is_const || v != want[i]) {
            fprintf(stderr, "tensor %s: dim %d differs\n", name, i);
            return 0;
        }
    }
    return 1;
}

static kiln_status parse(const char *json, const char *base_dir, kiln_network **out)
{
    return kiln_network_parse_json(NULL, json, strlen(json), base_dir, out);
}

/* ---- good networks ------------------------------------------------------------ */

static void test_load_mlp(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_load_json(NULL, NETS "/mlp.json", &net));
    if (!net)
        return;
    /* constants are tensors, not layers: 15 entries - 4 constants */
    CHECK(kiln_network_num_layers(net) == 11);
    CHECK(net->graph.n_inputs == 1 && net->graph.n_profiles == 1 && net->graph.n_outputs == 2);
    const kiln_profile_dims *p = &net->graph.profiles[0];
    CHECK(p->min.d[0] == 1 && p->opt.d[0] == 2 && p->max.d[0] == 8 && p->max.d[1] == 4);

    CHECK(has_shape(net, "x", KILN_DTYPE_F32, 2, (int64_t[]){-1, 4}));
    CHECK(has_shape(net, "w1", KILN_DTYPE_F32, 2, (int64_t[]){4, 4}));
    CHECK(has_shape(net, "fc1", KILN_DTYPE_F32, 2, (int64_t[]){-1, 4}));
    CHECK(has_shape(net, "w2", KILN_DTYPE_F32, 2, (int64_t[]){4, 3}));
    CHECK(has_shape(net, "fc2", KILN_DTYPE_F32, 2, (int64_t[]){-1, 3}));
    CHECK(has_shape(net, "total", KILN_DTYPE_F32, 2, (int64_t[]){-1, 1}));
    CHECK(has_shape(net, "cat", KILN_DTYPE_F32, 2, (int64_t[]){-1, 4}));
    CHECK(has_shape(net, "tr", KILN_DTYPE_F32, 2, (int64_t[]){2, -1}));
    CHECK(has_shape(net, "picked", KILN_DTYPE_F32, 2, (int64_t[]){3, -1}));
    CHECK(has_shape(net, "half", KILN_DTYPE_F16, 2, (int64_t[]){3, -1}));

    /* constant bytes, from the formulas in tests/data/nets/make_weights.py */
    const kiln_tensor_rec *w1 = rec(net, "w1"), *w2 = rec(net, "w2"), *b1 = rec(net, "b1");
    CHECK(w1 && w1->data_size == 64);
    for (int i = 0; w1 && i < 16; i++)
        CHECK(((const float *)w1->data)[i] == i * 0.25f);
    CHECK(w2 && w2->data_size == 48);
    for (int i = 0; w2 && i < 12; i++)
        CHECK(((const float *)w2->data)[i] == (i - 6) / 4.0f);
    CHECK(b1 && b1->data_size == 16 && ((const float *)b1->data)[3] == -1.0f);
    const kiln_tensor_rec *ids = rec(net, "ids");
    CHECK(ids && ids->dtype == KILN_DTYPE_I32 && ((const int32_t *)ids->data)[0] == 1);
    kiln_network_destroy(net);
}

static void test_inline_dtypes(void)
{
    kiln_network *net = NULL;
    CHECK_OK(parse(
        "{\"kiln_network\": 1, \"layers\": ["
        "{\"name\": \"h\", \"op\": \"constant\", \"dtype\": \"f16\", \"dims\": [2], \"data\": [1, -2]},"
        "{\"name\": \"b\", \"op\": \"constant\", \"dtype\": \"bf16\", \"dims\": [1], \"data\": [1.5]},"
        "{\"name\": \"q\", \"op\": \"constant\", \"dtype\": \"bool\", \"dims\": [3], \"data\": [true, 0, 1]},"
        "{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"i8\", \"dims\": [2], \"data\": [-128, 127]},"
        "{\"name\": \"u\", \"op\": \"constant\", \"dtype\": \"u8\", \"dims\": [1, 1], \"data\": [255]},"
        "{\"name\": \"l\", \"op\": \"constant\", \"dtype\": \"i64\", \"dims\": [], \"data\": [4611686018427387904]}"
        "], \"outputs\": [\"h\"]}",
        NULL, &net));
    if (!net)
        return;
    const kiln_tensor_rec *r;
    r = rec(net, "h"); /* binary16: 1 = 0x3c00, -2 = 0xc000 */
    CHECK(r && r->data_size == 4 && ((const uint16_t *)r->data)[0] == 0x3c00 &&
          ((const uint16_t *)r->data)[1] == 0xc000);
    r = rec(net, "b"); /* bfloat16 1.5 = 0x3fc0 */
    CHECK(r && ((const uint16_t *)r->data)[0] == 0x3fc0);
    r = rec(net, "q");
    CHECK(r && memcmp(r->data, "\x01\x00\x01", 3) == 0);
    r = rec(net, "c");
    CHECK(r && ((const int8_t *)r->data)[0] == -128 && ((const int8_t *)r->data)[1] == 127);
    r = rec(net, "u");
    CHECK(r && ((const uint8_t *)r->data)[0] == 255 && r->rank == 2);
    r = rec(net, "l");
    CHECK(r && r->rank == 0 && ((const int64_t *)r->data)[0] == (int64_t)1 << 62);
    kiln_network_destroy(net);
}

static void test_file_conversion(void)
{
    kiln_network *net = NULL;
    /* mlp_w2.npy is f32 (i - 6) / 4; asked for as f16 it is converted. */
    CHECK_OK(parse(
        "{\"kiln_network\": 1, \"layers\": ["
        "{\"name\": \"w\", \"op\": \"constant\", \"dtype\": \"f16\", \"dims\": [4, 3], \"file\": \"mlp_w2.npy\"},"
        "{\"name\": \"g\", \"op\": \"constant\", \"file\": \"./mlp_weights.safetensors\", \"tensor\": \"norm.weight\"}"
        "], \"outputs\": [\"w\"]}",
        NETS, &net));
    if (!net)
        return;
    /* binary16 of -1.5, -1.25, ..., 1.25 */
    const uint16_t want[12] = {0xbe00, 0xbd00, 0xbc00, 0xba00, 0xb800, 0xb400,
                               0x0000, 0x3400, 0x3800, 0x3a00, 0x3c00, 0x3d00};
    const kiln_tensor_rec *r = rec(net, "w");
    CHECK(r && r->dtype == KILN_DTYPE_F16 && r->data_size == 24 && memcmp(r->data, want, 24) == 0);
    r = rec(net, "g");
    CHECK(r && r->dtype == KILN_DTYPE_F32 && r->rank == 1 && ((const float *)r->data)[3] == 4.0f);
    kiln_network_destroy(net);
}

/* ---- a probe plugin: records the fields it was created with ------------------------ */

static float probe_scale;
static double probe_list[3];
static int64_t probe_list_count;
static int32_t probe_pair[2];
static int64_t probe_big;
static char probe_label[32];

static int32_t probe_num_outputs(const kiln_plugin *self) { return 2; }
static kiln_status probe_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in, kiln_shape_expr *out,
                                int32_t n_out, kiln_expr_builder *eb)
{
    out[0] = out[1] = in[0];
    return KILN_OK;
}
static kiln_status probe_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                int32_t n_out)
{
    out[0] = out[1] = in[0];
    return KILN_OK;
}
static int32_t probe_supports(const kiln_plugin *self, kiln_backend b, const kiln_tensor_desc *d, int32_t n_in,
                              int32_t n_out)
{
    return 1;
}
static kiln_status probe_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *input_descs,
                                 const void *const *inputs, int32_t n_inputs, const kiln_tensor_desc *output_descs,
                                 void *const *outputs, int32_t n_outputs, void *workspace, void *stream)
{
    return KILN_OK;
}
static kiln_status probe_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    *size = 0;
    return KILN_OK;
}
static void probe_destroy(kiln_plugin *self) { free(self); }
static kiln_status probe_clone(const kiln_plugin *self, kiln_plugin **out);

static const kiln_plugin_ops probe_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = probe_num_outputs,
    .output_shapes = probe_shapes,
    .output_dtypes = probe_dtypes,
    .supports = probe_supports,
    .enqueue = probe_enqueue,
    .serialize = probe_serialize,
    .clone = probe_clone,
    .destroy = probe_destroy,
};

static kiln_status probe_new(kiln_plugin **out)
{
    kiln_plugin *p = calloc(1, sizeof *p);
    p->struct_size = sizeof *p;
    p->abi_version = KILN_PLUGIN_ABI_VERSION;
    p->ops = &probe_ops;
    *out = p;
    return KILN_OK;
}
static kiln_status probe_clone(const kiln_plugin *self, kiln_plugin **out) { return probe_new(out); }

static kiln_status probe_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    for (int32_t i = 0; i < n; i++) {
        if (!strcmp(f[i].name, "scale"))
            probe_scale = *(const float *)f[i].data;
        else if (!strcmp(f[i].name, "list")) {
            probe_list_count = f[i].count;
            memcpy(probe_list, f[i].data, (size_t)(f[i].count < 3 ? f[i].count : 3) * 8);
        } else if (!strcmp(f[i].name, "pair"))
            memcpy(probe_pair, f[i].data, sizeof probe_pair);
        else if (!strcmp(f[i].name, "big"))
            probe_big = *(const int64_t *)f[i].data;
        else if (!strcmp(f[i].name, "label"))
            snprintf(probe_label, sizeof probe_label, "%s", (const char *)f[i].data);
    }
    return probe_new(out);
}
static kiln_status probe_deserialize(const kiln_plugin_creator *c, uint32_t v, const void *blob, size_t size,
                                     kiln_plugin **out)
{
    return probe_new(out);
}

#define SPEC(n, t, cnt, req) \
    { \
        sizeof(kiln_field_spec), KILN_PLUGIN_ABI_VERSION, n, t, cnt, req, 0, NULL, 0, n \
    }
static const kiln_field_spec probe_fields[] = {
    SPEC("scale", KILN_FIELD_F32, 1, 1),    SPEC("list", KILN_FIELD_F64, KILN_FIELD_ANY_COUNT, 0),
    SPEC("pair", KILN_FIELD_I32, 2, 0),     SPEC("big", KILN_FIELD_I64, 1, 0),
    SPEC("label", KILN_FIELD_STRING, 1, 0),
};
static const kiln_plugin_creator probe_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "JsonProbe",
    .version = "1",
    .plugin_namespace = "test",
    .fields = probe_fields,
    .n_fields = 5,
    .blob_version = 1,
    .create = probe_create,
    .deserialize = probe_deserialize,
};

static void test_plugin_layer(void)
{
    kiln_registry *reg = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    if (!reg)
        return;
    CHECK_OK(kiln_registry_register(reg, &probe_creator));
    const char *json = "{\"kiln_network\": 1,"
                       " \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"dims\": [2, 3]}],"
                       " \"layers\": ["
                       "  {\"name\": \"p\", \"op\": \"plugin\","
                       "   \"plugin\": {\"name\": \"JsonProbe\", \"version\": \"1\", \"namespace\": \"test\"},"
                       "   \"fields\": {\"scale\": {\"type\": \"f32\", \"data\": 2.5},"
                       "              \"list\": {\"type\": \"f64\", \"data\": [0.125, -3, 1e300]},"
                       "              \"pair\": {\"type\": \"i32\", \"data\": [7, -2147483648]},"
                       "              \"big\": {\"type\": \"i64\", \"data\": [9007199254740993]},"
                       "              \"label\": {\"type\": \"string\", \"data\": \"hello\"}},"
                       "   \"inputs\": [\"x\"]},"
                       "  {\"name\": \"sum\", \"op\": \"binary\", \"kind\": \"add\", \"inputs\": [\"p:0\", \"p:1\"]}"
                       " ],"
                       " \"outputs\": [\"sum\", \"p:1\"]}";
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_parse_json(reg, json, strlen(json), NULL, &net));
    CHECK(probe_scale == 2.5f);
    CHECK(probe_list_count == 3 && probe_list[0] == 0.125 && probe_list[1] == -3.0 && probe_list[2] == 1e300);
    CHECK(probe_pair[0] == 7 && probe_pair[1] == INT32_MIN);
    CHECK(probe_big == 9007199254740993LL); /* 2^53 + 1: no trip through a double */
    CHECK(strcmp(probe_label, "hello") == 0);
    CHECK(net && kiln_network_num_layers(net) == 2);
    CHECK(net && has_shape(net, "sum", KILN_DTYPE_F32, 2, (int64_t[]){2, 3}));
    kiln_network_destroy(net);

    /* schema errors come from the registry and name the layer and field */
    net = NULL;
    const char *bad = "{\"kiln_network\": 1, \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"dims\": [2]}],"
                      " \"layers\": [{\"name\": \"p\", \"op\": \"plugin\","
                      "   \"plugin\": {\"name\": \"JsonProbe\", \"version\": \"1\", \"namespace\": \"test\"},"
                      "   \"fields\": {\"scael\": {\"type\": \"f32\", \"data\": 1}}, \"inputs\": [\"x\"]}],"
                      " \"outputs\": [\"p:0\"]}";
    CHECK(kiln_network_parse_json(reg, bad, strlen(bad), NULL, &net) != KILN_OK);
    const char *place = "network JSON: layer \"p\" (index 0): plugin JsonProbe";
    CHECK(strncmp(kiln_last_error(), place, strlen(place)) == 0);
    CHECK(strstr(kiln_last_error(), "\"scael\"") != NULL);
    CHECK(net == NULL);
    kiln_registry_destroy(reg);
}

/* ---- malformed networks ---------------------------------------------------------- */

typedef struct bad_case {
    const char *json;
    kiln_status status;
    const char *message;
} bad_case;

#define HEAD "{\"kiln_network\": 1, \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"dims\": [2, 3]}], "
#define W "{\"name\": \"w\", \"op\": \"constant\", \"dtype\": \"f32\", \"dims\": [3, 3], \"data\": [1,2,3,4,5,6,7,8,9]}"

static const bad_case bad_cases[] = {
    {"", KILN_ERROR_FORMAT, "network JSON: line 1"},
    {"{\"kiln_network\": 1, ", KILN_ERROR_FORMAT, "network JSON: line 1"},
    {"[1]", KILN_ERROR_FORMAT, "expected a JSON object"},
    {"{\"layers\": [], \"outputs\": []}", KILN_ERROR_FORMAT, "field \"kiln_network\": missing"},
    {"{\"kiln_network\": 2, \"layers\": [], \"outputs\": []}", KILN_ERROR_VERSION, "format version 2 is not supported"},
    {"{\"kiln_network\": \"1\", \"layers\": [], \"outputs\": []}", KILN_ERROR_FORMAT, "expected the integer 1"},
    {"{\"kiln_network\": 1, \"layer\": [], \"outputs\": []}", KILN_ERROR_INVALID_ARGUMENT,
     "top level: unknown field \"layer\""},
    {"{\"kiln_network\": 1, \"outputs\": []}", KILN_ERROR_INVALID_ARGUMENT, "field \"layers\": missing"},
    {"{\"kiln_network\": 1, \"kiln_network\": 1, \"layers\": [], \"outputs\": []}", KILN_ERROR_FORMAT, "duplicate"},
    /* inputs and profiles */
    {"{\"kiln_network\": 1, \"inputs\": [{\"name\": \"x\", \"dtype\": \"f33\", \"dims\": [2]}], "
     "\"layers\": [], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "input \"x\" (index 0): field \"dtype\": unknown dtype \"f33\""},
    {"{\"kiln_network\": 1, \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"dims\": [-2]}], "
     "\"layers\": [], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"dims\": entry 0: -2 is below -1"},
    {"{\"kiln_network\": 1, \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"dims\": [1], \"shape\": 1}], "
     "\"layers\": [], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "input \"x\" (index 0): unknown field \"shape\""},
    {"{\"kiln_network\": 1, \"inputs\": [{\"dtype\": \"f32\", \"dims\": [1]}], "
     "\"layers\": [], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "input 0: field \"name\": missing"},
    {"{\"kiln_network\": 1, \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"dims\": [-1]}], "
     "\"profiles\": [{\"x\": {\"min\": [1], \"opt\": [2]}}], \"layers\": [], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "profile 0, input \"x\": field \"max\": missing"},
    {"{\"kiln_network\": 1, \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"dims\": [-1]}], "
     "\"profiles\": [{\"y\": {\"min\": [1], \"opt\": [2], \"max\": [3]}}], \"layers\": [], \"outputs\": []}",
     KILN_ERROR_NOT_FOUND, "\"y\""},
    {"{\"kiln_network\": 1, \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"dims\": [-1]}], "
     "\"profiles\": [{\"x\": {\"min\": [1], \"opt\": [2], \"max\": [3], \"mid\": [2]}}], \"layers\": [], \"outputs\": "
     "[]}",
     KILN_ERROR_INVALID_ARGUMENT, "unknown field \"mid\""},
    /* layers: generic */
    {HEAD "\"layers\": [5], \"outputs\": []}", KILN_ERROR_INVALID_ARGUMENT, "layer 0: expected an object"},
    {HEAD "\"layers\": [{\"name\": \"a\"}], \"outputs\": []}", KILN_ERROR_INVALID_ARGUMENT,
     "layer \"a\" (index 0): field \"op\": missing"},
    {HEAD "\"layers\": [{\"name\": \"a\", \"op\": \"conv\"}], \"outputs\": []}", KILN_ERROR_INVALID_ARGUMENT,
     "field \"op\": unknown op \"conv\""},
    {HEAD "\"layers\": [{\"name\": 3, \"op\": \"unary\"}], \"outputs\": []}", KILN_ERROR_INVALID_ARGUMENT,
     "layer 0: field \"name\": expected a string"},
    {HEAD
     "\"layers\": [{\"name\": \"a\", \"op\": \"unary\", \"kind\": \"relu\", \"inputs\": [\"nope\"]}], \"outputs\": []}",
     KILN_ERROR_NOT_FOUND, "layer \"a\" (index 0): field \"inputs\": unknown tensor \"nope\""},
    {HEAD
     "\"layers\": [{\"name\": \"a\", \"op\": \"unary\", \"kind\": \"relu\", \"inputs\": [\"a\"]}], \"outputs\": []}",
     KILN_ERROR_NOT_FOUND, "unknown tensor \"a\""},
    {HEAD "\"layers\": [{\"name\": \"a\", \"op\": \"unary\", \"kind\": \"relu\", \"inputs\": \"x\"}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"inputs\": expected an array"},
    {HEAD "\"layers\": [{\"name\": \"a\", \"op\": \"unary\", \"kind\": \"relu\", \"inputs\": [\"x\", \"x\"]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"inputs\": expected 1 tensor, got 2"},
    {HEAD "\"layers\": [{\"name\": \"a\", \"op\": \"unary\", \"kind\": \"relu\"}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"inputs\": missing"},
    {HEAD
     "\"layers\": [{\"name\": \"a\", \"op\": \"unary\", \"kind\": \"gelu\", \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "layer \"a\" (index 0): field \"kind\": "},
    {HEAD
     "\"layers\": [{\"name\": \"a\", \"op\": \"unary\", \"kind\": \"relu\", \"input\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "layer \"a\" (index 0): unknown field \"input\""},
    /* matmul */
    {HEAD "\"layers\": [" W
          ", {\"name\": \"fc\", \"op\": \"matmul\", \"inputs\": [\"x\", \"w\"], \"transpose_b\": 1}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "layer \"fc\" (index 1): field \"transpose_b\": expected a boolean"},
    {HEAD
     "\"layers\": [" W
     ", {\"name\": \"fc\", \"op\": \"matmul\", \"inputs\": [\"x\", \"w\"], \"transpose_c\": true}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "unknown field \"transpose_c\""},
    /* x [2, 3] times w [4, 3]: inner dims 3 and 4 differ; the network API's
     * message follows the place, without naming the layer twice */
    {HEAD "\"layers\": [{\"name\": \"w\", \"op\": \"constant\", \"dtype\": \"f32\", \"dims\": [4, 3], \"data\": "
          "[1,2,3,4,5,6,7,8,9,1,2,3]}, "
          "{\"name\": \"fc\", \"op\": \"matmul\", \"inputs\": [\"x\", \"w\"]}], \"outputs\": []}",
     KILN_ERROR_SHAPE, "network JSON: layer \"fc\" (index 1): "},
    /* constants */
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"f32\", \"dims\": [3], \"data\": [1, 2]}], "
          "\"outputs\": []}",
     KILN_ERROR_SHAPE, "layer \"c\" (index 0): field \"data\": has 2 values, dims need 3"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"f32\", \"dims\": [1], \"data\": "
          "[\"1\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"data\": entry 0: expected a number"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"f16\", \"dims\": [1], \"data\": "
          "[70000]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "entry 0: 70000 overflows f16"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"f32\", \"dims\": [1], \"data\": [1e39]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "overflows f32"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"u8\", \"dims\": [1], \"data\": [256]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "entry 0: 256 does not fit u8"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"i32\", \"dims\": [1], \"data\": [1.5]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "entry 0: expected an integer"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"bool\", \"dims\": [1], \"data\": [2]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "does not fit bool"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"f32\", \"dims\": [4294967296, "
          "4294967296], \"data\": []}], \"outputs\": []}",
     KILN_ERROR_SHAPE, "overflows"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"f32\", \"data\": [1]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"dims\": missing"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dims\": [1], \"data\": [1]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"dtype\": missing"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"f32\", \"dims\": [1]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "needs \"data\" or \"file\""},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"file\": \"w.npy\", \"data\": [1]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "not both"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"file\": \"w.npy\"}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"file\": side files are not allowed here"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"dtype\": \"f32\", \"dims\": [1], \"data\": [1], "
          "\"tensor\": \"t\"}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"tensor\": only with \"file\""},
    /* reduce, slice, shuffle, concat, gather, cast */
    {HEAD "\"layers\": [{\"name\": \"r\", \"op\": \"reduce\", \"kind\": \"sum\", \"axes\": [2], \"inputs\": [\"x\"]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"axes\": axis 2 is out of range for rank 2"},
    {HEAD "\"layers\": [{\"name\": \"r\", \"op\": \"reduce\", \"kind\": \"sum\", \"axes\": [1, -1], \"inputs\": "
          "[\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "axis -1 is listed twice"},
    {HEAD "\"layers\": [{\"name\": \"r\", \"op\": \"reduce\", \"kind\": \"avg\", \"axes\": [1], \"inputs\": [\"x\"]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"kind\""},
    {HEAD
     "\"layers\": [{\"name\": \"r\", \"op\": \"reduce\", \"kind\": \"sum\", \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"axes\": missing"},
    {HEAD "\"layers\": [{\"name\": \"s\", \"op\": \"slice\", \"start\": [0], \"size\": [1, 1], \"inputs\": [\"x\"]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"start\": expected 2 entries"},
    {HEAD "\"layers\": [{\"name\": \"s\", \"op\": \"slice\", \"start\": [0, 0], \"size\": [1, 1], \"stride\": [0, 1], "
          "\"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"stride\": entry 0: 0 is below 1"},
    {HEAD "\"layers\": [{\"name\": \"t\", \"op\": \"shuffle\", \"first_transpose\": [1, 0, 2], \"inputs\": [\"x\"]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"first_transpose\": expected 2 entries, got 3"},
    {HEAD "\"layers\": [{\"name\": \"t\", \"op\": \"shuffle\", \"reshape\": [1,1,1,1,1,1,1,1,6], \"inputs\": "
          "[\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"reshape\": 9 entries exceed the maximum rank 8"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"concat\", \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"axis\": missing"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"concat\", \"axis\": 99, \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"axis\": 99 is outside -8..7"},
    {HEAD "\"layers\": [{\"name\": \"c\", \"op\": \"concat\", \"axis\": 0, \"inputs\": []}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "expected at least 1 tensor"},
    {HEAD "\"layers\": [{\"name\": \"g\", \"op\": \"gather\", \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "expected 2 tensors, got 1"},
    {HEAD "\"layers\": [{\"name\": \"k\", \"op\": \"cast\", \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "layer \"k\" (index 0): field \"dtype\": missing"},
    /* plugin syntax (checked before the registry is consulted) */
    {HEAD "\"layers\": [{\"name\": \"p\", \"op\": \"plugin\", \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"plugin\": missing"},
    {HEAD "\"layers\": [{\"name\": \"p\", \"op\": \"plugin\", \"plugin\": {\"name\": \"A\", \"version\": \"1\", "
          "\"ns\": \"\"}, \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"plugin\": unknown key \"ns\""},
    {HEAD "\"layers\": [{\"name\": \"p\", \"op\": \"plugin\", \"plugin\": {\"name\": \"A\"}, \"inputs\": [\"x\"]}], "
          "\"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"plugin.version\": missing"},
    {HEAD "\"layers\": [{\"name\": \"p\", \"op\": \"plugin\", \"plugin\": {\"name\": \"A\", \"version\": \"1\"}, "
          "\"fields\": {\"a\": {\"type\": \"f16\", \"data\": 1}}, \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"fields.a\": unknown type \"f16\""},
    {HEAD
     "\"layers\": [{\"name\": \"p\", \"op\": \"plugin\", \"plugin\": {\"name\": \"A\", \"version\": \"1\"}, "
     "\"fields\": {\"a\": {\"type\": \"i32\", \"data\": [1, 2147483648]}}, \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"fields.a\": entry 1: expected an integer fitting i32"},
    {HEAD "\"layers\": [{\"name\": \"p\", \"op\": \"plugin\", \"plugin\": {\"name\": \"A\", \"version\": \"1\"}, "
          "\"fields\": {\"a\": {\"type\": \"string\", \"data\": [\"s\"]}}, \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "\"data\" must be a string"},
    {HEAD "\"layers\": [{\"name\": \"p\", \"op\": \"plugin\", \"plugin\": {\"name\": \"A\", \"version\": \"1\"}, "
          "\"fields\": {\"a\": {\"type\": \"f32\", \"value\": 1}}, \"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_INVALID_ARGUMENT, "field \"fields.a\": unknown key \"value\""},
    {HEAD "\"layers\": [{\"name\": \"p\", \"op\": \"plugin\", \"plugin\": {\"name\": \"A\", \"version\": \"1\"}, "
          "\"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_PLUGIN, "network JSON: layer \"p\" (index 0): plugin A 1"},
    /* an unnamed layer is placed by index, and the API names its generated name */
    {HEAD "\"layers\": [{\"op\": \"plugin\", \"plugin\": {\"name\": \"A\", \"version\": \"1\"}, "
          "\"inputs\": [\"x\"]}], \"outputs\": []}",
     KILN_ERROR_PLUGIN, "network JSON: layer 0: layer \""},
    /* outputs */
    {HEAD "\"layers\": [], \"outputs\": [\"y\"]}", KILN_ERROR_NOT_FOUND,
     "output 0: field \"outputs\": unknown tensor \"y\""},
    {HEAD "\"layers\": [], \"outputs\": [{\"tensor\": \"x\", \"rename\": \"y\"}]}", KILN_ERROR_INVALID_ARGUMENT,
     "output 0: unknown field \"rename\""},
    {HEAD "\"layers\": [], \"outputs\": [{\"name\": \"y\"}]}", KILN_ERROR_INVALID_ARGUMENT,
     "output 0: field \"tensor\": missing"},
    {HEAD "\"layers\": [], \"outputs\": {}}", KILN_ERROR_INVALID_ARGUMENT, "outputs: expected an array"},
};

static void test_malformed(void)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        kiln_network *net = NULL;
        kiln_status s = parse(bad_cases[i].json, NULL, &net);
        test_checks_++;
        if (s != bad_cases[i].status || !strstr(kiln_last_error(), bad_cases[i].message) ||
            strchr(kiln_last_error(), '\n') || net) {
            test_failures_++;
            fprintf(stderr, "bad case %zu: expected %s containing \"%s\", got %s: \"%s\"\n", i,
                    kiln_status_name(bad_cases[i].status), bad_cases[i].message, kiln_status_name(s),
                    kiln_last_error());
        }
        kiln_network_destroy(net);
    }
}

static void test_side_file_rules(void)
{
    kiln_network *net = NULL;
#define FILE_NET(file, extra) \
    "{\"kiln_network\": 1, \"layers\": [{\"name\": \"c\", \"op\": \"constant\", \"file\": \"" file "\"" extra \
    "}], \"outputs\": []}"
    CHECK_FAILS(parse(FILE_NET("/etc/passwd.npy", ""), NETS, &net), KILN_ERROR_INVALID_ARGUMENT,
                "layer \"c\" (index 0): field \"file\": \"/etc/passwd.npy\": expected a relative path");
    CHECK_FAILS(parse(FILE_NET("../npy/f32_2x3.npy", ""), NETS, &net), KILN_ERROR_INVALID_ARGUMENT,
                "\"..\" is not allowed");
    CHECK_FAILS(parse(FILE_NET("sub/../../x.npy", ""), NETS, &net), KILN_ERROR_INVALID_ARGUMENT,
                "\"..\" is not allowed");
    CHECK_FAILS(parse(FILE_NET("mlp.json", ""), NETS, &net), KILN_ERROR_INVALID_ARGUMENT,
                "expected a .npy or .safetensors file");
    CHECK_FAILS(parse(FILE_NET("missing.npy", ""), NETS, &net), KILN_ERROR_IO,
                "network JSON: layer \"c\" (index 0): tests/data/nets/missing.npy: cannot open");
    CHECK_FAILS(parse(FILE_NET("mlp_weights.safetensors", ""), NETS, &net), KILN_ERROR_INVALID_ARGUMENT,
                "field \"tensor\": missing");
    CHECK_FAILS(parse(FILE_NET("mlp_weights.safetensors", ", \"tensor\": \"fc2.weight\""), NETS, &net),
                KILN_ERROR_NOT_FOUND, "no tensor \"fc2.weight\"");
    CHECK_FAILS(parse(FILE_NET("mlp_w2.npy", ", \"tensor\": \"a\""), NETS, &net), KILN_ERROR_INVALID_ARGUMENT,
                "field \"tensor\": only for .safetensors files");
    CHECK_FAILS(parse(FILE_NET("mlp_w2.npy", ", \"dims\": [3, 4]"), NETS, &net), KILN_ERROR_SHAPE,
                "field \"dims\": [3, 4] does not match [4, 3] in \"mlp_w2.npy\"");
    CHECK_FAILS(parse(FILE_NET("mlp_w2.npy", ", \"dtype\": \"fp8_e4m3\""), NETS, &net), KILN_ERROR_UNSUPPORTED,
                "cannot convert f32 to fp8_e4m3");
    CHECK(net == NULL);
#undef FILE_NET
}

static void test_load_errors(void)
{
    kiln_network *net = NULL;
    CHECK_FAILS(kiln_network_load_json(NULL, NETS "/missing.json", &net), KILN_ERROR_IO, "missing.json");
    /* a file's errors are prefixed with its path */
    char dir[] = "/tmp/kiln_json_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/net.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"kiln_network\": 1, \"layers\": [{\"op\": \"softmax\", \"axis\": true, \"inputs\": []}], "
          "\"outputs\": []}",
          f);
    fclose(f);
    char want[192];
    snprintf(want, sizeof want, "%s: layer 0: field \"axis\": expected an integer", path);
    CHECK_FAILS(kiln_network_load_json(NULL, path, &net), KILN_ERROR_INVALID_ARGUMENT, want);
    CHECK(net == NULL);
    unlink(path);
    rmdir(dir);
}

static const test_case_ tests[] = {
    TEST(test_load_mlp),  TEST(test_inline_dtypes),   TEST(test_file_conversion), TEST(test_plugin_layer),
    TEST(test_malformed), TEST(test_side_file_rules), TEST(test_load_errors),
};
TEST_MAIN(tests)
