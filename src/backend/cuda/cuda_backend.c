/* The CUDA backend's device (cuBLASLt handle, workspace, error word),
 * plugin dispatch and the layer dispatch to the op families' entries
 * (cuda_ops.h). Launches only: nothing here allocates device memory or
 * synchronizes once a device exists, except kiln_cuda_device_check's reset
 * after an error, which runs outside enqueue. */
#ifdef KILN_HAVE_CUDA

#include "backend/cuda/cuda_ops.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- the device ------------------------------------------------------------------------ */

int kiln_cuda_available(int32_t *arch)
{
    int n = 0, dev = 0, major = 0, minor = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* no GPU is not an error for later calls */
        return 0;
    }
    if (arch)
        *arch = 10 * major + minor;
    return 1;
}

kiln_status kiln_cuda_device_create(kiln_cuda_device **out)
{
    const char *who = "CUDA device";
    int32_t arch = 0;
    if (!kiln_cuda_available(&arch))
        return kiln_fail(KILN_ERROR_TARGET, "no CUDA GPU is available");
    kiln_cuda_device *d = calloc(1, sizeof *d);
    if (!d)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a CUDA device");
    d->arch = arch;
    /* KILN_CUDA_PDL=0 launches without programmatic dependent launch: for
     * timing both ways, and a way out should a driver mishandle it. */
    const char *pdl = getenv("KILN_CUDA_PDL");
    kcu_set_pdl(!(pdl && strcmp(pdl, "0") == 0));
    kcu_gemv_set_pdl(!(pdl && strcmp(pdl, "0") == 0));
    const char *gemv = getenv("KILN_CUDA_GEMV"), *rows = getenv("KILN_CUDA_GEMV_ROWS");
    d->gemv = !(gemv && strcmp(gemv, "0") == 0);
    kcu_gemv_set_rows(rows ? (int32_t)atoi(rows) : 2);
    kiln_status st = KILN_OK;
    cudaError_t e = cudaGetDevice(&d->ordinal);
    int sms = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d->ordinal);
    int l2 = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, d->ordinal);
    if (e == cudaSuccess)
        e = cudaMalloc(&d->lt_workspace, KILN_CUDA_CUBLASLT_WORKSPACE);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&d->err, sizeof *d->err);
    if (e == cudaSuccess)
        e = cudaMemset(d->err, 0, sizeof *d->err);
    if (e == cudaSuccess)
        e = cudaHostAlloc((void **)&d->report, sizeof *d->report, cudaHostAllocMapped);
    if (e == cudaSuccess) {
        memset(d->report, 0, sizeof *d->report);
        e = cudaHostGetDevicePointer((void **)&d->report_dev, d->report, 0);
    }
    if (e != cudaSuccess) {
        st = kiln_fail(KILN_ERROR_BACKEND, "%s: setup failed: %s", who, cudaGetErrorString(e));
    } else {
        cublasStatus_t ls = cublasLtCreate(&d->lt);
        if (ls != CUBLAS_STATUS_SUCCESS) {
            d->lt = NULL;
            st = kiln_fail(KILN_ERROR_BACKEND, "%s: cublasLtCreate failed: cuBLAS status %d", who, (int)ls);
        }
    }
    d->sms = sms;
    d->l2_bytes = l2;
    if (st == KILN_OK)
        st = kiln_cuda_matmul_cache_create(d);
    if (st != KILN_OK) {
        kiln_cuda_device_destroy(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

#ifdef KILN_CUDA_TIMELINE
/* The kernel timeline's rings (timeline.cuh), one per .cu file, registered
 * when the library loads and written to $KILN_TIMELINE when the first
 * device is destroyed. */
#include <stdio.h>
static struct {
    const char *module;
    int (*dump)(FILE *f, const char *module);
} timeline_rings[64];
static int timeline_n;

void kiln_cuda_timeline_add(const char *module, int (*dump)(FILE *f, const char *module))
{
    if (timeline_n < (int)(sizeof timeline_rings / sizeof timeline_rings[0]))
        timeline_rings[timeline_n].module = module, timeline_rings[timeline_n++].dump = dump;
}

static void timeline_write(void)
{
    static int written; /* once a process: the rings outlive devices */
    const char *path = getenv("KILN_TIMELINE");
    FILE *f = !written && path && *path ? fopen(path, "w") : NULL;
    if (!f)
        return;
    written = 1;
    for (int i = 0; i < timeline_n; i++)
        if (timeline_rings[i].dump(f, timeline_rings[i].module) != 0)
            fprintf(stderr, "kiln: timeline of %s not read\n", timeline_rings[i].module);
    fclose(f);
}
#endif

void kiln_cuda_device_destroy(kiln_cuda_device *dev)
{
    if (!dev)
        return;
#ifdef KILN_CUDA_TIMELINE
    timeline_write();
#endif
    kiln_cuda_matmul_cache_destroy(dev);
    if (dev->lt)
        cublasLtDestroy(dev->lt);
    cudaFree(dev->lt_workspace);
    cudaFree(dev->err);
    if (dev->report)
        cudaFreeHost(dev->report);
    free(dev);
}

kiln_status kiln_cuda_device_check(kiln_cuda_device *dev, const kiln_graph *graph)
{
    if (!dev)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_device_check: no device");
    volatile kcu_error_word *r = dev->report;
    if (!r->flag)
        return KILN_OK;
    const kcu_error_word w = {r->flag, r->layer, r->index, r->position};
    CU_CHECK("CUDA device", cudaMemset(dev->err, 0, sizeof *dev->err));
    r->flag = 0;
    const char *name = graph && w.layer >= 0 && w.layer < graph->n_layers && graph->layers[w.layer].name
                           ? graph->layers[w.layer].name
                           : "?";
    return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                     "layer \"%s\": gather index %lld at position %lld is out of range (clamped on the GPU)", name,
                     (long long)w.index, (long long)w.position);
}

/* ---- plugins ---------------------------------------------------------------------------------------- */

static kiln_status run_plugin(const kiln_cuda_args *a)
{
    return kiln_layer_run_plugin(layer_name(a), a->plugin, KILN_BACKEND_CUDA, a->layer, a->inputs, a->outputs,
                                 a->workspace, a->stream);
}

/* ---- dispatch --------------------------------------------------------------------------------------- */

kiln_status kiln_cuda_run_layer(const kiln_cuda_args *args)
{
    if (!args || !args->layer)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_run_layer: no layer");
    const kiln_layer *l = args->layer;
    if (!args->device)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": no CUDA device", layer_name(args));
    if ((l->n_inputs > 0 && !args->inputs) || (l->n_outputs > 0 && !args->outputs) || l->n_outputs < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": missing input or output tensors",
                         layer_name(args));
    switch (l->op) {
    case KILN_OP_MATMUL: return cuda_run_matmul(args);
    case KILN_OP_BINARY: return cuda_run_binary(args);
    case KILN_OP_UNARY: return cuda_run_unary(args);
    case KILN_OP_REDUCE: return cuda_run_reduce(args);
    case KILN_OP_SOFTMAX: return cuda_run_softmax(args);
    case KILN_OP_CONCAT: return cuda_run_concat(args);
    case KILN_OP_SLICE: return cuda_run_slice(args);
    case KILN_OP_SHUFFLE: return cuda_run_shuffle(args);
    case KILN_OP_GATHER: return cuda_run_gather(args);
    case KILN_OP_CAST: return cuda_run_cast(args);
    case KILN_OP_PLUGIN: return run_plugin(args);
    case KILN_OP_FUSED: return cuda_run_fused(args);
    default:
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": op %d is not executed by the CUDA backend",
                         layer_name(args), (int)l->op);
    }
}

#endif
