/* Sample (kiln/Sample/1): each sequence's next token from its logits, as
 * src/llm/sampler.c chooses it: the penalties, then greedy (argmax, lowest
 * id on ties) when the temperature is <= 0, else temperature, top-k, top-p
 * and min-p, then a draw with the uniform the caller passes. The LLM step
 * network ends with it (docs/llm.md), so a cuda engine samples on the GPU
 * and returns only ids.
 *
 * The penalties need each sequence's history. It lives beside the engine
 * in `state`, one row per slot (a running sequence that uses penalties
 * owns one): per token id, bit 0 = seen in the prompt or the output, the
 * rest = times generated. The layer keeps it: before sampling row s it
 * resets the slot's row when the step feeds position 0, then marks every
 * token the step feeds for that sequence (generated once its position is
 * past the prompt), so the last sampled token counts from the step that
 * feeds it on.
 *
 * Inputs:  logits f32 [S, V]; params f32 [S, 7] (temperature, top_k, top_p,
 *          min_p, repetition, presence, frequency penalty); seq i32 [S, 4]
 *          (53 random bits, high 21 then low 32, as kiln_sampler_uniform_bits
 *          makes them; the state slot, -1 for none; the prompt's length);
 *          tokens i32 [T], positions i32 [T], query_start i32 [S + 1] (the
 *          step's, docs/llm.md; scoring, which takes every position's logits
 *          as rows of one sequence, passes fewer, and rows past them must have
 *          no slot); state i32 [slots, V], updated in place.
 * Output:  ids i32 [S].
 * Fields:  logprobs (i32, 0..20, default 0): with n > 0 the layer takes an
 *          eighth params column, the row's number of alternatives (-1: no
 *          logprobs for the row, 0..n), and has three more outputs:
 *          logprob f32 [S], the log-softmax of the sampled id over the
 *          penalized logits (before temperature: what the model assigns it,
 *          as OpenAI's logprobs report), and top_ids i32 [S, n] with
 *          top_logprobs f32 [S, n], the row's most likely ids (ties to the
 *          lower id) and their log-softmax, most likely first. Entries a row
 *          did not ask for hold id -1 and NaN; a row without logprobs NaN.
 * Blob v1: empty (logprobs 0). v2: logprobs, i32.
 *
 * The CPU path calls the library's sampler (a built-in is compiled into
 * libkiln, so it shares that code rather than copy it): its draws are
 * bit-for-bit those of kiln_sampler_sample from the same PRNG state. The
 * CUDA path (sample.cu) makes the same choice for greedy and draws from the
 * same distribution otherwise. */
#include <math.h>

#include "plugin_util.h"

#include "llm/sampler.h"
#include "sample/sample.h"

#define NAME "Sample"
#define BLOB_VERSION 2u

static const kiln_host_api *host;

static const kiln_plugin_ops sample_ops;

typedef struct sample_plugin {
    kiln_plugin base;
    int32_t top; /* the logprobs field: alternatives per row, 0: no logprob outputs */
} sample_plugin;

static int32_t top_of(const kiln_plugin *self) { return ((const sample_plugin *)self)->top; }

static kiln_status sample_new(int32_t top, kiln_plugin **out)
{
    if (top < 0 || top > SAMPLE_MAX_TOP)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": logprobs %d is not in [0, %d]", (int)top,
                          SAMPLE_MAX_TOP);
    sample_plugin *p = calloc(1, sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    p->base.struct_size = sizeof p->base;
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &sample_ops;
    p->top = top;
    *out = &p->base;
    return KILN_OK;
}

static int32_t sample_num_outputs(const kiln_plugin *self) { return top_of(self) > 0 ? 4 : 1; }

static kiln_status sample_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                        kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    int64_t v;
    if (n_in != 7 || in[0].rank != 2 || in[1].rank != 2 || in[2].rank != 2 || in[3].rank != 1 || in[4].rank != 1 ||
        in[5].rank != 1 || in[6].rank != 2)
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects logits [S, V], params [S, 7], seq [S, 4], tokens [T], "
                                                 "positions [T], query_start [S + 1] and state [slots, V]");
    const int32_t top = top_of(self);
    if (!host->expr_is_constant(eb, in[1].d[1], &v) || v != (top > 0 ? SAMPLE_PARAMS_LOGPROBS : SAMPLE_PARAMS))
        return host->fail(KILN_ERROR_SHAPE,
                          NAME ": params must be [S, %d] (temperature, top_k, top_p, min_p, repetition, presence, "
                               "frequency%s)",
                          top > 0 ? SAMPLE_PARAMS_LOGPROBS : SAMPLE_PARAMS, top > 0 ? ", logprobs" : "");
    if (!host->expr_is_constant(eb, in[2].d[1], &v) || v != SAMPLE_SEQ)
        return host->fail(KILN_ERROR_SHAPE, NAME ": seq must be [S, 4] (random high, random low, slot, prompt length)");
    for (int32_t o = 0; o < n_out; o++) {
        out[o].rank = o < 2 ? 1 : 2;
        out[o].d[0] = in[0].d[0];
        if (o >= 2)
            out[o].d[1] = host->expr_constant(eb, top);
    }
    return KILN_OK;
}

