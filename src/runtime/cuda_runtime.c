/* The CUDA side of engines and contexts: the target check, constants on the
 * device once per engine, device blocks for the engine's pool, and per
 * context a stream, pinned staging, CUDA-graph capture and replay, and
 * event timing. enqueue only launches: every allocation happens at engine
 * load, context creation, a shape change or a staging copy. */
#ifdef KILN_HAVE_CUDA

#include "runtime_internal.h"

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../backend/cuda/cuda_backend.h"
#include "../core/error.h"

static kiln_status cuda_failed(cudaError_t err, const char *call, const char *file, int line)
{
    return kiln_fail(KILN_ERROR_BACKEND, "%s failed: %s (%s:%d)", call, cudaGetErrorString(err),
                     file, line);
}

#define CU(call)                                                        \
    do {                                                                \
        cudaError_t cu_err_ = (call);                                   \
        if (cu_err_ != cudaSuccess)                                     \
            return cuda_failed(cu_err_, #call, __FILE__, __LINE__);     \
    } while (0)

#define CONST_ALIGN 256u

/* ---- target --------------------------------------------------------------------------- */

static void format_archs(const kiln_engine_header_info *info, char *buf, size_t size)
{
    size_t len = 0;
    int32_t n = info->n_gpu_archs < 0 || info->n_gpu_archs > 8 ? 0 : info->n_gpu_archs;
    buf[0] = '\0';
    for (int32_t i = 0; i < n && len < size; i++) {
        int w = snprintf(buf + len, size - len, "%ssm_%d", i ? ", " : "", (int)info->gpu_archs[i]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    if (n == 0)
        snprintf(buf, size, "no GPU architecture recorded");
}

/* Whether this library carries PTX for `arch`: KILN_CUDA_ARCHITECTURES is
 * CMake's list, where "90" means sm_90 code plus compute_90 PTX,
 * "90-real" code only and "90-virtual" PTX only. */
static int library_has_ptx(int32_t arch)
{
    const char *p = KILN_CUDA_ARCHITECTURES;
    while (*p) {
        while (*p == ';' || *p == ',' || *p == ' ')
            p++;
        char *end;
        long v = strtol(p, &end, 10);
        const char *stop = end;
        while (*stop && *stop != ';' && *stop != ',' && *stop != ' ')
            stop++;
        int real_only = (size_t)(stop - end) == 5 && strncmp(end, "-real", 5) == 0;
        if (end != p && v == arch && !real_only)
            return 1;
        if (stop == p)
            break;
        p = stop;
    }
    return 0;
}

kiln_status kiln_cuda_check_target(const kiln_engine_header_info *info)
{
    char archs[128];
    format_archs(info, archs, sizeof archs);
    int32_t gpu = 0;
    if (!kiln_cuda_available(&gpu))
        return kiln_fail(KILN_ERROR_TARGET, "engine targets cuda (%s), but no CUDA GPU is available",
                         archs);
    int32_t n = info->n_gpu_archs < 0 || info->n_gpu_archs > 8 ? 0 : info->n_gpu_archs;
    for (int32_t i = 0; i < n; i++)
        if (info->gpu_archs[i] == gpu)
            return KILN_OK;
    /* PTX for an older architecture is compiled for this GPU by the driver. */
    for (int32_t i = 0; i < n; i++)
        if (info->gpu_archs[i] < gpu && library_has_ptx(info->gpu_archs[i])) {
            kiln_log(KILN_LOG_INFO, "engine holds %s, this GPU is sm_%d: running its PTX", archs,
                     (int)gpu);
            return KILN_OK;
        }
    return kiln_fail(KILN_ERROR_TARGET, "engine holds %s, this GPU is sm_%d", archs, (int)gpu);
}

/* ---- engine ------------------------------------------------------------------------------ */

struct kiln_cuda_engine {
    kiln_cuda_device *device;
    void *constants;       /* one device allocation holding every constant */
    void **constant_ptr;   /* graph.n_tensors; device address of each constant */
};

void kiln_cuda_engine_destroy(kiln_engine *e)
{
    kiln_cuda_engine *c = e->cuda;
    if (!c)
        return;
    if (c->constants)
        cudaFree(c->constants);
    kiln_cuda_device_destroy(c->device);
    free(c->constant_ptr);
    free(c);
    e->cuda = NULL;
}

static kiln_status upload_constants(kiln_engine *e)
{
    kiln_cuda_engine *c = e->cuda;
    const kiln_graph *g = &e->graph;
    size_t total = 0;
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        if (!(r->flags & KILN_TENSOR_CONSTANT))
            continue;
        size_t padded;
        if (kiln_add_overflow(total, r->data_size, &padded) ||
            kiln_add_overflow(padded, CONST_ALIGN - 1, &padded))
            return kiln_fail(KILN_ERROR_FORMAT, "constants overflow at \"%s\"", r->name);
        total = padded & ~(size_t)(CONST_ALIGN - 1);
    }
    CU(cudaMalloc(&c->constants, total ? total : 1));
    size_t at = 0;
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        if (!(r->flags & KILN_TENSOR_CONSTANT))
            continue;
        c->constant_ptr[t] = (unsigned char *)c->constants + at;
        if (r->data_size)
            CU(cudaMemcpy(c->constant_ptr[t], r->data, r->data_size, cudaMemcpyHostToDevice));
        at = (at + r->data_size + CONST_ALIGN - 1) & ~(size_t)(CONST_ALIGN - 1);
    }
    kiln_log(KILN_LOG_INFO, "cuda: %zu bytes of constants on the device", total);
    return KILN_OK;
}

kiln_status kiln_cuda_engine_create(kiln_engine *e)
{
    kiln_cuda_engine *c = calloc(1, sizeof *c);
    if (!c)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory loading a cuda engine");
    e->cuda = c;
    c->constant_ptr = calloc(e->graph.n_tensors > 0 ? (size_t)e->graph.n_tensors : 1,
                             sizeof *c->constant_ptr);
    kiln_status s = c->constant_ptr ? KILN_OK
                                    : kiln_fail(KILN_ERROR_OUT_OF_MEMORY,
                                                "out of memory loading a cuda engine");
    if (s == KILN_OK)
        s = kiln_cuda_device_create(&c->device);
    if (s == KILN_OK)
        s = upload_constants(e);
    if (s != KILN_OK)
        kiln_cuda_engine_destroy(e);
    return s;
}

void *kiln_cuda_engine_constant(const kiln_engine *e, int32_t t) { return e->cuda->constant_ptr[t]; }

void *kiln_cuda_block_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

void kiln_cuda_block_free(void *block) { cudaFree(block); }

/* ---- context ------------------------------------------------------------------------------ */

/* A graph captured for one set of input shapes and I/O addresses. */
typedef struct graph_entry {
    int64_t *symbols;          /* graph.n_symbols */
    void **addr;               /* engine n_io: device address of each I/O tensor */
    cudaGraphExec_t exec;      /* NULL: slot empty */
    uint64_t last_use;
} graph_entry;

/* Shapes a context alternates between (e.g. prefill and decode) stay
 * captured; a fifth evicts the least recently used. */
#define GRAPH_CACHE 4

/* The arguments of the host callback that finishes a staged output copy. */
typedef struct staged_output {
    void *host;
    const void *staging;
    size_t bytes;
} staged_output;

struct kiln_cuda_context {
    cudaStream_t stream;
    cudaEvent_t start, stop;   /* around the last enqueue's launches */
    int32_t timed;             /* start/stop describe the last enqueue */
    cudaEvent_t *layer_events; /* graph.n_layers + 1 when profiling */
    int32_t profiled;          /* layer_events describe the last enqueue */
    int32_t graph_mode;
    graph_entry graphs[GRAPH_CACHE];
    uint64_t uses;
    /* pinned staging per tensor (only I/O tensors get one) */
    void **staging;
    size_t *staging_bytes;
    cudaEvent_t *staging_done; /* the last copy through the buffer */
    staged_output *pending;
    unsigned char *host_block; /* host copy of the block for reference runs */
    void **host_io;            /* host copies of the I/O tensors for reference runs */
    size_t *host_io_bytes;
};

static void drop_graphs(kiln_cuda_context *c)
{
    /* An executable graph still running is freed when it completes. */
    for (int i = 0; i < GRAPH_CACHE; i++)
        if (c->graphs[i].exec) {
            cudaGraphExecDestroy(c->graphs[i].exec);
            c->graphs[i].exec = NULL;
        }
}

void kiln_cuda_context_destroy(kiln_context *ctx)
{
    kiln_cuda_context *c = ctx->cuda;
    if (!c)
        return;
    const kiln_graph *g = &ctx->engine->graph;
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    drop_graphs(c);
    for (int i = 0; i < GRAPH_CACHE; i++) {
        free(c->graphs[i].symbols);
        free(c->graphs[i].addr);
    }
    if (c->layer_events)
        for (int32_t l = 0; l <= g->n_layers; l++)
            if (c->layer_events[l])
                cudaEventDestroy(c->layer_events[l]);
    free(c->layer_events);
    for (int32_t t = 0; c->staging && t < g->n_tensors; t++) {
        if (c->staging[t])
            cudaFreeHost(c->staging[t]);
        if (c->staging_done[t])
            cudaEventDestroy(c->staging_done[t]);
    }
    free(c->staging);
    free(c->staging_bytes);
    free(c->staging_done);
    free(c->pending);
    if (c->start)
        cudaEventDestroy(c->start);
    if (c->stop)
        cudaEventDestroy(c->stop);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    if (c->host_block)
        munmap(c->host_block, ctx->engine->pool.block_bytes ? ctx->engine->pool.block_bytes : 1);
    for (int32_t t = 0; c->host_io && t < g->n_tensors; t++)
        free(c->host_io[t]);
    free(c->host_io);
    free(c->host_io_bytes);
    free(c);
    ctx->cuda = NULL;
}

static kiln_status context_init(kiln_context *ctx)
{
    kiln_cuda_context *c = ctx->cuda;
    const kiln_engine *e = ctx->engine;
    size_t nt = e->graph.n_tensors > 0 ? (size_t)e->graph.n_tensors : 1;
    size_t ns = e->graph.n_symbols > 0 ? (size_t)e->graph.n_symbols : 1;
    size_t nio = e->n_io > 0 ? (size_t)e->n_io : 1;
    c->staging = calloc(nt, sizeof *c->staging);
    c->staging_bytes = calloc(nt, sizeof *c->staging_bytes);
    c->staging_done = calloc(nt, sizeof *c->staging_done);
    c->pending = calloc(nt, sizeof *c->pending);
    c->host_io = calloc(nt, sizeof *c->host_io);
    c->host_io_bytes = calloc(nt, sizeof *c->host_io_bytes);
    if (!c->staging || !c->staging_bytes || !c->staging_done || !c->pending || !c->host_io ||
        !c->host_io_bytes)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory creating a cuda context");
    for (int i = 0; i < GRAPH_CACHE; i++) {
        c->graphs[i].symbols = calloc(ns, sizeof *c->graphs[i].symbols);
        c->graphs[i].addr = calloc(nio, sizeof *c->graphs[i].addr);
        if (!c->graphs[i].symbols || !c->graphs[i].addr)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory creating a cuda context");
    }
    CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CU(cudaEventCreate(&c->start));
    CU(cudaEventCreate(&c->stop));
    return KILN_OK;
}

kiln_status kiln_cuda_context_create(kiln_context *ctx)
{
    if (!(ctx->cuda = calloc(1, sizeof *ctx->cuda)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory creating a cuda context");
    kiln_status s = context_init(ctx);
    if (s != KILN_OK)
        kiln_cuda_context_destroy(ctx);
    return s;
}

/* A host pointer bound on a cuda engine would fault inside a kernel; say
 * so here, naming the tensor. */
kiln_status kiln_cuda_check_binding(const char *name, void *ptr)
{
    struct cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return cuda_failed(err, "cudaPointerGetAttributes", __FILE__, __LINE__);
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "tensor \"%s\": %p is not device memory; a cuda engine binds device "
                         "pointers (host data goes through kiln_context_copy_input)",
                         name, ptr);
    return KILN_OK;
}

/* ---- staging ------------------------------------------------------------------------------ */

static void *io_address(const kiln_context *ctx, int32_t t)
{
    return ctx->bound[t] ? ctx->bound[t] : kiln_context_tensor_data(ctx, t);
}

/* Replaces tensor t's staging buffer with one of `bytes`, once the last
 * copy through the old one has finished. */
static kiln_status grow_staging(kiln_context *ctx, int32_t t, size_t bytes)
{
    kiln_cuda_context *c = ctx->cuda;
    if (!c->staging_done[t])
        CU(cudaEventCreateWithFlags(&c->staging_done[t], cudaEventDisableTiming));
    CU(cudaEventSynchronize(c->staging_done[t]));
    if (c->staging[t]) {
        CU(cudaFreeHost(c->staging[t]));
        c->staging[t] = NULL;
        c->staging_bytes[t] = 0;
    }
    CU(cudaHostAlloc(&c->staging[t], bytes, cudaHostAllocDefault));
    c->staging_bytes[t] = bytes;
    return KILN_OK;
}

kiln_status kiln_cuda_context_shapes_changed(kiln_context *ctx)
{
    kiln_cuda_context *c = ctx->cuda;
    const kiln_graph *g = &ctx->engine->graph;
    for (int32_t t = 0; t < g->n_tensors; t++) {
        size_t bytes;
        if (!c->staging[t] || kiln_dims_bytes(&ctx->dims[t], g->tensors[t].dtype, &bytes) != KILN_OK)
            continue;
        if (bytes > c->staging_bytes[t])
            KILN_TRY(grow_staging(ctx, t, bytes));
    }
    return KILN_OK;
}

static void CUDART_CB finish_output(void *arg)
{
    const staged_output *o = arg;
    memcpy(o->host, o->staging, o->bytes);
}

kiln_status kiln_cuda_context_copy(kiln_context *ctx, int32_t t, void *host, size_t bytes,
                                   int to_device)
{
    kiln_cuda_context *c = ctx->cuda;
    if (!bytes)
        return KILN_OK;
    if (bytes > c->staging_bytes[t])
        KILN_TRY(grow_staging(ctx, t, bytes));
    /* The staging buffer is reused only after the last copy through it. */
    CU(cudaEventSynchronize(c->staging_done[t]));
    void *dev = io_address(ctx, t);
    if (to_device) {
        memcpy(c->staging[t], host, bytes);
        CU(cudaMemcpyAsync(dev, c->staging[t], bytes, cudaMemcpyHostToDevice, c->stream));
    } else {
        CU(cudaMemcpyAsync(c->staging[t], dev, bytes, cudaMemcpyDeviceToHost, c->stream));
        c->pending[t] = (staged_output){host, c->staging[t], bytes};
        CU(cudaLaunchHostFunc(c->stream, finish_output, &c->pending[t]));
    }
    CU(cudaEventRecord(c->staging_done[t], c->stream));
    return KILN_OK;
}

/* ---- launching ---------------------------------------------------------------------------- */

static const char *layer_what(const kiln_graph *g, const kiln_layer *L)
{
    return L->op == KILN_OP_PLUGIN ? g->plugins[L->p.plugin.index].name : kiln_op_name(L->op);
}

/* Launches every layer on s. While capturing, a launch that invalidates the
 * capture is reported with the layer that made it. */
static kiln_status launch_layers(kiln_context *ctx, cudaStream_t s, cudaEvent_t *events,
                                 int capturing)
{
    const kiln_engine *e = ctx->engine;
    const kiln_graph *g = &e->graph;
    if (events)
        CU(cudaEventRecord(events[0], s));
    for (int32_t l = 0; l < g->n_layers; l++) {
        const kiln_layer *L = &g->layers[l];
        if (L->op != KILN_OP_CONSTANT) {
            for (int32_t i = 0; i < L->n_inputs; i++) {
                int32_t t = L->inputs[i];
                ctx->in_args[i] = (kiln_exec_tensor){kiln_context_tensor_data(ctx, t),
                                                     g->tensors[t].dtype, ctx->dims[t]};
            }
            for (int32_t i = 0; i < L->n_outputs; i++) {
                int32_t t = L->outputs[i];
                ctx->out_args[i] = (kiln_exec_tensor){kiln_context_tensor_data(ctx, t),
                                                      g->tensors[t].dtype, ctx->dims[t]};
            }
            kiln_cuda_args args = {
                .graph = g,
                .layer = L,
                .inputs = ctx->in_args,
                .outputs = ctx->out_args,
                .plugin = L->op == KILN_OP_PLUGIN ? ctx->plugins[L->p.plugin.index] : NULL,
                .workspace = ctx->block + e->workspace_offset,
                .device = e->cuda->device,
                .stream = s,
            };
            nvtxRangePushA(L->name);
            kiln_status st = kiln_cuda_run_layer(&args);
            nvtxRangePop();
            cudaError_t err = cudaGetLastError();
            if (st != KILN_OK)
                return capturing ? kiln_fail_context(st, "CUDA graph capture broke at layer \"%s\" (%s)",
                                                     L->name, layer_what(g, L))
                                 : st;
            if (capturing) {
                enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
                cudaError_t qerr = cudaStreamIsCapturing(s, &cs);
                if (err != cudaSuccess || qerr != cudaSuccess || cs != cudaStreamCaptureStatusActive)
                    return kiln_fail(KILN_ERROR_BACKEND,
                                     "CUDA graph capture broke at layer \"%s\" (%s): %s", L->name,
                                     layer_what(g, L),
                                     cudaGetErrorString(err != cudaSuccess ? err
                                                        : qerr != cudaSuccess ? qerr
                                                        : cudaErrorStreamCaptureInvalidated));
            } else if (err != cudaSuccess) {
                return kiln_fail(KILN_ERROR_BACKEND, "layer \"%s\" (%s): launch failed: %s",
                                 L->name, layer_what(g, L), cudaGetErrorString(err));
            }
        }
        if (events)
            CU(cudaEventRecord(events[l + 1], s));
    }
    /* An output the builder folded to a constant has no producing layer;
     * memory bound for it still receives the values. */
    for (int32_t i = 0; i < g->n_outputs; i++) {
        int32_t t = g->outputs[i];
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes;
        void *src = kiln_context_tensor_data(ctx, t);
        if ((r->flags & KILN_TENSOR_CONSTANT) && ctx->bound[t] && ctx->bound[t] != src &&
            kiln_dims_bytes(&ctx->dims[t], r->dtype, &bytes) == KILN_OK && bytes)
            CU(cudaMemcpyAsync(ctx->bound[t], src, bytes, cudaMemcpyDeviceToDevice, s));
    }
    return KILN_OK;
}

/* ---- CUDA graphs -------------------------------------------------------------------------- */

static int entry_matches(const kiln_context *ctx, const graph_entry *en)
{
    const kiln_engine *e = ctx->engine;
    if (!en->exec)
        return 0;
    for (int32_t s = 0; s < e->graph.n_symbols; s++)
        if (en->symbols[s] != ctx->symbols[s])
            return 0;
    for (int32_t i = 0; i < e->n_io; i++)
        if (en->addr[i] != io_address(ctx, e->io[i]))
            return 0;
    return 1;
}

static kiln_status capture(kiln_context *ctx, cudaStream_t s, graph_entry *en)
{
    const kiln_engine *e = ctx->engine;
    /* Thread-local: another thread creating a context (cudaMalloc) while
     * this one captures must not break either. */
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    kiln_status st = launch_layers(ctx, s, NULL, 1);
    cudaGraph_t graph = NULL;
    cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (st == KILN_OK && end != cudaSuccess)
        st = kiln_fail(KILN_ERROR_BACKEND, "ending the CUDA graph capture failed: %s",
                       cudaGetErrorString(end));
    cudaGetLastError();
    if (st == KILN_OK) {
        cudaError_t err = cudaGraphInstantiate(&en->exec, graph, 0);
        if (err != cudaSuccess) {
            en->exec = NULL;
            st = cuda_failed(err, "cudaGraphInstantiate", __FILE__, __LINE__);
        }
    }
    if (graph)
        cudaGraphDestroy(graph);
    if (st != KILN_OK)
        return st;
    memcpy(en->symbols, ctx->symbols, sizeof *en->symbols * (size_t)e->graph.n_symbols);
    for (int32_t i = 0; i < e->n_io; i++)
        en->addr[i] = io_address(ctx, e->io[i]);
    kiln_log(KILN_LOG_INFO, "cuda: captured a graph of %d layers", (int)e->graph.n_layers);
    return KILN_OK;
}

static kiln_status enqueue_graph(kiln_context *ctx, cudaStream_t s)
{
    kiln_cuda_context *c = ctx->cuda;
    graph_entry *en = NULL;
    for (int i = 0; i < GRAPH_CACHE && !en; i++)
        if (entry_matches(ctx, &c->graphs[i]))
            en = &c->graphs[i];
    if (!en) {
        /* An empty slot, else the least recently used. */
        en = &c->graphs[0];
        for (int i = 1; i < GRAPH_CACHE && en->exec; i++)
            if (!c->graphs[i].exec || c->graphs[i].last_use < en->last_use)
                en = &c->graphs[i];
        if (en->exec) {
            cudaGraphExecDestroy(en->exec);
            en->exec = NULL;
        }
        KILN_TRY(capture(ctx, s, en));
    }
    en->last_use = ++c->uses;
    CU(cudaEventRecord(c->start, s));
    CU(cudaGraphLaunch(en->exec, s));
    CU(cudaEventRecord(c->stop, s));
    c->timed = 1;
    return KILN_OK;
}

kiln_status kiln_cuda_context_set_graph(kiln_context *ctx, int32_t enable)
{
    kiln_cuda_context *c = ctx->cuda;
    const kiln_graph *g = &ctx->engine->graph;
    if (enable)
        for (int32_t l = 0; l < g->n_layers; l++) {
            const kiln_layer *L = &g->layers[l];
            if (L->op != KILN_OP_PLUGIN)
                continue;
            const kiln_plugin *p = ctx->plugins[L->p.plugin.index];
            if (!(p->ops->flags & KILN_PLUGIN_FLAG_CAPTURE_SAFE))
                return kiln_fail(KILN_ERROR_UNSUPPORTED,
                                 "CUDA graphs are off for this engine: plugin \"%s\" (layer \"%s\") "
                                 "is not marked capture-safe",
                                 g->plugins[L->p.plugin.index].name, L->name);
        }
    if (!enable)
        drop_graphs(c);
    c->graph_mode = enable != 0;
    return KILN_OK;
}

/* ---- enqueue, synchronize, timing --------------------------------------------------------- */

kiln_status kiln_cuda_context_enqueue(kiln_context *ctx, void *stream)
{
    kiln_cuda_context *c = ctx->cuda;
    KILN_TRY(kiln_context_require_shapes(ctx));
    cudaStream_t s = stream ? (cudaStream_t)stream : c->stream;
    /* A caller capturing this enqueue into its own graph gets the bare
     * launches: no events, no graph of ours inside theirs. */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CU(cudaStreamIsCapturing(s, &cs));
    int outer = cs != cudaStreamCaptureStatusNone;
    c->timed = 0;
    c->profiled = 0;
    if (outer)
        return launch_layers(ctx, s, NULL, 0);
    if (c->graph_mode)
        return enqueue_graph(ctx, s);
    int profile = ctx->layer_ms && c->layer_events;
    CU(cudaEventRecord(c->start, s));
    KILN_TRY(launch_layers(ctx, s, profile ? c->layer_events : NULL, 0));
    CU(cudaEventRecord(c->stop, s));
    c->timed = 1;
    c->profiled = profile;
    return KILN_OK;
}

kiln_status kiln_cuda_context_synchronize(kiln_context *ctx)
{
    CU(cudaStreamSynchronize(ctx->cuda->stream));
    /* Errors kernels recorded on the device (a gather index out of range)
     * can only be read once the work is done. */
    return kiln_cuda_device_check(ctx->engine->cuda->device, &ctx->engine->graph);
}

kiln_status kiln_cuda_context_gpu_time(kiln_context *ctx, float *ms)
{
    kiln_cuda_context *c = ctx->cuda;
    if (!c->timed)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "no timed enqueue yet (none ran, or the caller captured the last one)");
    CU(cudaEventSynchronize(c->stop));
    CU(cudaEventElapsedTime(ms, c->start, c->stop));
    return KILN_OK;
}

kiln_status kiln_cuda_context_set_profiling(kiln_context *ctx)
{
    kiln_cuda_context *c = ctx->cuda;
    int32_t n = ctx->engine->graph.n_layers;
    if (c->layer_events)
        return KILN_OK;
    if (!(c->layer_events = calloc((size_t)n + 1, sizeof *c->layer_events)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for layer events");
    for (int32_t l = 0; l <= n; l++)
        CU(cudaEventCreate(&c->layer_events[l]));
    return KILN_OK;
}

kiln_status kiln_cuda_context_layer_times(kiln_context *ctx)
{
    kiln_cuda_context *c = ctx->cuda;
    int32_t n = ctx->engine->graph.n_layers;
    if (!c->profiled)
        return KILN_OK;
    CU(cudaEventSynchronize(c->layer_events[n]));
    for (int32_t l = 0; l < n; l++) {
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, c->layer_events[l], c->layer_events[l + 1]));
        ctx->layer_ms[l] = ms;
    }
    c->profiled = 0;
    return KILN_OK;
}

/* ---- the CPU reference of a CUDA context ---------------------------------------------------- */

/* Host memory for the reference run: a copy of the block (arena and
 * workspace) and one buffer per I/O tensor at its current size. Allocated
 * on the first reference run and grown with the shapes. */
static kiln_status reference_memory(kiln_context *ctx)
{
    kiln_cuda_context *c = ctx->cuda;
    const kiln_engine *e = ctx->engine;
    const kiln_graph *g = &e->graph;
    if (!c->host_block) {
        void *p = mmap(NULL, e->pool.block_bytes ? e->pool.block_bytes : 1, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY,
                             "out of memory for a %zu-byte host copy of the context",
                             e->pool.block_bytes);
        c->host_block = p;
    }
    for (int32_t i = 0; i < e->n_io; i++) {
        int32_t t = e->io[i];
        size_t bytes;
        if ((g->tensors[t].flags & KILN_TENSOR_CONSTANT) || e->offsets[t] >= 0)
            continue;
        KILN_TRY(kiln_dims_bytes(&ctx->dims[t], g->tensors[t].dtype, &bytes));
        if (bytes <= c->host_io_bytes[t] && c->host_io[t])
            continue;
        void *p = malloc(bytes ? bytes : 1);
        if (!p)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a host copy of \"%s\"",
                             g->tensors[t].name);
        free(c->host_io[t]);
        c->host_io[t] = p;
        c->host_io_bytes[t] = bytes;
    }
    return KILN_OK;
}

