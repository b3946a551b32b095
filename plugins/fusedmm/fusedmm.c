/* FusedMatMul (kiln/FusedMatMul/1): a linear layer with the elementwise
 * work around it folded in, so that at decode (a few rows, where a matmul
 * is one pass over W) the whole of it is one kernel and its intermediate
 * tensors never reach memory:
 *
 *   prologue (norm = 1):  x ← RMSNorm(x) with norm_weight and epsilon, as
 *                         kiln/RMSNorm computes and rounds it with y in
 *                         w's dtype;
 *   product:              p = x · Wᵀ, summed in f32, rounded to w's dtype
 *                         (what a separate matmul would store);
 *   epilogue "none":      y = p; with output_dtype f32 the sums are
 *                         stored unrounded (an LLM's logits);
 *            "residual":  y = residual + p, added in f32 and rounded to
 *                         the residual's dtype (the residual add of a
 *                         decoder layer: the O and down projections write
 *                         the updated residual stream, f32 in a bf16 or
 *                         f16 engine);
 *            "swiglu":    rows of W interleave the gate and up projections
 *                         (row 2i is gate_i, row 2i + 1 is up_i) and
 *                         y[:, i] = SwiGLU(p[:, 2i], p[:, 2i + 1]) as
 *                         kiln/SwiGLU computes it;
 *            "rope":      y = kiln/RoPE of p, a packed qkv row (RoPE's
 *                         fields, n_kv_heads > 0 or not), with W's rows
 *                         stored so that each rotated pair is adjacent:
 *                         in every rotated head, W rows 2j and 2j + 1 are
 *                         the head's output dims j and j + rotary_dim / 2
 *                         (interleaved = 0; with interleaved = 1 they are
 *                         2j and 2j + 1 already); y is in the usual order.
 *
 * With weights = fp8, W is E4M3 codes with an f32 scale per output
 * channel (kiln/Fp8MatMul's W) and the product is Fp8MatMul's: each row of
 * the (normalized) x, rounded to the dtype t as above, is quantized with
 * its own scale (kiln_fp8_quantize_row; with x_amax > 0 every row with
 * the static max x_amax, values beyond saturating: a calibrated build)
 * and p = (Σ xq · wq) · sx · sw,
 * summed in f32 and rounded to t; the epilogues are as above. t is then
 * norm_weight's dtype, or x's without the norm. An FP8 decoder layer so
 * computes what the unfused one (RMSNorm or SwiGLU with quantize = fp8,
 * Fp8MatMul, RoPE, the residual add in the next AddRMSNorm) computes.
 *
 * So the result is that of RMSNorm, MatMul, then SwiGLU or an add, up to
 * the order of the f32 sums. This CPU code is the reference (a plain
 * column-parallel loop, not a fast CPU path: CPU engines are built
 * unfused); the CUDA kernels (fusedmm_cuda.cu) run one GEMV for 1, 2, 4
 * or 8 rows and the unfused kernels with cuBLASLt's GEMM otherwise.
 *
 * Inputs:  x [..., k]; w [n, k]; w_scale f32 [n] with weights = fp8 (w
 *          then u8 codes); norm_weight [k] when norm = 1;
 *          residual [..., n] with the residual epilogue, positions i32
 *          [tokens] with rope. w f32, f16 or bf16 and norm_weight of
 *          w's dtype; x of w's dtype, or f32 with norm = 1 (the f32
 *          residual stream of a bf16 engine); the residual of w's dtype
 *          or f32.
 * Output:  y [..., n] ([..., n / 2] with swiglu): the residual's dtype
 *          with the residual epilogue, f32 with output_dtype f32, else
 *          w's.
 * Fields:  n, k (i32, required); norm (i32, default 0); epsilon (f32,
 *          required > 0 with norm); epilogue (string: none, residual,
 *          swiglu, rope; default none; swiglu needs n even); with rope,
 *          kiln/RoPE's fields (n = (n_heads + 2 n_kv_heads) head_dim);
 *          output_dtype (string: default, or f32 with epilogue none);
 *          weights (string: dtype, the default, or fp8; k a multiple of
 *          16 with fp8); x_amax (f32, default 0: per row; fp8 only).
 * Blob v4: n, k, norm, epilogue (i32), epsilon (f32), kiln/RoPE's blob
 *          (rope/rope_params.h; zeros without rope), y's dtype (i32; -1:
 *          the default), weights (i32: 0 dtype, 1 fp8), x_amax (f32). v3
 *          lacks the last (per row), v2 also weights (dtype), v1 also y's
 *          dtype (the default y).
 * Workspace: kiln_fusedmm_workspace (plugin_cuda.h). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "core/fp8.h"
#include "plugin_cuda.h"
#include "plugin_util.h"
#include "rope/rope_params.h"

#define NAME "FusedMatMul"
#define BLOB_VERSION 4u

typedef struct fusedmm_params {
    int32_t n, k, norm, epilogue;
    float epsilon;
    rope_params rope;
    int32_t output_dtype; /* KILN_DTYPE_F32 (epilogue none), or -1: the default */
    int32_t fp8;          /* 1: w is E4M3 codes with per-channel scales (weights = fp8) */
    float x_amax;         /* fp8: a static max |x| for every row (0: each row's own) */
} fusedmm_params;

