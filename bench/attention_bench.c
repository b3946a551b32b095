/* attention_bench: kiln/PagedAttention on the GPU at the Llama-3.1-8B shape
 * (32 query heads, 8 kv heads, head_dim 128, bf16, KV blocks of 16 tokens).
 *
 *   attention_bench [--reps N] [--sweep] [--prefill] [--variants a,b,...] [--cases TEXT]
 *                   [--prefill-variants a,b,...] [--fp8]
 *
 * Decode (one new token per sequence): batch 1 at contexts 136 (also with
 * a table sized for an 8448-token engine: the splits planned for it, as a
 * decode step right after a short prompt runs them), 1024 and 8192, batch 64 at context 8192
 * (batch 1 also with a block table sized for 131072 tokens, as an engine
 * built for a long max context has it: the splits follow the actual
 * length), 8, 16, 32, 66 and 128 sequences of 256..2048 (around where
 * the default turns from kat_pipe to kat_dmma: 32 sequences of 8 kv heads,
 * 256 CTAs; kat_dmma was as fast or faster from 32 on an H100, fewer not
 * yet measured), 512 sequences of lengths uniform in 1000..2000
 * and 1024 of 128..256 (continuous batching's many mixed sequences). For each: the
 * step's time (cache write, attention, split combine) and the KV-cache
 * bytes it must read over that time, as a fraction of the device-to-device
 * copy bandwidth measured in the same run (bytes read + written). Each
 * case runs with every variant of the decode in `variants` below, one row
 * each: `default` the library's choice (kat_dmma where the sequences
 * times kv heads reach kat_pipe's aim of CTAs, else kat_pipe), `pipe`
 * kat_pipe at any batch (KILN_ATTENTION_DECODE=pipe, as every variant
 * below that names no other kernel; cached keys' loads issued before the
 * wait on the previous kernel, one block-table read per warp stage, splits
 * of at least 64 keys, the grid's splits capped at a cluster's 16), `late`
 * without the early loads (KILN_ATTENTION_PIPE_EARLY=0), `rowtab` with a
 * table read per key (KILN_ATTENTION_PIPE_STAGE_BLOCK=0), `k32` and `k256`
 * with splits of at least 32 and 256 keys (KILN_ATTENTION_PIPE_SPLIT_KEYS),
 * `cap8` and `cap16` with the splits capped at 8 and 16 (KILN_ATTENTION_PIPE_CAP),
 * `s3` and `s4` with 3 and 4 pipeline stages a warp (KILN_ATTENTION_PIPE_STAGES;
 * by default 3, so that 4 CTAs fit an SM, where many sequences fill the
 * grid, else 4), `nocl` with the splits merged by
 * kat_combine instead of in a thread-block cluster
 * (KILN_ATTENTION_CLUSTER=0), `w1` with a warp a CTA where a step runs
 * one split (KILN_ATTENTION_PIPE_WARPS=1: the many-sequence cases), `prev`
 * the previous default (all four choices undone), `split` the older
 * kat_decode (KILN_ATTENTION_DECODE=split) and `mma` the decode on the
 * tensor cores, kat_dmma (KILN_ATTENTION_DECODE=mma), and `mma4` its
 * form fitted for 4 CTAs an SM (KILN_ATTENTION_DMMA_CTAS=4: an FP8 cache
 * only; with a bf16 one the same kernel as `mma`). Two times: one
 * launch between two events ("launch", includes the host's launch cost
 * when the GPU outruns it), and a CUDA graph of 8 steps replayed, per step
 * ("graph", as the engine replays decode). Inputs rotate among copies
 * whose caches together exceed the L2 cache, so a small case is not timed
 * out of L2. --prefill times the prefill cases alone. --variants
 * runs only the named decode variants (e.g. pipe,nocl), --prefill-variants
 * the named prefill ones, and --cases only the cases whose name contains
 * TEXT (e.g. "sequences", "2048 tokens"): a whole run takes
 * minutes, more than a short device call has. With --sweep, kat_pipe runs again at KILN_ATTENTION_PIPE_CTAS
 * = 128, 264 and 1056 (the CTAs it aims for when splitting; default 528).
 * Prefill of one 512-, 2048- and 8192-token prompt and of 64 prompts of
 * 128, each with kat_prefill's default (the form chosen by shape) and its
 * variants: `narrow` and `wide` (KILN_ATTENTION_PREFILL), and `prev` (the
 * narrow form in the grid order before 2026-12-04,
 * KILN_ATTENTION_PREFILL_ORDER=head):
 * causal attention FLOPs (4 * heads * head_dim per query-key pair at or before
 * the query) per second. Every figure is the median of --reps (default 50)
 * runs timed with CUDA events after warm-up. Needs a GPU (exits 77 without
 * one). --fp8 runs every case on an E4M3 cache (`--kv-dtype fp8`: kat_write
 * then writes the new rows, and KV bytes are one a value). */
