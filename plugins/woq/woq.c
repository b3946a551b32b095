/* WeightOnlyMatMul (kiln/WeightOnlyMatMul/1): y = x · Wᵀ with W in 8 or 4
 * bits and x, y in f32, f16 or bf16, so a decode step reads 1 or about 0.5
 * bytes per weight instead of 2. The weights are integers with a scale
 * per group of `group_size` consecutive values of a row (a row is one
 * output feature); the CPU dequantizes each weight to f32 and multiplies
 * it with x in f32, which is the reference of the CUDA kernels
 * (woq_cuda.cu).
 *
 *   bits 8: symmetric, w = s · q, q an int8 (the byte as two's complement);
 *           per output channel when group_size = k (kiln build --weights int8).
 *   bits 4: asymmetric, w = s · (q − z), q and z in 0..15; byte j of a row
 *           holds value 2j in its low nibble and 2j + 1 in its high one
 *           (kiln build --weights int4, groups of 128; AWQ and GPTQ
 *           checkpoints are unpacked into this layout at import).
 *
 * Inputs:  x: f32, f16 or bf16, [..., K].
 *          q: u8, [N, K · bits / 8].
 *          scales: f32, [N, K / group_size].
 *          zeros (bits 4 only): u8, [N, K / group_size].
 * Output:  y: dtype of x, [..., N]; with f16/bf16 the products are still
 *          accumulated in f32 and y rounded once, as a bf16 linear layer does.
 * Fields:  bits (i32): 8 or 4; group_size (i32): a multiple of 32 that
 *          divides k; n, k (i32), k a multiple of 32.
 * Blob v1: four int32: bits, group_size, n, k.
 * Workspace: on the CPU, f32 copies of up to 16 rows of f16/bf16 x and y;
 * on CUDA past the GEMVs' rows, a dequantized slice of W and cuBLASLt's
 * scratch (kiln_woq_cuda_workspace, plugin_cuda.h). */
#include <stdint.h>

#include "plugin_cuda.h"
#include "plugin_util.h"

#define NAME "WeightOnlyMatMul"
#define BLOB_VERSION 1u

typedef struct woq_params {
    int32_t bits, group, n, k;
} woq_params;

typedef struct woq {
    kiln_plugin base;
    woq_params p;
} woq;

static const kiln_host_api *host;
static const kiln_plugin_ops woq_ops;

static kiln_status woq_new(const woq_params *p, kiln_plugin **out)
{
    if (p->bits != 8 && p->bits != 4)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": bits %d is not 8 or 4", p->bits);
    if (p->n <= 0 || p->k <= 0 || p->k % 32 != 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": n = %d and k = %d must be positive, k a multiple of 32",
                          p->n, p->k);
    if (p->group <= 0 || p->group % 32 != 0 || p->k % p->group != 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": group_size %d must be a positive multiple of 32 that divides k = %d", p->group, p->k);
    woq *w = calloc(1, sizeof *w);
    if (!w)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    w->base.struct_size = sizeof w->base;
    w->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    w->base.ops = &woq_ops;
    w->p = *p;
    *out = &w->base;
    return KILN_OK;
}

static int32_t woq_n_inputs(const woq_params *p) { return p->bits == 4 ? 4 : 3; }

static int32_t woq_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status woq_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                     kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    const woq_params *p = &((const woq *)self)->p;
    if (n_in != woq_n_inputs(p) || in[0].rank < 1)
        return host->fail(KILN_ERROR_SHAPE, NAME ": %d bits expects x [..., K], q, scales%s", p->bits,
                          p->bits == 4 ? " and zeros" : "");
    const int64_t want[3][2] = {{p->n, (int64_t)p->k * p->bits / 8}, {p->n, p->k / p->group}, {p->n, p->k / p->group}};
    const char *names[3] = {"q", "scales", "zeros"};
    int64_t v;
    if (host->expr_is_constant(eb, in[0].d[in[0].rank - 1], &v) && v != p->k)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x has %lld columns, k is %d", (long long)v, p->k);
    for (int32_t i = 1; i < n_in; i++) {
        if (in[i].rank != 2)
            return host->fail(KILN_ERROR_SHAPE, NAME ": %s must have rank 2", names[i - 1]);
        for (int d = 0; d < 2; d++)
            if (host->expr_is_constant(eb, in[i].d[d], &v) && v != want[i - 1][d])
                return host->fail(KILN_ERROR_SHAPE, NAME ": %s dim %d is %lld, expected %lld", names[i - 1], d,
                                  (long long)v, (long long)want[i - 1][d]);
    }
    out[0] = in[0];
    out[0].d[in[0].rank - 1] = host->expr_constant(eb, p->n);
    return KILN_OK;
}

static kiln_status woq_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                     int32_t n_out)
{
    out[0] = in[0];
    return KILN_OK;
}