typedef struct fusedmm {
    kiln_plugin base;
    fusedmm_params p;
    float inv_freq[ROPE_MAX_PAIRS]; /* the rope epilogue's, derived from p */
} fusedmm;

static const kiln_host_api *host;
static const kiln_plugin_ops fusedmm_ops;

static kiln_status fusedmm_new(const fusedmm_params *p, kiln_plugin **out)
{
    if (p->n <= 0 || p->k <= 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": n = %d and k = %d must be positive", p->n, p->k);
    if ((p->norm != 0 && p->norm != 1) || (p->norm && !(p->epsilon > 0.0f && isfinite(p->epsilon))))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": field \"norm\" is %d (0 or 1) and \"epsilon\" %g (a positive number with norm)",
                          p->norm, (double)p->epsilon);
    if (p->epilogue < KILN_FUSEDMM_NONE || p->epilogue > KILN_FUSEDMM_ROPE ||
        (p->epilogue == KILN_FUSEDMM_SWIGLU && p->n % 2))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": epilogue %d with n = %d (swiglu needs n even)",
                          p->epilogue, p->n);
    if (p->output_dtype != -1 && (p->output_dtype != KILN_DTYPE_F32 || p->epilogue != KILN_FUSEDMM_NONE))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": output dtype %d with epilogue %d (only an f32 y, with epilogue none)",
                          p->output_dtype, p->epilogue);
    /* k <= 2^30: the CUDA GEMV keeps its k offsets in 32 bits */
    if ((p->fp8 != 0 && p->fp8 != 1) || (p->fp8 && (p->k % 16 != 0 || p->k > (1 << 30))))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": weights fp8 (%d) needs k = %d a multiple of 16 and at most 2^30", p->fp8, p->k);
    if (!(p->x_amax >= 0.0f) || !isfinite(p->x_amax) || (p->x_amax > 0.0f && !p->fp8))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": field \"x_amax\" must be a finite number >= 0, and 0 without weights = fp8 (got %g)",
                          (double)p->x_amax);
    if (p->epilogue == KILN_FUSEDMM_ROPE) {
        kiln_status st = rope_params_check(host, NAME, &p->rope);
        if (st != KILN_OK)
            return st;
        if ((int64_t)p->n != (p->rope.n_heads + 2 * (int64_t)p->rope.n_kv_heads) * p->rope.head_dim)
            return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                              NAME ": n = %d is not (n_heads %d + 2 * n_kv_heads %d) * head_dim %d", p->n,
                              p->rope.n_heads, p->rope.n_kv_heads, p->rope.head_dim);
    }
    fusedmm *f = calloc(1, sizeof *f);
    if (!f)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    f->base.struct_size = sizeof f->base;
    f->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    f->base.ops = &fusedmm_ops;
    f->p = *p;
    if (p->epilogue == KILN_FUSEDMM_ROPE)
        rope_params_frequencies(&p->rope, f->inv_freq);
    *out = &f->base;
    return KILN_OK;
}

