/* attention_bench: kiln/PagedAttention on the GPU at the Llama-3.1-8B shape
 * (32 query heads, 8 kv heads, head_dim 128, bf16, KV blocks of 16 tokens).
 *
 *   attention_bench [--reps N]
 *
 * Decode (one new token per sequence, every sequence 8192 tokens long) at
 * batch 1 and 64: the step's time (cache write, attention, split combine)
 * and the KV-cache bytes it must read over that time, as a fraction of the
 * device-to-device copy bandwidth measured in the same run (bytes read +
 * written). Prefill of one 512- and one 2048-token prompt: causal attention
 * FLOPs (4 * heads * head_dim per query-key pair at or before the query)
 * per second. Every figure is the median of --reps (default 50) runs timed
 * with CUDA events after warm-up. Needs a GPU (exits 77 without one). */
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
static int reps = 50;

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

/* One attention step: the plugin layer with its inputs on the device. */
typedef struct attn_job {
    kiln_cuda_device *dev;
    kiln_plugin *pl;
    kiln_layer layer;
    kiln_exec_tensor in[7], out;
    void *ws;
} attn_job;

static void run_attn(void *arg)
{
    attn_job *j = arg;
    kiln_cuda_args a = {.layer = &j->layer,
                        .inputs = j->in,
                        .outputs = &j->out,
                        .plugin = j->pl,
                        .workspace = j->ws,
                        .device = j->dev,
                        .stream = stream};
    if (kiln_cuda_run_layer(&a) != KILN_OK) {
        fprintf(stderr, "attention_bench: %s\n", kiln_last_error());
        exit(1);
    }
}

static void *dev_alloc(size_t bytes, int fill_random)
{
    void *d = NULL;
    CU(cudaMalloc(&d, bytes));
    if (fill_random) {
        /* small bf16 values (exponent of 0.5..1, random mantissa and sign) */
        uint16_t *h = malloc(bytes);
        uint32_t x = 12345;
        for (size_t i = 0; i < bytes / 2; i++) {
            x = x * 1664525u + 1013904223u;
            h[i] = (uint16_t)(0x3f00u | ((x >> 16) & 0x807fu));
        }
        CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
        free(h);
    }
    return d;
}

