/* A plugin that misbehaves in every way the ABI lets it: Misbehave 1
 * (namespace "kiln.test") takes a string field "fail" naming the call that
 * goes wrong, and how. The blob is that string, so a built engine misbehaves
 * the same way when loaded. tests/e2e/plugin_misbehave.sh drives it; every
 * case must end in one clear error line, never a crash or a silent
 * success. With "fail": "none" it copies its f32 input. */
#include <kiln/plugin.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const kiln_host_api *host;

typedef struct misbehave {
    kiln_plugin base;
    char mode[32];
} misbehave;

static const kiln_plugin_ops misbehave_ops;

static int is(const kiln_plugin *self, const char *mode) { return strcmp(((const misbehave *)self)->mode, mode) == 0; }

static kiln_status misbehave_new(const char *mode, size_t len, kiln_plugin **out)
{
    if (strncmp(mode, "create", len) == 0 && len == 6)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "Misbehave: refusing to be created, as asked");
    if (strncmp(mode, "create-silent", len) == 0 && len == 13)
        return KILN_ERROR_INVALID_ARGUMENT;
    misbehave *p = calloc(1, sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, "Misbehave: out of memory");
    p->base.struct_size = sizeof(kiln_plugin);
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &misbehave_ops;
    memcpy(p->mode, mode, len < sizeof p->mode - 1 ? len : sizeof p->mode - 1);
    *out = &p->base;
    return KILN_OK;
}

static int32_t misbehave_num_outputs(const kiln_plugin *self)
{
    if (is(self, "outputs-0"))
        return 0;
    if (is(self, "outputs-many"))
        return 1000000;
    return 1;
}

static kiln_status misbehave_output_shapes(const kiln_plugin *self, const kiln_shape_expr *inputs, int32_t n_inputs,
                                           kiln_shape_expr *outputs, int32_t n_outputs, kiln_expr_builder *eb)
{
    (void)eb;
    if (is(self, "shapes-silent"))
        return KILN_ERROR_SHAPE;
    if (n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_SHAPE, "Misbehave takes 1 input and gives 1 output");
    outputs[0] = inputs[0];
    if (is(self, "shapes-rank"))
        outputs[0].rank = 99;
    if (is(self, "shapes-expr"))
        outputs[0].d[0] = 1 << 30;
    return KILN_OK;
}

static kiln_status misbehave_output_dtypes(const kiln_plugin *self, const kiln_dtype *inputs, int32_t n_inputs,
                                           kiln_dtype *outputs, int32_t n_outputs)
{
    if (is(self, "dtypes-silent"))
        return KILN_ERROR_UNSUPPORTED;
    if (n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "Misbehave takes 1 input and gives 1 output");
    outputs[0] = is(self, "dtypes-bad") ? (kiln_dtype)1234 : inputs[0];
    return KILN_OK;
}

static int32_t misbehave_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *descs,
                                  int32_t n_inputs, int32_t n_outputs)
{
    return !is(self, "supports-none") && backend == KILN_BACKEND_CPU && n_inputs == 1 && n_outputs == 1 &&
           descs[0].dtype == KILN_DTYPE_F32 && descs[1].dtype == KILN_DTYPE_F32;
}

static size_t misbehave_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *inputs, int32_t n_inputs,
                                       const kiln_tensor_desc *outputs, int32_t n_outputs)
{
    (void)inputs, (void)n_inputs, (void)outputs, (void)n_outputs;
    if (is(self, "workspace-huge"))
        return SIZE_MAX / 2;
    if (is(self, "workspace-max"))
        return SIZE_MAX;
    return 0;
}

static kiln_status misbehave_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *input_descs,
                                     const void *const *inputs, int32_t n_inputs, const kiln_tensor_desc *output_descs,
                                     void *const *outputs, int32_t n_outputs, void *workspace, void *stream)
{
    (void)backend, (void)workspace, (void)stream, (void)n_inputs, (void)n_outputs;
    if (is(self, "enqueue"))
        return host->fail(KILN_ERROR_BACKEND, "Misbehave: enqueue failed, as asked");
    if (is(self, "enqueue-silent"))
        return KILN_ERROR_BACKEND;
    int64_t n = 1;
    for (int32_t i = 0; i < input_descs[0].dims.rank; i++)
        n *= input_descs[0].dims.d[i];
    (void)output_descs;
    memcpy(outputs[0], inputs[0], (size_t)n * sizeof(float));
    return KILN_OK;
}

static kiln_status misbehave_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const misbehave *p = (const misbehave *)self;
    size_t n = strlen(p->mode);
    if (is(self, "serialize-silent"))
        return KILN_ERROR_FORMAT;
    if (!buf) {
        *size = n;
        return KILN_OK;
    }
    /* Lies: claims to have written more than the buffer holds (it does
     * not actually write past it). */
    if (is(self, "serialize-grows")) {
        memcpy(buf, p->mode, n < *size ? n : *size);
        *size = n + 100;
        return KILN_OK;
    }
    if (*size < n)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "Misbehave: blob buffer too small");
    memcpy(buf, p->mode, n);
    *size = n;
    return KILN_OK;
}

static kiln_status misbehave_clone(const kiln_plugin *self, kiln_plugin **out)
{
    if (is(self, "clone-silent"))
        return KILN_ERROR_OUT_OF_MEMORY;
    const misbehave *p = (const misbehave *)self;
    return misbehave_new(p->mode, strlen(p->mode), out);
}

static void misbehave_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops misbehave_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = misbehave_num_outputs,
    .output_shapes = misbehave_output_shapes,
    .output_dtypes = misbehave_output_dtypes,
    .supports = misbehave_supports,
    .workspace_size = misbehave_workspace_size,
    .enqueue = misbehave_enqueue,
    .serialize = misbehave_serialize,
    .clone = misbehave_clone,
    .destroy = misbehave_destroy,
};

static const kiln_field_spec misbehave_fields[] = {
    {.struct_size = sizeof(kiln_field_spec),
     .abi_version = KILN_PLUGIN_ABI_VERSION,
     .name = "fail",
     .type = KILN_FIELD_STRING,
     .count = 1,
     .required = 1,
     .doc = "which call misbehaves"},
};

static kiln_status misbehave_create(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                                    kiln_plugin **out)
{
    (void)creator;
    const char *mode = n_fields == 1 ? (const char *)fields[0].data : "none";
    return misbehave_new(mode, strlen(mode), out);
}

static kiln_status misbehave_deserialize(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob,
                                         size_t size, kiln_plugin **out)
{
    (void)creator, (void)blob_version;
    static const char silent[] = "deserialize-silent";
    if (size == sizeof silent - 1 && memcmp(blob, silent, size) == 0)
        return KILN_ERROR_FORMAT;
    if (size >= 32)
        return host->fail(KILN_ERROR_FORMAT, "Misbehave: blob of %zu bytes", size);
    return misbehave_new(blob, size, out);
}

static const kiln_plugin_creator misbehave_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "Misbehave",
    .version = "1",
    .plugin_namespace = "kiln.test",
    .fields = misbehave_fields,
    .n_fields = 1,
    .blob_version = 1,
    .create = misbehave_create,
    .deserialize = misbehave_deserialize,
    .description = "fails on purpose in the call its \"fail\" field names",
};

KILN_PLUGIN_EXPORT kiln_status kiln_plugin_library_init(const kiln_host_api *host_api, kiln_registry *reg)
{
    host = host_api;
    return host->register_creator(reg, &misbehave_creator);
}