static int32_t fusedmm_num_outputs(const kiln_plugin *self) { return 1; }

/* x, w, then w_scale (fp8), then norm_weight (norm), then residual or
 * positions (rope) */
static int32_t fusedmm_n_inputs(const fusedmm_params *p)
{
    return 2 + p->fp8 + p->norm + (p->epilogue == KILN_FUSEDMM_RESIDUAL || p->epilogue == KILN_FUSEDMM_ROPE);
}

/* Where norm_weight is among the inputs (with norm = 1). */
static int32_t fusedmm_norm_at(const fusedmm_params *p) { return 2 + p->fp8; }

/* The product's dtype t: w's, or with E4M3 weights norm_weight's (x's
 * without the norm). */
static kiln_dtype fusedmm_t(const fusedmm_params *p, const kiln_dtype *in)
{
    return !p->fp8 ? in[1] : p->norm ? in[fusedmm_norm_at(p)] : in[0];
}

static int64_t fusedmm_width(const fusedmm_params *p) { return p->epilogue == KILN_FUSEDMM_SWIGLU ? p->n / 2 : p->n; }

static kiln_status fusedmm_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                         kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    const fusedmm_params *p = &((const fusedmm *)self)->p;
    const int32_t na = fusedmm_norm_at(p);
    if (n_in != fusedmm_n_inputs(p) || in[0].rank < 1 || in[1].rank != 2 || (p->fp8 && in[2].rank != 1) ||
        (p->norm && in[na].rank != 1))
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects x [..., K], w [N, K]%s%s%s", p->fp8 ? ", w_scale [N]" : "",
                          p->norm ? ", norm_weight [K]" : "",
                          p->epilogue == KILN_FUSEDMM_RESIDUAL ? ", residual [..., N]" : "");
    int64_t v;
    if (host->expr_is_constant(eb, in[0].d[in[0].rank - 1], &v) && v != p->k)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x has %lld columns, k is %d", (long long)v, p->k);
    if ((host->expr_is_constant(eb, in[1].d[0], &v) && v != p->n) ||
        (host->expr_is_constant(eb, in[1].d[1], &v) && v != p->k) ||
        (p->fp8 && host->expr_is_constant(eb, in[2].d[0], &v) && v != p->n) ||
        (p->norm && host->expr_is_constant(eb, in[na].d[0], &v) && v != p->k))
        return host->fail(KILN_ERROR_SHAPE, NAME ": w must be [%d, %d]%s%s", p->n, p->k, p->fp8 ? ", w_scale [n]" : "",
                          p->norm ? " and norm_weight [k]" : "");
    if (p->epilogue == KILN_FUSEDMM_RESIDUAL) {
        const kiln_shape_expr *r = &in[n_in - 1];
        if (r->rank != in[0].rank || (host->expr_is_constant(eb, r->d[r->rank - 1], &v) && v != p->n))
            return host->fail(KILN_ERROR_SHAPE, NAME ": residual must be [..., %d] of x's rank", p->n);
    }
    if (p->epilogue == KILN_FUSEDMM_ROPE && in[n_in - 1].rank != 1)
        return host->fail(KILN_ERROR_SHAPE, NAME ": positions must be [tokens]");
    out[0] = in[0];
    out[0].d[in[0].rank - 1] = host->expr_constant(eb, fusedmm_width(p));
    return KILN_OK;
}

static kiln_status fusedmm_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                         int32_t n_out)
{
    const fusedmm_params *p = &((const fusedmm *)self)->p;
    out[0] = p->epilogue == KILN_FUSEDMM_RESIDUAL ? in[n_in - 1]
             : p->output_dtype >= 0               ? (kiln_dtype)p->output_dtype
                                                  : fusedmm_t(p, in);
    return KILN_OK;
}