static kiln_status sample_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                        int32_t n_out)
{
    static const kiln_dtype types[4] = {KILN_DTYPE_I32, KILN_DTYPE_F32, KILN_DTYPE_I32, KILN_DTYPE_F32};
    for (int32_t o = 0; o < n_out && o < 4; o++)
        out[o] = types[o];
    return KILN_OK;
}

static int32_t sample_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                               int32_t n_out)
{
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    backend_ok |= backend == KILN_BACKEND_CUDA;
#endif
    int ok = backend_ok && n_in == 7 && n_out == sample_num_outputs(self) && d[0].dtype == KILN_DTYPE_F32 &&
             d[1].dtype == KILN_DTYPE_F32;
    for (int32_t i = 2; ok && i < 8; i++)
        ok = d[i].dtype == KILN_DTYPE_I32;
    for (int32_t o = 1; ok && o < n_out; o++)
        ok = d[n_in + o].dtype == (o == 2 ? KILN_DTYPE_I32 : KILN_DTYPE_F32);
    return ok;
}

/* Per vocabulary entry and sequence, one candidate (the CPU filter's
 * scratch; the CUDA path keeps a probability there) and one penalized
 * logit. */
static size_t sample_workspace(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                               const kiln_tensor_desc *out, int32_t n_out)
{
    return (size_t)plugin_desc_count(&in[0]) * SAMPLE_WORKSPACE_PER_ENTRY;
}

typedef struct sample_job {
    const sample_args *a;
} sample_job;

/* Row s's logprob outputs from its penalized logits (sample.h's
 * definition): the log-softmax of the sampled id and of the n most
 * likely ids. */
static void row_logprobs(const sample_args *a, int64_t s, const float *row, int32_t n)
{
    const int32_t V = a->V, K = a->top;
    int32_t *top = a->top_ids + s * K;
    float *lp = a->top_logprobs + s * K;
    for (int32_t k = 0; k < K; k++) {
        top[k] = -1;
        lp[k] = NAN;
    }
    a->logprob[s] = NAN;
    if (n < 0)
        return;
    float max = -INFINITY;
    for (int32_t i = 0; i < V; i++)
        max = row[i] > max ? row[i] : max;
    double sum = 0.0;
    for (int32_t i = 0; i < V && max != -INFINITY; i++)
        sum += exp((double)row[i] - (double)max);
    const double lse = (double)max + log(sum);
    a->logprob[s] = (float)((double)row[a->ids[s]] - lse);
    if (n > K)
        n = K;
    /* Insertion into the n best so far: descending logit, lower id first. */
    int32_t have = 0;
    for (int32_t i = 0; i < V; i++) {
        int32_t at = have;
        while (at > 0 && row[i] > row[top[at - 1]])
            at--;
        if (at >= n)
            continue;
        for (int32_t k = (have < n ? have : n - 1); k > at; k--)
            top[k] = top[k - 1];
        top[at] = i;
        if (have < n)
            have++;
    }
    for (int32_t k = 0; k < have; k++)
        lp[k] = (float)((double)row[top[k]] - lse);
}

static void sample_rows(void *arg, int64_t begin, int64_t end)
{
    const sample_args *a = ((const sample_job *)arg)->a;
    const int32_t V = a->V;
    for (int64_t s = begin; s < end; s++) {
        const float *row = a->logits + s * V, *pr = a->params + s * a->P;
        const int32_t *sq = a->seq + s * SAMPLE_SEQ;
        kiln_llm_sampling p = {.temperature = pr[0],
                               .top_k = sample_top_k(pr[1], V),
                               .top_p = pr[2],
                               .min_p = pr[3],
                               .repetition_penalty = pr[4],
                               .presence_penalty = pr[5],
                               .frequency_penalty = pr[6]};
        int32_t slot = sq[2];
        if (slot >= 0) {
            int32_t *st = a->state + (int64_t)slot * V;
            sample_track(st, V, a->tokens, a->positions, a->qstart[s], a->qstart[s + 1], sq[3]);
            if (sample_has_penalty(pr)) {
                float *pen = (float *)((kiln_candidate *)a->workspace + (int64_t)a->S * V) + s * V;
                for (int32_t i = 0; i < V; i++)
                    pen[i] = kiln_sampler_penalty(row[i], st[i] & 1, st[i] >> 1, &p);
                row = pen;
            }
        }
        if (!(p.temperature > 0.0f)) {
            a->ids[s] = kiln_sampler_argmax(row, V);
        } else {
            kiln_candidate *c = (kiln_candidate *)a->workspace + s * V;
            int32_t n = kiln_sampler_filter(row, V, &p, c);
            a->ids[s] = kiln_sampler_draw(c, n, kiln_sampler_uniform_from_bits(sq));
        }
        if (a->top > 0)
            row_logprobs(a, s, row, pr[SAMPLE_PARAMS] >= 0.0f ? (int32_t)pr[SAMPLE_PARAMS] : -1);
    }
}