/* Host address of non-constant tensor t in the reference run. */
static void *reference_data(const kiln_context *ctx, int32_t t)
{
    const kiln_cuda_context *c = ctx->cuda;
    int64_t off = ctx->engine->offsets[t];
    return off >= 0 ? (void *)(c->host_block + off) : c->host_io[t];
}

/* Inputs come from the device, the layers run on host copies with the
 * engine's host constants, and the outputs go back where enqueue would
 * have written them: the caller reads both runs the same way. */
kiln_status kiln_cuda_context_run_reference(kiln_context *ctx)
{
    kiln_cuda_context *c = ctx->cuda;
    const kiln_engine *e = ctx->engine;
    const kiln_graph *g = &e->graph;
    KILN_TRY(kiln_context_require_shapes(ctx));
    KILN_TRY(reference_memory(ctx));
    CU(cudaStreamSynchronize(c->stream));
    for (int32_t i = 0; i < g->n_inputs; i++) {
        int32_t t = g->inputs[i];
        size_t bytes;
        if (g->tensors[t].flags & KILN_TENSOR_CONSTANT)
            continue;
        KILN_TRY(kiln_dims_bytes(&ctx->dims[t], g->tensors[t].dtype, &bytes));
        if (bytes)
            CU(cudaMemcpyAsync(reference_data(ctx, t), io_address(ctx, t), bytes,
                               cudaMemcpyDeviceToHost, c->stream));
    }
    CU(cudaStreamSynchronize(c->stream));
    KILN_TRY(kiln_context_run_cpu(ctx, 1, c->host_block, c->host_io));
    for (int32_t i = 0; i < g->n_outputs; i++) {
        int32_t t = g->outputs[i];
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes;
        KILN_TRY(kiln_dims_bytes(&ctx->dims[t], r->dtype, &bytes));
        /* An unbound constant output is the engine's shared copy: it
         * already holds the values and must not be written. */
        if (!bytes || ((r->flags & KILN_TENSOR_CONSTANT) && !ctx->bound[t]))
            continue;
        const void *src = (r->flags & KILN_TENSOR_CONSTANT) ? r->data : reference_data(ctx, t);
        CU(cudaMemcpyAsync(io_address(ctx, t), src, bytes, cudaMemcpyHostToDevice, c->stream));
    }
    CU(cudaStreamSynchronize(c->stream));
    return KILN_OK;
}

