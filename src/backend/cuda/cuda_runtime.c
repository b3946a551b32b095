/* The CUDA backend's table (src/backend/backend.h): the target check,
 * constants on the device once per engine, device memory for the engine's
 * pool, and per context a stream, pinned staging, CUDA-graph capture and
 * replay, and event timing. enqueue only launches: every allocation
 * happens at engine load, context creation, a shape change or a staging
 * copy. */
#ifdef KILN_HAVE_CUDA

#include "backend/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>
#include <kiln/runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/error.h"

/* Failed CUDA calls are reported as "CUDA: <call> failed: <error> (file:line)". */
#define CU(call) CU_CHECK("CUDA", call)

/* ---- target --------------------------------------------------------------------------- */

/* Whether this library carries PTX for `arch` (KILN_CUDA_ARCHITECTURES,
 * CMake's list: "90" is sm_90 code plus compute_90 PTX, "90-real" code
 * only, "90-virtual" PTX only). */
static int library_has_ptx(int32_t arch)
{
    int32_t archs[16], ptx[16];
    int32_t n = kiln_gpu_archs_parse(KILN_CUDA_ARCHITECTURES, archs, ptx, 16);
    for (int32_t i = 0; i < n; i++)
        if (archs[i] == arch)
            return ptx[i];
    return 0;
}

static kiln_status cuda_check_target(const kiln_engine_header_info *info)
{
    char archs[128];
    kiln_gpu_archs_format(info->n_gpu_archs, info->gpu_archs, archs, sizeof archs);
    int32_t gpu = 0;
    if (!kiln_cuda_available(&gpu))
        return kiln_fail(KILN_ERROR_TARGET, "engine targets cuda (%s), but no CUDA GPU is available", archs);
    int32_t n = info->n_gpu_archs < 0 || info->n_gpu_archs > 8 ? 0 : info->n_gpu_archs;
    for (int32_t i = 0; i < n; i++)
        if (info->gpu_archs[i] == gpu)
            return KILN_OK;
    /* PTX for an older architecture is compiled for this GPU by the driver. */
    for (int32_t i = 0; i < n; i++)
        if (info->gpu_archs[i] < gpu && library_has_ptx(info->gpu_archs[i])) {
            kiln_log(KILN_LOG_INFO, "engine holds %s, this GPU is sm_%d: running its PTX", archs, (int)gpu);
            return KILN_OK;
        }
    return kiln_fail(KILN_ERROR_TARGET, "engine holds %s, this GPU is sm_%d", archs, (int)gpu);
}

/* ---- engine ------------------------------------------------------------------------------ */

/* What an engine holds on the GPU. */
struct kiln_backend_engine {
    kiln_cuda_device *device;
    void *constants;     /* one device allocation holding every constant */
    void **constant_ptr; /* graph.n_tensors; device address of each constant */
};

static void cuda_engine_destroy(kiln_backend_engine *c)
{
    if (!c)
        return;
    if (c->constants)
        cudaFree(c->constants);
    kiln_cuda_device_destroy(c->device);
    free(c->constant_ptr);
    free(c);
}

#define CONST_ALIGN 256u

