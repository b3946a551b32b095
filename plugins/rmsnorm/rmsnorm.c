/* RMSNorm (kiln/RMSNorm/1): y = x / sqrt(mean(x^2) + epsilon) * weight over
 * the last axis, computed in f32 as Hugging Face's LlamaRMSNorm does (the
 * normalized value is rounded to the input dtype before the weight
 * multiply).
 *
 * Inputs:  x [..., H] (f32/f16/bf16), weight [H] (f32/f16/bf16).
 * Output:  y, shape of x, dtype output_dtype (default x's). The
 *          normalized value is rounded to x's dtype (HF rounds it to the
 *          input dtype), the product with the weight to y's: an f32 x
 *          (the residual stream of a bf16 or f16 LLM engine, docs/llm.md)
 *          with a bf16 y is rounded once, at the store.
 * Fields:  epsilon (f32, required); output_dtype (string: input, f32,
 *          f16 or bf16; default input, x's dtype); quantize (string:
 *          none or fp8; default none); x_amax (f32, default 0).
 * With quantize = fp8, y (its values rounded to output_dtype as above) is
 * not stored: its rows leave as kiln/Fp8MatMul's pre-quantized x, two
 * outputs in its place, the E4M3 codes (u8, y's shape) and a scale a row
 * (f32, y's shape with a last dim of 1), quantized as Fp8MatMul quantizes
 * an x (kiln_fp8_quantize_row). The FP8 engine's norms feed its matmuls
 * so, and its quantization costs no pass over y of its own. x_amax > 0
 * is a static scale (from a calibration text): every row is quantized as
 * if its max |y| were x_amax, values beyond it saturating.
 * Blob v4: epsilon as f32, then y's dtype as i32 (-1: x's), then quantize
 *          as i32 (0 none, 1 fp8), then x_amax as f32. v3 lacks x_amax
 *          (dynamic); v2 also quantize (none); v1 (epsilon
 *          alone, engines built before output_dtype) reads as y in x's
 *          dtype.
 *
 * AddRMSNorm (kiln/AddRMSNorm/1): the residual add fused with the norm
 * that follows it, so the sum is read once instead of written and read
 * again: sum = x + residual, added in f32 and rounded to x's dtype (as
 * the separate add stores it), y = RMSNorm(sum). The residual may be of
 * another float dtype than x: a bf16 engine keeps its residual stream x
 * in f32 and adds each layer's bf16 output into it.
 *
 * Inputs:  x, residual [..., H] (same shape; float dtypes), weight [H].
 * Outputs: sum (shape and dtype of x), y (shape of x, dtype output_dtype;
 *          with quantize = fp8 its codes and scales).
 * Fields and blob: as RMSNorm.
 *
 * The CUDA kernels (rmsnorm_cuda.cu) follow the same arithmetic.
 */
#include <math.h>
#include <stdlib.h>

#include "core/fp8.h"

#include "plugin_util.h"
#include "plugin_cuda.h"

#define NAME "RMSNorm"
#define ADD_NAME "AddRMSNorm"
#define BLOB_VERSION 4u

static const kiln_host_api *host;

typedef struct rmsnorm {
    kiln_plugin base;
    struct {
        float epsilon;
        int32_t output_dtype; /* kiln_dtype of y; -1: x's */
        int32_t quantize;     /* 1: y as E4M3 codes and row scales */
        float x_amax;         /* quantize: a static max |y| (0: each row's own) */
    } p;
    int32_t add; /* AddRMSNorm: inputs x, residual, weight; outputs sum, y */
} rmsnorm;

static const kiln_plugin_ops rmsnorm_ops;

