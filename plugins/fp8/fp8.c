/* Fp8MatMul (kiln/Fp8MatMul/1): y = x · Wᵀ in FP8 E4M3 (W8A8), the form
 * Hopper's tensor cores run at twice the bf16 rate. W is stored as E4M3
 * codes with an f32 scale per output channel; each row (token) of x is
 * quantized when the layer runs, with its own dynamic scale:
 *
 *   a = max |x[r, :]|;  sx = a / 448;  xq = e4m3(x · (448 / a))  (0 when a = 0)
 *   y[r, c] = (Σ_i f32(xq[r, i]) · f32(w[c, i])) · sx · sw[c]
 *
 * with the products summed in f32 and y rounded once to its dtype. The CPU
 * computes exactly this (the reference: every E4M3 value is exact in f32,
 * so only the order of the sums differs from the GPU); the CUDA kernels
 * (fp8_cuda.cu) quantize x the same way, then run a GEMV for few rows and
 * cuBLASLt's FP8 GEMM (TN, f32 accumulation) for more.
 *
 * Inputs:  x: f32, f16 or bf16, [..., K].
 *          w: u8 (E4M3 codes), [N, K].
 *          w_scale: f32, [N].
 *          x_scale (optional): f32, [..., 1]; with it x is already
 *          quantized: u8 E4M3 codes with a scale a row, as RMSNorm,
 *          AddRMSNorm and SwiGLU write them with quantize = fp8 (the
 *          quantization then rides on the kernel that wrote x: no pass of
 *          its own over x, and the decode GEMV has no max |x| prologue).
 * Output:  y: [..., N], dtype output_dtype (default x's; required when x
 *          is u8).
 * Fields:  n, k (i32), k a multiple of 16 (at most 2^30); output_dtype
 *          (string: input, f32, f16 or bf16; default input); x_amax (f32,
 *          default 0): a static max |x| for every row in place of a (from
 *          a calibration text; values beyond it saturate to ±448), for an
 *          x the plugin quantizes itself.
 * Blob v3: three int32: n, k, y's dtype (-1: x's), then x_amax as f32.
 *          v2 lacks x_amax (dynamic); v1 (n, k) reads as y in x's dtype.
 * Workspace: the quantized rows of x and their scales, and for more rows
 * than the GEMV takes the GEMM's f32 result and cuBLASLt's scratch. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/fp8.h"
#include "plugin_cuda.h"
#include "plugin_util.h"

#define NAME "Fp8MatMul"
#define BLOB_VERSION 3u

typedef struct fp8_params {
    int32_t n, k;
    int32_t output_dtype; /* kiln_dtype of y; -1: x's */
    float x_amax;         /* a static max |x| (0: each row's own) */
} fp8_params;

typedef struct fp8mm {
    kiln_plugin base;
    fp8_params p;
} fp8mm;

static const kiln_host_api *host;
static const kiln_plugin_ops fp8_ops;

static kiln_status fp8_new(const fp8_params *p, kiln_plugin **out)
{
    /* k <= 2^30: the CUDA GEMV keeps its k offsets in 32 bits */
    if (p->n <= 0 || p->k <= 0 || p->k % 16 != 0 || p->k > (1 << 30))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": n = %d and k = %d must be positive, k a multiple of 16 and at most 2^30", p->n, p->k);
    if (p->output_dtype != -1 && !plugin_is_float((kiln_dtype)p->output_dtype))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": output dtype %d is not f32, f16 or bf16",
                          p->output_dtype);
    if (!(p->x_amax >= 0.0f) || !isfinite(p->x_amax))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": field \"x_amax\" must be a finite number >= 0, got %g",
                          (double)p->x_amax);
    fp8mm *f = calloc(1, sizeof *f);
    if (!f)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    f->base.struct_size = sizeof f->base;
    f->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    f->base.ops = &fp8_ops;
    f->p = *p;
    *out = &f->base;
    return KILN_OK;
}