/* Sets up S sequences of `len` tokens, `n_new` of them new this step. */
static void attn_setup(attn_job *j, kiln_cuda_device *dev, kiln_registry *reg, int64_t S, int64_t n_new, int64_t len)
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
    const int64_t T = S * n_new, mb = (len + BS - 1) / BS, nb = S * mb;
    int32_t *table = malloc((size_t)(S * mb) * sizeof *table), *lens = malloc((size_t)S * sizeof *lens);
    int32_t *qs = malloc((size_t)(S + 1) * sizeof *qs);
    for (int64_t i = 0; i < S * mb; i++)
        table[i] = (int32_t)i;
    for (int64_t s = 0; s < S; s++) {
        lens[s] = (int32_t)len;
        qs[s] = (int32_t)(s * n_new);
    }
    qs[S] = (int32_t)T;
    kiln_dims dq = {.rank = 2, .d = {T, NH * HD}}, dk = {.rank = 2, .d = {T, NKV * HD}};
    kiln_dims dc = {.rank = 5, .d = {nb, 2, NKV, BS, HD}}, dt = {.rank = 2, .d = {S, mb}};
    kiln_dims ds = {.rank = 1, .d = {S}}, dqs = {.rank = 1, .d = {S + 1}};
    j->in[0] = (kiln_exec_tensor){dev_alloc((size_t)(T * NH * HD) * 2, 1), KILN_DTYPE_BF16, dq};
    j->in[1] = (kiln_exec_tensor){dev_alloc((size_t)(T * NKV * HD) * 2, 1), KILN_DTYPE_BF16, dk};
    j->in[2] = (kiln_exec_tensor){dev_alloc((size_t)(T * NKV * HD) * 2, 1), KILN_DTYPE_BF16, dk};
    j->in[3] = (kiln_exec_tensor){dev_alloc((size_t)(nb * 2 * NKV * BS * HD) * 2, 1), KILN_DTYPE_BF16, dc};
    j->in[4] = (kiln_exec_tensor){dev_alloc((size_t)(S * mb) * 4, 0), KILN_DTYPE_I32, dt};
    j->in[5] = (kiln_exec_tensor){dev_alloc((size_t)S * 4, 0), KILN_DTYPE_I32, ds};
    j->in[6] = (kiln_exec_tensor){dev_alloc((size_t)(S + 1) * 4, 0), KILN_DTYPE_I32, dqs};
    CU(cudaMemcpy(j->in[4].data, table, (size_t)(S * mb) * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(j->in[5].data, lens, (size_t)S * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(j->in[6].data, qs, (size_t)(S + 1) * 4, cudaMemcpyHostToDevice));
    j->out = (kiln_exec_tensor){dev_alloc((size_t)(T * NH * HD) * 2, 0), KILN_DTYPE_BF16, dq};
    kiln_tensor_desc d[8];
    for (int i = 0; i < 8; i++)
        d[i] = (kiln_tensor_desc){.struct_size = sizeof(kiln_tensor_desc),
                                  .abi_version = KILN_PLUGIN_ABI_VERSION,
                                  .dtype = i < 7 ? j->in[i].dtype : j->out.dtype,
                                  .format = KILN_FORMAT_LINEAR,
                                  .dims = i < 7 ? j->in[i].dims : j->out.dims};
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
    free(lens);
    free(qs);
}

static void attn_free(attn_job *j)
{
    for (int i = 0; i < 7; i++)
        cudaFree(j->in[i].data);
    cudaFree(j->out.data);
    cudaFree(j->ws);
    j->pl->ops->destroy(j->pl);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 5) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: attention_bench [--reps N (>= 5)]\n");
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

    printf("kiln/PagedAttention, Llama-3.1-8B shape: %d query / %d kv heads, head_dim %d, bf16, block %d; sm_%d\n", NH,
           NKV, HD, BS, (int)arch);
    printf("device copy (cudaMemcpyAsync D2D 1 GiB, read + written): %.2f TB/s\n\n", copy_bw / 1e12);
    printf("%-26s %10s %12s %9s %11s\n", "decode", "time us", "KV read MB", "TB/s", "of copy bw");
    const int64_t ctx = 8192, batches[2] = {1, 64};
    for (int b = 0; b < 2; b++) {
        attn_job j;
        attn_setup(&j, dev, reg, batches[b], 1, ctx);
        float ms = time_ms(run_attn, &j);
        double bytes = (double)batches[b] * ctx * NKV * HD * 2 /* k and v */ * 2 /* bf16 */;
        double bw = bytes / (ms * 1e-3);
        char name[64];
        snprintf(name, sizeof name, "batch %lld, context %lld", (long long)batches[b], (long long)ctx);
        printf("%-26s %10.1f %12.1f %9.2f %10.0f%%\n", name, ms * 1e3, bytes / 1e6, bw / 1e12, 100.0 * bw / copy_bw);
        attn_free(&j);
    }
    printf("\n%-26s %10s %12s %9s\n", "prefill (one prompt)", "time us", "GFLOP", "TFLOP/s");
    const int64_t lens[2] = {512, 2048};
    for (int i = 0; i < 2; i++) {
        attn_job j;
        attn_setup(&j, dev, reg, 1, lens[i], lens[i]);
        float ms = time_ms(run_attn, &j);
        double pairs = (double)lens[i] * (double)(lens[i] + 1) / 2.0;
        double flop = 4.0 * NH * HD * pairs;
        char name[64];
        snprintf(name, sizeof name, "%lld tokens", (long long)lens[i]);
        printf("%-26s %10.1f %12.2f %9.1f\n", name, ms * 1e3, flop / 1e9, flop / (ms * 1e-3) / 1e12);
        attn_free(&j);
    }
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaStreamDestroy(stream);
    kiln_registry_destroy(reg);
    kiln_cuda_device_destroy(dev);
    return 0;
}
