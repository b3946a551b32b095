/* TestNoCapture/1/"test": an f32 identity that declares the CPU and CUDA
 * backends but is NOT marked KILN_PLUGIN_FLAG_CAPTURE_SAFE, so a cuda engine
 * holding it must refuse CUDA-graph mode naming it
 * (tests/ops/test_cuda_runtime.c). Built against plugin.h alone, it has no
 * CUDA kernel: its cuda enqueue reports that instead of running, and the
 * test never enqueues it on the GPU. No fields; empty blob, version 1. */
#include <kiln/plugin.h>

#include <stdlib.h>
#include <string.h>

static const kiln_host_api *host;
static const kiln_plugin_ops nc_ops;

static kiln_status nc_new(kiln_plugin **out)
{
    kiln_plugin *p = malloc(sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, "TestNoCapture: out of memory");
    p->struct_size = sizeof(kiln_plugin);
    p->abi_version = KILN_PLUGIN_ABI_VERSION;
    p->ops = &nc_ops;
    *out = p;
    return KILN_OK;
}

static int32_t nc_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status nc_output_shapes(const kiln_plugin *self, const kiln_shape_expr *inputs, int32_t n_inputs,
                                    kiln_shape_expr *outputs, int32_t n_outputs, kiln_expr_builder *eb)
{
    if (n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_SHAPE, "TestNoCapture takes 1 input and gives 1 output");
    outputs[0] = inputs[0];
    return KILN_OK;
}

static kiln_status nc_output_dtypes(const kiln_plugin *self, const kiln_dtype *inputs, int32_t n_inputs,
                                    kiln_dtype *outputs, int32_t n_outputs)
{
    if (n_inputs != 1 || n_outputs != 1 || inputs[0] != KILN_DTYPE_F32)
        return host->fail(KILN_ERROR_UNSUPPORTED, "TestNoCapture takes one f32 input");
    outputs[0] = KILN_DTYPE_F32;
    return KILN_OK;
}

static int32_t nc_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *descs,
                           int32_t n_inputs, int32_t n_outputs)
{
    return n_inputs == 1 && n_outputs == 1 && descs[0].dtype == KILN_DTYPE_F32 && descs[1].dtype == KILN_DTYPE_F32;
}

static kiln_status nc_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *input_descs,
                              const void *const *inputs, int32_t n_inputs, const kiln_tensor_desc *output_descs,
                              void *const *outputs, int32_t n_outputs, void *workspace, void *stream)
{
    if (backend != KILN_BACKEND_CPU)
        return host->fail(KILN_ERROR_UNSUPPORTED, "TestNoCapture has no CUDA kernel (a test plugin)");
    int64_t n = 1;
    for (int32_t i = 0; i < input_descs[0].dims.rank; i++)
        n *= input_descs[0].dims.d[i];
    memcpy(outputs[0], inputs[0], (size_t)n * sizeof(float));
    return KILN_OK;
}

static kiln_status nc_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    *size = 0;
    return KILN_OK;
}

static kiln_status nc_clone(const kiln_plugin *self, kiln_plugin **out) { return nc_new(out); }

static void nc_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops nc_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = 0,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU) | KILN_BACKEND_BIT(KILN_BACKEND_CUDA),
    .num_outputs = nc_num_outputs,
    .output_shapes = nc_output_shapes,
    .output_dtypes = nc_output_dtypes,
    .supports = nc_supports,
    .enqueue = nc_enqueue,
    .serialize = nc_serialize,
    .clone = nc_clone,
    .destroy = nc_destroy,
};

static kiln_status nc_create(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                             kiln_plugin **out)
{
    return nc_new(out);
}

static kiln_status nc_deserialize(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob,
                                  size_t size, kiln_plugin **out)
{
    if (blob_version != 1)
        return host->fail(KILN_ERROR_VERSION, "TestNoCapture blob schema version %u, this plugin reads 1",
                          blob_version);
    return nc_new(out);
}

static const kiln_plugin_creator nc_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "TestNoCapture",
    .version = "1",
    .plugin_namespace = "test",
    .fields = NULL,
    .n_fields = 0,
    .blob_version = 1,
    .create = nc_create,
    .deserialize = nc_deserialize,
    .description = "f32 identity that is not capture-safe",
};

KILN_PLUGIN_EXPORT kiln_status kiln_plugin_library_init(const kiln_host_api *host_api, kiln_registry *reg)
{
    host = host_api;
    return host->register_creator(reg, &nc_creator);
}