static kiln_status upload_constants(kiln_backend_engine *c, const kiln_graph *g)
{
    size_t total = 0;
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        if (!(r->flags & KILN_TENSOR_CONSTANT))
            continue;
        size_t padded;
        if (kiln_add_overflow(total, r->data_size, &padded) || kiln_add_overflow(padded, CONST_ALIGN - 1, &padded))
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

static kiln_status cuda_engine_create(const kiln_graph *g, kiln_backend_engine **out, void *const **constants)
{
    kiln_backend_engine *c = calloc(1, sizeof *c);
    if (!c)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory loading a cuda engine");
    c->constant_ptr = calloc(g->n_tensors > 0 ? (size_t)g->n_tensors : 1, sizeof *c->constant_ptr);
    kiln_status s =
        c->constant_ptr ? KILN_OK : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory loading a cuda engine");
    if (s == KILN_OK)
        s = kiln_cuda_device_create(&c->device);
    if (s == KILN_OK)
        s = upload_constants(c, g);
    if (s != KILN_OK) {
        cuda_engine_destroy(c);
        return s;
    }
    *out = c;
    *constants = c->constant_ptr;
    return KILN_OK;
}

static void *cuda_mem_alloc(size_t bytes, int block)
{
    (void)block;
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_mem_free(void *p, size_t bytes, int block)
{
    (void)bytes;
    (void)block;
    cudaFree(p);
}

/* ---- context ------------------------------------------------------------------------------ */

/* A graph captured for one set of input shapes and I/O addresses. */
typedef struct graph_entry {
    int64_t *symbols;     /* graph.n_symbols */
    void **addr;          /* engine n_io: device address of each I/O tensor */
    cudaGraphExec_t exec; /* NULL: slot empty */
    size_t n_nodes;       /* kernel and copy nodes: launches per replay */
    uint64_t last_use;
} graph_entry;

/* Shapes a context alternates between (an LLM's decode batch sizes) stay
 * captured; a seventeenth evicts the least recently used. */
#define GRAPH_CACHE 16

/* An output copy waiting in a staging buffer: the device-to-staging copy
 * is enqueued, the staging-to-host memcpy happens at the next
 * synchronize (or before the buffer is reused), on the calling thread. A
 * host callback on the stream did it before: its round trip through the
 * driver's callback thread cost every decode step about 75 us on the H200
 * (1B decode 1,000 -> 1,110 tok/s without it, bench/README.md). */
typedef struct staged_output {
    void *host; /* NULL: nothing pending */
    const void *staging;
    size_t bytes;
} staged_output;

struct kiln_backend_context {
    kiln_exec_plan *plan; /* the runtime's context, borrowed */
    kiln_backend_engine *engine;
    cudaStream_t stream;
    cudaEvent_t start, stop;   /* around the last enqueue's launches */
    int32_t timed;             /* start/stop describe the last enqueue */
    cudaEvent_t *layer_events; /* graph.n_layers + 1 when profiling */
    int32_t profiled;          /* layer_events describe the last enqueue */
    int32_t graph_mode;        /* KILN_CUDA_GRAPH_* */
    graph_entry graphs[GRAPH_CACHE];
    const graph_entry *last_graph; /* what the last enqueue replayed, NULL: none */
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

static void drop_graphs(kiln_backend_context *c)
{
    c->last_graph = NULL;
    /* An executable graph still running is freed when it completes. */
    for (int i = 0; i < GRAPH_CACHE; i++)
        if (c->graphs[i].exec) {
            cudaGraphExecDestroy(c->graphs[i].exec);
            c->graphs[i].exec = NULL;
        }
}

static void cuda_context_destroy(kiln_backend_context *c)
{
    if (!c)
        return;
    const kiln_graph *g = c->plan->graph;
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
        munmap(c->host_block, c->plan->block_bytes ? c->plan->block_bytes : 1);
    for (int32_t t = 0; c->host_io && t < g->n_tensors; t++)
        free(c->host_io[t]);
    free(c->host_io);
    free(c->host_io_bytes);
    free(c);
}

static kiln_status context_init(kiln_backend_context *c)
{
    const kiln_exec_plan *p = c->plan;
    size_t nt = p->graph->n_tensors > 0 ? (size_t)p->graph->n_tensors : 1;
    size_t ns = p->graph->n_symbols > 0 ? (size_t)p->graph->n_symbols : 1;
    size_t nio = p->n_io > 0 ? (size_t)p->n_io : 1;
    c->staging = calloc(nt, sizeof *c->staging);
    c->staging_bytes = calloc(nt, sizeof *c->staging_bytes);
    c->staging_done = calloc(nt, sizeof *c->staging_done);
    c->pending = calloc(nt, sizeof *c->pending);
    c->host_io = calloc(nt, sizeof *c->host_io);
    c->host_io_bytes = calloc(nt, sizeof *c->host_io_bytes);
    if (!c->staging || !c->staging_bytes || !c->staging_done || !c->pending || !c->host_io || !c->host_io_bytes)
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

static kiln_status cuda_context_create(kiln_backend_engine *e, kiln_exec_plan *plan, kiln_backend_context **out)
{
    kiln_backend_context *c = calloc(1, sizeof *c);
    if (!c)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory creating a cuda context");
    c->plan = plan;
    c->engine = e;
    kiln_status s = context_init(c);
    if (s != KILN_OK) {
        cuda_context_destroy(c);
        return s;
    }
    *out = c;
    return KILN_OK;
}

/* A host pointer bound on a cuda engine would fault inside a kernel; say
 * so here, naming the tensor. */
static kiln_status cuda_check_binding(const char *name, void *ptr)
{
    struct cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(err, "CUDA", "cudaPointerGetAttributes", __FILE__, __LINE__);
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "tensor \"%s\": %p is not device memory; a cuda engine binds device "
                         "pointers (host data goes through kiln_context_copy_input)",
                         name, ptr);
    return KILN_OK;
}

/* ---- staging ------------------------------------------------------------------------------ */

/* Completes output copy t once its device copy has finished. */
static kiln_status finish_output(kiln_backend_context *c, int32_t t)
{
    staged_output *o = &c->pending[t];
    if (!o->host)
        return KILN_OK;
    CU(cudaEventSynchronize(c->staging_done[t]));
    memcpy(o->host, o->staging, o->bytes);
    o->host = NULL;
    return KILN_OK;
}

/* Replaces tensor t's staging buffer with one of `bytes`, once the last
 * copy through the old one has finished. */
static kiln_status grow_staging(kiln_backend_context *c, int32_t t, size_t bytes)
{
    if (!c->staging_done[t])
        CU(cudaEventCreateWithFlags(&c->staging_done[t], cudaEventDisableTiming));
    KILN_TRY(finish_output(c, t));
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

static kiln_status cuda_shapes_changed(kiln_backend_context *c)
{
    const kiln_exec_plan *p = c->plan;
    const kiln_graph *g = p->graph;
    for (int32_t t = 0; t < g->n_tensors; t++) {
        size_t bytes;
        if (!c->staging[t] || kiln_dims_bytes(&p->dims[t], g->tensors[t].dtype, &bytes) != KILN_OK)
            continue;
        if (bytes > c->staging_bytes[t])
            KILN_TRY(grow_staging(c, t, bytes));
    }
    return KILN_OK;
}

static kiln_status cuda_copy(kiln_backend_context *c, int32_t t, void *host, size_t bytes, int to_device)
{
    if (!bytes)
        return KILN_OK;
    if (bytes > c->staging_bytes[t])
        KILN_TRY(grow_staging(c, t, bytes));
    /* The staging buffer is reused only after the last copy through it
     * (and its bytes reached the host). */
    KILN_TRY(finish_output(c, t));
    CU(cudaEventSynchronize(c->staging_done[t]));
    void *dev = kiln_exec_io_address(c->plan, t);
    if (to_device) {
        memcpy(c->staging[t], host, bytes);
        CU(cudaMemcpyAsync(dev, c->staging[t], bytes, cudaMemcpyHostToDevice, c->stream));
    } else {
        CU(cudaMemcpyAsync(c->staging[t], dev, bytes, cudaMemcpyDeviceToHost, c->stream));
        c->pending[t] = (staged_output){host, c->staging[t], bytes};
    }
    CU(cudaEventRecord(c->staging_done[t], c->stream));
    return KILN_OK;
}

static kiln_status cuda_copy_between(kiln_backend_context *c, int32_t dst, int32_t src, size_t bytes)
{
    CU(cudaMemcpyAsync(kiln_exec_io_address(c->plan, dst), kiln_exec_io_address(c->plan, src), bytes,
                       cudaMemcpyDeviceToDevice, c->stream));
    return KILN_OK;
}

/* ---- launching ---------------------------------------------------------------------------- */

static const char *layer_what(const kiln_graph *g, const kiln_layer *L)
{
    return L->op == KILN_OP_PLUGIN ? g->plugins[L->p.plugin.index].name : kiln_op_name(L->op);
}

/* One launch of the layer loop on `stream`, with per-layer events when
 * profiling. While capturing, a launch that invalidates the capture is
 * reported with the layer that made it. */
typedef struct launch {
    kiln_backend_context *c;
    cudaStream_t stream;
    cudaEvent_t *events;
    int capturing;
} launch;

static kiln_status launch_layer(void *user, const kiln_exec_call *call)
{
    const launch *ln = user;
    const kiln_graph *g = call->graph;
    const kiln_layer *L = call->layer;
    kiln_cuda_args args = {
        .graph = g,
        .layer = L,
        .inputs = call->inputs,
        .outputs = call->outputs,
        .plugin = call->plugin,
        .workspace = call->workspace,
        .device = ln->c->engine->device,
        .stream = ln->stream,
    };
    nvtxRangePushA(L->name);
    kiln_status st = kiln_cuda_run_layer(&args);
    nvtxRangePop();
    cudaError_t err = cudaGetLastError();
    if (st != KILN_OK)
        return ln->capturing
                   ? kiln_fail_context(st, "CUDA graph capture broke at layer \"%s\" (%s)", L->name, layer_what(g, L))
                   : st;
    if (ln->capturing) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaError_t qerr = cudaStreamIsCapturing(ln->stream, &cs);
        if (err != cudaSuccess || qerr != cudaSuccess || cs != cudaStreamCaptureStatusActive)
            return kiln_fail(KILN_ERROR_BACKEND, "CUDA graph capture broke at layer \"%s\" (%s): %s", L->name,
                             layer_what(g, L),
                             cudaGetErrorString(err != cudaSuccess    ? err
                                                : qerr != cudaSuccess ? qerr
                                                                      : cudaErrorStreamCaptureInvalidated));
    } else if (err != cudaSuccess) {
        return kiln_fail(KILN_ERROR_BACKEND, "layer \"%s\" (%s): launch failed: %s", L->name, layer_what(g, L),
                         cudaGetErrorString(err));
    }
    return KILN_OK;
}

static kiln_status record_layer_event(void *user, int32_t layer)
{
    const launch *ln = user;
    CU(cudaEventRecord(ln->events[layer + 1], ln->stream));
    return KILN_OK;
}

static kiln_status copy_on_stream(void *user, void *dst, const void *src, size_t bytes)
{
    const launch *ln = user;
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ln->stream));
    return KILN_OK;
}

/* Launches every layer on s (kiln_exec_run), recording events[0] before
 * the first and events[l + 1] after layer l when `events` is given. */
static kiln_status launch_layers(kiln_backend_context *c, cudaStream_t s, cudaEvent_t *events, int capturing)
{
    launch ln = {c, s, events, capturing};
    kiln_exec_hooks hooks = {
        .run = launch_layer,
        .after = events ? record_layer_event : NULL,
        .copy = copy_on_stream,
        .user = &ln,
    };
    if (events)
        CU(cudaEventRecord(events[0], s));
    return kiln_exec_run(c->plan, NULL, &hooks);
}

/* ---- CUDA graphs -------------------------------------------------------------------------- */

static int entry_matches(const kiln_backend_context *c, const graph_entry *en)
{
    const kiln_exec_plan *p = c->plan;
    if (!en->exec)
        return 0;
    for (int32_t s = 0; s < p->graph->n_symbols; s++)
        if (en->symbols[s] != p->symbols[s])
            return 0;
    for (int32_t i = 0; i < p->n_io; i++)
        if (en->addr[i] != kiln_exec_io_address(p, p->io[i]))
            return 0;
    return 1;
}

static kiln_status capture(kiln_backend_context *c, cudaStream_t s, graph_entry *en)
{
    const kiln_exec_plan *p = c->plan;
    /* Thread-local: another thread creating a context (cudaMalloc) while
     * this one captures must not break either. */
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    kiln_status st = launch_layers(c, s, NULL, 1);
    cudaGraph_t graph = NULL;
    cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (st == KILN_OK && end != cudaSuccess)
        st = kiln_fail(KILN_ERROR_BACKEND, "ending the CUDA graph capture failed: %s", cudaGetErrorString(end));
    cudaGetLastError();
    if (st == KILN_OK) {
        cudaError_t err = cudaGraphInstantiate(&en->exec, graph, 0);
        if (err != cudaSuccess) {
            en->exec = NULL;
            st = cuda_fail(err, "CUDA", "cudaGraphInstantiate", __FILE__, __LINE__);
        }
    }
    en->n_nodes = 0;
    if (st == KILN_OK && cudaGraphGetNodes(graph, NULL, &en->n_nodes) != cudaSuccess) {
        cudaGetLastError();
        en->n_nodes = 0;
    }
    if (graph)
        cudaGraphDestroy(graph);
    if (st != KILN_OK)
        return st;
    memcpy(en->symbols, p->symbols, sizeof *en->symbols * (size_t)p->graph->n_symbols);
    for (int32_t i = 0; i < p->n_io; i++)
        en->addr[i] = kiln_exec_io_address(p, p->io[i]);
    kiln_log(KILN_LOG_INFO, "cuda: captured a graph of %d layers, %zu nodes", (int)p->graph->n_layers, en->n_nodes);
    return KILN_OK;
}

static kiln_status enqueue_graph(kiln_backend_context *c, cudaStream_t s)
{
    graph_entry *en = NULL;
    for (int i = 0; i < GRAPH_CACHE && !en; i++)
        if (entry_matches(c, &c->graphs[i]))
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
        KILN_TRY(capture(c, s, en));
    }
    en->last_use = ++c->uses;
    c->last_graph = en;
    CU(cudaEventRecord(c->start, s));
    CU(cudaGraphLaunch(en->exec, s));
    CU(cudaEventRecord(c->stop, s));
    c->timed = 1;
    return KILN_OK;
}