static kiln_status rmsnorm_new(float epsilon, int32_t output_dtype, int32_t quantize, float x_amax, int32_t add,
                               kiln_plugin **out)
{
    if (!(epsilon > 0.0f) || !isfinite(epsilon))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: field \"epsilon\" must be a positive number, got %g",
                          add ? ADD_NAME : NAME, (double)epsilon);
    if (output_dtype != -1 && !plugin_is_float((kiln_dtype)output_dtype))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: output dtype %d is not f32, f16 or bf16",
                          add ? ADD_NAME : NAME, output_dtype);
    if (quantize != 0 && quantize != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: quantize %d is not 0 (none) or 1 (fp8)",
                          add ? ADD_NAME : NAME, quantize);
    if (!(x_amax >= 0.0f) || !isfinite(x_amax) || (x_amax > 0.0f && !quantize))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          "%s: field \"x_amax\" must be a finite number >= 0, and 0 without quantize = fp8 (got %g)",
                          add ? ADD_NAME : NAME, (double)x_amax);
    rmsnorm *r = calloc(1, sizeof *r);
    if (!r)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    r->base.struct_size = sizeof r->base;
    r->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    r->base.ops = &rmsnorm_ops;
    r->p.epsilon = epsilon;
    r->p.output_dtype = output_dtype;
    r->p.quantize = quantize;
    r->p.x_amax = x_amax;
    r->add = add;
    *out = &r->base;
    return KILN_OK;
}

static int32_t rmsnorm_num_outputs(const kiln_plugin *self)
{
    const rmsnorm *r = (const rmsnorm *)self;
    return 1 + r->add + r->p.quantize;
}

static kiln_status rmsnorm_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                         kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    int32_t add = ((const rmsnorm *)self)->add;
    if (n_in != 2 + add || in[0].rank < 1 || in[1 + add].rank != 1 || (add && in[1].rank != in[0].rank))
        return host->fail(KILN_ERROR_SHAPE, add ? ADD_NAME
                                                ": expects inputs x [..., H], residual [..., H] and weight [H]"
                                                : NAME ": expects inputs x [..., H] and weight [H]");
    int64_t h, w;
    if (host->expr_is_constant(eb, in[0].d[in[0].rank - 1], &h) && host->expr_is_constant(eb, in[1 + add].d[0], &w) &&
        h != w)
        return host->fail(KILN_ERROR_SHAPE, "%s: x has %lld features but weight has %lld", add ? ADD_NAME : NAME,
                          (long long)h, (long long)w);
    for (int32_t i = 0; add && i < in[0].rank; i++) {
        int64_t a, b;
        if (host->expr_is_constant(eb, in[0].d[i], &a) && host->expr_is_constant(eb, in[1].d[i], &b) && a != b)
            return host->fail(KILN_ERROR_SHAPE, ADD_NAME ": x and residual differ in dim %d (%lld vs %lld)", i,
                              (long long)a, (long long)b);
    }
    out[0] = in[0];
    out[add] = in[0];
    if (((const rmsnorm *)self)->p.quantize) {
        out[add + 1] = in[0];
        out[add + 1].d[in[0].rank - 1] = host->expr_constant(eb, 1);
    }
    return KILN_OK;
}

/* The dtype of y for an x of dtype xt. */
static kiln_dtype rmsnorm_y_dtype(const rmsnorm *r, kiln_dtype xt)
{
    return r->p.output_dtype < 0 ? xt : (kiln_dtype)r->p.output_dtype;
}

static kiln_status rmsnorm_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                         int32_t n_out)
{
    const rmsnorm *r = (const rmsnorm *)self;
    out[0] = in[0];
    out[r->add] = r->p.quantize ? KILN_DTYPE_U8 : rmsnorm_y_dtype(r, in[0]);
    if (r->p.quantize)
        out[r->add + 1] = KILN_DTYPE_F32;
    return KILN_OK;
}

