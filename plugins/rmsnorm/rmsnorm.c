/* RMSNorm (kiln/RMSNorm/1): y = x / sqrt(mean(x^2) + epsilon) * weight over
 * the last axis, computed in f32 as Hugging Face's LlamaRMSNorm does (the
 * normalized value is rounded to the input dtype before the weight
 * multiply).
 *
 * Inputs:  x [..., H] (f32/f16/bf16), weight [H] (f32/f16/bf16).
 * Output:  y, shape and dtype of x.
 * Fields:  epsilon (f32, required).
 * Blob v1: epsilon as f32.
 */
#include <math.h>

#include "../plugin_util.h"

#define NAME "RMSNorm"
#define BLOB_VERSION 1u

static const kiln_host_api *host;

typedef struct rmsnorm {
    kiln_plugin base;
    struct { float epsilon; } p;
} rmsnorm;

static const kiln_plugin_ops rmsnorm_ops;

static kiln_status rmsnorm_new(float epsilon, kiln_plugin **out) {
    if (!(epsilon > 0.0f) || !isfinite(epsilon))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": field \"epsilon\" must be a positive number, got %g",
                          (double)epsilon);
    rmsnorm *r = calloc(1, sizeof *r);
    if (!r)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    r->base.struct_size = sizeof r->base;
    r->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    r->base.ops = &rmsnorm_ops;
    r->p.epsilon = epsilon;
    *out = &r->base;
    return KILN_OK;
}

static int32_t rmsnorm_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status rmsnorm_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                         kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb) {
    if (n_in != 2 || in[0].rank < 1 || in[1].rank != 1)
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects inputs x [..., H] and weight [H]");
    int64_t h, w;
    if (host->expr_is_constant(eb, in[0].d[in[0].rank - 1], &h) && host->expr_is_constant(eb, in[1].d[0], &w) &&
        h != w)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x has %lld features but weight has %lld", (long long)h,
                          (long long)w);
    out[0] = in[0];
    return KILN_OK;
}

static kiln_status rmsnorm_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in,
                                         kiln_dtype *out, int32_t n_out) {
    out[0] = in[0];
    return KILN_OK;
}

static int32_t rmsnorm_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d,
                                int32_t n_in, int32_t n_out) {
    return backend == KILN_BACKEND_CPU && n_in == 2 && n_out == 1 && plugin_is_float(d[0].dtype) &&
           plugin_is_float(d[1].dtype) && d[2].dtype == d[0].dtype;
}

typedef struct rmsnorm_job {
    const rmsnorm *r;
    const kiln_tensor_desc *x_desc, *w_desc;
    const void *x, *w;
    void *y;
    int64_t h;
} rmsnorm_job;

static void rmsnorm_rows(void *arg, int64_t begin, int64_t end) {
    const rmsnorm_job *j = arg;
    kiln_dtype xt = j->x_desc->dtype, wt = j->w_desc->dtype;
    for (int64_t row = begin; row < end; row++) {
        int64_t base = row * j->h;
        float ss = 0.0f;
        for (int64_t i = 0; i < j->h; i++) {
            float v = plugin_load(host, j->x, xt, base + i);
            ss += v * v;
        }
        float inv = 1.0f / sqrtf(ss / (float)j->h + j->r->p.epsilon);
        for (int64_t i = 0; i < j->h; i++) {
            /* Round the normalized value to the storage dtype first, as HF does. */
            float n = plugin_load(host, j->x, xt, base + i) * inv;
            n = plugin_round(host, xt, n);
            plugin_store(host, j->y, xt, base + i, n * plugin_load(host, j->w, wt, i));
        }
    }
}

static kiln_status rmsnorm_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                   const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc,
                                   void *const *out, int32_t n_out, void *workspace, void *stream) {
    const kiln_tensor_desc *x = &in_desc[0];
    int64_t h = x->dims.d[x->dims.rank - 1];
    if (in_desc[1].dims.d[0] != h)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x has %lld features but weight has %lld", (long long)h,
                          (long long)in_desc[1].dims.d[0]);
    rmsnorm_job job = {(const rmsnorm *)self, x, &in_desc[1], in[0], in[1], out[0], h};
    int64_t rows = h ? plugin_desc_count(x) / h : 0;
    host->parallel_for(stream, rows, rmsnorm_rows, &job);
    return KILN_OK;
}

static kiln_status rmsnorm_serialize(const kiln_plugin *self, void *buf, size_t *size) {
    const rmsnorm *r = (const rmsnorm *)self;
    return plugin_pod_serialize(host, NAME, &r->p, sizeof r->p, buf, size);
}

static kiln_status rmsnorm_clone(const kiln_plugin *self, kiln_plugin **out) {
    return plugin_pod_clone(host, self, sizeof(rmsnorm), out);
}

static void rmsnorm_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops rmsnorm_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = rmsnorm_num_outputs,
    .output_shapes = rmsnorm_output_shapes,
    .output_dtypes = rmsnorm_output_dtypes,
    .supports = rmsnorm_supports,
    .enqueue = rmsnorm_enqueue,
    .serialize = rmsnorm_serialize,
    .clone = rmsnorm_clone,
    .destroy = rmsnorm_destroy,
};

static kiln_status rmsnorm_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n,
                                  kiln_plugin **out) {
    return rmsnorm_new(plugin_field_f32(f, n, "epsilon", 0.0f), out);
}

static kiln_status rmsnorm_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob,
                                       size_t size, kiln_plugin **out) {
    float eps;
    kiln_status s = plugin_pod_check_blob(host, NAME, BLOB_VERSION, version, size, sizeof eps);
    if (s != KILN_OK)
        return s;
    memcpy(&eps, blob, sizeof eps);
    return rmsnorm_new(eps, out);
}

static const kiln_field_spec rmsnorm_fields[] = {
    PLUGIN_FIELD_REQUIRED("epsilon", KILN_FIELD_F32, "added to the mean square before the square root"),
};

static const kiln_plugin_creator rmsnorm_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = rmsnorm_fields,
    .n_fields = 1,
    .blob_version = BLOB_VERSION,
    .create = rmsnorm_create,
    .deserialize = rmsnorm_deserialize,
    .description = "root-mean-square normalization over the last axis, times a weight",
};

kiln_status kiln_rmsnorm_register(const kiln_host_api *h, kiln_registry *reg) {
    host = h;
    return h->register_creator(reg, &rmsnorm_creator);
}
