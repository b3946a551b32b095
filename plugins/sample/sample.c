/* Sample (kiln/Sample/1): each sequence's next token from its logits, as
 * src/llm/sampler.c chooses it: greedy (argmax, lowest id on ties) when
 * the temperature is <= 0, else temperature, top-k, top-p and min-p, then
 * a draw with the uniform the caller passes. The LLM step network ends
 * with it (docs/llm.md), so a cuda engine samples on the GPU and returns
 * only ids. Penalties are not applied here: they need each sequence's
 * token history, which the generation runtime keeps on the host.
 *
 * Inputs:  logits f32 [S, V]; params f32 [S, 4] (temperature, top_k, top_p,
 *          min_p); random i32 [S, 2] (53 random bits, high 21 then low 32:
 *          kiln_sampler_uniform_bits).
 * Output:  ids i32 [S].
 * Fields:  none.
 * Blob v1: empty.
 *
 * The CPU path calls the library's sampler (a built-in is compiled into
 * libkiln, so it shares that code rather than copy it): its draws are
 * bit-for-bit those of kiln_sampler_sample from the same PRNG state. The
 * CUDA path (sample.cu) makes the same choice for greedy and draws from the
 * same distribution otherwise. */
#include "../plugin_util.h"

#include "../../src/llm/sampler.h"
#include "sample.h"

#define NAME "Sample"
#define BLOB_VERSION 1u

static const kiln_host_api *host;

static const kiln_plugin_ops sample_ops;

static kiln_status sample_new(kiln_plugin **out) {
    kiln_plugin *p = calloc(1, sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    p->struct_size = sizeof *p;
    p->abi_version = KILN_PLUGIN_ABI_VERSION;
    p->ops = &sample_ops;
    *out = p;
    return KILN_OK;
}

static int32_t sample_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status sample_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                        kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb) {
    int64_t v;
    if (n_in != 3 || in[0].rank != 2 || in[1].rank != 2 || in[2].rank != 2)
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects logits [S, V], params [S, 4] and random [S, 2]");
    if (!host->expr_is_constant(eb, in[1].d[1], &v) || v != 4)
        return host->fail(KILN_ERROR_SHAPE, NAME ": params must be [S, 4] (temperature, top_k, top_p, min_p)");
    if (!host->expr_is_constant(eb, in[2].d[1], &v) || v != 2)
        return host->fail(KILN_ERROR_SHAPE, NAME ": random must be [S, 2]");
    out[0].rank = 1;
    out[0].d[0] = in[0].d[0];
    return KILN_OK;
}

static kiln_status sample_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in,
                                        kiln_dtype *out, int32_t n_out) {
    out[0] = KILN_DTYPE_I32;
    return KILN_OK;
}

static int32_t sample_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d,
                               int32_t n_in, int32_t n_out) {
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    backend_ok |= backend == KILN_BACKEND_CUDA;
#endif
    return backend_ok && n_in == 3 && n_out == 1 && d[0].dtype == KILN_DTYPE_F32 && d[1].dtype == KILN_DTYPE_F32 &&
           d[2].dtype == KILN_DTYPE_I32 && d[3].dtype == KILN_DTYPE_I32;
}

/* One candidate per vocabulary entry and sequence (the CPU filter's
 * scratch; the CUDA path keeps a probability per entry in it). */
static size_t sample_workspace(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                               const kiln_tensor_desc *out, int32_t n_out) {
    return (size_t)plugin_desc_count(&in[0]) * sizeof(kiln_candidate);
}

typedef struct sample_job {
    const float *logits, *params;
    const int32_t *random;
    int32_t *ids;
    int32_t vocab;
    kiln_candidate *scratch;
} sample_job;

static void sample_rows(void *arg, int64_t begin, int64_t end) {
    const sample_job *j = arg;
    for (int64_t s = begin; s < end; s++) {
        const float *row = j->logits + s * j->vocab, *pr = j->params + s * 4;
        kiln_llm_sampling p = {.temperature = pr[0], .top_k = sample_top_k(pr[1], j->vocab), .top_p = pr[2],
                               .min_p = pr[3]};
        if (!(p.temperature > 0.0f)) {
            j->ids[s] = kiln_sampler_argmax(row, j->vocab);
            continue;
        }
        kiln_candidate *c = j->scratch + s * j->vocab;
        int32_t n = kiln_sampler_filter(row, j->vocab, &p, c);
        j->ids[s] = kiln_sampler_draw(c, n, kiln_sampler_uniform_from_bits(j->random + 2 * s));
    }
}

static kiln_status sample_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                  const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc,
                                  void *const *out, int32_t n_out, void *workspace, void *stream) {
    int64_t S = in_desc[0].dims.d[0], V = in_desc[0].dims.d[1];
    if (in_desc[1].dims.d[0] != S || in_desc[2].dims.d[0] != S)
        return host->fail(KILN_ERROR_SHAPE, NAME ": %lld rows of logits but %lld of params and %lld of random",
                          (long long)S, (long long)in_desc[1].dims.d[0], (long long)in_desc[2].dims.d[0]);
    if (V < 1 || V > INT32_MAX)
        return host->fail(KILN_ERROR_SHAPE, NAME ": vocabulary of %lld entries", (long long)V);
    if (S == 0)
        return KILN_OK;
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA)
        return kiln_sample_cuda(in[0], in[1], in[2], out[0], (int32_t)S, (int32_t)V, workspace, stream) == 0
                   ? KILN_OK
                   : host->fail(KILN_ERROR_BACKEND, NAME ": kernel launch failed");
#endif
    sample_job job = {in[0], in[1], in[2], out[0], (int32_t)V, workspace};
    host->parallel_for(stream, S, sample_rows, &job);
    return KILN_OK;
}

static kiln_status sample_serialize(const kiln_plugin *self, void *buf, size_t *size) {
    return plugin_pod_serialize(host, NAME, NULL, 0, buf, size);
}

static kiln_status sample_clone(const kiln_plugin *self, kiln_plugin **out) {
    return plugin_pod_clone(host, self, sizeof(kiln_plugin), out);
}

static void sample_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops sample_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
#ifdef KILN_HAVE_CUDA
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU) | KILN_BACKEND_BIT(KILN_BACKEND_CUDA),
#else
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
#endif
    .num_outputs = sample_num_outputs,
    .output_shapes = sample_output_shapes,
    .output_dtypes = sample_output_dtypes,
    .supports = sample_supports,
    .workspace_size = sample_workspace,
    .enqueue = sample_enqueue,
    .serialize = sample_serialize,
    .clone = sample_clone,
    .destroy = sample_destroy,
};

static kiln_status sample_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out) {
    return sample_new(out);
}

static kiln_status sample_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                      kiln_plugin **out) {
    kiln_status s = plugin_pod_check_blob(host, NAME, BLOB_VERSION, version, size, 0);
    return s != KILN_OK ? s : sample_new(out);
}

static const kiln_plugin_creator sample_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = NULL,
    .n_fields = 0,
    .blob_version = BLOB_VERSION,
    .create = sample_create,
    .deserialize = sample_deserialize,
    .description = "next token per sequence: greedy, or temperature, top-k, top-p, min-p and a given uniform",
};

kiln_status kiln_sample_register(const kiln_host_api *h, kiln_registry *reg) {
    host = h;
    return h->register_creator(reg, &sample_creator);
}