static kiln_status cuda_set_graph_mode(kiln_backend_context *c, int32_t mode)
{
    const kiln_exec_plan *p = c->plan;
    const kiln_graph *g = p->graph;
    if (mode == KILN_CUDA_GRAPH_ON && c->graph_mode != KILN_CUDA_GRAPH_ON)
        for (int32_t l = 0; l < g->n_layers; l++) {
            const kiln_layer *L = &g->layers[l];
            if (L->op != KILN_OP_PLUGIN)
                continue;
            const kiln_plugin *pl = p->plugins[L->p.plugin.index];
            if (!(pl->ops->flags & KILN_PLUGIN_FLAG_CAPTURE_SAFE))
                return kiln_fail(KILN_ERROR_UNSUPPORTED,
                                 "CUDA graphs are off for this engine: plugin \"%s\" (layer \"%s\") "
                                 "is not marked capture-safe",
                                 g->plugins[L->p.plugin.index].name, L->name);
        }
    if (mode == KILN_CUDA_GRAPH_OFF)
        drop_graphs(c);
    c->graph_mode = mode;
    return KILN_OK;
}

static kiln_status cuda_graph_nodes(kiln_backend_context *c, size_t *n_nodes)
{
    if (!c->last_graph)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "the last enqueue did not replay a CUDA graph");
    *n_nodes = c->last_graph->n_nodes;
    return KILN_OK;
}

