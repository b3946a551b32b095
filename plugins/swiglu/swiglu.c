/* SwiGLU (kiln/SwiGLU/1): y = silu(gate) * up, elementwise — the gated MLP
 * activation of Llama-family models, fused so the silu result never goes to
 * memory. As in Hugging Face, silu's result is rounded to the storage dtype
 * before the multiply.
 *
 * Inputs:  gate, up: same shape and dtype (f32/f16/bf16).
 * Output:  y, shape and dtype of gate.
 * Fields:  packed (i32, default 0): 1 = one input [..., 2*I] holding gate
 *          then up in each row (a fused gate+up matmul), output [..., I].
 * Blob v2: packed as i32; v1 (empty) is still read as packed = 0.
 *
 * The CUDA kernel (swiglu_cuda.cu) follows the same arithmetic.
 */
#include <math.h>

#include "plugin_cuda.h"
#include "plugin_util.h"

#define NAME "SwiGLU"
#define BLOB_VERSION 2u

static const kiln_host_api *host;

typedef struct swiglu {
    kiln_plugin base;
    struct {
        int32_t packed;
    } p;
} swiglu;

/* Blob bytes of each schema version (v1 is empty). */
static const size_t blob_sizes[BLOB_VERSION] = {0, sizeof(int32_t)};

static const kiln_plugin_ops swiglu_ops;

static kiln_status swiglu_new(int32_t packed, kiln_plugin **out)
{
    if (packed != 0 && packed != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": field \"packed\" is %d; expected 0 or 1", packed);
    swiglu *p = calloc(1, sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    p->base.struct_size = sizeof p->base;
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &swiglu_ops;
    p->p.packed = packed;
    *out = &p->base;
    return KILN_OK;
}

static int32_t swiglu_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status swiglu_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                        kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    if (((const swiglu *)self)->p.packed) {
        int64_t w;
        if (n_in != 1 || in[0].rank < 1)
            return host->fail(KILN_ERROR_SHAPE, NAME ": packed expects one input [..., 2*I]");
        int32_t last = in[0].rank - 1;
        if (host->expr_is_constant(eb, in[0].d[last], &w) && w % 2)
            return host->fail(KILN_ERROR_SHAPE, NAME ": packed input's last dim %lld is odd", (long long)w);
        out[0] = in[0];
        out[0].d[last] = host->expr_operation(eb, KILN_EXPR_FLOOR_DIV, in[0].d[last], host->expr_constant(eb, 2));
        return KILN_OK;
    }
    if (n_in != 2 || in[0].rank != in[1].rank)
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects two inputs of the same shape (gate, up)");
    for (int32_t i = 0; i < in[0].rank; i++) {
        int64_t a, b;
        if (host->expr_is_constant(eb, in[0].d[i], &a) && host->expr_is_constant(eb, in[1].d[i], &b) && a != b)
            return host->fail(KILN_ERROR_SHAPE, NAME ": gate and up differ in dim %d (%lld vs %lld)", i, (long long)a,
                              (long long)b);
    }
    out[0] = in[0];
    return KILN_OK;
}

static kiln_status swiglu_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                        int32_t n_out)
{
    out[0] = in[0];
    return KILN_OK;
}

static int32_t swiglu_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                               int32_t n_out)
{
    int32_t n_in_want = ((const swiglu *)self)->p.packed ? 1 : 2;
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    backend_ok = backend_ok || backend == KILN_BACKEND_CUDA;
#endif
    return backend_ok && n_in == n_in_want && n_out == 1 && plugin_is_float(d[0].dtype) && d[1].dtype == d[0].dtype &&
           (n_in == 1 || d[2].dtype == d[0].dtype);
}

/* Rows of `width` outputs; gate and up rows are `ld` elements apart. */
typedef struct swiglu_job {
    kiln_dtype t;
    const void *gate, *up;
    void *y;
    int64_t width, ld;
} swiglu_job;

static void swiglu_rows(void *arg, int64_t begin, int64_t end)
{
    const swiglu_job *j = arg;
    for (int64_t r = begin; r < end; r++)
        for (int64_t c = 0; c < j->width; c++) {
            float g = plugin_load(host, j->gate, j->t, r * j->ld + c);
            float s = plugin_round(host, j->t, g / (1.0f + expf(-g)));
            plugin_store(host, j->y, j->t, r * j->width + c, s * plugin_load(host, j->up, j->t, r * j->ld + c));
        }
}

#ifdef PLUGIN_AVX512
/* f32 rows with e^x on registers (plugin_exp16) instead of a libm call
 * per element. */
