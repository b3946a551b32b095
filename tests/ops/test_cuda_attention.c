/* kiln/PagedAttention on the GPU against its CPU reference (attention.c) on
 * the same random q, k, v and the same randomly filled paged cache, with a
 * shuffled block table whose unused entries are out of range (a kernel
 * that reads past a sequence's length gets NaN and fails):
 *   - decode, batch 1..64, lengths mixed from 1 to past 8192 (splits merged
 *     in a thread-block cluster, and with KILN_ATTENTION_CLUSTER=0 by the
 *     combine kernel; one split; splits past a length); one sequence of
 *     20000 tokens beside one of 5 (more splits than a cluster holds);
 *     KILN_ATTENTION_PIPE_CTAS at its largest (44 splits) and smallest
 *     (no split of 9001 keys);
 *     many sequences in one step: 300 of 1000..2000 tokens and 1024 of
 *     128..256 tokens (no split) by default (kat_dmma with 16-bit
 *     activations: the sequences fill the GPU) and through kat_pipe; GQA
 *     groups of 1, 4 and 8 at head_dim 64 and 128; all of it with the
 *     pipelined kernel (kat_pipe, the default of fewer sequences), a part
 *     again with KILN_ATTENTION_DECODE=split (kat_decode) and with
 *     KILN_ATTENTION_DECODE=mma (kat_dmma, on the tensor cores, at any batch);
 *     short and long contexts in tables sized for 8448 tokens under each of
 *     kat_pipe's settings (cached keys loaded before the wait on the
 *     previous kernel or after it, block-table reads per stage or per key,
 *     splits of at least 16, 64 or 256 keys,
 *     the grid's splits capped at 16, at 2 or not, no cluster, 3 pipeline
 *     stages);
 *   - prefill of several sequences packed without padding (tensor-core
 *     kernel for f16/bf16), chunked prefill onto a filled cache, decodes
 *     and a prompt in one step;
 *   - GQA 32/8, MQA, MHA, groups of 2 and 12 query heads per kv head;
 *   - head_dim 64 and 128 (fast kernels), 16, 80 and 256 (generic kernel),
 *     block sizes 16, 7 and 1; packed qkv; q or k and v views off 16-byte
 *     alignment (other kernels, the separate cache write);
 *   - f32, f16, bf16; a decode and a prefill step replayed from a CUDA graph;
 *   - an FP8 cache (E4M3 codes in u8): the cache write rounding (some k and
 *     v values past ±448: saturated), kat_pipe's decode (splits in a
 *     cluster and through kat_combine, GQA groups of 1, 4 and 8, block 7,
 *     3 pipeline stages, splits of 256 keys, a short context in a long
 *     table, a graph), kat_prefill's tiles (prefill, chunked prefill onto an FP8
 *     cache, a mixed step) and kat_generic (f32 activations, head_dim 16,
 *     unaligned q).
 * The GPU output is poisoned with NaN before each launch. Tolerance on the
 * output, ||gpu - cpu|| / ||cpu||: f32 2e-5 (both sum up to 9000 terms in
 * f32, in different orders: about sqrt(n/2) * 2^-24 apart), f16 2e-3 and
 * bf16 1e-2 (a few ulps of the output dtype; the tensor-core path also
 * rounds the probabilities to it). Every element must be finite. The
 * cache after the step must equal the CPU's byte for byte (it is a copy).
 *
 * Without a GPU (or without the CUDA backend) it exits 77: skipped. */
#include "test.h"

#ifdef KILN_HAVE_CUDA

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"

#include <cuda_runtime.h>
#include <kiln/registry.h>
#include <stdint.h>

static kiln_cuda_device *dev;
static cudaStream_t stream;
static kiln_threadpool *pool;
static kiln_registry *reg;

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_float(float lo, float hi) { return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0)); }

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess ||
        cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "cannot place %zu bytes on the GPU\n", bytes);
        exit(1);
    }
    return d;
}

/* A fill of n values: each a hash of a seed drawn from the test's
 * generator and the value's index, so the pool's threads share it and the
 * values do not depend on how the pool splits it (the many-sequence caches
 * hold up to a billion values: filled on one core, they took most of the
 * test's time). codes: E4M3 codes of magnitude up to 3.75 (0x47), either
 * sign, no NaN, instead of t values in [lo, hi). */
typedef struct fill_job {
    void *p;
    kiln_dtype t;
    int codes;
    float lo, hi;
    uint64_t seed;
} fill_job;

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_range(void *arg, int64_t begin, int64_t end)
{
    const fill_job *j = arg;
    for (int64_t i = begin; i < end; i++) {
        const uint64_t r = mix64(j->seed + (uint64_t)i);
        if (j->codes)
            ((uint8_t *)j->p)[i] = (uint8_t)((r >> 20) % 0x48 | ((r >> 60) & 0x8) << 4);
        else
            kiln_store_f32(j->p, j->t, i, j->lo + (j->hi - j->lo) * (float)((r >> 40) * (1.0 / 16777216.0)));
    }
}

static void fill_any(void *p, kiln_dtype t, int codes, int64_t n, float lo, float hi)
{
    fill_job j = {p, t, codes, lo, hi, rng_next()};
    kiln_threadpool_run(pool, n, fill_range, &j);
}

static void fill(void *p, kiln_dtype t, int64_t n, float lo, float hi) { fill_any(p, t, 0, n, lo, hi); }

static kiln_plugin *make_plugin(int32_t nh, int32_t nkv, int32_t hd, int32_t bs, int32_t packed)
{
    const kiln_plugin_creator *c = kiln_registry_find(reg, "PagedAttention", "1", "kiln", NULL);
    CHECK(c != NULL);
    if (!c)
        return NULL;
    const char *names[5] = {"n_heads", "n_kv_heads", "head_dim", "block_size", "packed_qkv"};
    const int32_t vals[5] = {nh, nkv, hd, bs, packed};
    kiln_field f[5];
    for (int i = 0; i < 5; i++)
        f[i] = (kiln_field){.struct_size = sizeof(kiln_field),
                            .abi_version = KILN_PLUGIN_ABI_VERSION,
                            .name = names[i],
                            .type = KILN_FIELD_I32,
                            .count = 1,
                            .data = &vals[i]};
    kiln_plugin *pl = NULL;
    CHECK_OK(kiln_plugin_create(c, f, 5, &pl));
    return pl;
}

/* One step's shapes: S sequences with n_new[s] new tokens each and
 * lens[s] tokens after the step. */
typedef struct step {
    const char *name;
    int32_t nh, nkv, hd, bs;
    int32_t packed;   /* one qkv input */
    int32_t misalign; /* 1: q and out, 2: k and v viewed one element in (not 16-byte aligned) */
    int32_t graph;    /* replay the launch from a captured CUDA graph */
    int32_t S;
    const int32_t *n_new, *lens;
} step;