static kiln_status cuda_memory_info(size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    CU(cudaMemGetInfo(&f, &t));
    *free_bytes = f;
    *total_bytes = t;
    return KILN_OK;
}

/* ---- enqueue, synchronize, timing --------------------------------------------------------- */

static kiln_status cuda_enqueue(kiln_backend_context *c, void *stream)
{
    cudaStream_t s = stream ? (cudaStream_t)stream : c->stream;
    /* A caller capturing this enqueue into its own graph gets the bare
     * launches: no events, no graph of ours inside theirs. */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CU(cudaStreamIsCapturing(s, &cs));
    int outer = cs != cudaStreamCaptureStatusNone;
    c->timed = 0;
    c->profiled = 0;
    c->last_graph = NULL;
    if (outer)
        return launch_layers(c, s, NULL, 0);
    if (c->graph_mode == KILN_CUDA_GRAPH_ON)
        return enqueue_graph(c, s);
    int profile = c->plan->layer_ms && c->layer_events;
    CU(cudaEventRecord(c->start, s));
    KILN_TRY(launch_layers(c, s, profile ? c->layer_events : NULL, 0));
    CU(cudaEventRecord(c->stop, s));
    c->timed = 1;
    c->profiled = profile;
    return KILN_OK;
}

static kiln_status cuda_synchronize(kiln_backend_context *c)
{
    CU(cudaStreamSynchronize(c->stream));
    for (int32_t i = 0; i < c->plan->n_io; i++)
        KILN_TRY(finish_output(c, c->plan->io[i]));
    /* Errors kernels recorded on the device (a gather index out of range)
     * can only be read once the work is done. */
    return kiln_cuda_device_check(c->engine->device, c->plan->graph);
}