static int32_t fusedmm_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                                int32_t n_out)
{
    const fusedmm_params *p = &((const fusedmm *)self)->p;
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    /* asked when an engine is built and loaded: cuBLASLt is set up here,
     * never inside a captured step; without a GPU the setup fails and
     * enqueue reports it when a GEMM is needed */
    if (backend == KILN_BACKEND_CUDA) {
        (void)kiln_fusedmm_cuda_init();
        if (p->fp8)
            (void)kiln_fp8_cuda_init(); /* the prefill path's FP8 GEMM */
        backend_ok = 1;
    }
#endif
    if (!backend_ok || n_in != fusedmm_n_inputs(p) || n_out != 1)
        return 0;
    kiln_dtype dt[8];
    for (int32_t i = 0; i < 8; i++)
        dt[i] = i < n_in ? d[i].dtype : KILN_DTYPE_F32;
    const kiln_dtype t = fusedmm_t(p, dt), y = d[n_in].dtype;
    if (!plugin_is_float(t) || (p->fp8 && (d[1].dtype != KILN_DTYPE_U8 || d[2].dtype != KILN_DTYPE_F32)) ||
        (!p->fp8 && d[1].dtype != t))
        return 0;
    if (d[0].dtype != t && !(p->norm && d[0].dtype == KILN_DTYPE_F32))
        return 0;
    if (p->norm && d[fusedmm_norm_at(p)].dtype != t)
        return 0;
    if (p->epilogue == KILN_FUSEDMM_ROPE && d[n_in - 1].dtype != KILN_DTYPE_I32)
        return 0;
    if (p->epilogue == KILN_FUSEDMM_RESIDUAL)
        return (y == t || y == KILN_DTYPE_F32) && d[n_in - 1].dtype == y;
    return y == (p->output_dtype >= 0 ? (kiln_dtype)p->output_dtype : t);
}

static size_t fusedmm_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                                     const kiln_tensor_desc *out, int32_t n_out)
{
    const fusedmm_params *p = &((const fusedmm *)self)->p;
    const int64_t rows = plugin_desc_count(&in[0]) / p->k;
    if (p->fp8)
        return kiln_fusedmm_fp8_workspace(rows, p->n, p->k,
                                          plugin_float_size(in[p->norm ? fusedmm_norm_at(p) : 0].dtype));
    return kiln_fusedmm_workspace(rows, p->n, p->k, plugin_float_size(in[1].dtype));
}

typedef struct fusedmm_job {
    const fusedmm *f;
    const fusedmm_params *p;
    int64_t rows;
    const float *xf;     /* [rows, k]: x, normalized with the prologue */
    const void *w, *res; /* res: the residual, or the positions (rope) */
    void *y;
    kiln_dtype t, yt; /* w's, y's (and the residual's) */
    kiln_dtype pt;    /* the product's: t, or f32 for an f32 y without epilogue */
    /* E4M3 weights: xf holds the E4M3 values of x's rows, sx their
     * scales, sw W's; lut every code's value */
    const float *sx, *sw;
    float lut[256];
} fusedmm_job;

/* The product of row r of xf with row c of w, rounded to pt (with E4M3
 * weights times the two scales first, as kiln/Fp8MatMul). */
static float fusedmm_dot(const fusedmm_job *j, int64_t r, int64_t c)
{
    const int64_t k = j->p->k;
    const float *xr = j->xf + r * k;
    float acc = 0.0f;
    if (j->p->fp8) {
        const uint8_t *wr = (const uint8_t *)j->w + c * k;
        for (int64_t i = 0; i < k; i++)
            acc += xr[i] * j->lut[wr[i]];
        return plugin_round(host, j->pt, acc * j->sx[r] * j->sw[c]);
    }
    for (int64_t i = 0; i < k; i++)
        acc += xr[i] * plugin_load(host, j->w, j->t, c * k + i);
    return plugin_round(host, j->pt, acc);
}

/* W rows 2q and 2q + 1 for every row, rotated as kiln/RoPE rotates and
 * stored where the packed row keeps them. */
