/* SwiGLU (kiln/SwiGLU/1): y = silu(gate) * up, elementwise — the gated MLP
 * activation of Llama-family models, fused so the silu result never goes to
 * memory. As in Hugging Face, silu's result is rounded to the storage dtype
 * before the multiply.
 *
 * Inputs:  gate, up: same shape and dtype (f32/f16/bf16).
 * Output:  y, shape and dtype of gate.
 * Fields:  none.
 * Blob v1: empty.
 */
#include <math.h>

#include "../plugin_util.h"

#define NAME "SwiGLU"
#define BLOB_VERSION 1u

static const kiln_host_api *host;

static const kiln_plugin_ops swiglu_ops;

static kiln_status swiglu_new(kiln_plugin **out) {
    kiln_plugin *p = calloc(1, sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    p->struct_size = sizeof *p;
    p->abi_version = KILN_PLUGIN_ABI_VERSION;
    p->ops = &swiglu_ops;
    *out = p;
    return KILN_OK;
}

static int32_t swiglu_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status swiglu_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                        kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb) {
    if (n_in != 2 || in[0].rank != in[1].rank)
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects two inputs of the same shape (gate, up)");
    for (int32_t i = 0; i < in[0].rank; i++) {
        int64_t a, b;
        if (host->expr_is_constant(eb, in[0].d[i], &a) && host->expr_is_constant(eb, in[1].d[i], &b) && a != b)
            return host->fail(KILN_ERROR_SHAPE, NAME ": gate and up differ in dim %d (%lld vs %lld)", i,
                              (long long)a, (long long)b);
    }
    out[0] = in[0];
    return KILN_OK;
}

static kiln_status swiglu_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in,
                                        kiln_dtype *out, int32_t n_out) {
    out[0] = in[0];
    return KILN_OK;
}

static int32_t swiglu_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d,
                               int32_t n_in, int32_t n_out) {
    return backend == KILN_BACKEND_CPU && n_in == 2 && n_out == 1 && plugin_is_float(d[0].dtype) &&
           d[1].dtype == d[0].dtype && d[2].dtype == d[0].dtype;
}

typedef struct swiglu_job {
    kiln_dtype t;
    const void *gate, *up;
    void *y;
} swiglu_job;

static void swiglu_range(void *arg, int64_t begin, int64_t end) {
    const swiglu_job *j = arg;
    for (int64_t i = begin; i < end; i++) {
        float g = plugin_load(host, j->gate, j->t, i);
        float s = plugin_round(host, j->t, g / (1.0f + expf(-g)));
        plugin_store(host, j->y, j->t, i, s * plugin_load(host, j->up, j->t, i));
    }
}

static kiln_status swiglu_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                  const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc,
                                  void *const *out, int32_t n_out, void *workspace, void *stream) {
    int64_t n = plugin_desc_count(&in_desc[0]);
    if (plugin_desc_count(&in_desc[1]) != n)
        return host->fail(KILN_ERROR_SHAPE, NAME ": gate has %lld elements but up has %lld", (long long)n,
                          (long long)plugin_desc_count(&in_desc[1]));
    swiglu_job job = {in_desc[0].dtype, in[0], in[1], out[0]};
    host->parallel_for(stream, n, swiglu_range, &job);
    return KILN_OK;
}

static kiln_status swiglu_serialize(const kiln_plugin *self, void *buf, size_t *size) {
    return plugin_pod_serialize(host, NAME, NULL, 0, buf, size);
}

static kiln_status swiglu_clone(const kiln_plugin *self, kiln_plugin **out) {
    return plugin_pod_clone(host, self, sizeof(kiln_plugin), out);
}

static void swiglu_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops swiglu_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = swiglu_num_outputs,
    .output_shapes = swiglu_output_shapes,
    .output_dtypes = swiglu_output_dtypes,
    .supports = swiglu_supports,
    .enqueue = swiglu_enqueue,
    .serialize = swiglu_serialize,
    .clone = swiglu_clone,
    .destroy = swiglu_destroy,
};

static kiln_status swiglu_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out) {
    return swiglu_new(out);
}

static kiln_status swiglu_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob,
                                      size_t size, kiln_plugin **out) {
    kiln_status s = plugin_pod_check_blob(host, NAME, BLOB_VERSION, version, size, 0);
    return s != KILN_OK ? s : swiglu_new(out);
}

static const kiln_plugin_creator swiglu_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = NULL,
    .n_fields = 0,
    .blob_version = BLOB_VERSION,
    .create = swiglu_create,
    .deserialize = swiglu_deserialize,
    .description = "silu(gate) * up, the gated MLP activation of Llama-family models",
};

kiln_status kiln_swiglu_register(const kiln_host_api *h, kiln_registry *reg) {
    host = h;
    return h->register_creator(reg, &swiglu_creator);
}
