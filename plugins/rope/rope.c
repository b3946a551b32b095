/* Rotary position embedding (kiln/RoPE/1), applied in place of a copy:
 * y = x rotated by angle position * inv_freq[i] in each pair of dims.
 *
 * Frequencies and angles are computed in f32 whatever the storage dtype
 * (rounding inv_freq to bf16 was measured to move logits by 3%); as in
 * Hugging Face, cos and sin are then rounded to the storage dtype.
 *
 * Inputs:  x [..., n_heads * head_dim] (f32/f16/bf16), one row per token;
 *          positions i32 [tokens].
 * Output:  y, shape and dtype of x.
 * Fields:  n_heads, head_dim (i32, required); theta (f32, required);
 *          rotary_dim (i32, default 0 = head_dim: partial rotary rotates
 *          only the first rotary_dim dims of each head);
 *          interleaved (i32, default 0: pairs (i, i + rotary_dim/2) as in
 *          HF's rotate_half; 1: adjacent pairs (2i, 2i+1) as in GGML);
 *          scaling (string: "none", "linear" or "llama3"), factor,
 *          low_freq_factor, high_freq_factor (f32), original_max_position
 *          (i32) — Llama 3.1 style frequency scaling;
 *          n_kv_heads (i32, default 0): > 0 means x is the packed row of a
 *          fused QKV matmul, [..., (n_heads + 2 * n_kv_heads) * head_dim]:
 *          the n_heads q heads and the n_kv_heads k heads are rotated, the
 *          v heads copied through.
 * Blob v2: the fields above as 4-byte values (scaling as 0/1/2) in the
 * order of rope_params; v1 (without n_kv_heads) is still read.
 *
 * The CUDA kernel (rope_cuda.cu) follows the same arithmetic.
 */
#include <math.h>

#include <stddef.h>

#include "plugin_cuda.h"
#include "plugin_util.h"
#include "rope/rope_params.h"

#define NAME "RoPE"
#define BLOB_VERSION 2u

static const kiln_host_api *host;

/* Blob bytes of each schema version (v1 lacks n_kv_heads). */
static const size_t blob_sizes[BLOB_VERSION] = {offsetof(rope_params, n_kv_heads), sizeof(rope_params)};

typedef struct rope {
    kiln_plugin base;
    rope_params p;
    float inv_freq[ROPE_MAX_PAIRS]; /* derived from p */
} rope;

static const kiln_plugin_ops rope_ops;

static kiln_status rope_new(const rope_params *p, kiln_plugin **out)
{
    kiln_status st = rope_params_check(host, NAME, p);
    if (st != KILN_OK)
        return st;
    rope *r = calloc(1, sizeof *r);
    if (!r)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    r->base.struct_size = sizeof r->base;
    r->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    r->base.ops = &rope_ops;
    r->p = *p;
    rope_params_frequencies(&r->p, r->inv_freq);
    *out = &r->base;
    return KILN_OK;
}

static int32_t rope_num_outputs(const kiln_plugin *self) { return 1; }

/* Heads in one row of x, and how many of them (the first) are rotated. */
static int64_t rope_row_heads(const rope_params *p) { return p->n_heads + 2 * (int64_t)p->n_kv_heads; }
static int64_t rope_rotated_heads(const rope_params *p) { return p->n_heads + (int64_t)p->n_kv_heads; }

static kiln_status rope_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                      kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    const rope *r = (const rope *)self;
    int64_t last;
    if (n_in != 2 || in[0].rank < 1 || in[1].rank != 1)
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects x [..., n_heads*head_dim] and positions [tokens]");
    int64_t width = rope_row_heads(&r->p) * r->p.head_dim;
    if (host->expr_is_constant(eb, in[0].d[in[0].rank - 1], &last) && last != width)
        return host->fail(KILN_ERROR_SHAPE,
                          NAME ": last dim of x is %lld, expected (n_heads + 2*n_kv_heads)*head_dim = %lld",
                          (long long)last, (long long)width);
    out[0] = in[0];
    return KILN_OK;
}