PLUGIN_AVX512_FN static void swiglu_rows_f32(void *arg, int64_t begin, int64_t end)
{
    const swiglu_job *j = arg;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t r = begin; r < end; r++) {
        const float *g = (const float *)j->gate + r * j->ld, *u = (const float *)j->up + r * j->ld;
        float *y = (float *)j->y + r * j->width;
        int64_t c = 0;
        for (; c + 16 <= j->width; c += 16) {
            __m512 gv = _mm512_loadu_ps(g + c);
            __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, plugin_exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
            _mm512_storeu_ps(y + c, _mm512_mul_ps(s, _mm512_loadu_ps(u + c)));
        }
        for (; c < j->width; c++)
            y[c] = g[c] / (1.0f + expf(-g[c])) * u[c];
    }
}
#endif

static kiln_status swiglu_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                  const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc,
                                  void *const *out, int32_t n_out, void *workspace, void *stream)
{
    int64_t n = plugin_desc_count(&in_desc[0]), rows, width, ld;
    const void *gate = in[0], *up;
    if (((const swiglu *)self)->p.packed) {
        ld = in_desc[0].dims.rank ? in_desc[0].dims.d[in_desc[0].dims.rank - 1] : 0;
        if (ld % 2 || plugin_desc_count(&out_desc[0]) * 2 != n)
            return host->fail(KILN_ERROR_SHAPE,
                              NAME ": packed input of %lld elements (rows of %lld) does not match "
                                   "the output's %lld",
                              (long long)n, (long long)ld, (long long)plugin_desc_count(&out_desc[0]));
        width = ld / 2;
        rows = width ? n / ld : 0;
        up = (const char *)in[0] + (size_t)width * plugin_float_size(in_desc[0].dtype);
    } else {
        if (plugin_desc_count(&in_desc[1]) != n)
            return host->fail(KILN_ERROR_SHAPE, NAME ": gate has %lld elements but up has %lld", (long long)n,
                              (long long)plugin_desc_count(&in_desc[1]));
        width = ld = in_desc[0].dims.rank ? in_desc[0].dims.d[in_desc[0].dims.rank - 1] : 1;
        rows = width ? n / width : 0, up = in[1];
    }
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        int e = kiln_swiglu_cuda(gate, up, out[0], (int32_t)in_desc[0].dtype, rows, width, ld, stream);
        return e ? host->fail(KILN_ERROR_BACKEND, NAME ": kernel launch failed (cuda error %d)", e) : KILN_OK;
    }
#endif
    swiglu_job job = {in_desc[0].dtype, gate, up, out[0], width, ld};
#ifdef PLUGIN_AVX512
    if (job.t == KILN_DTYPE_F32 && plugin_has_avx512()) {
        host->parallel_for(stream, rows, swiglu_rows_f32, &job);
        return KILN_OK;
    }
#endif
    host->parallel_for(stream, rows, swiglu_rows, &job);
    return KILN_OK;
}

static kiln_status swiglu_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const swiglu *p = (const swiglu *)self;
    return plugin_pod_serialize(host, NAME, &p->p, sizeof p->p, buf, size);
}

static kiln_status swiglu_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(swiglu), out);
}

static void swiglu_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops swiglu_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
    .num_outputs = swiglu_num_outputs,
    .output_shapes = swiglu_output_shapes,
    .output_dtypes = swiglu_output_dtypes,
    .supports = swiglu_supports,
    .enqueue = swiglu_enqueue,
    .serialize = swiglu_serialize,
    .clone = swiglu_clone,
    .destroy = swiglu_destroy,
};

static kiln_status swiglu_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    return swiglu_new(plugin_field_i32(f, n, "packed", 0), out);
}

static kiln_status swiglu_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                      kiln_plugin **out)
{
    int32_t packed = 0;
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, blob_sizes, version, blob, size, &packed);
    return s != KILN_OK ? s : swiglu_new(packed, out);
}

static const int32_t zero_i32 = 0;

static const kiln_field_spec swiglu_fields[] = {
    PLUGIN_FIELD_OPTIONAL("packed", KILN_FIELD_I32, &zero_i32, "1: one input [..., 2*I], gate then up in each row"),
};

static const kiln_plugin_creator swiglu_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = swiglu_fields,
    .n_fields = 1,
    .blob_version = BLOB_VERSION,
    .create = swiglu_create,
    .deserialize = swiglu_deserialize,
    .description = "silu(gate) * up, the gated MLP activation of Llama-family models",
};

kiln_status kiln_swiglu_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &swiglu_creator);
}