static void fusedmm_rope_pair(const fusedmm_job *j, int64_t q)
{
    const rope_params *rp = &j->p->rope;
    const int64_t n = j->p->n, o = 2 * q % rp->head_dim, h = 2 * q / rp->head_dim;
    const int rotated = h < rp->n_heads + (int64_t)rp->n_kv_heads && o < rp->rotary_dim;
    const int32_t half = rp->rotary_dim / 2, i = (int32_t)(o / 2);
    const int64_t a = rotated ? h * rp->head_dim + (rp->interleaved ? 2 * i : i) : 2 * q;
    const int64_t b = rotated ? h * rp->head_dim + (rp->interleaved ? 2 * i + 1 : i + half) : 2 * q + 1;
    const kiln_dtype t = j->t;
    for (int64_t r = 0; r < j->rows; r++) {
        float x0 = fusedmm_dot(j, r, 2 * q), x1 = fusedmm_dot(j, r, 2 * q + 1), y0 = x0, y1 = x1;
        if (rotated) {
            float angle = (float)((const int32_t *)j->res)[r] * j->f->inv_freq[i];
            float c = plugin_round(host, t, cosf(angle)), s = plugin_round(host, t, sinf(angle));
            y0 = plugin_round(host, t, x0 * c) - plugin_round(host, t, x1 * s);
            y1 = plugin_round(host, t, x1 * c) + plugin_round(host, t, x0 * s);
        }
        plugin_store(host, j->y, t, r * n + a, y0);
        plugin_store(host, j->y, t, r * n + b, y1);
    }
}

/* Output columns [begin, end) for every row (pairs of W rows with rope). */
static void fusedmm_range(void *arg, int64_t begin, int64_t end)
{
    const fusedmm_job *j = arg;
    const int64_t width = fusedmm_width(j->p);
    if (j->p->epilogue == KILN_FUSEDMM_ROPE) {
        for (int64_t q = begin; q < end; q++)
            fusedmm_rope_pair(j, q);
        return;
    }
    for (int64_t c = begin; c < end; c++)
        for (int64_t r = 0; r < j->rows; r++) {
            float v;
            if (j->p->epilogue == KILN_FUSEDMM_SWIGLU) {
                /* kiln/SwiGLU's arithmetic */
                float g = fusedmm_dot(j, r, 2 * c), u = fusedmm_dot(j, r, 2 * c + 1);
                v = plugin_round(host, j->t, g / (1.0f + expf(-g))) * u;
            } else {
                v = fusedmm_dot(j, r, c);
                if (j->p->epilogue == KILN_FUSEDMM_RESIDUAL)
                    v += plugin_load(host, j->res, j->yt, r * width + c);
            }
            plugin_store(host, j->y, j->yt, r * width + c, v);
        }
}