/* Set: the next steps keep the cache in FP8 (u8 E4M3 codes) instead of
 * the activations' dtype. */
static int cache_fp8;

/* Block table width of the next steps when wider than the longest
 * sequence's + 2: as an engine built for a longer context plans them. */
static int64_t table_blocks;

static double rel_norm_tol(kiln_dtype t) { return t == KILN_DTYPE_F32 ? 2e-5 : t == KILN_DTYPE_F16 ? 2e-3 : 1e-2; }

static kiln_status run_gpu(const kiln_layer *l, const kiln_exec_tensor *din, const kiln_exec_tensor *dout,
                           kiln_plugin *pl, void *ws, int graph)
{
    kiln_cuda_args ga = {
        .layer = l, .inputs = din, .outputs = dout, .plugin = pl, .workspace = ws, .device = dev, .stream = stream};
    if (!graph)
        return kiln_cuda_run_layer(&ga);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess)
        return KILN_ERROR_BACKEND;
    kiln_status st = kiln_cuda_run_layer(&ga);
    cudaError_t e = cudaStreamEndCapture(stream, &g);
    if (st != KILN_OK)
        return st;
    if (e != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess ||
        cudaGraphLaunch(ge, stream) != cudaSuccess) {
        fprintf(stderr, "graph capture or replay failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        st = KILN_ERROR_BACKEND;
    }
    cudaStreamSynchronize(stream);
    if (ge)
        cudaGraphExecDestroy(ge);
    if (g)
        cudaGraphDestroy(g);
    return st;
}