static int32_t rmsnorm_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                                int32_t n_out)
{
    const rmsnorm *r = (const rmsnorm *)self;
    int32_t add = r->add;
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    backend_ok = backend_ok || backend == KILN_BACKEND_CUDA;
#endif
    if (!backend_ok || n_in != 2 + add || n_out != 1 + add + r->p.quantize)
        return 0;
    for (int32_t i = 0; i < n_in; i++)
        if (!plugin_is_float(d[i].dtype))
            return 0;
    /* inputs x, [residual,] weight; outputs [sum,] y */
    if (r->p.quantize)
        return (!add || d[n_in].dtype == d[0].dtype) && plugin_is_float(rmsnorm_y_dtype(r, d[0].dtype)) &&
               d[n_in + add].dtype == KILN_DTYPE_U8 && d[n_in + add + 1].dtype == KILN_DTYPE_F32;
    return (!add || d[n_in].dtype == d[0].dtype) && d[n_in + add].dtype == rmsnorm_y_dtype(r, d[0].dtype);
}

typedef struct rmsnorm_job {
    const rmsnorm *r;
    kiln_dtype xt, rt, wt, yt; /* x and sum, residual, weight, y */
    const void *x, *res, *w;   /* res: NULL without the add */
    void *sum, *y;             /* y: E4M3 codes with quantize */
    float *y_scale;            /* quantize: a scale a row */
    int64_t h;
    int failed; /* quantize: no memory for a row's values */
} rmsnorm_job;

static void rmsnorm_rows(void *arg, int64_t begin, int64_t end)
{
    const rmsnorm_job *j = arg;
    kiln_dtype xt = j->xt, rt = j->rt, wt = j->wt, yt = j->yt;
    /* with the add, the rounded sum is stored first and every later read
     * takes it from there, exactly as a separate add then RMSNorm would */
    const void *src = j->res ? j->sum : j->x;
    const int all_f32 =
        xt == KILN_DTYPE_F32 && (!j->res || rt == KILN_DTYPE_F32) && wt == KILN_DTYPE_F32 && yt == KILN_DTYPE_F32;
    /* quantize: a row of y's values (rounded to y's dtype), then its codes */
    float *yrow = NULL;
    if (j->y_scale && !(yrow = malloc((size_t)j->h * sizeof *yrow))) {
        ((rmsnorm_job *)arg)->failed = 1;
        return;
    }
    for (int64_t row = begin; row < end; row++) {
        int64_t base = row * j->h;
        float part[8] = {0}, buf[64];
        if (all_f32) {
            /* the same arithmetic without a conversion per element: one
             * decode step runs two of these per layer */
            const float *x = (const float *)j->x + base, *w = j->w;
            float *s = j->res ? (float *)j->sum + base : NULL, *y = yrow ? yrow : (float *)j->y + base;
            if (s) {
                const float *r = (const float *)j->res + base;
                for (int64_t i = 0; i < j->h; i++)
                    s[i] = x[i] + r[i];
                x = s;
            }
            plugin_sum_squares_add(part, 0, x, j->h);
            float inv = 1.0f / sqrtf(plugin_sum_squares_total(part) / (float)j->h + j->r->p.epsilon);
            for (int64_t i = 0; i < j->h; i++)
                y[i] = x[i] * inv * w[i];
            if (yrow)
                j->y_scale[row] = kiln_fp8_quantize_row(yrow, j->h, j->r->p.x_amax, (uint8_t *)j->y + base);
            continue;
        }
        for (int64_t i0 = 0; i0 < j->h; i0 += 64) {
            int64_t n = j->h - i0 < 64 ? j->h - i0 : 64;
            for (int64_t i = 0; i < n; i++) {
                if (j->res)
                    plugin_store(host, j->sum, xt, base + i0 + i,
                                 plugin_load(host, j->x, xt, base + i0 + i) +
                                     plugin_load(host, j->res, rt, base + i0 + i));
                buf[i] = plugin_load(host, src, xt, base + i0 + i);
            }
            plugin_sum_squares_add(part, i0, buf, n);
        }
        float inv = 1.0f / sqrtf(plugin_sum_squares_total(part) / (float)j->h + j->r->p.epsilon);
        for (int64_t i = 0; i < j->h; i++) {
            /* Round the normalized value to x's dtype first, as HF does. */
            float n = plugin_load(host, src, xt, base + i) * inv;
            n = plugin_round(host, xt, n);
            if (yrow)
                yrow[i] = plugin_round(host, yt, n * plugin_load(host, j->w, wt, i));
            else
                plugin_store(host, j->y, yt, base + i, n * plugin_load(host, j->w, wt, i));
        }
        if (yrow)
            j->y_scale[row] = kiln_fp8_quantize_row(yrow, j->h, j->r->p.x_amax, (uint8_t *)j->y + base);
    }
    free(yrow);
}