static kiln_status fusedmm_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                   const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc,
                                   void *const *out, int32_t n_out, void *workspace, void *stream)
{
    const fusedmm_params *p = &((const fusedmm *)self)->p;
    const kiln_dims *xd = &in_desc[0].dims;
    int64_t rows = xd->rank >= 1 && xd->d[xd->rank - 1] == p->k ? plugin_desc_count(&in_desc[0]) / p->k : -1;
    const int32_t na = fusedmm_norm_at(p);
    if (n_in != fusedmm_n_inputs(p) || rows < 0 || plugin_desc_count(&in_desc[1]) != (int64_t)p->n * p->k ||
        (p->fp8 && plugin_desc_count(&in_desc[2]) != p->n) || (p->norm && plugin_desc_count(&in_desc[na]) != p->k) ||
        (p->epilogue == KILN_FUSEDMM_RESIDUAL && plugin_desc_count(&in_desc[n_in - 1]) != rows * p->n) ||
        (p->epilogue == KILN_FUSEDMM_ROPE && plugin_desc_count(&in_desc[n_in - 1]) != rows) ||
        plugin_desc_count(&out_desc[0]) != rows * fusedmm_width(p))
        return host->fail(KILN_ERROR_SHAPE,
                          NAME ": x's last dim must be k = %d, w [%d, %d]%s; residual, positions and y of x's rows",
                          p->k, p->n, p->k, p->fp8 ? ", w_scale [n]" : "");
    kiln_dtype dt[8];
    for (int32_t i = 0; i < 8; i++)
        dt[i] = i < n_in ? in_desc[i].dtype : KILN_DTYPE_F32;
    const kiln_dtype xt = in_desc[0].dtype, t = fusedmm_t(p, dt), yt = out_desc[0].dtype;
    const void *nw = p->norm ? in[na] : NULL, *res = n_in > na + p->norm ? in[n_in - 1] : NULL;
    const float *sw = p->fp8 ? in[2] : NULL;
    if (rows == 0)
        return KILN_OK;
    if (!workspace)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": no workspace");
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        kiln_fusedmm_cuda_args a;
        memset(&a, 0, sizeof a);
        a.x = in[0], a.w = in[1], a.w_scale = sw, a.norm_weight = nw, a.y = out[0];
        if (p->epilogue == KILN_FUSEDMM_ROPE) {
            const fusedmm *f = (const fusedmm *)self;
            a.positions = res;
            a.rope.rotated_heads = p->rope.n_heads + p->rope.n_kv_heads, a.rope.head_dim = p->rope.head_dim;
            a.rope.rotary_dim = p->rope.rotary_dim, a.rope.interleaved = p->rope.interleaved;
            memcpy(a.rope.inv_freq, f->inv_freq, sizeof(float) * (size_t)(p->rope.rotary_dim / 2));
        } else {
            a.residual = res;
        }
        a.workspace = workspace;
        a.workspace_size = p->fp8 ? kiln_fusedmm_fp8_workspace(rows, p->n, p->k, plugin_float_size(t))
                                  : kiln_fusedmm_workspace(rows, p->n, p->k, plugin_float_size(t));
        a.rows = rows, a.n = p->n, a.k = p->k, a.epilogue = p->epilogue, a.dtype = (int32_t)t;
        a.x_dtype = (int32_t)xt, a.y_dtype = (int32_t)yt;
        a.epsilon = p->epsilon;
        a.x_amax = p->x_amax;
        int e = kiln_fusedmm_cuda(&a, stream);
        return e ? host->fail(KILN_ERROR_BACKEND, NAME ": %s", kiln_fusedmm_cuda_error(e)) : KILN_OK;
    }
#endif
    /* x as f32 rows in the workspace, normalized as kiln/RMSNorm does:
     * the normalized value rounded to x's dtype, times the weight, rounded
     * to w's */
    float *xf = workspace;
    for (int64_t r = 0; r < rows; r++) {
        float *xr = xf + r * p->k, inv = 1.0f;
        for (int64_t i = 0; i < p->k; i++)
            xr[i] = plugin_load(host, in[0], xt, r * p->k + i);
        if (!nw)
            continue;
        float part[8] = {0};
        plugin_sum_squares_add(part, 0, xr, p->k);
        inv = 1.0f / sqrtf(plugin_sum_squares_total(part) / (float)p->k + p->epsilon);
        for (int64_t i = 0; i < p->k; i++)
            xr[i] = plugin_round(host, t, plugin_round(host, xt, xr[i] * inv) * plugin_load(host, nw, t, i));
    }
    fusedmm_job job = {.f = (const fusedmm *)self,
                       .p = p,
                       .rows = rows,
                       .xf = xf,
                       .w = in[1],
                       .res = res,
                       .y = out[0],
                       .t = t,
                       .yt = yt,
                       .pt = p->output_dtype >= 0 ? yt : t};
    if (p->fp8) {
        /* each row of x (as the norm rounds it to t, or as given) as
         * kiln/Fp8MatMul quantizes it: its E4M3 values, exact in f32, in
         * place, and its scale */
        const size_t es = plugin_float_size(t);
        uint8_t *q = (uint8_t *)workspace + kiln_fusedmm_fp8_workspace_codes(rows, p->n, p->k, es);
        float *sx = (float *)((char *)workspace + kiln_fusedmm_fp8_workspace_scales(rows, p->n, p->k, es));
        for (int c = 0; c < 256; c++)
            job.lut[c] = kiln_e4m3_to_f32((uint8_t)c);
        for (int64_t r = 0; r < rows; r++) {
            float *xr = xf + r * p->k;
            sx[r] = kiln_fp8_quantize_row(xr, p->k, p->x_amax, q + r * p->k);
            for (int64_t i = 0; i < p->k; i++)
                xr[i] = job.lut[q[r * p->k + i]];
        }
        job.sx = sx, job.sw = sw;
    }
    host->parallel_for(stream, p->epilogue == KILN_FUSEDMM_ROPE ? p->n / 2 : fusedmm_width(p), fusedmm_range, &job);
    return KILN_OK;
}