static kiln_status cuda_gpu_time(kiln_backend_context *c, float *ms)
{
    if (!c->timed)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "no timed enqueue yet (none ran, or the caller captured the last one)");
    CU(cudaEventSynchronize(c->stop));
    CU(cudaEventElapsedTime(ms, c->start, c->stop));
    return KILN_OK;
}

static kiln_status cuda_set_profiling(kiln_backend_context *c)
{
    int32_t n = c->plan->graph->n_layers;
    if (c->layer_events)
        return KILN_OK;
    if (!(c->layer_events = calloc((size_t)n + 1, sizeof *c->layer_events)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for layer events");
    for (int32_t l = 0; l <= n; l++)
        CU(cudaEventCreate(&c->layer_events[l]));
    return KILN_OK;
}

static kiln_status cuda_layer_times(kiln_backend_context *c)
{
    int32_t n = c->plan->graph->n_layers;
    if (!c->profiled)
        return KILN_OK;
    CU(cudaEventSynchronize(c->layer_events[n]));
    for (int32_t l = 0; l < n; l++) {
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, c->layer_events[l], c->layer_events[l + 1]));
        c->plan->layer_ms[l] = ms;
    }
    c->profiled = 0;
    return KILN_OK;
}

/* ---- the CPU reference of a CUDA context ---------------------------------------------------- */

