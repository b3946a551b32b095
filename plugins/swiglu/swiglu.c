/* SwiGLU (kiln/SwiGLU/1): y = silu(gate) * up, elementwise — the gated MLP
 * activation of Llama-family models, fused so the silu result never goes to
 * memory. As in Hugging Face, silu's result is rounded to the storage dtype
 * before the multiply.
 *
 * Inputs:  gate, up: same shape and dtype (f32/f16/bf16).
 * Output:  y, shape and dtype of gate.
 * Fields:  packed (i32, default 0): 1 = one input [..., 2*I] holding gate
 *          then up in each row (a fused gate+up matmul), output [..., I];
 *          quantize (string: none or fp8; default none): with fp8 y's
 *          rows (their values rounded to the dtype as above) leave as
 *          kiln/Fp8MatMul's pre-quantized x, two outputs in y's place: the
 *          E4M3 codes (u8, y's shape) and a scale a row (f32, y's shape
 *          with a last dim of 1), as Fp8MatMul quantizes an x
 *          (kiln_fp8_quantize_row): the FP8 engine's down projection reads
 *          them, and the quantization costs no pass over y of its own;
 *          x_amax (f32, default 0): with quantize, a static max |y| for
 *          every row (from a calibration text; values beyond saturate).
 * Blob v4: packed, then quantize (0 none, 1 fp8), as i32, then x_amax as
 *          f32; v3 lacks x_amax (dynamic), v2 (packed alone) reads as
 *          quantize none, v1 (empty) as packed = 0 too.
 *
 * The CUDA kernel (swiglu_cuda.cu) follows the same arithmetic.
 */
#include <math.h>
#include <stdlib.h>

#include "core/fp8.h"

#include "plugin_cuda.h"
#include "plugin_util.h"

#define NAME "SwiGLU"
#define BLOB_VERSION 4u

static const kiln_host_api *host;

typedef struct swiglu {
    kiln_plugin base;
    struct {
        int32_t packed, quantize;
        float x_amax; /* quantize: a static max |y| (0: each row's own) */
    } p;
} swiglu;

/* Blob bytes of each schema version (v1 is empty). */
static const size_t blob_sizes[BLOB_VERSION] = {0, sizeof(int32_t), 2 * sizeof(int32_t),
                                                2 * sizeof(int32_t) + sizeof(float)};

static const kiln_plugin_ops swiglu_ops;

static kiln_status swiglu_new(int32_t packed, int32_t quantize, float x_amax, kiln_plugin **out)
{
    if (packed != 0 && packed != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": field \"packed\" is %d; expected 0 or 1", packed);
    if (quantize != 0 && quantize != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": quantize %d is not 0 (none) or 1 (fp8)", quantize);
    if (!(x_amax >= 0.0f) || !isfinite(x_amax) || (x_amax > 0.0f && !quantize))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": field \"x_amax\" must be a finite number >= 0, and 0 without quantize = fp8 (got %g)",
                          (double)x_amax);
    swiglu *p = calloc(1, sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    p->base.struct_size = sizeof p->base;
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &swiglu_ops;
    p->p.packed = packed;
    p->p.quantize = quantize;
    p->p.x_amax = x_amax;
    *out = &p->base;
    return KILN_OK;
}

static int32_t swiglu_num_outputs(const kiln_plugin *self) { return 1 + ((const swiglu *)self)->p.quantize; }

/* With quantize: the scales' shape, y's with a last dim of 1. */
static void swiglu_scale_shape(const kiln_plugin *self, kiln_shape_expr *out, kiln_expr_builder *eb)
{
    if (((const swiglu *)self)->p.quantize) {
        out[1] = out[0];
        out[1].d[out[0].rank - 1] = host->expr_constant(eb, 1);
    }
}

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
        swiglu_scale_shape(self, out, eb);
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
    if (((const swiglu *)self)->p.quantize && in[0].rank < 1)
        return host->fail(KILN_ERROR_SHAPE, NAME ": quantize = fp8 needs inputs of rank 1 or more");
    out[0] = in[0];
    swiglu_scale_shape(self, out, eb);
    return KILN_OK;
}

static kiln_status swiglu_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                        int32_t n_out)
{
    const int32_t q = ((const swiglu *)self)->p.quantize;
    out[0] = q ? KILN_DTYPE_U8 : in[0];
    if (q)
        out[1] = KILN_DTYPE_F32;
    return KILN_OK;
}

static int32_t swiglu_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                               int32_t n_out)
{
    const swiglu *p = (const swiglu *)self;
    int32_t n_in_want = p->p.packed ? 1 : 2;
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    backend_ok = backend_ok || backend == KILN_BACKEND_CUDA;
#endif
    if (!backend_ok || n_in != n_in_want || n_out != 1 + p->p.quantize || !plugin_is_float(d[0].dtype) ||
        (n_in == 2 && d[1].dtype != d[0].dtype))
        return 0;
    return p->p.quantize ? d[n_in].dtype == KILN_DTYPE_U8 && d[n_in + 1].dtype == KILN_DTYPE_F32
                         : d[n_in].dtype == d[0].dtype;
}