static kiln_status fusedmm_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    return plugin_pod_serialize(host, NAME, &((const fusedmm *)self)->p, sizeof(fusedmm_params), buf, size);
}

static kiln_status fusedmm_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(fusedmm), out);
}

static void fusedmm_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops fusedmm_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
    .num_outputs = fusedmm_num_outputs,
    .output_shapes = fusedmm_output_shapes,
    .output_dtypes = fusedmm_output_dtypes,
    .supports = fusedmm_supports,
    .workspace_size = fusedmm_workspace_size,
    .enqueue = fusedmm_enqueue,
    .serialize = fusedmm_serialize,
    .clone = fusedmm_clone,
    .destroy = fusedmm_destroy,
};

static kiln_status fusedmm_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    fusedmm_params p;
    memset(&p, 0, sizeof p);
    p.n = plugin_field_i32(f, n, "n", 0), p.k = plugin_field_i32(f, n, "k", 0);
    p.norm = plugin_field_i32(f, n, "norm", 0), p.epsilon = plugin_field_f32(f, n, "epsilon", 0.0f);
    const kiln_field *e = plugin_field(f, n, "epilogue");
    const char *kind = e ? e->data : "none";
    if (strcmp(kind, "swiglu") == 0)
        p.epilogue = KILN_FUSEDMM_SWIGLU;
    else if (strcmp(kind, "residual") == 0)
        p.epilogue = KILN_FUSEDMM_RESIDUAL;
    else if (strcmp(kind, "rope") == 0)
        p.epilogue = KILN_FUSEDMM_ROPE;
    else if (strcmp(kind, "none") != 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": field \"epilogue\" is \"%s\"; expected none, residual, swiglu or rope", kind);
    if (p.epilogue == KILN_FUSEDMM_ROPE) {
        kiln_status st = rope_params_read(host, NAME, f, n, &p.rope);
        if (st != KILN_OK)
            return st;
    }
    const kiln_field *od = plugin_field(f, n, "output_dtype");
    const char *want = od ? od->data : "default";
    if (strcmp(want, "f32") == 0)
        p.output_dtype = KILN_DTYPE_F32;
    else if (strcmp(want, "default") == 0)
        p.output_dtype = -1;
    else
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": field \"output_dtype\" is \"%s\"; expected default or f32", want);
    const kiln_field *wf = plugin_field(f, n, "weights");
    const char *wk = wf ? wf->data : "dtype";
    if (strcmp(wk, "fp8") == 0)
        p.fp8 = 1;
    else if (strcmp(wk, "dtype") != 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": field \"weights\" is \"%s\"; expected dtype or fp8", wk);
    p.x_amax = plugin_field_f32(f, n, "x_amax", 0.0f);
    return fusedmm_new(&p, out);
}

static kiln_status fusedmm_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                       kiln_plugin **out)
{
    /* v1: without output_dtype, v2 without fp8, v3 without x_amax */
    static const size_t sizes[BLOB_VERSION] = {offsetof(fusedmm_params, output_dtype), offsetof(fusedmm_params, fp8),
                                               offsetof(fusedmm_params, x_amax), sizeof(fusedmm_params)};
    fusedmm_params p;
    memset(&p, 0, sizeof p);
    p.output_dtype = -1;
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, sizes, version, blob, size, &p);
    if (s != KILN_OK)
        return s;
    return fusedmm_new(&p, out);
}