static kiln_status rope_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                      int32_t n_out)
{
    out[0] = in[0];
    return KILN_OK;
}

static int32_t rope_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                             int32_t n_out)
{
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    backend_ok = backend_ok || backend == KILN_BACKEND_CUDA;
#endif
    return backend_ok && n_in == 2 && n_out == 1 && plugin_is_float(d[0].dtype) && d[1].dtype == KILN_DTYPE_I32 &&
           d[2].dtype == d[0].dtype;
}

typedef struct rope_job {
    const rope *r;
    kiln_dtype t;
    const void *x;
    const int32_t *pos;
    void *y;
} rope_job;

static void rope_tokens(void *arg, int64_t begin, int64_t end)
{
    const rope_job *j = arg;
    const rope_params *p = &j->r->p;
    int32_t half = p->rotary_dim / 2;
    int64_t width = rope_row_heads(p) * p->head_dim, rotated = rope_rotated_heads(p);
    for (int64_t tok = begin; tok < end; tok++) {
        float pos = (float)j->pos[tok];
        for (int32_t i = 0; i < half; i++) {
            float angle = pos * j->r->inv_freq[i];
            float c = plugin_round(host, j->t, cosf(angle)), s = plugin_round(host, j->t, sinf(angle));
            for (int64_t h = 0; h < rotated; h++) {
                int64_t base = tok * width + (int64_t)h * p->head_dim;
                int64_t a = base + (p->interleaved ? 2 * i : i), b = base + (p->interleaved ? 2 * i + 1 : i + half);
                float x0 = plugin_load(host, j->x, j->t, a), x1 = plugin_load(host, j->x, j->t, b);
                float y0 = plugin_round(host, j->t, x0 * c) - plugin_round(host, j->t, x1 * s);
                float y1 = plugin_round(host, j->t, x1 * c) + plugin_round(host, j->t, x0 * s);
                plugin_store(host, j->y, j->t, a, y0);
                plugin_store(host, j->y, j->t, b, y1);
            }
        }
        /* Dims past rotary_dim, and the v heads of a packed row, pass
         * through unchanged. */
        if (j->x != j->y)
            for (int64_t h = 0; h < rope_row_heads(p); h++)
                for (int32_t d = h < rotated ? p->rotary_dim : 0; d < p->head_dim; d++) {
                    int64_t k = tok * width + h * p->head_dim + d;
                    plugin_store(host, j->y, j->t, k, plugin_load(host, j->x, j->t, k));
                }
    }
}

static kiln_status rope_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc, void *const *out,
                                int32_t n_out, void *workspace, void *stream)
{
    const rope *r = (const rope *)self;
    int64_t width = rope_row_heads(&r->p) * r->p.head_dim;
    int64_t tokens = plugin_desc_count(&in_desc[0]) / width;
    if (in_desc[0].dims.d[in_desc[0].dims.rank - 1] != width || in_desc[1].dims.d[0] != tokens)
        return host->fail(KILN_ERROR_SHAPE,
                          NAME
                          ": x holds %lld tokens of width %lld but positions has %lld entries (width %lld expected)",
                          (long long)tokens, (long long)in_desc[0].dims.d[in_desc[0].dims.rank - 1],
                          (long long)in_desc[1].dims.d[0], (long long)width);
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        kiln_rope_cuda_args a;
        memset(&a, 0, sizeof a);
        a.x = in[0], a.pos = in[1], a.y = out[0], a.dtype = (int32_t)in_desc[0].dtype, a.tokens = tokens;
        a.row_heads = (int32_t)rope_row_heads(&r->p), a.rotated_heads = (int32_t)rope_rotated_heads(&r->p);
        a.head_dim = r->p.head_dim, a.rotary_dim = r->p.rotary_dim, a.interleaved = r->p.interleaved;
        memcpy(a.inv_freq, r->inv_freq, sizeof(float) * (size_t)(r->p.rotary_dim / 2));
        int e = kiln_rope_cuda(&a, stream);
        return e ? host->fail(KILN_ERROR_BACKEND, NAME ": kernel launch failed (cuda error %d)", e) : KILN_OK;
    }