static kiln_status rmsnorm_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                   const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc,
                                   void *const *out, int32_t n_out, void *workspace, void *stream)
{
    const rmsnorm *r = (const rmsnorm *)self;
    int32_t add = r->add;
    const kiln_tensor_desc *x = &in_desc[0], *w = &in_desc[1 + add];
    int64_t h = x->dims.d[x->dims.rank - 1];
    if (w->dims.d[0] != h)
        return host->fail(KILN_ERROR_SHAPE, "%s: x has %lld features but weight has %lld", add ? ADD_NAME : NAME,
                          (long long)h, (long long)w->dims.d[0]);
    int64_t rows = h ? plugin_desc_count(x) / h : 0;
    if (add && plugin_desc_count(&in_desc[1]) != rows * h)
        return host->fail(KILN_ERROR_SHAPE, ADD_NAME ": x has %lld elements but residual has %lld",
                          (long long)(rows * h), (long long)plugin_desc_count(&in_desc[1]));
    const int32_t q = r->p.quantize;
    const kiln_dtype yt = rmsnorm_y_dtype(r, x->dtype);
    if (q && h && !workspace)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: no workspace for y before its quantization",
                          add ? ADD_NAME : NAME);
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        /* with quantize, y itself goes to the workspace only where the
         * kernel cannot quantize it in registers */
        int e = kiln_rmsnorm_cuda(in[0], add ? in[1] : NULL, in[1 + add], add ? out[0] : NULL, q ? workspace : out[add],
                                  x->dtype, in_desc[add].dtype, yt, w->dtype, rows, h, r->p.epsilon,
                                  q ? out[add] : NULL, q ? out[add + 1] : NULL, r->p.x_amax, stream);
        return e ? host->fail(KILN_ERROR_BACKEND, "%s: kernel launch failed (cuda error %d)", add ? ADD_NAME : NAME, e)
                 : KILN_OK;
    }
#endif
    rmsnorm_job job = {r,
                       x->dtype,
                       in_desc[add].dtype,
                       w->dtype,
                       yt,
                       in[0],
                       add ? in[1] : NULL,
                       in[1 + add],
                       add ? out[0] : NULL,
                       out[add],
                       q ? out[add + 1] : NULL,
                       h,
                       0};
    host->parallel_for(stream, rows, rmsnorm_rows, &job);
    return job.failed ? host->fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", add ? ADD_NAME : NAME) : KILN_OK;
}

/* With quantize on CUDA: y in its dtype, where the kernel that cannot
 * quantize in registers (rows past 8,192 values) stores it first. */
static size_t rmsnorm_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                                     const kiln_tensor_desc *out, int32_t n_out)
{
    const rmsnorm *r = (const rmsnorm *)self;
    return r->p.quantize ? (size_t)plugin_desc_count(&in[0]) * plugin_float_size(rmsnorm_y_dtype(r, in[0].dtype)) : 0;
}

static kiln_status rmsnorm_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const rmsnorm *r = (const rmsnorm *)self;
    return plugin_pod_serialize(host, NAME, &r->p, sizeof r->p, buf, size);
}

static kiln_status rmsnorm_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(rmsnorm), out);
}