static kiln_status sample_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                  const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc,
                                  void *const *out, int32_t n_out, void *workspace, void *stream)
{
    int64_t S = in_desc[0].dims.d[0], V = in_desc[0].dims.d[1], T = in_desc[3].dims.d[0];
    int64_t Q = in_desc[5].dims.d[0];
    if (in_desc[1].dims.d[0] != S || in_desc[2].dims.d[0] != S || Q < 1 || Q > S + 1)
        return host->fail(KILN_ERROR_SHAPE,
                          NAME ": %lld rows of logits but %lld of params, %lld of seq and %lld "
                               "query_start entries",
                          (long long)S, (long long)in_desc[1].dims.d[0], (long long)in_desc[2].dims.d[0], (long long)Q);
    if (V < 1 || V > INT32_MAX || in_desc[6].dims.d[1] != V || in_desc[4].dims.d[0] != T)
        return host->fail(KILN_ERROR_SHAPE,
                          NAME ": vocabulary of %lld entries, state rows of %lld, %lld tokens and "
                               "%lld positions",
                          (long long)V, (long long)in_desc[6].dims.d[1], (long long)T, (long long)in_desc[4].dims.d[0]);
    if (S == 0)
        return KILN_OK;
    const int32_t top = top_of(self);
    sample_args a = {.logits = in[0],
                     .params = in[1],
                     .seq = in[2],
                     .tokens = in[3],
                     .positions = in[4],
                     .qstart = in[5],
                     .state = (int32_t *)in[6],
                     .ids = out[0],
                     .S = (int32_t)S,
                     .V = (int32_t)V,
                     .T = (int32_t)T,
                     .slots = (int32_t)in_desc[6].dims.d[0],
                     .workspace = workspace,
                     .Q = (int32_t)Q,
                     .P = top > 0 ? SAMPLE_PARAMS_LOGPROBS : SAMPLE_PARAMS,
                     .top = top,
                     .logprob = top > 0 ? out[1] : NULL,
                     .top_ids = top > 0 ? out[2] : NULL,
                     .top_logprobs = top > 0 ? out[3] : NULL};
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA)
        return kiln_sample_cuda(&a, stream) == 0 ? KILN_OK
                                                 : host->fail(KILN_ERROR_BACKEND, NAME ": kernel launch failed");
#endif
    /* The metadata is the caller's: check what the tracking indexes with. */
    for (int64_t s = 0; s < S; s++) {
        const int32_t *sq = a.seq + s * SAMPLE_SEQ;
        if (sq[2] < 0)
            continue;
        if (sq[2] >= a.slots || s + 1 >= Q || a.qstart[s] < 0 || a.qstart[s] > a.qstart[s + 1] || a.qstart[s + 1] > T)
            return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": row %lld: slot %d of %d, query_start %d..%d of %lld",
                              (long long)s, sq[2], a.slots, s + 1 < Q ? a.qstart[s] : -1,
                              s + 1 < Q ? a.qstart[s + 1] : -1, (long long)T);
        for (int32_t t = a.qstart[s]; t < a.qstart[s + 1]; t++)
            if (a.tokens[t] < 0 || a.tokens[t] >= V)
                return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": token %d outside the vocabulary", a.tokens[t]);
    }
    sample_job job = {&a};
    host->parallel_for(stream, S, sample_rows, &job);
    return KILN_OK;
}

static kiln_status sample_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const int32_t top = top_of(self);
    return plugin_pod_serialize(host, NAME, &top, sizeof top, buf, size);
}

static kiln_status sample_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(sample_plugin), out);
}

static void sample_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops sample_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
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

static kiln_status sample_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    return sample_new(plugin_field_i32(f, n, "logprobs", 0), out);
}

static kiln_status sample_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                      kiln_plugin **out)
{
    /* v1 (engines built before the logprob outputs) is empty. */
    static const size_t sizes[2] = {0, sizeof(int32_t)};
    int32_t top = 0;
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, sizes, version, blob, size, &top);
    return s != KILN_OK ? s : sample_new(top, out);
}

static const int32_t zero_i32 = 0;

static const kiln_field_spec sample_fields[] = {
    PLUGIN_FIELD_OPTIONAL("logprobs", KILN_FIELD_I32, &zero_i32,
                          "alternatives per row of the logprob outputs (0..20); 0: no logprob outputs"),
};

static const kiln_plugin_creator sample_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = sample_fields,
    .n_fields = 1,
    .blob_version = BLOB_VERSION,
    .create = sample_create,
    .deserialize = sample_deserialize,
    .description = "next token per sequence: penalties, then greedy, or temperature, top-k, top-p, min-p and a "
                   "given uniform",
};

kiln_status kiln_sample_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &sample_creator);
}