static const int32_t zero_i32 = 0, default_max_position = 8192;
static const float zero_f32 = 0.0f, one_f32 = 1.0f, four_f32 = 4.0f;

static const kiln_field_spec fusedmm_fields[] = {
    PLUGIN_FIELD_REQUIRED("n", KILN_FIELD_I32, "output features (rows of w)"),
    PLUGIN_FIELD_REQUIRED("k", KILN_FIELD_I32, "input features"),
    PLUGIN_FIELD_OPTIONAL("norm", KILN_FIELD_I32, &zero_i32, "1: RMSNorm x with norm_weight first"),
    PLUGIN_FIELD_OPTIONAL("epsilon", KILN_FIELD_F32, &zero_f32, "the RMSNorm's epsilon (with norm)"),
    PLUGIN_FIELD_OPTIONAL("epilogue", KILN_FIELD_STRING, "none",
                          "none, residual (y = residual + x·Wᵀ), swiglu (w rows interleaved gate, up) or rope"),
    /* the rope epilogue: kiln/RoPE's fields */
    PLUGIN_FIELD_OPTIONAL("n_heads", KILN_FIELD_I32, &zero_i32, "rope: heads in the row"),
    PLUGIN_FIELD_OPTIONAL("n_kv_heads", KILN_FIELD_I32, &zero_i32, "rope: > 0, a packed qkv row"),
    PLUGIN_FIELD_OPTIONAL("head_dim", KILN_FIELD_I32, &zero_i32, "rope: dims per head"),
    PLUGIN_FIELD_OPTIONAL("theta", KILN_FIELD_F32, &zero_f32, "rope: base of the frequencies"),
    PLUGIN_FIELD_OPTIONAL("rotary_dim", KILN_FIELD_I32, &zero_i32, "rope: dims rotated per head; 0 = head_dim"),
    PLUGIN_FIELD_OPTIONAL("interleaved", KILN_FIELD_I32, &zero_i32, "rope: 1 adjacent pairs, 0 halves"),
    PLUGIN_FIELD_OPTIONAL("scaling", KILN_FIELD_STRING, "none", "rope: none, linear or llama3"),
    PLUGIN_FIELD_OPTIONAL("factor", KILN_FIELD_F32, &one_f32, "rope: scaling factor"),
    PLUGIN_FIELD_OPTIONAL("low_freq_factor", KILN_FIELD_F32, &one_f32, "rope: llama3 low frequency factor"),
    PLUGIN_FIELD_OPTIONAL("high_freq_factor", KILN_FIELD_F32, &four_f32, "rope: llama3 high frequency factor"),
    PLUGIN_FIELD_OPTIONAL("original_max_position", KILN_FIELD_I32, &default_max_position,
                          "rope: llama3 original context length"),
    PLUGIN_FIELD_OPTIONAL("output_dtype", KILN_FIELD_STRING, "default",
                          "dtype of y: default (the residual's, else w's) or f32 (epilogue none: unrounded sums)"),
    PLUGIN_FIELD_OPTIONAL("weights", KILN_FIELD_STRING, "dtype",
                          "dtype (w of the product's dtype) or fp8 (w E4M3 codes, then w_scale f32 [n]; W8A8)"),
    PLUGIN_FIELD_OPTIONAL("x_amax", KILN_FIELD_F32, &zero_f32,
                          "weights fp8: a static max |x| for every row (from calibration; 0: each row's own)"),
};

static const kiln_plugin_creator fusedmm_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = fusedmm_fields,
    .n_fields = sizeof fusedmm_fields / sizeof fusedmm_fields[0],
    .blob_version = BLOB_VERSION,
    .create = fusedmm_create,
    .deserialize = fusedmm_deserialize,
    .description = "x·Wᵀ (W in the dtype or FP8 E4M3) with an RMSNorm prologue and a residual-add, SwiGLU or RoPE "
                   "epilogue folded in",
};

kiln_status kiln_fusedmm_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &fusedmm_creator);
}