#include <cuda_runtime_api.h>
#include <kiln/kiln.h>
#include <kiln/registry.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"

#define NH 32
#define NKV 8
#define HD 128
#define BS 16

static cudaStream_t stream;
static cudaEvent_t ev0, ev1;
static int reps = 50, sweep, prefill_only, fp8_cache;         /* --fp8: an E4M3 cache (--kv-dtype fp8) */
static const char *only_variants, *only_cases, *only_prefill; /* --variants, --cases, --prefill-variants (NULL: all) */

/* Whether `name` is one of the comma-separated names of `list`. */
static int listed(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define CU(call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) { \
            fprintf(stderr, "attention_bench: %s: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__); \
            exit(1); \
        } \
    } while (0)

/* Median milliseconds of one launch of `run(arg)` on the stream. */
static float time_ms(void (*run)(void *), void *arg)
{
    for (int i = 0; i < 3; i++)
        run(arg);
    float *t = malloc((size_t)reps * sizeof *t);
    for (int i = 0; i < reps; i++) {
        CU(cudaEventRecord(ev0, stream));
        run(arg);
        CU(cudaEventRecord(ev1, stream));
        CU(cudaEventSynchronize(ev1));
        CU(cudaEventElapsedTime(&t[i], ev0, ev1));
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_float);
    float m = t[reps / 2];
    free(t);
    return m;
}

typedef struct copy_job {
    void *src, *dst;
    size_t bytes;
} copy_job;

static void run_copy(void *arg)
{
    copy_job *c = arg;
    CU(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, stream));
}

/* One attention step: the plugin layer with its inputs on the device, in
 * `n_rot` copies that successive runs take in turn. */
#define MAX_ROT 8
#define GRAPH_STEPS 8

typedef struct attn_job {
    kiln_cuda_device *dev;
    kiln_plugin *pl;
    kiln_layer layer;
    kiln_exec_tensor in[MAX_ROT][7], out[MAX_ROT];
    int n_rot, rot;
    void *ws;
} attn_job;

static void run_attn(void *arg)
{
    attn_job *j = arg;
    kiln_cuda_args a = {.layer = &j->layer,
                        .inputs = j->in[j->rot],
                        .outputs = &j->out[j->rot],
                        .plugin = j->pl,
                        .workspace = j->ws,
                        .device = j->dev,
                        .stream = stream};
    j->rot = (j->rot + 1) % j->n_rot;
    if (kiln_cuda_run_layer(&a) != KILN_OK) {
        fprintf(stderr, "attention_bench: %s\n", kiln_last_error());
        exit(1);
    }
}

/* Median milliseconds of one step replayed from a graph of GRAPH_STEPS. */
static float time_graph_ms(attn_job *j)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < GRAPH_STEPS; i++)
        run_attn(j);
    CU(cudaStreamEndCapture(stream, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; i++)
        CU(cudaGraphLaunch(ge, stream));
    float *t = malloc((size_t)reps * sizeof *t);
    for (int i = 0; i < reps; i++) {
        CU(cudaEventRecord(ev0, stream));
        CU(cudaGraphLaunch(ge, stream));
        CU(cudaEventRecord(ev1, stream));
        CU(cudaEventSynchronize(ev1));
        CU(cudaEventElapsedTime(&t[i], ev0, ev1));
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_float);
    float m = t[reps / 2] / GRAPH_STEPS;
    free(t);
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    return m;
}

static void *dev_alloc(size_t bytes, int fill_random)
{
    void *d = NULL;
    CU(cudaMalloc(&d, bytes));
    if (fill_random) {
        /* small bf16 values (exponent of 0.5..1, random mantissa and sign) */
        uint16_t *h = malloc(bytes);
        uint32_t x = 12345 + (uint32_t)bytes;
        for (size_t i = 0; i < bytes / 2; i++) {
            x = x * 1664525u + 1013904223u;
            h[i] = (uint16_t)(0x3f00u | ((x >> 16) & 0x807fu));
        }
        CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
        free(h);
    }
    return d;
}

/* Sets up S sequences of lens[s] tokens, `n_new` of them new this step,
 * with block tables `mb` blocks wide (at least the longest sequence's),
 * in enough copies that their caches exceed 256 MB (L2 is 50 MB). */
static void attn_setup(attn_job *j, kiln_cuda_device *dev, kiln_registry *reg, int64_t S, int64_t n_new,
                       const int32_t *lens, int64_t mb)
{
    const kiln_plugin_creator *c = kiln_registry_find(reg, "PagedAttention", "1", "kiln", NULL);
    const char *names[4] = {"n_heads", "n_kv_heads", "head_dim", "block_size"};
    const int32_t vals[4] = {NH, NKV, HD, BS};
    kiln_field f[4];
    for (int i = 0; i < 4; i++)
        f[i] = (kiln_field){.struct_size = sizeof(kiln_field),
                            .abi_version = KILN_PLUGIN_ABI_VERSION,
                            .name = names[i],
                            .type = KILN_FIELD_I32,
                            .count = 1,
                            .data = &vals[i]};
    if (!c || kiln_plugin_create(c, f, 4, &j->pl) != KILN_OK) {
        fprintf(stderr, "attention_bench: cannot create the plugin: %s\n", kiln_last_error());
        exit(1);
    }
    int64_t nb = 0;
    for (int64_t s = 0; s < S; s++)
        nb += (lens[s] + BS - 1) / BS;
    const int64_t T = S * n_new;
    const size_t cache_bytes = (size_t)(nb * 2 * NKV * BS * HD) * (fp8_cache ? 1 : 2);
    j->n_rot = (int)(((size_t)256 << 20) / cache_bytes + 1);
    j->n_rot = j->n_rot > MAX_ROT ? MAX_ROT : j->n_rot;
    j->rot = 0;
    int32_t *table = malloc((size_t)(S * mb) * sizeof *table), *qs = malloc((size_t)(S + 1) * sizeof *qs);
    int64_t next = 0;
    for (int64_t s = 0; s < S; s++) {
        int64_t b = (lens[s] + BS - 1) / BS;
        for (int64_t i = 0; i < mb; i++)
            table[s * mb + i] = i < b ? (int32_t)next++ : 0;
        qs[s] = (int32_t)(s * n_new);
    }
    qs[S] = (int32_t)T;
    kiln_dims dq = {.rank = 2, .d = {T, NH * HD}}, dk = {.rank = 2, .d = {T, NKV * HD}};
    kiln_dims dc = {.rank = 5, .d = {nb, 2, NKV, BS, HD}}, dt = {.rank = 2, .d = {S, mb}};
    kiln_dims ds = {.rank = 1, .d = {S}}, dqs = {.rank = 1, .d = {S + 1}};
    for (int r = 0; r < j->n_rot; r++) {
        kiln_exec_tensor *in = j->in[r];
        in[0] = (kiln_exec_tensor){dev_alloc((size_t)(T * NH * HD) * 2, 1), KILN_DTYPE_BF16, dq};
        in[1] = (kiln_exec_tensor){dev_alloc((size_t)(T * NKV * HD) * 2, 1), KILN_DTYPE_BF16, dk};
        in[2] = (kiln_exec_tensor){dev_alloc((size_t)(T * NKV * HD) * 2, 1), KILN_DTYPE_BF16, dk};
        in[3] = (kiln_exec_tensor){dev_alloc(cache_bytes, !fp8_cache), fp8_cache ? KILN_DTYPE_U8 : KILN_DTYPE_BF16, dc};
        if (fp8_cache) /* codes of 0.5 and 0.5625 (random bf16 bytes would hold NaN codes) */
            CU(cudaMemset(in[3].data, 0x30 | (r & 1), cache_bytes));
        in[4] = (kiln_exec_tensor){dev_alloc((size_t)(S * mb) * 4, 0), KILN_DTYPE_I32, dt};
        in[5] = (kiln_exec_tensor){dev_alloc((size_t)S * 4, 0), KILN_DTYPE_I32, ds};
        in[6] = (kiln_exec_tensor){dev_alloc((size_t)(S + 1) * 4, 0), KILN_DTYPE_I32, dqs};
        CU(cudaMemcpy(in[4].data, table, (size_t)(S * mb) * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(in[5].data, lens, (size_t)S * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(in[6].data, qs, (size_t)(S + 1) * 4, cudaMemcpyHostToDevice));
        j->out[r] = (kiln_exec_tensor){dev_alloc((size_t)(T * NH * HD) * 2, 0), KILN_DTYPE_BF16, dq};
    }
    kiln_tensor_desc d[8];
    for (int i = 0; i < 8; i++)
        d[i] = (kiln_tensor_desc){.struct_size = sizeof(kiln_tensor_desc),
                                  .abi_version = KILN_PLUGIN_ABI_VERSION,
                                  .dtype = i < 7 ? j->in[0][i].dtype : j->out[0].dtype,
                                  .format = KILN_FORMAT_LINEAR,
                                  .dims = i < 7 ? j->in[0][i].dims : j->out[0].dims};
    size_t ws = j->pl->ops->workspace_size(j->pl, d, 7, d + 7, 1);
    j->ws = ws ? dev_alloc(ws, 0) : NULL;
    j->dev = dev;
    memset(&j->layer, 0, sizeof j->layer);
    j->layer.name = (char *)"attention";
    j->layer.op = KILN_OP_PLUGIN;
    j->layer.n_inputs = 7;
    j->layer.n_outputs = 1;
    j->layer.tactic = -1;
    j->layer.workspace = ws;
    free(table);
    free(qs);
}

static void attn_free(attn_job *j)
{
    for (int r = 0; r < j->n_rot; r++) {
        for (int i = 0; i < 7; i++)
            cudaFree(j->in[r][i].data);
        cudaFree(j->out[r].data);
    }
    cudaFree(j->ws);
    j->pl->ops->destroy(j->pl);
}

/* The kernels and settings each decode case runs with: the default, then
 * each of its choices undone alone, the previous default, the older
 * kernel; with --sweep the last three too. */
typedef struct variant {
    const char *name;
    const char *env[8]; /* variable, value pairs (NULL: fewer) */
} variant;

static const variant variants[] = {
    {"default", {NULL}},
    {"pipe", {NULL}},
    {"late", {"KILN_ATTENTION_PIPE_EARLY", "0"}},
    {"rowtab", {"KILN_ATTENTION_PIPE_STAGE_BLOCK", "0"}},
    {"k32", {"KILN_ATTENTION_PIPE_SPLIT_KEYS", "32"}},
    {"k256", {"KILN_ATTENTION_PIPE_SPLIT_KEYS", "256"}},
    {"cap8", {"KILN_ATTENTION_PIPE_CAP", "8"}},
    {"cap16", {"KILN_ATTENTION_PIPE_CAP", "16"}},
    {"s3", {"KILN_ATTENTION_PIPE_STAGES", "3"}},
    {"s4", {"KILN_ATTENTION_PIPE_STAGES", "4"}},
    {"nocl", {"KILN_ATTENTION_CLUSTER", "0"}},
    {"w1", {"KILN_ATTENTION_PIPE_WARPS", "1"}},
    {"prev",
     {"KILN_ATTENTION_PIPE_EARLY", "0", "KILN_ATTENTION_PIPE_STAGE_BLOCK", "0", "KILN_ATTENTION_PIPE_SPLIT_KEYS", "256",
      "KILN_ATTENTION_PIPE_CAP", "0"}},
    {"split", {"KILN_ATTENTION_DECODE", "split"}},
    {"mma", {"KILN_ATTENTION_DECODE", "mma"}},
    {"mma4", {"KILN_ATTENTION_DECODE", "mma", "KILN_ATTENTION_DMMA_CTAS", "4"}},
    {"p128", {"KILN_ATTENTION_PIPE_CTAS", "128"}},
    {"p264", {"KILN_ATTENTION_PIPE_CTAS", "264"}},
    {"p1056", {"KILN_ATTENTION_PIPE_CTAS", "1056"}},
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])

/* A decode case: S sequences, lengths lo + (uniform 0..hi - lo), tables
 * `mb` blocks wide (0: the longest sequence's). */
typedef struct decode_case {
    const char *name;
    int64_t S;
    int32_t lo, hi;
    int64_t mb;
} decode_case;

static void bench_decode(kiln_cuda_device *dev, kiln_registry *reg, const decode_case *dc, double copy_bw)
{
    int32_t *lens = malloc((size_t)dc->S * sizeof *lens), longest = 1;
    uint32_t x = 777;
    double tokens = 0;
    for (int64_t s = 0; s < dc->S; s++) {
        x = x * 1664525u + 1013904223u;
        lens[s] = dc->lo + (dc->hi > dc->lo ? (int32_t)((x >> 8) % (uint32_t)(dc->hi - dc->lo + 1)) : 0);
        longest = lens[s] > longest ? lens[s] : longest;
        tokens += lens[s];
    }
    const int64_t mb = dc->mb ? dc->mb : (longest + BS - 1) / BS;
    const double bytes = tokens * NKV * HD * 2 /* k and v */ * (fp8_cache ? 1 : 2) /* E4M3 or bf16 */;
    for (int k = 0; k < (sweep || only_variants ? N_VARIANTS : N_VARIANTS - 3); k++) {
        if (only_variants && !listed(only_variants, variants[k].name))
            continue;
        /* every variant but `default` is kat_pipe's unless it names its kernel */
        if (k > 0)
            setenv("KILN_ATTENTION_DECODE", "pipe", 1);
        for (int i = 0; i < 8 && variants[k].env[i]; i += 2)
            setenv(variants[k].env[i], variants[k].env[i + 1], 1);
        attn_job j;
        attn_setup(&j, dev, reg, dc->S, 1, lens, mb);
        float ms = time_ms(run_attn, &j), gms = time_graph_ms(&j);
        double bw = bytes / (gms * 1e-3);
        printf("%-34s %-7s %10.1f %10.1f %12.1f %9.2f %10.0f%%\n", dc->name, variants[k].name, ms * 1e3, gms * 1e3,
               bytes / 1e6, bw / 1e12, 100.0 * bw / copy_bw);
        attn_free(&j);
        for (int i = 0; i < 8 && variants[k].env[i]; i += 2)
            unsetenv(variants[k].env[i]);
        unsetenv("KILN_ATTENTION_DECODE");
    }
    free(lens);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 5) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--prefill") == 0) {
            prefill_only = 1;
        } else if (strcmp(argv[i], "--fp8") == 0) {
            fp8_cache = 1;
        } else if (strcmp(argv[i], "--sweep") == 0) {
            sweep = 1;
        } else if (strcmp(argv[i], "--variants") == 0 && i + 1 < argc) {
            only_variants = argv[++i];
        } else if (strcmp(argv[i], "--prefill-variants") == 0 && i + 1 < argc) {
            only_prefill = argv[++i];
        } else if (strcmp(argv[i], "--cases") == 0 && i + 1 < argc) {
            only_cases = argv[++i];
        } else {
            fprintf(stderr, "usage: attention_bench [--reps N (>= 5)] [--sweep] [--prefill] [--variants a,b,...] "
                            "[--cases TEXT] [--prefill-variants a,b,...] [--fp8]\n");
            return 2;
        }
    }
    if (only_variants) { /* a name no variant has is a typo, not an empty run */
        int want = 1, have = 0;
        for (const char *c = only_variants; *c; c++)
            want += *c == ',';
        for (int k = 0; k < N_VARIANTS; k++)
            have += listed(only_variants, variants[k].name);
        if (have != want) {
            fprintf(stderr, "attention_bench: --variants %s names a variant that is not one of:", only_variants);
            for (int k = 0; k < N_VARIANTS; k++)
                fprintf(stderr, " %s", variants[k].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    int32_t arch = 0;
    if (!kiln_cuda_available(&arch)) {
        printf("skipped: no CUDA GPU\n");
        return 77;
    }
    kiln_cuda_device *dev = NULL;
    kiln_registry *reg = NULL;
    if (kiln_cuda_device_create(&dev) != KILN_OK || kiln_registry_create(&reg) != KILN_OK) {
        fprintf(stderr, "attention_bench: %s\n", kiln_last_error());
        return 1;
    }
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));

    copy_job cp = {.bytes = (size_t)1 << 30};
    cp.src = dev_alloc(cp.bytes, 0);
    cp.dst = dev_alloc(cp.bytes, 0);
    CU(cudaMemset(cp.src, 1, cp.bytes));
    double copy_bw = 2.0 * (double)cp.bytes / (time_ms(run_copy, &cp) * 1e-3);
    cudaFree(cp.src);
    cudaFree(cp.dst);

    printf("kiln/PagedAttention, Llama-3.1-8B shape: %d query / %d kv heads, head_dim %d, bf16, %s cache, block %d; "
           "sm_%d\n",
           NH, NKV, HD, fp8_cache ? "E4M3" : "bf16", BS, (int)arch);
    printf("device copy (cudaMemcpyAsync D2D 1 GiB, read + written): %.2f TB/s\n\n", copy_bw / 1e12);
    printf("%-34s %-7s %10s %10s %12s %9s %11s\n", "decode (one new token each)", "kernel", "launch us", "graph us",
           "KV read MB", "TB/s", "of copy bw");
    static const decode_case cases[] = {
        {"batch 1, context 136", 1, 136, 136, 0},
        {"batch 1, 136, table for 8448", 1, 136, 136, 8448 / BS},
        {"batch 1, context 1024", 1, 1024, 1024, 0},
        {"batch 1, context 8192", 1, 8192, 8192, 0},
        {"batch 1, 8192, table for 131072", 1, 8192, 8192, 131072 / BS},
        {"batch 64, context 8192", 64, 8192, 8192, 0},
        {"8 sequences, 256..2048", 8, 256, 2048, 0},
        {"16 sequences, 256..2048", 16, 256, 2048, 0},
        {"32 sequences, 256..2048", 32, 256, 2048, 0},
        {"66 sequences, 256..2048", 66, 256, 2048, 0},
        {"128 sequences, 256..2048", 128, 256, 2048, 0},
        {"512 sequences, 1000..2000", 512, 1000, 2000, 0},
        {"1024 sequences, 128..256", 1024, 128, 256, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !prefill_only; i++)
        if (!only_cases || strstr(cases[i].name, only_cases))
            bench_decode(dev, reg, &cases[i], copy_bw);
    printf("(TB/s and of copy bw from the graph time)\n");
    printf("\n%-30s %10s %12s %9s\n", "prefill", "time us", "GFLOP", "TFLOP/s");
    /* one prompt of 512, 2,048 and 8,192 tokens, and 64 prompts of 128 (a
     * step of `kiln bench --throughput`'s prefill at 128 input tokens) */
    const int64_t n_seqs[4] = {1, 1, 1, 64}, lens[4] = {512, 2048, 8192, 128};
    /* kat_prefill's default, and its variants: KILN_ATTENTION_PREFILL (the
     * kernel) and KILN_ATTENTION_PREFILL_ORDER (its grid's order) */
    static const struct {
        const char *name, *kernel, *order;
    } pv[] = {{"default", NULL, NULL}, {"narrow", "narrow", NULL}, {"wide", "wide", NULL}, {"prev", "narrow", "head"}};
    for (int i = 0; i < 4; i++)
        for (int v = 0; v < (int)(sizeof pv / sizeof pv[0]); v++) {
            attn_job j;
            int32_t len[64];
            char name[64];
            snprintf(name, sizeof name, "%s%lld tokens, %s", n_seqs[i] > 1 ? "64 x " : "", (long long)lens[i],
                     pv[v].name);
            if ((only_cases && !strstr(name, only_cases)) || (only_prefill && !listed(only_prefill, pv[v].name)))
                continue;
            for (int s = 0; s < n_seqs[i]; s++)
                len[s] = (int32_t)lens[i];
            if (pv[v].kernel)
                setenv("KILN_ATTENTION_PREFILL", pv[v].kernel, 1);
            else
                unsetenv("KILN_ATTENTION_PREFILL");
            if (pv[v].order)
                setenv("KILN_ATTENTION_PREFILL_ORDER", pv[v].order, 1);
            else
                unsetenv("KILN_ATTENTION_PREFILL_ORDER");
            attn_setup(&j, dev, reg, n_seqs[i], lens[i], len, (lens[i] + BS - 1) / BS);
            float ms = time_ms(run_attn, &j);
            double pairs = (double)n_seqs[i] * (double)lens[i] * (double)(lens[i] + 1) / 2.0;
            double flop = 4.0 * NH * HD * pairs;
            printf("%-30s %10.1f %12.2f %9.1f\n", name, ms * 1e3, flop / 1e9, flop / (ms * 1e-3) / 1e12);
            attn_free(&j);
        }
    unsetenv("KILN_ATTENTION_PREFILL_ORDER");
    unsetenv("KILN_ATTENTION_PREFILL");
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaStreamDestroy(stream);
    kiln_registry_destroy(reg);
    kiln_cuda_device_destroy(dev);
    return 0;
}