static int32_t fp8_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status fp8_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                     kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    const fp8_params *p = &((const fp8mm *)self)->p;
    if (n_in < 3 || n_in > 4 || in[0].rank < 1 || in[1].rank != 2 || in[2].rank != 1 ||
        (n_in == 4 && in[3].rank != in[0].rank))
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects x [..., K], w [N, K], w_scale [N] and optionally x_scale "
                                                 "[..., 1]");
    if (n_in == 4 && p->x_amax > 0.0f)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": field \"x_amax\" is for an x it quantizes itself, but x_scale is given (x already "
                               "quantized)");
    int64_t v, u;
    for (int32_t i = 0; n_in == 4 && i < in[0].rank; i++) {
        const int last = i == in[0].rank - 1;
        if (host->expr_is_constant(eb, in[3].d[i], &v) &&
            (last ? v != 1 : host->expr_is_constant(eb, in[0].d[i], &u) && u != v))
            return host->fail(KILN_ERROR_SHAPE,
                              NAME ": x_scale must be x's shape with a last dim of 1 (dim %d is %lld)", i,
                              (long long)v);
    }
    if (host->expr_is_constant(eb, in[0].d[in[0].rank - 1], &v) && v != p->k)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x has %lld columns, k is %d", (long long)v, p->k);
    if ((host->expr_is_constant(eb, in[1].d[0], &v) && v != p->n) ||
        (host->expr_is_constant(eb, in[1].d[1], &v) && v != p->k) ||
        (host->expr_is_constant(eb, in[2].d[0], &v) && v != p->n))
        return host->fail(KILN_ERROR_SHAPE, NAME ": w must be [%d, %d] and w_scale [%d]", p->n, p->k, p->n);
    out[0] = in[0];
    out[0].d[in[0].rank - 1] = host->expr_constant(eb, p->n);
    return KILN_OK;
}

static kiln_status fp8_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                     int32_t n_out)
{
    const fp8_params *p = &((const fp8mm *)self)->p;
    if (in[0] == KILN_DTYPE_U8 && p->output_dtype < 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": x is E4M3 codes (u8): field \"output_dtype\" must say y's dtype");
    out[0] = p->output_dtype >= 0 ? (kiln_dtype)p->output_dtype : in[0];
    return KILN_OK;
}

static int32_t fp8_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                            int32_t n_out)
{
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    /* asked when an engine is built and loaded: cuBLASLt is set up here,
     * never inside a captured step; without a GPU (a build for one) the
     * setup fails and enqueue reports it */
    if (backend == KILN_BACKEND_CUDA) {
        (void)kiln_fp8_cuda_init();
        backend_ok = 1;
    }
#endif
    const fp8_params *p = &((const fp8mm *)self)->p;
    const kiln_dtype y = d[n_in].dtype;
    /* the CUDA kernels that quantize x themselves write y in x's dtype */
    const int x_ok = n_in == 3 ? plugin_is_float(d[0].dtype) && (backend != KILN_BACKEND_CUDA || y == d[0].dtype)
                               : d[0].dtype == KILN_DTYPE_U8 && d[3].dtype == KILN_DTYPE_F32;
    return backend_ok && (n_in == 3 || n_in == 4) && n_out == 1 && x_ok && d[1].dtype == KILN_DTYPE_U8 &&
           d[2].dtype == KILN_DTYPE_F32 && plugin_is_float(y) &&
           y == (p->output_dtype >= 0 ? (kiln_dtype)p->output_dtype : d[0].dtype);
}

static size_t fp8_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                                 const kiln_tensor_desc *out, int32_t n_out)
{
    const fp8_params *p = &((const fp8mm *)self)->p;
    int64_t rows = plugin_desc_count(&in[0]) / p->k;
    return kiln_fp8_workspace(rows, p->n, p->k);
}

typedef struct fp8_job {
    const fp8_params *p;
    int64_t rows;
    const uint8_t *xq, *w;
    const float *sx, *sw;
    void *y;
    kiln_dtype t; /* y's */
} fp8_job;

/* Output columns [begin, end) for every row. */
static void fp8_range(void *arg, int64_t begin, int64_t end)
{
    const fp8_job *j = arg;
    const int64_t k = j->p->k, n = j->p->n;
    float lut[256];
    for (int c = 0; c < 256; c++)
        lut[c] = kiln_e4m3_to_f32((uint8_t)c);
    for (int64_t c = begin; c < end; c++) {
        const uint8_t *wr = j->w + c * k;
        for (int64_t r = 0; r < j->rows; r++) {
            const uint8_t *xr = j->xq + r * k;
            float acc = 0;
            for (int64_t i = 0; i < k; i++)
                acc += lut[xr[i]] * lut[wr[i]];
            plugin_store(host, j->y, j->t, r * n + c, acc * j->sx[r] * j->sw[c]);
        }
    }
}