#endif
    rope_job job = {r, in_desc[0].dtype, in[0], in[1], out[0]};
    host->parallel_for(stream, tokens, rope_tokens, &job);
    return KILN_OK;
}

static kiln_status rope_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const rope *r = (const rope *)self;
    return plugin_pod_serialize(host, NAME, &r->p, sizeof r->p, buf, size);
}

static kiln_status rope_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(rope), out);
}

static void rope_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops rope_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
    .num_outputs = rope_num_outputs,
    .output_shapes = rope_output_shapes,
    .output_dtypes = rope_output_dtypes,
    .supports = rope_supports,
    .enqueue = rope_enqueue,
    .serialize = rope_serialize,
    .clone = rope_clone,
    .destroy = rope_destroy,
};

static kiln_status rope_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    rope_params p;
    kiln_status st = rope_params_read(host, NAME, f, n, &p);
    if (st != KILN_OK)
        return st;
    return rope_new(&p, out);
}

static kiln_status rope_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                    kiln_plugin **out)
{
    rope_params p = {0};
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, blob_sizes, version, blob, size, &p);
    if (s != KILN_OK)
        return s;
    return rope_new(&p, out);
}

static const int32_t zero_i32 = 0, default_max_position = 8192;
static const float one_f32 = 1.0f, four_f32 = 4.0f;

static const kiln_field_spec rope_fields[] = {
    PLUGIN_FIELD_REQUIRED("n_heads", KILN_FIELD_I32, "heads in x"),
    PLUGIN_FIELD_REQUIRED("head_dim", KILN_FIELD_I32, "dims per head"),
    PLUGIN_FIELD_REQUIRED("theta", KILN_FIELD_F32, "base of the frequencies (rope_theta)"),
    PLUGIN_FIELD_OPTIONAL("rotary_dim", KILN_FIELD_I32, &zero_i32, "dims rotated per head; 0 = head_dim"),
    PLUGIN_FIELD_OPTIONAL("interleaved", KILN_FIELD_I32, &zero_i32, "1: rotate adjacent pairs (GGML); 0: halves (HF)"),
    PLUGIN_FIELD_OPTIONAL("scaling", KILN_FIELD_STRING, "none", "none, linear or llama3"),
    PLUGIN_FIELD_OPTIONAL("factor", KILN_FIELD_F32, &one_f32, "scaling factor"),
    PLUGIN_FIELD_OPTIONAL("low_freq_factor", KILN_FIELD_F32, &one_f32, "llama3 scaling: low frequency factor"),
    PLUGIN_FIELD_OPTIONAL("high_freq_factor", KILN_FIELD_F32, &four_f32, "llama3 scaling: high frequency factor"),
    PLUGIN_FIELD_OPTIONAL("original_max_position", KILN_FIELD_I32, &default_max_position,
                          "llama3 scaling: the original context length"),
    PLUGIN_FIELD_OPTIONAL("n_kv_heads", KILN_FIELD_I32, &zero_i32,
                          "> 0: x is a packed qkv row; rotate the q and k heads, copy the v heads"),
};

static const kiln_plugin_creator rope_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = rope_fields,
    .n_fields = (int32_t)(sizeof rope_fields / sizeof rope_fields[0]),
    .blob_version = BLOB_VERSION,
    .create = rope_create,
    .deserialize = rope_deserialize,
    .description = "rotary position embedding, with partial rotary and Llama 3 frequency scaling",
};

kiln_status kiln_rope_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &rope_creator);
}
