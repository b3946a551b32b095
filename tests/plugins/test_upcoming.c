/* TestUpcoming/1/"test": reports what host->upcoming_constants tells it.
 * Its input (any f32 tensor) is ignored; its output y [17] f32 holds the
 * number of ranges n, then for each (at most 8) the first f32 value the
 * range points at and its byte count. The test lays constants with known
 * first values after it and checks the order, the sizes and the budget.
 *
 * Fields: budget (i64, required): bytes asked for.
 * Blob: schema version 1 = budget as little-endian i64 (8 bytes). */
#include <kiln/plugin.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static const kiln_host_api *host;

typedef struct up_plugin {
    kiln_plugin base;
    int64_t budget;
} up_plugin;

static const kiln_plugin_ops up_ops;

static kiln_status up_new(int64_t budget, kiln_plugin **out)
{
    up_plugin *p = malloc(sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, "TestUpcoming: out of memory");
    p->base.struct_size = sizeof(kiln_plugin);
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &up_ops;
    p->budget = budget;
    *out = &p->base;
    return KILN_OK;
}

static int32_t up_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status up_output_shapes(const kiln_plugin *self, const kiln_shape_expr *inputs, int32_t n_inputs,
                                    kiln_shape_expr *outputs, int32_t n_outputs, kiln_expr_builder *eb)
{
    if (n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_SHAPE, "TestUpcoming takes 1 input and gives 1 output");
    outputs[0].rank = 1;
    outputs[0].d[0] = host->expr_constant(eb, 17);
    return KILN_OK;
}

static kiln_status up_output_dtypes(const kiln_plugin *self, const kiln_dtype *inputs, int32_t n_inputs,
                                    kiln_dtype *outputs, int32_t n_outputs)
{
    outputs[0] = KILN_DTYPE_F32;
    return KILN_OK;
}

static int32_t up_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *descs,
                           int32_t n_inputs, int32_t n_outputs)
{
    return backend == KILN_BACKEND_CPU && n_inputs == 1 && n_outputs == 1 && descs[1].dtype == KILN_DTYPE_F32;
}

static kiln_status up_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *input_descs,
                              const void *const *inputs, int32_t n_inputs, const kiln_tensor_desc *output_descs,
                              void *const *outputs, int32_t n_outputs, void *workspace, void *stream)
{
    if (host->struct_size < offsetof(kiln_host_api, upcoming_constants) + sizeof host->upcoming_constants)
        return host->fail(KILN_ERROR_UNSUPPORTED, "TestUpcoming: the host has no upcoming_constants");
    const void *ptr[8];
    int64_t bytes[8];
    int32_t n = host->upcoming_constants(stream, ((const up_plugin *)self)->budget, ptr, bytes, 8);
    float *y = outputs[0];
    memset(y, 0, 17 * sizeof(float));
    y[0] = (float)n;
    for (int32_t i = 0; i < n && i < 8; i++) {
        memcpy(&y[1 + 2 * i], ptr[i], sizeof(float));
        y[2 + 2 * i] = (float)bytes[i];
    }
    return KILN_OK;
}

static kiln_status up_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    if (buf) {
        if (*size < 8)
            return host->fail(KILN_ERROR_INVALID_ARGUMENT, "TestUpcoming: blob buffer too small");
        uint64_t u = (uint64_t)((const up_plugin *)self)->budget;
        for (int i = 0; i < 8; i++)
            ((unsigned char *)buf)[i] = (unsigned char)(u >> (8 * i));
    }
    *size = 8;
    return KILN_OK;
}

static kiln_status up_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return up_new(((const up_plugin *)self)->budget, out);
}

static void up_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops up_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = up_num_outputs,
    .output_shapes = up_output_shapes,
    .output_dtypes = up_output_dtypes,
    .supports = up_supports,
    .enqueue = up_enqueue,
    .serialize = up_serialize,
    .clone = up_clone,
    .destroy = up_destroy,
};

static const kiln_field_spec up_fields[] = {
    {.struct_size = sizeof(kiln_field_spec),
     .abi_version = KILN_PLUGIN_ABI_VERSION,
     .name = "budget",
     .type = KILN_FIELD_I64,
     .count = 1,
     .required = 1,
     .doc = "bytes of upcoming constants asked for"},
};

static kiln_status up_create(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                             kiln_plugin **out)
{
    if (n_fields != 1)
        return host->fail(KILN_ERROR_INTERNAL, "TestUpcoming: expected 1 field, got %d", (int)n_fields);
    return up_new(*(const int64_t *)fields[0].data, out);
}

static kiln_status up_deserialize(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob,
                                  size_t size, kiln_plugin **out)
{
    if (blob_version != 1 || size != 8)
        return host->fail(KILN_ERROR_FORMAT, "TestUpcoming blob v%u of %zu bytes, expected v1 of 8", blob_version,
                          size);
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u |= (uint64_t)((const unsigned char *)blob)[i] << (8 * i);
    return up_new((int64_t)u, out);
}

static const kiln_plugin_creator up_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "TestUpcoming",
    .version = "1",
    .plugin_namespace = "test",
    .fields = up_fields,
    .n_fields = 1,
    .blob_version = 1,
    .create = up_create,
    .deserialize = up_deserialize,
    .description = "reports the host's upcoming constants",
};

KILN_PLUGIN_EXPORT kiln_status kiln_plugin_library_init(const kiln_host_api *host_api, kiln_registry *reg)
{
    host = host_api;
    return host->register_creator(reg, &up_creator);
}