static void rmsnorm_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops rmsnorm_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
    .num_outputs = rmsnorm_num_outputs,
    .output_shapes = rmsnorm_output_shapes,
    .output_dtypes = rmsnorm_output_dtypes,
    .supports = rmsnorm_supports,
    .workspace_size = rmsnorm_workspace_size,
    .enqueue = rmsnorm_enqueue,
    .serialize = rmsnorm_serialize,
    .clone = rmsnorm_clone,
    .destroy = rmsnorm_destroy,
};

/* user_data of the AddRMSNorm creator is non-NULL. */
static kiln_status rmsnorm_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    const kiln_field *of = plugin_field(f, n, "output_dtype"), *qf = plugin_field(f, n, "quantize");
    const char *want = of ? of->data : "input", *qw = qf ? qf->data : "none";
    const int32_t dtype = plugin_float_dtype_named(want, "input"), q = plugin_quantize_named(qw);
    if (dtype == -2)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          "%s: field \"output_dtype\" is \"%s\"; expected input, f32, f16 or bf16", c->name, want);
    if (q < 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: field \"quantize\" is \"%s\"; expected none or fp8",
                          c->name, qw);
    const float amax = plugin_field_f32(f, n, "x_amax", 0.0f);
    return rmsnorm_new(plugin_field_f32(f, n, "epsilon", 0.0f), dtype, q, amax, c->user_data != NULL, out);
}

static kiln_status rmsnorm_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                       kiln_plugin **out)
{
    /* v1 holds epsilon alone: y in x's dtype; v2 adds y's dtype */
    static const size_t sizes[BLOB_VERSION] = {sizeof(float), sizeof(float) + sizeof(int32_t),
                                               sizeof(float) + 2 * sizeof(int32_t),
                                               2 * sizeof(float) + 2 * sizeof(int32_t)};
    struct {
        float epsilon;
        int32_t output_dtype, quantize;
        float x_amax;
    } p = {0.0f, -1, 0, 0.0f};
    kiln_status s = plugin_pod_read_blob(host, c->name, BLOB_VERSION, sizes, version, blob, size, &p);
    if (s != KILN_OK)
        return s;
    return rmsnorm_new(p.epsilon, p.output_dtype, p.quantize, p.x_amax, c->user_data != NULL, out);
}

static const float zero_f32 = 0.0f;

static const kiln_field_spec rmsnorm_fields[] = {
    PLUGIN_FIELD_REQUIRED("epsilon", KILN_FIELD_F32, "added to the mean square before the square root"),
    PLUGIN_FIELD_OPTIONAL("output_dtype", KILN_FIELD_STRING, "input", "dtype of y: input (x's), f32, f16 or bf16"),
    PLUGIN_FIELD_OPTIONAL("quantize", KILN_FIELD_STRING, "none",
                          "none, or fp8: y as E4M3 codes and a scale a row (kiln/Fp8MatMul's x)"),
    PLUGIN_FIELD_OPTIONAL("x_amax", KILN_FIELD_F32, &zero_f32,
                          "quantize: a static max |y| for every row (from calibration; 0: each row's own)"),
};

static const kiln_plugin_creator rmsnorm_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = rmsnorm_fields,
    .n_fields = sizeof rmsnorm_fields / sizeof rmsnorm_fields[0],
    .blob_version = BLOB_VERSION,
    .create = rmsnorm_create,
    .deserialize = rmsnorm_deserialize,
    .description = "root-mean-square normalization over the last axis, times a weight",
};

static const kiln_plugin_creator add_rmsnorm_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = ADD_NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = rmsnorm_fields,
    .n_fields = sizeof rmsnorm_fields / sizeof rmsnorm_fields[0],
    .blob_version = BLOB_VERSION,
    .create = rmsnorm_create,
    .deserialize = rmsnorm_deserialize,
    .description = "residual add fused with the RMSNorm after it: outputs the sum and its norm",
    .user_data = (void *)&add_rmsnorm_creator,
};

kiln_status kiln_rmsnorm_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    kiln_status s = h->register_creator(reg, &rmsnorm_creator);
    return s != KILN_OK ? s : h->register_creator(reg, &add_rmsnorm_creator);
}
