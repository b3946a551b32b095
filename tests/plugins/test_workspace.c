/* TestWorkspace/1/"test": an f32 plugin that needs scratch memory. It
 * reverses its input (y[i] = x[n-1-i], over all elements) by way of the
 * workspace, and writes every workspace byte it asked for, so a workspace
 * that is too small or shared with live data shows up as wrong output or an
 * ASan report.
 *
 * Workspace: numel(x) * 4 + extra_bytes bytes.
 * Fields: extra_bytes (i64, 1 value, optional, default 0).
 * Blob: schema version 1 = extra_bytes as little-endian i64 (8 bytes). */
#include <kiln/plugin.h>

#include <stdlib.h>
#include <string.h>

static const kiln_host_api *host;

typedef struct ws_plugin {
    kiln_plugin base;
    int64_t extra_bytes;
} ws_plugin;

static const kiln_plugin_ops ws_ops;

static kiln_status ws_new(int64_t extra_bytes, kiln_plugin **out)
{
    if (extra_bytes < 0 || extra_bytes > ((int64_t)1 << 30))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          "TestWorkspace: field \"extra_bytes\" must be in [0, 2^30], got %lld",
                          (long long)extra_bytes);
    ws_plugin *p = malloc(sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, "TestWorkspace: out of memory");
    p->base.struct_size = sizeof(kiln_plugin);
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &ws_ops;
    p->extra_bytes = extra_bytes;
    *out = &p->base;
    return KILN_OK;
}

static int32_t ws_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status ws_output_shapes(const kiln_plugin *self, const kiln_shape_expr *inputs, int32_t n_inputs,
                                    kiln_shape_expr *outputs, int32_t n_outputs, kiln_expr_builder *eb)
{
    if (n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_SHAPE, "TestWorkspace takes 1 input and gives 1 output");
    outputs[0] = inputs[0];
    return KILN_OK;
}

static kiln_status ws_output_dtypes(const kiln_plugin *self, const kiln_dtype *inputs, int32_t n_inputs,
                                    kiln_dtype *outputs, int32_t n_outputs)
{
    if (n_inputs != 1 || n_outputs != 1 || inputs[0] != KILN_DTYPE_F32)
        return host->fail(KILN_ERROR_UNSUPPORTED, "TestWorkspace takes one f32 input");
    outputs[0] = KILN_DTYPE_F32;
    return KILN_OK;
}

static int32_t ws_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *descs,
                           int32_t n_inputs, int32_t n_outputs)
{
    return backend == KILN_BACKEND_CPU && n_inputs == 1 && n_outputs == 1 && descs[0].dtype == KILN_DTYPE_F32 &&
           descs[1].dtype == KILN_DTYPE_F32;
}

static int64_t numel(const kiln_tensor_desc *d)
{
    int64_t n = 1;
    for (int32_t i = 0; i < d->dims.rank; i++)
        if (d->dims.d[i] < 0 || __builtin_mul_overflow(n, d->dims.d[i], &n))
            return -1;
    return n;
}

static size_t ws_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *inputs, int32_t n_inputs,
                                const kiln_tensor_desc *outputs, int32_t n_outputs)
{
    const ws_plugin *p = (const ws_plugin *)self;
    int64_t n = n_inputs == 1 ? numel(&inputs[0]) : -1;
    if (n < 0 || n > ((int64_t)1 << 40))
        return 0;
    return (size_t)n * sizeof(float) + (size_t)p->extra_bytes;
}

static kiln_status ws_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *input_descs,
                              const void *const *inputs, int32_t n_inputs, const kiln_tensor_desc *output_descs,
                              void *const *outputs, int32_t n_outputs, void *workspace, void *stream)
{
    const ws_plugin *p = (const ws_plugin *)self;
    if (backend != KILN_BACKEND_CPU || n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_UNSUPPORTED, "TestWorkspace runs one input on the CPU only");
    int64_t n = numel(&input_descs[0]);
    if (n < 0 || n != numel(&output_descs[0]))
        return host->fail(KILN_ERROR_SHAPE, "TestWorkspace: input and output sizes differ");
    if (!workspace && (n > 0 || p->extra_bytes > 0))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "TestWorkspace: no workspace given");
    float *scratch = workspace;
    const float *x = inputs[0];
    float *y = outputs[0];
    for (int64_t i = 0; i < n; i++)
        scratch[i] = x[n - 1 - i];
    memset((char *)workspace + (size_t)n * sizeof(float), 0xAB, (size_t)p->extra_bytes);
    memcpy(y, scratch, (size_t)n * sizeof(float));
    return KILN_OK;
}

static kiln_status ws_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const ws_plugin *p = (const ws_plugin *)self;
    if (buf) {
        if (*size < 8)
            return host->fail(KILN_ERROR_INVALID_ARGUMENT, "TestWorkspace: blob buffer too small");
        uint64_t u = (uint64_t)p->extra_bytes;
        for (int i = 0; i < 8; i++)
            ((unsigned char *)buf)[i] = (unsigned char)(u >> (8 * i));
    }
    *size = 8;
    return KILN_OK;
}

static kiln_status ws_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return ws_new(((const ws_plugin *)self)->extra_bytes, out);
}

static void ws_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops ws_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = ws_num_outputs,
    .output_shapes = ws_output_shapes,
    .output_dtypes = ws_output_dtypes,
    .supports = ws_supports,
    .workspace_size = ws_workspace_size,
    .enqueue = ws_enqueue,
    .serialize = ws_serialize,
    .clone = ws_clone,
    .destroy = ws_destroy,
};

static const int64_t no_extra_bytes = 0;

static const kiln_field_spec ws_fields[] = {
    {.struct_size = sizeof(kiln_field_spec),
     .abi_version = KILN_PLUGIN_ABI_VERSION,
     .name = "extra_bytes",
     .type = KILN_FIELD_I64,
     .count = 1,
     .required = 0,
     .default_data = &no_extra_bytes,
     .default_count = 1,
     .doc = "workspace bytes beyond numel(x) * 4"},
};

static kiln_status ws_create(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                             kiln_plugin **out)
{
    /* The host fills in the default, so the one field is always present. */
    if (n_fields != 1)
        return host->fail(KILN_ERROR_INTERNAL, "TestWorkspace: expected 1 field after defaults, got %d", (int)n_fields);
    return ws_new(*(const int64_t *)fields[0].data, out);
}

static kiln_status ws_deserialize(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob,
                                  size_t size, kiln_plugin **out)
{
    if (blob_version != 1)
        return host->fail(KILN_ERROR_VERSION, "TestWorkspace blob schema version %u, this plugin reads 1",
                          blob_version);
    if (size != 8)
        return host->fail(KILN_ERROR_FORMAT, "TestWorkspace blob is %zu bytes, expected 8", size);
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u |= (uint64_t)((const unsigned char *)blob)[i] << (8 * i);
    return ws_new((int64_t)u, out);
}

static const kiln_plugin_creator ws_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "TestWorkspace",
    .version = "1",
    .plugin_namespace = "test",
    .fields = ws_fields,
    .n_fields = 1,
    .blob_version = 1,
    .create = ws_create,
    .deserialize = ws_deserialize,
    .description = "reverses an f32 tensor through numel*4 + extra_bytes of workspace",
};

KILN_PLUGIN_EXPORT kiln_status kiln_plugin_library_init(const kiln_host_api *host_api, kiln_registry *reg)
{
    host = host_api;
    return host->register_creator(reg, &ws_creator);
}