static kiln_status fp8_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                               const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc, void *const *out,
                               int32_t n_out, void *workspace, void *stream)
{
    const fp8_params *p = &((const fp8mm *)self)->p;
    const kiln_dims *xd = &in_desc[0].dims;
    if ((n_in != 3 && n_in != 4) || xd->rank < 1 || xd->d[xd->rank - 1] != p->k ||
        plugin_desc_count(&in_desc[1]) != (int64_t)p->n * p->k || plugin_desc_count(&in_desc[2]) != p->n)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x's last dim must be k = %d, w [%d, %d], w_scale [%d]", p->k, p->n,
                          p->k, p->n);
    const kiln_dtype xt = in_desc[0].dtype, yt = out_desc[0].dtype;
    const int64_t rows = plugin_desc_count(&in_desc[0]) / p->k;
    if (n_in == 4 && plugin_desc_count(&in_desc[3]) != rows)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x has %lld rows but x_scale %lld values", (long long)rows,
                          (long long)plugin_desc_count(&in_desc[3]));
    if (rows == 0)
        return KILN_OK;
    if (!workspace)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": no workspace for the quantized activations");
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        const size_t ws = kiln_fp8_workspace(rows, p->n, p->k);
        int e = n_in == 4 ? kiln_fp8_matmul_q8_cuda(in[0], in[3], in[1], in[2], out[0], (int32_t)yt, rows, p->n, p->k,
                                                    workspace, ws, stream)
                          : kiln_fp8_matmul_cuda(in[0], in[1], in[2], out[0], (int32_t)xt, rows, p->n, p->k, p->x_amax,
                                                 workspace, ws, stream);
        return e ? host->fail(KILN_ERROR_BACKEND, NAME ": %s", kiln_fp8_cuda_error(e)) : KILN_OK;
    }
#endif
    const uint8_t *xq = in[0];
    const float *sx = n_in == 4 ? in[3] : NULL;
    if (n_in == 3) {
        /* the workspace starts with the quantized rows, then their scales */
        uint8_t *q = workspace;
        float *s = (float *)((char *)workspace + kiln_fp8_workspace_scales(rows, p->k));
        float *row = malloc((size_t)p->k * sizeof *row);
        if (!row)
            return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < p->k; i++)
                row[i] = plugin_load(host, in[0], xt, r * p->k + i);
            s[r] = kiln_fp8_quantize_row(row, p->k, p->x_amax, q + r * p->k);
        }
        free(row);
        xq = q, sx = s;
    }
    fp8_job job = {p, rows, xq, in[1], sx, in[2], out[0], yt};
    host->parallel_for(stream, p->n, fp8_range, &job);
    return KILN_OK;
}

static kiln_status fp8_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    return plugin_pod_serialize(host, NAME, &((const fp8mm *)self)->p, sizeof(fp8_params), buf, size);
}

static kiln_status fp8_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(fp8mm), out);
}

static void fp8_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops fp8_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
    .num_outputs = fp8_num_outputs,
    .output_shapes = fp8_output_shapes,
    .output_dtypes = fp8_output_dtypes,
    .supports = fp8_supports,
    .workspace_size = fp8_workspace_size,
    .enqueue = fp8_enqueue,
    .serialize = fp8_serialize,
    .clone = fp8_clone,
    .destroy = fp8_destroy,
};

static kiln_status fp8_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    const kiln_field *of = plugin_field(f, n, "output_dtype");
    const char *want = of ? of->data : "input";
    fp8_params p = {plugin_field_i32(f, n, "n", 0), plugin_field_i32(f, n, "k", 0),
                    plugin_float_dtype_named(want, "input"), plugin_field_f32(f, n, "x_amax", 0.0f)};
    if (p.output_dtype == -2)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": field \"output_dtype\" is \"%s\"; expected input, f32, f16 or bf16", want);
    return fp8_new(&p, out);
}

static kiln_status fp8_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                   kiln_plugin **out)
{
    /* v1: n and k; y in x's dtype; v2 adds it, v3 x_amax */
    static const size_t sizes[BLOB_VERSION] = {offsetof(fp8_params, output_dtype), offsetof(fp8_params, x_amax),
                                               sizeof(fp8_params)};
    fp8_params p = {0, 0, -1, 0.0f};
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, sizes, version, blob, size, &p);
    return s != KILN_OK ? s : fp8_new(&p, out);
}

static const float zero_f32 = 0.0f;

static const kiln_field_spec fp8_fields[] = {
    PLUGIN_FIELD_REQUIRED("n", KILN_FIELD_I32, "output features (rows of w)"),
    PLUGIN_FIELD_REQUIRED("k", KILN_FIELD_I32, "input features, a multiple of 16"),
    PLUGIN_FIELD_OPTIONAL("output_dtype", KILN_FIELD_STRING, "input",
                          "dtype of y: input (x's), f32, f16 or bf16; required when x is E4M3 codes"),
    PLUGIN_FIELD_OPTIONAL("x_amax", KILN_FIELD_F32, &zero_f32,
                          "a static max |x| for every row (from calibration; 0: each row's own)"),
};

static const kiln_plugin_creator fp8_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = fp8_fields,
    .n_fields = sizeof fp8_fields / sizeof fp8_fields[0],
    .blob_version = BLOB_VERSION,
    .create = fp8_create,
    .deserialize = fp8_deserialize,
    .description = "x · Wᵀ in FP8 E4M3: W per-channel scaled, x quantized per token at run time, f32 sums",
};

kiln_status kiln_fp8_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &fp8_creator);
}