static void run_step(const step *c, kiln_dtype dt)
{
    char what[160];
    snprintf(what, sizeof what, "%s %s (heads %d/%d, head_dim %d, block %d%s%s%s%s)", c->name, kiln_dtype_name(dt),
             c->nh, c->nkv, c->hd, c->bs, c->packed ? ", packed" : "",
             c->misalign == 1   ? ", q unaligned"
             : c->misalign == 2 ? ", k v unaligned"
                                : "",
             c->graph ? ", graph" : "", cache_fp8 ? ", fp8 cache" : "");
    kiln_plugin *pl = make_plugin(c->nh, c->nkv, c->hd, c->bs, c->packed);
    if (!pl)
        return;
    const size_t es = kiln_dtype_size(dt);
    const kiln_dtype ct = cache_fp8 ? KILN_DTYPE_U8 : dt;
    const size_t ces = kiln_dtype_size(ct);
    int64_t T = 0, need = 0, max_blocks = 1;
    for (int32_t s = 0; s < c->S; s++) {
        int64_t b = (c->lens[s] + c->bs - 1) / c->bs;
        T += c->n_new[s];
        need += b;
        max_blocks = b > max_blocks ? b : max_blocks;
    }
    max_blocks += 2; /* table entries past every length: out of range */
    max_blocks = table_blocks > max_blocks ? table_blocks : max_blocks;
    const int64_t n_blocks = need + 3, qw = (int64_t)c->nh * c->hd, kvw = (int64_t)c->nkv * c->hd;

    /* block table: a shuffled assignment of the cache's blocks */
    int32_t *perm = malloc((size_t)n_blocks * sizeof *perm),
            *table = malloc((size_t)(c->S * max_blocks) * sizeof *table);
    int32_t *qstart = malloc((size_t)(c->S + 1) * sizeof *qstart);
    for (int64_t i = 0; i < n_blocks; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = n_blocks - 1; i > 0; i--) {
        int64_t j = (int64_t)(rng_next() % (uint64_t)(i + 1));
        int32_t x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    int64_t used = 0;
    qstart[0] = 0;
    for (int32_t s = 0; s < c->S; s++) {
        int64_t b = (c->lens[s] + c->bs - 1) / c->bs;
        for (int64_t j = 0; j < max_blocks; j++)
            table[s * max_blocks + j] = j < b ? perm[used++] : (int32_t)(n_blocks + 1000 + j);
        qstart[s + 1] = qstart[s] + c->n_new[s];
    }

    /* inputs: q, k, v apart or one packed row; tensors one element longer
     * so a misaligned view still has T rows */
    const int32_t n_act = c->packed ? 1 : 3;
    const int64_t widths[3] = {c->packed ? qw + 2 * kvw : qw, kvw, kvw};
    void *h_act[3], *d_act[3];
    for (int i = 0; i < n_act; i++) {
        int64_t n = T * widths[i] + 1;
        h_act[i] = malloc((size_t)n * es);
        fill(h_act[i], dt, n, -2.0f, 2.0f);
        /* k and v past E4M3's 448 too: saturated in the cache. Not q: it
         * is never cached, and scores of ~10^4 (600 x 448 / sqrt(d)) are
         * ill-conditioned in f32 — two summation orders of such a dot
         * product differ by a few 1e-5 of the output, which an f32 prefill
         * step showed as 4.5e-5 against the CPU. */
        for (int64_t j = 0; cache_fp8 && j < n; j += 101)
            if (i > 0 || (c->packed && j % widths[0] >= qw))
                kiln_store_f32(h_act[i], dt, j, rng_float(-600.0f, 600.0f));
        d_act[i] = dev_copy(h_act[i], (size_t)n * es);
    }
    const int64_t cache_n = n_blocks * 2 * kvw * c->bs;
    void *h_cache = malloc((size_t)cache_n * ces), *g_cache = malloc((size_t)cache_n * ces);
    fill_any(h_cache, dt, cache_fp8, cache_n, -1.0f, 1.0f);
    void *d_cache = dev_copy(h_cache, (size_t)cache_n * ces);
    void *d_table = dev_copy(table, (size_t)(c->S * max_blocks) * sizeof *table);
    void *d_lens = dev_copy(c->lens, (size_t)c->S * sizeof(int32_t));
    void *d_qstart = dev_copy(qstart, (size_t)(c->S + 1) * sizeof *qstart);
    const int64_t out_n = T * qw + 1;
    void *h_out = malloc((size_t)out_n * es), *g_out = malloc((size_t)out_n * es), *d_out = NULL;
    CHECK(cudaMalloc(&d_out, (size_t)out_n * es) == cudaSuccess);
    cudaMemset(d_out, 0xff, (size_t)out_n * es);

    const size_t off = c->misalign == 1 ? es : 0, kv_off = c->misalign == 2 ? es : 0;
    kiln_exec_tensor hin[7], din[7], hout, dout;
    int32_t n_in = 0;
    for (int i = 0; i < n_act; i++, n_in++) {
        kiln_dims d = {.rank = 2, .d = {T, widths[i]}};
        size_t o = i == 0 ? off : kv_off;
        hin[n_in] = (kiln_exec_tensor){(char *)h_act[i] + o, dt, d};
        din[n_in] = (kiln_exec_tensor){(char *)d_act[i] + o, dt, d};
    }
    kiln_dims cd = {.rank = 5, .d = {n_blocks, 2, c->nkv, c->bs, c->hd}};
    hin[n_in] = (kiln_exec_tensor){h_cache, ct, cd};
    din[n_in++] = (kiln_exec_tensor){d_cache, ct, cd};
    kiln_dims td = {.rank = 2, .d = {c->S, max_blocks}}, sd = {.rank = 1, .d = {c->S}},
              qd = {.rank = 1, .d = {c->S + 1}};
    hin[n_in] = (kiln_exec_tensor){table, KILN_DTYPE_I32, td};
    din[n_in++] = (kiln_exec_tensor){d_table, KILN_DTYPE_I32, td};
    hin[n_in] = (kiln_exec_tensor){(void *)c->lens, KILN_DTYPE_I32, sd};
    din[n_in++] = (kiln_exec_tensor){d_lens, KILN_DTYPE_I32, sd};
    hin[n_in] = (kiln_exec_tensor){qstart, KILN_DTYPE_I32, qd};
    din[n_in++] = (kiln_exec_tensor){d_qstart, KILN_DTYPE_I32, qd};
    kiln_dims od = {.rank = 2, .d = {T, qw}};
    hout = (kiln_exec_tensor){(char *)h_out + off, dt, od};
    dout = (kiln_exec_tensor){(char *)d_out + off, dt, od};

    /* the workspace at these shapes (the builder asks at the max shapes) */
    kiln_tensor_desc descs[8];
    for (int32_t i = 0; i <= n_in; i++) {
        const kiln_exec_tensor *t = i < n_in ? &hin[i] : &hout;
        descs[i] = (kiln_tensor_desc){.struct_size = sizeof(kiln_tensor_desc),
                                      .abi_version = KILN_PLUGIN_ABI_VERSION,
                                      .dtype = t->dtype,
                                      .format = KILN_FORMAT_LINEAR,
                                      .dims = t->dims};
    }
    CHECK(pl->ops->supports(pl, KILN_BACKEND_CUDA, descs, n_in, 1));
    size_t ws_bytes = pl->ops->workspace_size(pl, descs, n_in, descs + n_in, 1);
    void *ws = NULL;
    if (ws_bytes)
        CHECK(cudaMalloc(&ws, ws_bytes) == cudaSuccess);

    kiln_layer l;
    memset(&l, 0, sizeof l);
    l.name = (char *)"attention";
    l.op = KILN_OP_PLUGIN;
    l.n_inputs = n_in;
    l.n_outputs = 1;
    l.tactic = -1;
    l.workspace = ws_bytes;
    kiln_cpu_args ca = {.layer = &l, .inputs = hin, .outputs = &hout, .plugin = pl, .pool = pool};
    CHECK_OK(kiln_cpu_run_layer(&ca));
    cudaDeviceSynchronize(); /* copies and poison ran on the legacy stream */
    kiln_status st = run_gpu(&l, din, &dout, pl, ws, c->graph);
    cudaError_t e = cudaStreamSynchronize(stream);
    test_checks_ += 2;
    if (st != KILN_OK || e != cudaSuccess) {
        test_failures_++;
        fprintf(stderr, "%s: %s %s\n", what, st != KILN_OK ? kiln_last_error() : "", cudaGetErrorString(e));
    } else if (cudaMemcpy(g_out, d_out, (size_t)out_n * es, cudaMemcpyDeviceToHost) != cudaSuccess ||
               cudaMemcpy(g_cache, d_cache, (size_t)cache_n * ces, cudaMemcpyDeviceToHost) != cudaSuccess) {
        test_failures_++;
        fprintf(stderr, "%s: copying results back failed\n", what);
    } else {
        double num = 0, den = 0;
        int64_t bad = -1;
        for (int64_t i = 0; i < T * qw; i++) {
            double r = kiln_load_f32((char *)h_out + off, dt, i), g = kiln_load_f32((char *)g_out + off, dt, i);
            if (!isfinite(g) && bad < 0)
                bad = i;
            num += (g - r) * (g - r);
            den += r * r;
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        if (bad >= 0 || !(rel <= rel_norm_tol(dt))) {
            test_failures_++;
            fprintf(stderr, "%s: relative norm of the difference %.3g (tol %.0e)", what, rel, rel_norm_tol(dt));
            if (bad >= 0)
                fprintf(stderr, "; element %lld (token %lld, head %lld) is %g", (long long)bad, (long long)(bad / qw),
                        (long long)(bad % qw / c->hd), kiln_load_f32((char *)g_out + off, dt, bad));
            fprintf(stderr, "\n");
        }
        if (memcmp(g_cache, h_cache, (size_t)cache_n * ces) != 0) {
            test_failures_++;
            int64_t i = 0;
            while (memcmp((char *)g_cache + i * ces, (char *)h_cache + i * ces, ces) == 0)
                i++;
            fprintf(stderr, "%s: cache element %lld differs: gpu %g, cpu %g\n", what, (long long)i,
                    kiln_load_f32(g_cache, ct, i), kiln_load_f32(h_cache, ct, i));
        }
        printf("  %-60s rel %.2e\n", what, rel);
    }

    for (int i = 0; i < n_act; i++) {
        free(h_act[i]);
        cudaFree(d_act[i]);
    }
    free(h_cache);
    free(g_cache);
    free(h_out);
    free(g_out);
    free(perm);
    free(table);
    free(qstart);
    cudaFree(d_cache);
    cudaFree(d_table);
    cudaFree(d_lens);
    cudaFree(d_qstart);
    cudaFree(d_out);
    cudaFree(ws);
    pl->ops->destroy(pl);
}

static const kiln_dtype dtypes[3] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};

static void run_all(const step *c)
{
    for (int i = 0; i < 3; i++)
        run_step(c, dtypes[i]);
}

/* ---- decode ----------------------------------------------------------------------- */

static const int32_t ones[64] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

static void test_decode_long(void)
{
    static const int32_t len1[1] = {8300}, len3[3] = {1, 9001, 77};
    run_all(&(step){"decode batch 1, 8300 tokens", 32, 8, 128, 16, 0, 0, 0, 1, ones, len1});
    run_all(&(step){"decode batch 3, lengths 1/9001/77", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    run_step(&(step){"decode batch 1 (graph)", 32, 8, 128, 16, 0, 0, 1, 1, ones, len1}, KILN_DTYPE_BF16);
    static const int32_t len2[2] = {20000, 5};
    run_all(&(step){"decode batch 2, lengths 20000/5", 32, 8, 128, 16, 0, 0, 0, 2, ones, len2});
    /* kat_pipe's split targets at both ends: 44 splits through kat_combine, and none */
    setenv("KILN_ATTENTION_PIPE_CTAS", "1056", 1);
    run_all(&(step){"decode batch 3, lengths 1/9001/77, 44 splits", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    setenv("KILN_ATTENTION_PIPE_CTAS", "8", 1);
    run_all(&(step){"decode batch 3, lengths 1/9001/77, one split", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    unsetenv("KILN_ATTENTION_PIPE_CTAS");
    /* the splits merged by kat_combine instead of inside a cluster */
    setenv("KILN_ATTENTION_CLUSTER", "0", 1);
    run_all(&(step){"decode batch 3, lengths 1/9001/77, no cluster", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    run_step(&(step){"decode batch 1 (graph), no cluster", 32, 8, 128, 16, 0, 0, 1, 1, ones, len1}, KILN_DTYPE_BF16);
    unsetenv("KILN_ATTENTION_CLUSTER");
}

/* Many sequences in one decode step, as continuous batching forms them:
 * the tokens alone fill the GPU, so 16-bit activations take kat_dmma by
 * default (kat_use_dmma) and f32 ones kat_pipe; then kat_pipe for all
 * (KILN_ATTENTION_DECODE=pipe), where every sequence is one split and it
 * runs 3 pipeline stages a warp (kat_pipe_stages); once more with the 4
 * that fewer sequences get (KILN_ATTENTION_PIPE_STAGES=4). */
static void test_decode_many(void)
{
    static int32_t n_new[1024], lens[1024];
    for (int i = 0; i < 1024; i++) {
        n_new[i] = 1;
        lens[i] = 128 + (int32_t)(rng_next() % 129);
    }
    lens[3] = 1;
    run_all(&(step){"decode 1024 sequences of 128..256 (default)", 32, 8, 128, 16, 0, 0, 0, 1024, n_new, lens});
    setenv("KILN_ATTENTION_DECODE", "pipe", 1);
    run_all(&(step){"decode 1024 sequences of 128..256", 32, 8, 128, 16, 0, 0, 0, 1024, n_new, lens});
    setenv("KILN_ATTENTION_PIPE_STAGES", "4", 1);
    run_all(&(step){"decode 1024 sequences of 128..256, 4 stages", 32, 8, 128, 16, 0, 0, 0, 1024, n_new, lens});
    unsetenv("KILN_ATTENTION_PIPE_STAGES");
    for (int i = 0; i < 300; i++)
        lens[i] = 1000 + (int32_t)(rng_next() % 1001);
    run_all(&(step){"decode 300 sequences of 1000..2000", 32, 8, 128, 16, 0, 0, 0, 300, n_new, lens});
    run_step(&(step){"decode 300 sequences of 1000..2000 (graph)", 32, 8, 128, 16, 0, 0, 1, 300, n_new, lens},
             KILN_DTYPE_BF16);
    /* a warp a CTA (KILN_ATTENTION_PIPE_WARPS=1): the same, and 1,024
     * sequences of 1..12 keys (a step early in a large batch) */
    setenv("KILN_ATTENTION_PIPE_WARPS", "1", 1);
    run_all(&(step){"decode 300 sequences of 1000..2000, a warp a CTA", 32, 8, 128, 16, 0, 0, 0, 300, n_new, lens});
    run_step(
        &(step){"decode 300 sequences of 1000..2000, a warp a CTA (graph)", 32, 8, 128, 16, 0, 0, 1, 300, n_new, lens},
        KILN_DTYPE_BF16);
    for (int i = 0; i < 1024; i++)
        lens[i] = 128 + (int32_t)(rng_next() % 129);
    run_all(&(step){"decode 1024 sequences of 128..256, a warp a CTA", 32, 8, 128, 16, 0, 0, 0, 1024, n_new, lens});
    for (int i = 0; i < 1024; i++)
        lens[i] = 1 + (int32_t)(rng_next() % 12);
    run_all(&(step){"decode 1024 sequences of 1..12, a warp a CTA", 32, 8, 128, 16, 0, 0, 0, 1024, n_new, lens});
    unsetenv("KILN_ATTENTION_PIPE_WARPS");
    unsetenv("KILN_ATTENTION_DECODE");
    /* the default again: 300 sequences of 1000..2000 (kat_dmma for 16-bit
     * activations), 64 of them (512 CTAs: kat_dmma too), and 16 (128
     * CTAs: kat_pipe) */
    for (int i = 0; i < 300; i++)
        lens[i] = 1000 + (int32_t)(rng_next() % 1001);
    run_all(&(step){"decode 300 sequences of 1000..2000 (default)", 32, 8, 128, 16, 0, 0, 0, 300, n_new, lens});
    run_step(&(step){"decode 300 sequences of 1000..2000 (default, graph)", 32, 8, 128, 16, 0, 0, 1, 300, n_new, lens},
             KILN_DTYPE_BF16);
    run_all(&(step){"decode 64 sequences of 1000..2000 (default)", 32, 8, 128, 16, 0, 0, 0, 64, n_new, lens});
    run_all(&(step){"decode 16 sequences of 1000..2000 (default)", 32, 8, 128, 16, 0, 0, 0, 16, n_new, lens});
}

/* Decode of 4 kv heads with each of the n groups of query heads a kv
 * head at both fast head dims, lengths long and short, odd against the
 * block size; `prefix` names the cases. */
static void run_groups(const char *prefix, const int32_t *groups, int n)
{
    static const int32_t lens[4] = {4099, 1, 333, 17}, dims[2] = {64, 128};
    for (int d = 0; d < 2; d++)
        for (int g = 0; g < n; g++) {
            char name[64];
            snprintf(name, sizeof name, "%sdecode %d per kv head", prefix, groups[g]);
            run_all(&(step){name, 4 * groups[g], 4, dims[d], 16, 0, 0, 0, 4, ones, lens});
        }
}

/* GQA groups of 1, 4 and 8 query heads per kv head. */
static void test_decode_groups(void)
{
    static const int32_t groups[3] = {1, 4, 8};
    run_groups("", groups, 3);
}

/* kat_pipe's choices, each undone alone and all together, as
 * attention_bench times them: the loads of cached keys before the wait on
 * the previous kernel (KILN_ATTENTION_PIPE_EARLY), one block-table read a
 * warp stage (KILN_ATTENTION_PIPE_STAGE_BLOCK), the fewest keys a split
 * takes (KILN_ATTENTION_PIPE_SPLIT_KEYS; 16 makes one f32 CTA stage a
 * split), the grid's splits capped (KILN_ATTENTION_PIPE_CAP: 16, 2, none),
 * no cluster at all, 3 pipeline stages instead of 4
 * (KILN_ATTENTION_PIPE_STAGES), and a warp a CTA (KILN_ATTENTION_PIPE_WARPS). Short contexts in tables sized for 8448 tokens
 * (the 8B engine's: many splits planned, one to a few run, the others only
 * join the merge or leave), new keys inside the first stages (read after
 * the wait), from the k and v inputs or, with k and v off 16-byte
 * alignment, from the cache kat_write filled just before; long ones beside
 * them; a graph replay. */
static void test_decode_variants(void)
{
    static const char *const settings[][8] = {
        {NULL},
        {"KILN_ATTENTION_PIPE_EARLY", "0"},
        {"KILN_ATTENTION_PIPE_STAGE_BLOCK", "0"},
        {"KILN_ATTENTION_PIPE_SPLIT_KEYS", "16"},
        {"KILN_ATTENTION_PIPE_SPLIT_KEYS", "256"},
        {"KILN_ATTENTION_PIPE_CAP", "0"},
        {"KILN_ATTENTION_PIPE_CAP", "2"},
        {"KILN_ATTENTION_PIPE_STAGES", "3"},
        {"KILN_ATTENTION_CLUSTER", "0"},
        /* a warp a CTA where a step runs one split: the CTA target at its
         * smallest makes one split of nearly every case here */
        {"KILN_ATTENTION_PIPE_WARPS", "1", "KILN_ATTENTION_PIPE_CTAS", "8"},
        {"KILN_ATTENTION_PIPE_WARPS", "1", "KILN_ATTENTION_PIPE_CTAS", "8", "KILN_ATTENTION_PIPE_EARLY", "0"},
        {"KILN_ATTENTION_PIPE_EARLY", "0", "KILN_ATTENTION_PIPE_STAGE_BLOCK", "0", "KILN_ATTENTION_PIPE_SPLIT_KEYS",
         "256", "KILN_ATTENTION_PIPE_CAP", "0"},
    };
    static const int32_t len136[1] = {136}, len1[1] = {1}, len17[1] = {17}, len3[3] = {1, 9001, 77};
    static const int32_t lens4[4] = {1, 5, 40, 300}, lens5[5] = {1, 700, 129, 3000, 64};
    for (size_t v = 0; v < sizeof settings / sizeof settings[0]; v++) {
        for (int i = 0; i < 8 && settings[v][i]; i += 2)
            setenv(settings[v][i], settings[v][i + 1], 1);
        printf("  with %s=%s%s\n", settings[v][0] ? settings[v][0] : "defaults", settings[v][0] ? settings[v][1] : "",
               settings[v][2] ? " and more" : "");
        table_blocks = 8448 / 16;
        run_all(&(step){"decode batch 1, 136 of 8448", 32, 8, 128, 16, 0, 0, 0, 1, ones, len136});
        run_all(&(step){"decode batch 1, 1 of 8448", 32, 8, 128, 16, 0, 0, 0, 1, ones, len1});
        run_all(&(step){"decode batch 1, 17 of 8448, head_dim 64", 32, 8, 64, 16, 0, 0, 0, 1, ones, len17});
        run_all(&(step){"decode batch 3, lengths 1/9001/77", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
        run_all(&(step){"decode batch 4, short, unaligned k, v", 8, 2, 128, 16, 0, 2, 0, 4, ones, lens4});
        run_all(&(step){"decode batch 4, short, packed qkv", 32, 8, 64, 16, 1, 0, 0, 4, ones, lens4});
        run_all(&(step){"decode MQA, block 7", 8, 1, 64, 7, 0, 0, 0, 5, ones, lens5});
        run_all(&(step){"decode 8 per kv head, block 1", 16, 2, 128, 1, 0, 0, 0, 5, ones, lens5});
        run_all(&(step){"decode MHA, head_dim 64", 8, 8, 64, 16, 0, 0, 0, 5, ones, lens5});
        run_step(&(step){"decode batch 1, 136 of 8448 (graph)", 32, 8, 128, 16, 0, 0, 1, 1, ones, len136},
                 KILN_DTYPE_BF16);
        table_blocks = 0;
        for (int i = 0; i < 8 && settings[v][i]; i += 2)
            unsetenv(settings[v][i]);
    }
}

/* The decode on the tensor cores (KILN_ATTENTION_DECODE=mma: kat_dmma, a
 * CTA per token and kv head, the group's query heads as m-tile rows), on
 * a cache in the activations' dtype and in FP8: many sequences, long and
 * short ones, groups of 2 to 16 query heads at both fast head dims, block
 * sizes that do and do not hold a whole 16-key tile (16, 32, 7, 1), k and
 * v off 16-byte alignment, a graph replay; MHA and f32 fall back to
 * kat_pipe. Under an FP8 cache with bf16 activations Q K^T runs in f16
 * (KILN_ATTENTION_DMMA_Q16=0: in bf16, also checked); the FP8 form fitted
 * for 4 CTAs an SM (KILN_ATTENTION_DMMA_CTAS=4). */
static void test_decode_mma(void)
{
    setenv("KILN_ATTENTION_DECODE", "mma", 1);
    static int32_t n_new[1024], lens[1024];
    for (int i = 0; i < 1024; i++) {
        n_new[i] = 1;
        lens[i] = 128 + (int32_t)(rng_next() % 129);
    }
    lens[3] = 1;
    lens[9] = 16;
    lens[10] = 17;
    static const int32_t len3[3] = {1, 9001, 77}, lens4[4] = {4099, 1, 333, 17}, lens5[5] = {1, 700, 129, 3000, 64};
    for (int f8 = 0; f8 < 2; f8++) {
        cache_fp8 = f8;
        run_all(&(step){"mma: decode 1024 sequences of 128..256", 32, 8, 128, 16, 0, 0, 0, 1024, n_new, lens});
        run_all(&(step){"mma: decode batch 3, lengths 1/9001/77", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
        static const int32_t groups[5] = {2, 4, 8, 12, 16};
        run_groups("mma: ", groups, 5);
        run_all(&(step){"mma: decode, block 32", 32, 8, 128, 32, 0, 0, 0, 5, ones, lens5});
        run_all(&(step){"mma: decode, block 7", 16, 4, 64, 7, 0, 0, 0, 5, ones, lens5});
        run_all(&(step){"mma: decode 8 per kv head, block 1", 16, 2, 128, 1, 0, 0, 0, 5, ones, lens5});
        run_all(&(step){"mma: decode, unaligned k, v", 8, 2, 128, 16, 0, 2, 0, 4, ones, lens4});
        run_all(&(step){"mma: decode, packed qkv", 32, 8, 64, 16, 1, 0, 0, 4, ones, lens4});
        run_all(&(step){"mma: decode MHA (kat_pipe)", 8, 8, 64, 16, 0, 0, 0, 5, ones, lens5});
        run_step(&(step){"mma: decode 1024 sequences (graph)", 32, 8, 128, 16, 0, 0, 1, 1024, n_new, lens},
                 KILN_DTYPE_BF16);
    }
    /* Q K^T in bf16 under the FP8 cache, as when a Q value passes f16's range */
    cache_fp8 = 1;
    /* the FP8 form fitted for 4 CTAs an SM (KILN_ATTENTION_DMMA_CTAS=4) */
    setenv("KILN_ATTENTION_DMMA_CTAS", "4", 1);
    run_all(&(step){"mma: decode 1024 sequences, 4 CTAs an SM", 32, 8, 128, 16, 0, 0, 0, 1024, n_new, lens});
    run_all(&(step){"mma: decode batch 3, 4 CTAs an SM", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    run_all(&(step){"mma: decode, block 7, 4 CTAs an SM", 32, 8, 128, 7, 0, 0, 0, 5, ones, lens5});
    run_step(&(step){"mma: decode 1024 sequences, 4 CTAs an SM (graph)", 32, 8, 128, 16, 0, 0, 1, 1024, n_new, lens},
             KILN_DTYPE_BF16);
    unsetenv("KILN_ATTENTION_DMMA_CTAS");
    setenv("KILN_ATTENTION_DMMA_Q16", "0", 1);
    run_all(&(step){"mma: decode batch 3, Q K^T in bf16", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    run_all(&(step){"mma: decode 8 per kv head, block 1, Q K^T in bf16", 16, 2, 64, 1, 0, 0, 0, 5, ones, lens5});
    unsetenv("KILN_ATTENTION_DMMA_Q16");
    cache_fp8 = 0;
    unsetenv("KILN_ATTENTION_DECODE");
}

/* The previous decode kernel (kat_decode), kept selectable to time both. */
static void test_decode_split_kernel(void)
{
    setenv("KILN_ATTENTION_DECODE", "split", 1);
    static const int32_t len1[1] = {8300}, len3[3] = {1, 9001, 77}, lens5[5] = {1, 700, 129, 3000, 64};
    run_all(&(step){"kat_decode: batch 1, 8300 tokens", 32, 8, 128, 16, 0, 0, 0, 1, ones, len1});
    run_all(&(step){"kat_decode: batch 3, lengths 1/9001/77", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    run_all(&(step){"kat_decode: MQA", 8, 1, 64, 16, 0, 0, 0, 5, ones, lens5});
    run_all(&(step){"kat_decode: 12 per kv head, block 1", 24, 2, 64, 1, 0, 0, 0, 5, ones, lens5});
    setenv("KILN_ATTENTION_CLUSTER", "0", 1);
    run_all(&(step){"kat_decode: batch 3, no cluster", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    unsetenv("KILN_ATTENTION_CLUSTER");
    unsetenv("KILN_ATTENTION_DECODE");
}

static void test_decode_batch(void)
{
    int32_t lens[64];
    for (int i = 0; i < 64; i++)
        lens[i] = 1 + (int32_t)(rng_next() % 1500);
    lens[5] = 1;
    lens[17] = 8193;
    lens[40] = 64;
    run_all(&(step){"decode batch 64, lengths 1..8193", 32, 8, 128, 16, 0, 0, 0, 64, ones, lens});
    run_all(&(step){"decode batch 8, head_dim 64", 16, 4, 64, 16, 0, 0, 0, 8, ones, lens});
}

static void test_decode_heads(void)
{
    static const int32_t lens[5] = {1, 700, 129, 3000, 64};
    run_all(&(step){"decode MQA", 8, 1, 64, 16, 0, 0, 0, 5, ones, lens});
    run_all(&(step){"decode MHA", 4, 4, 128, 16, 0, 0, 0, 5, ones, lens});
    run_all(&(step){"decode 2 per kv head, block 7", 8, 4, 128, 7, 0, 0, 0, 5, ones, lens});
    run_all(&(step){"decode 12 per kv head, block 1", 24, 2, 64, 1, 0, 0, 0, 5, ones, lens});
    run_all(&(step){"decode packed qkv", 32, 8, 128, 16, 1, 0, 0, 5, ones, lens});
    run_all(&(step){"decode unaligned q", 8, 2, 128, 16, 0, 1, 0, 5, ones, lens});
    run_all(&(step){"decode unaligned k, v", 8, 2, 128, 16, 0, 2, 0, 5, ones, lens});
}

static void test_decode_generic(void)
{
    static const int32_t lens[4] = {1, 300, 2100, 17};
    run_all(&(step){"decode head_dim 16", 4, 2, 16, 16, 0, 0, 0, 4, ones, lens});
    run_all(&(step){"decode head_dim 80", 8, 2, 80, 16, 0, 0, 0, 4, ones, lens});
    run_all(&(step){"decode head_dim 256", 4, 1, 256, 16, 0, 0, 0, 4, ones, lens});
}

/* ---- prefill ---------------------------------------------------------------------- */

static void test_prefill(void)
{
    static const int32_t n_new[4] = {100, 1, 64, 250}, fresh[4] = {100, 1, 64, 250};
    run_all(&(step){"prefill 4 sequences", 32, 8, 128, 16, 0, 0, 0, 4, n_new, fresh});
    run_all(&(step){"prefill 4 sequences, head_dim 64 MQA", 8, 1, 64, 16, 0, 0, 0, 4, n_new, fresh});
    run_all(&(step){"prefill packed qkv", 32, 8, 128, 16, 1, 0, 0, 4, n_new, fresh});
    run_all(&(step){"prefill head_dim 16", 4, 2, 16, 16, 0, 0, 0, 4, n_new, fresh});
    static const int32_t one_new[1] = {1000}, one_len[1] = {1000};
    run_all(&(step){"prefill 1000 tokens", 32, 8, 128, 16, 0, 0, 0, 1, one_new, one_len});
    /* from 1,024 new tokens a sequence at head_dim 128 the wide form runs by default */
    static const int32_t long_new[1] = {1100}, long_len[1] = {1100};
    run_all(&(step){"prefill 1100 tokens", 32, 8, 128, 16, 0, 0, 0, 1, long_new, long_len});
    run_step(&(step){"prefill (graph)", 32, 8, 128, 16, 0, 0, 1, 4, n_new, fresh}, KILN_DTYPE_F16);
}

static void test_chunked_prefill(void)
{
    static const int32_t n_new[3] = {50, 130, 1}, lens[3] = {350, 207, 4000};
    run_all(&(step){"chunked prefill onto a filled cache", 32, 8, 128, 16, 0, 0, 0, 3, n_new, lens});
    run_all(&(step){"chunked prefill, block 7, 12 per kv head", 24, 2, 64, 7, 0, 0, 0, 3, n_new, lens});
    run_all(&(step){"chunked prefill unaligned q", 8, 2, 64, 16, 0, 1, 0, 3, n_new, lens});
    run_all(&(step){"chunked prefill unaligned k, v", 8, 2, 64, 16, 0, 2, 0, 3, n_new, lens});
    static const int32_t chunk_new[1] = {1030}, chunk_len[1] = {2000};
    run_all(&(step){"chunked prefill of 1030 onto 970, MQA", 8, 1, 128, 16, 0, 0, 0, 1, chunk_new, chunk_len});
    /* decodes beside a prompt: more tokens than sequences, so the prefill kernel takes them all */
    static const int32_t mixed_new[5] = {1, 1, 1, 40, 1}, mixed_lens[5] = {1, 5000, 300, 40, 17};
    run_all(&(step){"mixed step: 4 decodes and a prompt", 32, 8, 128, 16, 0, 0, 0, 5, mixed_new, mixed_lens});
    run_all(&(step){"mixed step, MQA head_dim 64", 16, 1, 64, 16, 0, 0, 0, 5, mixed_new, mixed_lens});
}

/* kat_prefill's two forms (KILN_ATTENTION_PREFILL=narrow: 64 rows a CTA;
 * wide: 128) and both grid orders
 * (KILN_ATTENTION_PREFILL_ORDER=head): the prefill and chunked prefill
 * cases again under each, partial tiles of both sizes among them (100, 250,
 * 1000 tokens by 4 heads; MQA 8 heads), and FP8. */
static void test_prefill_tiles(void)
{
    static const char *const vs[4][2] = {{"narrow", NULL}, {"wide", NULL}, {"narrow", "head"}, {"wide", "head"}};
    for (int v = 0; v < 4; v++) {
        setenv("KILN_ATTENTION_PREFILL", vs[v][0], 1);
        if (vs[v][1])
            setenv("KILN_ATTENTION_PREFILL_ORDER", vs[v][1], 1);
        else
            unsetenv("KILN_ATTENTION_PREFILL_ORDER");
        printf("  with KILN_ATTENTION_PREFILL=%s%s\n", vs[v][0], vs[v][1] ? ", KILN_ATTENTION_PREFILL_ORDER=head" : "");
        test_prefill();
        test_chunked_prefill();
        cache_fp8 = 1;
        static const int32_t n_new[4] = {100, 1, 64, 250}, fresh[4] = {100, 1, 64, 250};
        run_all(&(step){"fp8: prefill 4 sequences", 32, 8, 128, 16, 0, 0, 0, 4, n_new, fresh});
        run_all(&(step){"fp8: prefill, head_dim 64 MQA", 8, 1, 64, 16, 0, 0, 0, 4, n_new, fresh});
        cache_fp8 = 0;
    }
    unsetenv("KILN_ATTENTION_PREFILL");
    unsetenv("KILN_ATTENTION_PREFILL_ORDER");
}

/* ---- FP8 cache ------------------------------------------------------------------------ */

/* The cache as E4M3 codes: every kernel that reads or writes it, against
 * the CPU plugin, whose cache write rounds as core/fp8.h does (its op test,
 * tests/unit/test_llm_plugins.c, holds it to an encoder written from the
 * spec); the cache must come back byte for byte. */
static void test_fp8_cache(void)
{
    cache_fp8 = 1;
    static const int32_t len3[3] = {1, 9001, 77}, len1[1] = {8300}, lens5[5] = {1, 700, 129, 3000, 64};
    run_all(&(step){"fp8: decode batch 3, lengths 1/9001/77", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    run_step(&(step){"fp8: decode batch 1 (graph)", 32, 8, 128, 16, 0, 0, 1, 1, ones, len1}, KILN_DTYPE_BF16);
    static const int32_t groups[3] = {1, 4, 8};
    run_groups("fp8: ", groups, 3);
    run_all(&(step){"fp8: decode MQA, block 7", 8, 1, 64, 7, 0, 0, 0, 5, ones, lens5});
    run_all(&(step){"fp8: decode packed qkv", 32, 8, 128, 16, 1, 0, 0, 5, ones, lens5});
    run_all(&(step){"fp8: decode unaligned q", 8, 2, 128, 16, 0, 1, 0, 5, ones, lens5});
    run_all(&(step){"fp8: decode head_dim 16", 4, 2, 16, 16, 0, 0, 0, 5, ones, lens5});
    setenv("KILN_ATTENTION_CLUSTER", "0", 1);
    run_all(&(step){"fp8: decode batch 3, no cluster", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    unsetenv("KILN_ATTENTION_CLUSTER");
    setenv("KILN_ATTENTION_PIPE_EARLY", "0", 1);
    run_all(&(step){"fp8: decode batch 5, loads after the wait", 32, 8, 64, 16, 0, 0, 0, 5, ones, lens5});
    unsetenv("KILN_ATTENTION_PIPE_EARLY");
    setenv("KILN_ATTENTION_PIPE_STAGES", "3", 1);
    run_all(&(step){"fp8: decode batch 5, 3 pipeline stages", 16, 4, 128, 16, 0, 0, 0, 5, ones, lens5});
    unsetenv("KILN_ATTENTION_PIPE_STAGES");
    setenv("KILN_ATTENTION_PIPE_SPLIT_KEYS", "256", 1);
    setenv("KILN_ATTENTION_PIPE_CAP", "0", 1);
    run_all(&(step){"fp8: decode batch 3, splits of 256 keys, uncapped", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    unsetenv("KILN_ATTENTION_PIPE_SPLIT_KEYS");
    unsetenv("KILN_ATTENTION_PIPE_CAP");
    setenv("KILN_ATTENTION_PIPE_WARPS", "1", 1); /* with one split: a warp a CTA */
    setenv("KILN_ATTENTION_PIPE_CTAS", "8", 1);
    run_all(&(step){"fp8: decode batch 3, a warp a CTA", 32, 8, 128, 16, 0, 0, 0, 3, ones, len3});
    run_all(&(step){"fp8: decode batch 5, a warp a CTA, MHA", 8, 8, 64, 16, 0, 0, 0, 5, ones, lens5});
    unsetenv("KILN_ATTENTION_PIPE_WARPS");
    unsetenv("KILN_ATTENTION_PIPE_CTAS");
    table_blocks = 8448 / 16; /* short contexts in an 8B engine's tables: splits that only join the merge */
    static const int32_t len136[1] = {136};
    run_all(&(step){"fp8: decode batch 1, 136 of 8448", 32, 8, 128, 16, 0, 0, 0, 1, ones, len136});
    table_blocks = 0;
    static const int32_t n_new[4] = {100, 1, 64, 250}, fresh[4] = {100, 1, 64, 250};
    run_all(&(step){"fp8: prefill 4 sequences", 32, 8, 128, 16, 0, 0, 0, 4, n_new, fresh});
    run_all(&(step){"fp8: prefill, head_dim 64 MQA", 8, 1, 64, 16, 0, 0, 0, 4, n_new, fresh});
    static const int32_t c_new[3] = {50, 130, 1}, c_lens[3] = {350, 207, 4000};
    run_all(&(step){"fp8: chunked prefill onto a filled cache", 32, 8, 128, 16, 0, 0, 0, 3, c_new, c_lens});
    static const int32_t mixed_new[5] = {1, 1, 1, 40, 1}, mixed_lens[5] = {1, 5000, 300, 40, 17};
    run_all(&(step){"fp8: mixed step, 4 decodes and a prompt", 32, 8, 128, 16, 0, 0, 0, 5, mixed_new, mixed_lens});
    run_step(&(step){"fp8: prefill (graph)", 32, 8, 128, 16, 0, 0, 1, 4, n_new, fresh}, KILN_DTYPE_F16);
    cache_fp8 = 0;
}

/* A block outside the cache cannot be reported from the device: the
 * sequence's outputs turn NaN, the rest of the batch stays right, nothing
 * is written out of bounds (the run must not fault). */
static void test_bad_block(void)
{
    kiln_plugin *pl = make_plugin(4, 2, 64, 16, 0);
    if (!pl)
        return;
    const int64_t T = 2, qw = 4 * 64, kvw = 2 * 64, n_blocks = 4, cache_n = n_blocks * 2 * kvw * 16;
    int32_t table[2 * 2] = {0, 1000000, 2, 3}, lens[2] = {20, 20}, qstart[3] = {0, 1, 2};
    float *q = malloc((size_t)(T * qw) * sizeof *q), *k = malloc((size_t)(T * kvw) * sizeof *k);
    float *cache = malloc((size_t)cache_n * sizeof *cache), out[2 * 256];
    fill(q, KILN_DTYPE_F32, T * qw, -1, 1);
    fill(k, KILN_DTYPE_F32, T * kvw, -1, 1);
    fill(cache, KILN_DTYPE_F32, cache_n, -1, 1);
    void *d[7] = {dev_copy(q, (size_t)(T * qw) * 4),  dev_copy(k, (size_t)(T * kvw) * 4),
                  dev_copy(k, (size_t)(T * kvw) * 4), dev_copy(cache, (size_t)cache_n * 4),
                  dev_copy(table, sizeof table),      dev_copy(lens, sizeof lens),
                  dev_copy(qstart, sizeof qstart)};
    void *d_out = NULL;
    CHECK(cudaMalloc(&d_out, sizeof out) == cudaSuccess);
    kiln_exec_tensor din[7] = {{d[0], KILN_DTYPE_F32, {.rank = 2, .d = {T, qw}}},
                               {d[1], KILN_DTYPE_F32, {.rank = 2, .d = {T, kvw}}},
                               {d[2], KILN_DTYPE_F32, {.rank = 2, .d = {T, kvw}}},
                               {d[3], KILN_DTYPE_F32, {.rank = 5, .d = {n_blocks, 2, 2, 16, 64}}},
                               {d[4], KILN_DTYPE_I32, {.rank = 2, .d = {2, 2}}},
                               {d[5], KILN_DTYPE_I32, {.rank = 1, .d = {2}}},
                               {d[6], KILN_DTYPE_I32, {.rank = 1, .d = {3}}}};
    kiln_exec_tensor dout = {d_out, KILN_DTYPE_F32, {.rank = 2, .d = {T, qw}}};
    kiln_tensor_desc descs[8];
    for (int i = 0; i < 8; i++)
        descs[i] = (kiln_tensor_desc){.struct_size = sizeof(kiln_tensor_desc),
                                      .abi_version = KILN_PLUGIN_ABI_VERSION,
                                      .dtype = i < 7 ? din[i].dtype : dout.dtype,
                                      .format = KILN_FORMAT_LINEAR,
                                      .dims = i < 7 ? din[i].dims : dout.dims};
    void *ws = NULL;
    size_t ws_bytes = pl->ops->workspace_size(pl, descs, 7, descs + 7, 1);
    if (ws_bytes)
        cudaMalloc(&ws, ws_bytes);
    kiln_layer l;
    memset(&l, 0, sizeof l);
    l.name = (char *)"attention";
    l.op = KILN_OP_PLUGIN;
    l.n_inputs = 7;
    l.n_outputs = 1;
    cudaDeviceSynchronize();
    CHECK_OK(run_gpu(&l, din, &dout, pl, ws, 0));
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess);
    int nan0 = 1, fin1 = 1;
    for (int i = 0; i < qw; i++) {
        nan0 &= isnan(out[i]);
        fin1 &= isfinite(out[qw + i]);
    }
    CHECK(nan0);
    CHECK(fin1);
    for (int i = 0; i < 7; i++)
        cudaFree(d[i]);
    cudaFree(d_out);
    cudaFree(ws);
    free(q);
    free(k);
    free(cache);
    pl->ops->destroy(pl);
}

static const test_case_ tests[] = {
    TEST(test_decode_long),     TEST(test_decode_batch),  TEST(test_decode_heads),        TEST(test_decode_generic),
    TEST(test_decode_many),     TEST(test_decode_groups), TEST(test_decode_split_kernel), TEST(test_prefill),
    TEST(test_chunked_prefill), TEST(test_prefill_tiles), TEST(test_bad_block),           TEST(test_decode_variants),
    TEST(test_fp8_cache),       TEST(test_decode_mma),
};

int main(void)
{
    int32_t arch = 0;
    if (!kiln_cuda_available(&arch)) {
        printf("skipped: no CUDA GPU\n");
        return 77;
    }
    if (kiln_cuda_device_create(&dev) != KILN_OK ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        kiln_threadpool_create(0, &pool) != KILN_OK || kiln_registry_create(&reg) != KILN_OK) {
        fprintf(stderr, "cannot set up the GPU test: %s\n", kiln_last_error());
        return 1;
    }
    printf("GPU sm_%d\n", (int)arch);
    test_run_cases(tests, sizeof tests / sizeof tests[0]);
    kiln_registry_destroy(reg);
    kiln_threadpool_destroy(pool);
    cudaStreamDestroy(stream);
    kiln_cuda_device_destroy(dev);
    return test_failures_ ? 1 : 0;
}

#else

int main(void)
{
    printf("skipped: no CUDA GPU (built without the CUDA backend)\n");
    return 77 + test_failures_ + test_checks_; /* both 0: the harness is unused here */
}

#endif