/* Host memory for the reference run: a copy of the block (arena and
 * workspace) and one buffer per I/O tensor at its current size. Allocated
 * on the first reference run and grown with the shapes. */
static kiln_status reference_memory(kiln_backend_context *c)
{
    const kiln_exec_plan *p = c->plan;
    const kiln_graph *g = p->graph;
    if (!c->host_block) {
        void *m =
            mmap(NULL, p->block_bytes ? p->block_bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a %zu-byte host copy of the context",
                             p->block_bytes);
        c->host_block = m;
    }
    for (int32_t i = 0; i < p->n_io; i++) {
        int32_t t = p->io[i];
        size_t bytes;
        if ((g->tensors[t].flags & KILN_TENSOR_CONSTANT) || p->offsets[t] >= 0)
            continue;
        KILN_TRY(kiln_dims_bytes(&p->dims[t], g->tensors[t].dtype, &bytes));
        if (bytes <= c->host_io_bytes[t] && c->host_io[t])
            continue;
        void *m = malloc(bytes ? bytes : 1);
        if (!m)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a host copy of \"%s\"", g->tensors[t].name);
        free(c->host_io[t]);
        c->host_io[t] = m;
        c->host_io_bytes[t] = bytes;
    }
    return KILN_OK;
}

/* Host address of non-constant tensor t in the reference run. */
static void *reference_data(const kiln_backend_context *c, int32_t t)
{
    int64_t off = c->plan->offsets[t];
    return off >= 0 ? (void *)(c->host_block + off) : c->host_io[t];
}

/* Inputs come from the device, the layers run on host copies with the
 * engine's host constants, and the outputs go back where enqueue would
 * have written them: the caller reads both runs the same way. */