/* Rows of `width` outputs; gate and up rows are `ld` elements apart. */
typedef struct swiglu_job {
    kiln_dtype t;
    const void *gate, *up;
    void *y;        /* with quantize: E4M3 codes */
    float *y_scale; /* quantize: a scale a row */
    float x_amax;   /* quantize: the static max |y|, or 0 */
    int64_t width, ld;
    int failed; /* quantize: no memory for a row's values */
} swiglu_job;

static void swiglu_rows(void *arg, int64_t begin, int64_t end)
{
    const swiglu_job *j = arg;
    /* quantize: a row of y's values (rounded to the dtype), then its codes */
    float *yrow = NULL;
    if (j->y_scale && !(yrow = malloc((size_t)(j->width ? j->width : 1) * sizeof *yrow))) {
        ((swiglu_job *)arg)->failed = 1;
        return;
    }
    for (int64_t r = begin; r < end; r++) {
        for (int64_t c = 0; c < j->width; c++) {
            float g = plugin_load(host, j->gate, j->t, r * j->ld + c);
            float s = plugin_round(host, j->t, g / (1.0f + expf(-g)));
            float y = s * plugin_load(host, j->up, j->t, r * j->ld + c);
            if (yrow)
                yrow[c] = plugin_round(host, j->t, y);
            else
                plugin_store(host, j->y, j->t, r * j->width + c, y);
        }
        if (yrow)
            j->y_scale[r] = kiln_fp8_quantize_row(yrow, j->width, j->x_amax, (uint8_t *)j->y + r * j->width);
    }
    free(yrow);
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
    const int32_t q = ((const swiglu *)self)->p.quantize;
    const float amax = ((const swiglu *)self)->p.x_amax;
    if (q && rows > 0 && width > 0 && !workspace)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": no workspace for y before its quantization");
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        /* with quantize, y itself goes to the workspace only where the
         * kernel cannot quantize it in registers */
        int e = kiln_swiglu_cuda(gate, up, q ? workspace : out[0], (int32_t)in_desc[0].dtype, rows, width, ld,
                                 q ? out[0] : NULL, q ? out[1] : NULL, amax, stream);
        return e ? host->fail(KILN_ERROR_BACKEND, NAME ": kernel launch failed (cuda error %d)", e) : KILN_OK;
    }
#endif
    swiglu_job job = {in_desc[0].dtype, gate, up, out[0], q ? out[1] : NULL, amax, width, ld, 0};
    if (q) {
        host->parallel_for(stream, rows, swiglu_rows, &job);
        return job.failed ? host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory") : KILN_OK;
    }
#ifdef PLUGIN_AVX512
    if (job.t == KILN_DTYPE_F32 && plugin_has_avx512()) {
        host->parallel_for(stream, rows, swiglu_rows_f32, &job);
        return KILN_OK;
    }
#endif
    host->parallel_for(stream, rows, swiglu_rows, &job);
    return KILN_OK;
}

/* With quantize on CUDA: y in its dtype, where the kernel that cannot
 * quantize in registers stores it first. */
static size_t swiglu_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                                    const kiln_tensor_desc *out, int32_t n_out)
{
    return ((const swiglu *)self)->p.quantize ? (size_t)plugin_desc_count(&out[0]) * plugin_float_size(in[0].dtype) : 0;
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
    .workspace_size = swiglu_workspace_size,
    .enqueue = swiglu_enqueue,
    .serialize = swiglu_serialize,
    .clone = swiglu_clone,
    .destroy = swiglu_destroy,
};

static kiln_status swiglu_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    const kiln_field *qf = plugin_field(f, n, "quantize");
    const char *qw = qf ? qf->data : "none";
    const int32_t q = plugin_quantize_named(qw);
    if (q < 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": field \"quantize\" is \"%s\"; expected none or fp8", qw);
    return swiglu_new(plugin_field_i32(f, n, "packed", 0), q, plugin_field_f32(f, n, "x_amax", 0.0f), out);
}

static kiln_status swiglu_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                      kiln_plugin **out)
{
    struct {
        int32_t packed, quantize;
        float x_amax;
    } p = {0, 0, 0.0f};
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, blob_sizes, version, blob, size, &p);
    return s != KILN_OK ? s : swiglu_new(p.packed, p.quantize, p.x_amax, out);
}

static const int32_t zero_i32 = 0;
static const float zero_f32 = 0.0f;

static const kiln_field_spec swiglu_fields[] = {
    PLUGIN_FIELD_OPTIONAL("packed", KILN_FIELD_I32, &zero_i32, "1: one input [..., 2*I], gate then up in each row"),
    PLUGIN_FIELD_OPTIONAL("quantize", KILN_FIELD_STRING, "none",
                          "none, or fp8: y as E4M3 codes and a scale a row (kiln/Fp8MatMul's x)"),
    PLUGIN_FIELD_OPTIONAL("x_amax", KILN_FIELD_F32, &zero_f32,
                          "quantize: a static max |y| for every row (from calibration; 0: each row's own)"),
};

static const kiln_plugin_creator swiglu_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = swiglu_fields,
    .n_fields = sizeof swiglu_fields / sizeof swiglu_fields[0],
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