static int32_t woq_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                            int32_t n_out)
{
    const woq_params *p = &((const woq *)self)->p;
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    /* asked when an engine is built and loaded: the prefill GEMM's cuBLASLt
     * handle and the decode GEMVs' launch set-up are made here, never
     * inside a captured step (without a GPU the setup fails and an
     * enqueue reports it) */
    if (backend == KILN_BACKEND_CUDA) {
        (void)kiln_fusedmm_cuda_init();
        (void)kiln_woq_cuda_init();
        backend_ok = 1;
    }
#endif
    return backend_ok && n_in == woq_n_inputs(p) && n_out == 1 && plugin_is_float(d[0].dtype) &&
           d[1].dtype == KILN_DTYPE_U8 && d[2].dtype == KILN_DTYPE_F32 &&
           (p->bits == 8 || d[3].dtype == KILN_DTYPE_U8) && d[n_in].dtype == d[0].dtype;
}

/* f16/bf16 on the CPU: x and y go through f32 copies of this many rows at
 * a time, a small workspace whatever the token count. */
#define WOQ_HALF_ROWS 16
/* Weights of a row dequantized at a time and shared by every row of x. */
#define WOQ_CHUNK 256

/* The CPU's f32 copies (f16/bf16 x) or, where CUDA is built in, the
 * GPU's dequantized slice of W and cuBLASLt's scratch when the rows pass
 * the GEMVs (kiln_woq_cuda_workspace): the larger, as the size cannot
 * depend on the backend. */
static size_t woq_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                                 const kiln_tensor_desc *out, int32_t n_out)
{
    const woq_params *p = &((const woq *)self)->p;
    int64_t rows = plugin_desc_count(&in[0]) / p->k;
    size_t cpu = in[0].dtype == KILN_DTYPE_F32 ? 0
                                               : (size_t)(rows < WOQ_HALF_ROWS ? rows : WOQ_HALF_ROWS) *
                                                     ((size_t)p->k + (size_t)p->n) * sizeof(float);
#ifdef KILN_HAVE_CUDA
    size_t gpu = kiln_woq_cuda_workspace(p->bits, p->group, rows, p->n, p->k, plugin_float_size(in[0].dtype));
    return gpu > cpu ? gpu : cpu;
#else
    return cpu;
#endif
}

/* Weights [k0, k0 + len) of row c as f32: s · q or s · (q − z), one
 * multiply of exact integers (what the CUDA kernels compute up to the
 * order of the sums). k0 and len are multiples of 32, so a run never
 * splits a byte. */
static void woq_dequant(const woq_params *p, const uint8_t *q, const float *scales, const uint8_t *zeros, int64_t c,
                        int64_t k0, int64_t len, float *w)
{
    const int64_t ng = p->k / p->group;
    const float *s = scales + c * ng;
    /* runs of 32 share one group */
    if (p->bits == 8) {
        const int8_t *r = (const int8_t *)q + c * p->k + k0;
        for (int64_t i0 = 0; i0 < len; i0 += 32) {
            float sg = s[(k0 + i0) / p->group];
            for (int64_t i = i0; i < i0 + 32; i++)
                w[i] = sg * (float)r[i];
        }
        return;
    }
    const uint8_t *r = q + c * (p->k / 2) + k0 / 2, *z = zeros + c * ng;
    for (int64_t i0 = 0; i0 < len; i0 += 32) {
        int64_t g = (k0 + i0) / p->group;
        float sg = s[g];
        int32_t zg = z[g];
        for (int64_t i = i0; i < i0 + 32; i += 2) {
            uint8_t b = r[i / 2];
            w[i] = sg * (float)((b & 0x0F) - zg);
            w[i + 1] = sg * (float)((b >> 4) - zg);
        }
    }
}

typedef struct woq_job {
    const woq_params *p;
    int64_t rows;
    const float *x;
    const uint8_t *q, *zeros;
    const float *scales;
    float *y;
} woq_job;

/* Output columns [begin, end): each chunk of a weight row is dequantized
 * once and every row of x passes over it while it is in L1. */
static void woq_range(void *arg, int64_t begin, int64_t end)
{
    const woq_job *j = arg;
    const woq_params *p = j->p;
    float w[WOQ_CHUNK];
    for (int64_t c = begin; c < end; c++) {
        for (int64_t r = 0; r < j->rows; r++)
            j->y[r * p->n + c] = 0;
        for (int64_t k0 = 0; k0 < p->k; k0 += WOQ_CHUNK) {
            int64_t len = p->k - k0 < WOQ_CHUNK ? p->k - k0 : WOQ_CHUNK;
            woq_dequant(p, j->q, j->scales, j->zeros, c, k0, len, w);
            for (int64_t r = 0; r < j->rows; r++) {
                const float *xr = j->x + r * p->k + k0;
                float acc = 0;
                for (int64_t i = 0; i < len; i++)
                    acc += w[i] * xr[i];
                j->y[r * p->n + c] += acc;
            }
        }
    }
}