static kiln_status cuda_run_reference(kiln_backend_context *c)
{
    kiln_exec_plan *p = c->plan;
    const kiln_graph *g = p->graph;
    KILN_TRY(reference_memory(c));
    CU(cudaStreamSynchronize(c->stream));
    for (int32_t i = 0; i < g->n_inputs; i++) {
        int32_t t = g->inputs[i];
        size_t bytes;
        if (g->tensors[t].flags & KILN_TENSOR_CONSTANT)
            continue;
        KILN_TRY(kiln_dims_bytes(&p->dims[t], g->tensors[t].dtype, &bytes));
        if (bytes)
            CU(cudaMemcpyAsync(reference_data(c, t), kiln_exec_io_address(p, t), bytes, cudaMemcpyDeviceToHost,
                               c->stream));
    }
    CU(cudaStreamSynchronize(c->stream));
    kiln_exec_host host = {c->host_block, c->host_io};
    KILN_TRY(kiln_cpu_exec(p, &host, 1));
    for (int32_t i = 0; i < g->n_outputs; i++) {
        int32_t t = g->outputs[i];
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes;
        KILN_TRY(kiln_dims_bytes(&p->dims[t], r->dtype, &bytes));
        /* An unbound constant output is the engine's shared copy: it
         * already holds the values and must not be written. */
        if (!bytes || ((r->flags & KILN_TENSOR_CONSTANT) && !p->bound[t]))
            continue;
        const void *src = (r->flags & KILN_TENSOR_CONSTANT) ? r->data : reference_data(c, t);
        CU(cudaMemcpyAsync(kiln_exec_io_address(p, t), src, bytes, cudaMemcpyHostToDevice, c->stream));
    }
    CU(cudaStreamSynchronize(c->stream));
    return KILN_OK;
}

/* ---- build time ------------------------------------------------------------------------------ */

static int cuda_device_arch(int32_t *arch) { return kiln_cuda_available(arch); }

static kiln_status cuda_tuner_create(void **tuner)
{
    kiln_cuda_device *dev = NULL;
    KILN_TRY(kiln_cuda_device_create(&dev));
    *tuner = dev;
    return KILN_OK;
}

static void cuda_tuner_destroy(void *tuner) { kiln_cuda_device_destroy(tuner); }

static kiln_status cuda_tune_layer(void *tuner, const kiln_layer *L, const kiln_exec_tensor *inputs,
                                   const kiln_exec_tensor *outputs, int64_t *tactic)
{
    *tactic = -1;
    if (L->op != KILN_OP_MATMUL)
        return KILN_OK;
    return kiln_cuda_matmul_tune(tuner, L, &inputs[0], &inputs[1], &outputs[0], tactic);
}

/* ---- device copy bandwidth ---------------------------------------------------------------- */

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

static kiln_status cuda_device_name(char *name, size_t size)
{
    if (!kiln_cuda_available(NULL))
        return kiln_fail(KILN_ERROR_TARGET, "no usable GPU to name");
    int dev = 0;
    struct cudaDeviceProp p;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&p, dev));
    snprintf(name, size, "%s", p.name);
    return KILN_OK;
}

/* 1 GiB when bytes is 0, as bench/kiln_bench.c's device copy. */
static kiln_status cuda_copy_bandwidth(size_t bytes, int32_t reps, double *bytes_per_s)
{
    if (!kiln_cuda_available(NULL))
        return kiln_fail(KILN_ERROR_TARGET, "no usable GPU to measure a device copy on");
    copy_probe p = {0};
    kiln_status s = copy_probe_run(&p, bytes ? bytes : (size_t)1 << 30, reps, bytes_per_s);
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

const kiln_backend_i kiln_backend_cuda = {
    .kind = KILN_BACKEND_CUDA,
    .check_target = cuda_check_target,
    .engine_create = cuda_engine_create,
    .engine_destroy = cuda_engine_destroy,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .check_binding = cuda_check_binding,
    .memory_info = cuda_memory_info,
    .context_create = cuda_context_create,
    .context_destroy = cuda_context_destroy,
    .shapes_changed = cuda_shapes_changed,
    .enqueue = cuda_enqueue,
    .synchronize = cuda_synchronize,
    .run_reference = cuda_run_reference,
    .copy = cuda_copy,
    .copy_between = cuda_copy_between,
    .set_graph_mode = cuda_set_graph_mode,
    .graph_nodes = cuda_graph_nodes,
    .gpu_time = cuda_gpu_time,
    .set_profiling = cuda_set_profiling,
    .layer_times = cuda_layer_times,
    .copy_bandwidth = cuda_copy_bandwidth,
    .device_name = cuda_device_name,
    .device_arch = cuda_device_arch,
    .tuner_create = cuda_tuner_create,
    .tuner_destroy = cuda_tuner_destroy,
    .tune_layer = cuda_tune_layer,
};

#endif