/* ---- device copy bandwidth --------------------------------------------------------------- */

typedef struct copy_probe {
    void *src, *dst;
    cudaStream_t stream;
    cudaEvent_t start, stop;
} copy_probe;

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static kiln_status copy_probe_run(copy_probe *p, size_t bytes, int32_t reps, double *bytes_per_s)
{
    enum { WARMUP = 3, MAX_REPS = 64 };
    float ms[MAX_REPS];
    CU(cudaMalloc(&p->src, bytes));
    CU(cudaMalloc(&p->dst, bytes));
    CU(cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking));
    CU(cudaEventCreate(&p->start));
    CU(cudaEventCreate(&p->stop));
    CU(cudaMemsetAsync(p->src, 1, bytes, p->stream));
    if (reps > MAX_REPS)
        reps = MAX_REPS;
    for (int32_t i = 0; i < WARMUP + reps; i++) {
        CU(cudaEventRecord(p->start, p->stream));
        CU(cudaMemcpyAsync(p->dst, p->src, bytes, cudaMemcpyDeviceToDevice, p->stream));
        CU(cudaEventRecord(p->stop, p->stream));
        CU(cudaEventSynchronize(p->stop));
        if (i >= WARMUP)
            CU(cudaEventElapsedTime(&ms[i - WARMUP], p->start, p->stop));
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp_float);
    float median = ms[reps / 2];
    if (!(median > 0))
        return kiln_fail(KILN_ERROR_BACKEND, "a device copy of %zu bytes took no measurable time", bytes);
    *bytes_per_s = 2.0 * (double)bytes / ((double)median * 1e-3);
    return KILN_OK;
}

kiln_status kiln_cuda_copy_bandwidth(size_t bytes, int32_t reps, double *bytes_per_s)
{
    if (!kiln_cuda_available(NULL))
        return kiln_fail(KILN_ERROR_TARGET, "no usable GPU to measure a device copy on");
    copy_probe p = {0};
    kiln_status s = copy_probe_run(&p, bytes, reps, bytes_per_s);
    if (p.stream)
        cudaStreamSynchronize(p.stream);
    if (p.start)
        cudaEventDestroy(p.start);
    if (p.stop)
        cudaEventDestroy(p.stop);
    if (p.stream)
        cudaStreamDestroy(p.stream);
    cudaFree(p.src);
    cudaFree(p.dst);
    return s;
}

#endif