static kiln_status woq_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                               const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc, void *const *out,
                               int32_t n_out, void *workspace, void *stream)
{
    const woq_params *p = &((const woq *)self)->p;
    const kiln_dims *xd = &in_desc[0].dims;
    if (n_in != woq_n_inputs(p) || xd->rank < 1 || xd->d[xd->rank - 1] != p->k ||
        plugin_desc_count(&in_desc[1]) != (int64_t)p->n * p->k * p->bits / 8 ||
        plugin_desc_count(&in_desc[2]) != (int64_t)p->n * (p->k / p->group) ||
        (p->bits == 4 && plugin_desc_count(&in_desc[3]) != (int64_t)p->n * (p->k / p->group)))
        return host->fail(KILN_ERROR_SHAPE, NAME ": x's last dim must be k = %d and q, scales, zeros hold n = %d rows",
                          p->k, p->n);
    kiln_dtype t = in_desc[0].dtype;
    int64_t rows = plugin_desc_count(&in_desc[0]) / p->k;
    const uint8_t *zeros = p->bits == 4 ? in[3] : NULL;
    if (rows == 0)
        return KILN_OK;
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        size_t ws = kiln_woq_cuda_workspace(p->bits, p->group, rows, p->n, p->k, plugin_float_size(t));
        int e = kiln_woq_matmul_cuda(p->bits, p->group, in[0], in[1], in[2], zeros, out[0], (int32_t)t, rows, p->n,
                                     p->k, workspace, ws, stream);
        return e ? host->fail(KILN_ERROR_BACKEND, NAME ": %s", kiln_woq_cuda_error(e)) : KILN_OK;
    }
#endif
    woq_job job = {p, rows, in[0], in[1], zeros, in[2], out[0]};
    if (t == KILN_DTYPE_F32) {
        host->parallel_for(stream, p->n, woq_range, &job);
        return KILN_OK;
    }
    if (!workspace)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": no workspace for the f32 copies of x and y");
    float *xf = workspace;
    for (int64_t r0 = 0; r0 < rows; r0 += WOQ_HALF_ROWS) {
        int64_t nr = rows - r0 < WOQ_HALF_ROWS ? rows - r0 : WOQ_HALF_ROWS;
        for (int64_t i = 0; i < nr * p->k; i++)
            xf[i] = plugin_load(host, in[0], t, r0 * p->k + i);
        job.rows = nr, job.x = xf, job.y = xf + nr * p->k;
        host->parallel_for(stream, p->n, woq_range, &job);
        for (int64_t i = 0; i < nr * p->n; i++)
            plugin_store(host, out[0], t, r0 * p->n + i, job.y[i]);
    }
    return KILN_OK;
}

static kiln_status woq_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    return plugin_pod_serialize(host, NAME, &((const woq *)self)->p, sizeof(woq_params), buf, size);
}

static kiln_status woq_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(woq), out);
}

static void woq_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops woq_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
    .num_outputs = woq_num_outputs,
    .output_shapes = woq_output_shapes,
    .output_dtypes = woq_output_dtypes,
    .supports = woq_supports,
    .workspace_size = woq_workspace_size,
    .enqueue = woq_enqueue,
    .serialize = woq_serialize,
    .clone = woq_clone,
    .destroy = woq_destroy,
};

static kiln_status woq_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    woq_params p = {plugin_field_i32(f, n, "bits", 0), plugin_field_i32(f, n, "group_size", 0),
                    plugin_field_i32(f, n, "n", 0), plugin_field_i32(f, n, "k", 0)};
    return woq_new(&p, out);
}

static kiln_status woq_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                   kiln_plugin **out)
{
    kiln_status s = plugin_pod_check_blob(host, NAME, BLOB_VERSION, version, size, sizeof(woq_params));
    if (s != KILN_OK)
        return s;
    woq_params p;
    memcpy(&p, blob, sizeof p);
    return woq_new(&p, out);
}

static const kiln_field_spec woq_fields[] = {
    PLUGIN_FIELD_REQUIRED("bits", KILN_FIELD_I32, "8 (symmetric int8) or 4 (asymmetric, with zero points)"),
    PLUGIN_FIELD_REQUIRED("group_size", KILN_FIELD_I32, "weights per scale along k: a multiple of 32 dividing k"),
    PLUGIN_FIELD_REQUIRED("n", KILN_FIELD_I32, "output features (rows of w)"),
    PLUGIN_FIELD_REQUIRED("k", KILN_FIELD_I32, "input features, a multiple of 32"),
};

static const kiln_plugin_creator woq_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = woq_fields,
    .n_fields = sizeof woq_fields / sizeof woq_fields[0],
    .blob_version = BLOB_VERSION,
    .create = woq_create,
    .deserialize = woq_deserialize,
    .description = "x · Wᵀ with W in int8 (per-group scales) or int4 (scales and zero points), dequantized on the fly",
};

kiln_status kiln_woq_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &woq_creator);
}
