/* The one interface between the runtime and a backend: a table of
 * functions per backend (kiln_backend_i), in the manner of ggml's
 * ggml_backend_i. The runtime (src/runtime/) owns engines and contexts:
 * shapes, bindings, I/O buffers, memory blocks from the engine's pool and
 * plugin clones, all lent to the backend as a kiln_exec_plan. It reaches a
 * backend only through the table of the engine's backend. A backend owns
 * what is its own (device handles, its copy of the constants, streams,
 * staging, graphs, events) behind two opaque handles.
 *
 * The layer loop exists once, here (kiln_exec_run): a backend hands it a
 * function that runs one layer.
 *
 * docs/backends.md describes the interface for someone adding a backend. */
#ifndef KILN_BACKEND_BACKEND_H
#define KILN_BACKEND_BACKEND_H

#include "core/graph.h"
#include "engine/engine_file.h"

/* A tensor as a kernel sees it: memory of the backend's kind, dtype and
 * concrete dims. */
typedef struct kiln_exec_tensor {
    void *data;
    kiln_dtype dtype;
    kiln_dims dims;
} kiln_exec_tensor;

/* Bytes of GEMM scratch (cuBLASLt workspace) each matmul layer of a GPU
 * engine reserves in the per-context workspace. The builder plans it even
 * in a kiln built without the GPU backend, so it is defined here. */
#define KILN_GPU_MATMUL_WORKSPACE ((size_t)32 << 20)

/* ---- the plan a backend runs ---------------------------------------------------------- */

/* One context's memory and shapes as a backend sees them. The runtime owns
 * every member and keeps them current; a backend reads them during its
 * calls and writes only layer_ms. Memory is of the backend's kind (device
 * memory on CUDA). */
typedef struct kiln_exec_plan {
    /* of the engine, fixed at load */
    const kiln_graph *graph;
    const int64_t *offsets; /* per tensor: byte offset in block; -1: constant or I/O */
    const int32_t *io;      /* the I/O tensors: inputs, then outputs that are not inputs */
    int32_t n_io;
    size_t block_bytes;      /* arena + workspace */
    size_t workspace_offset; /* where the plugin/cuBLASLt workspace starts in block */
    void *const *constants;  /* per tensor: the backend's copy of a constant; NULL: graph data */
    /* of the context */
    unsigned char *block;                 /* arena + workspace */
    void **bound;                         /* per tensor: caller bindings (NULL: none) */
    void **io_buf;                        /* per tensor: the context's buffer of an unbound I/O tensor */
    int64_t *symbols;                     /* graph.n_symbols: the current value of each shape symbol */
    kiln_dims *dims;                      /* per tensor: current shapes */
    kiln_plugin **plugins;                /* per plugin record: the context's clone */
    kiln_exec_tensor *in_args, *out_args; /* scratch for one layer */
    double *layer_ms;                     /* per layer when profiling (kiln_context_set_profiling), else NULL */
    struct kiln_threadpool *pool;         /* CPU: the context's own (kiln_context_set_threads), else NULL:
                                             the process-wide pool */
} kiln_exec_plan;

/* Where layers read and write tensor t: a constant's copy, the caller's
 * binding, the context's I/O buffer or the tensor's place in the block. A
 * constant is always read from the engine, even when it is also an output
 * the caller bound memory to: that memory only receives a copy after the
 * run. */
void *kiln_exec_tensor_data(const kiln_exec_plan *p, int32_t t);

/* Where the caller sees I/O tensor t: its binding, else where layers
 * write it. */
void *kiln_exec_io_address(const kiln_exec_plan *p, int32_t t);

/* From a plugin's enqueue inside kiln_exec_run, on its thread (the host's
 * upcoming_constants): up to `max` constants that the layers after the
 * running one read, in the order they run (a constant read twice named
 * once, those under 4 KiB skipped), *ptr[i] in the memory the layers read
 * and *bytes[i], the first `budget` bytes in all; returns how many. 0
 * outside a run or on another thread. */
int32_t kiln_exec_upcoming_constants(int64_t budget, const void **ptr, int64_t *bytes, int32_t max);

/* One layer to run, with its tensors resolved. */
typedef struct kiln_exec_call {
    const kiln_graph *graph;
    const kiln_layer *layer;
    int32_t index;                   /* of the layer in graph->layers */
    const kiln_exec_tensor *inputs;  /* layer->n_inputs */
    const kiln_exec_tensor *outputs; /* layer->n_outputs */
    kiln_plugin *plugin;             /* the context's instance for PLUGIN layers */
    void *workspace;                 /* the block's workspace */
} kiln_exec_call;

/* What kiln_exec_run calls. */
typedef struct kiln_exec_hooks {
    /* Runs (or launches) one layer; never called for CONSTANT layers. */
    kiln_status (*run)(void *user, const kiln_exec_call *call);
    /* After each layer, CONSTANT ones included (NULL: nothing). */
    kiln_status (*after)(void *user, int32_t layer);
    /* Copies bytes within the backend's memory: an output the builder
     * folded to a constant has no producing layer, and memory the caller
     * bound for it still receives the values. NULL: not done. */
    kiln_status (*copy)(void *user, void *dst, const void *src, size_t bytes);
    void *user;
} kiln_exec_hooks;

/* Host memory standing in for a context's (a CUDA context's CPU reference
 * run): arena tensors at their offsets in block, I/O tensor t at io[t],
 * constants the graph's host data. */
typedef struct kiln_exec_host {
    unsigned char *block;
    void **io;
} kiln_exec_host;

/* The layer loop: runs every layer of the plan's graph in order through
 * hooks->run, with tensors resolved in the plan's memory (or in `host`,
 * when not NULL; then hooks->copy is not used). */
kiln_status kiln_exec_run(kiln_exec_plan *p, const kiln_exec_host *host, const kiln_exec_hooks *hooks);

/* ---- the backend table ------------------------------------------------------------------- */

typedef struct kiln_backend_engine kiln_backend_engine;   /* a backend's per-engine state */
typedef struct kiln_backend_context kiln_backend_context; /* a backend's per-context state */

/* Members marked optional may be NULL: the runtime then does nothing, or
 * reports that the backend lacks the feature. */
typedef struct kiln_backend_i {
    kiln_backend kind;

    /* ---- target and engine ---- */
    /* Optional. KILN_OK when this machine can run an engine whose header
     * says `info` (CUDA: a GPU is present, the engine holds code for it). */
    kiln_status (*check_target)(const kiln_engine_header_info *info);
    /* State shared by an engine's contexts, created once per load: device
     * handles and the backend's copy of every constant. *constants
     * receives a per-tensor table of those copies, or NULL when layers read
     * the graph's host data. *out may be NULL (no state). */
    kiln_status (*engine_create)(const kiln_graph *g, kiln_backend_engine **out, void *const **constants);
    void (*engine_destroy)(kiln_backend_engine *e); /* NULL-safe */

    /* ---- memory ---- */
    /* Memory of the backend's kind: a context block (arena + workspace,
     * `block` nonzero) or an I/O buffer. NULL when out of memory. free gets
     * back the same size and kind. */
    void *(*mem_alloc)(size_t bytes, int block);
    void (*mem_free)(void *p, size_t bytes, int block);
    /* Optional. KILN_OK when ptr is memory this backend's layers can
     * address; the message names the tensor. */
    kiln_status (*check_binding)(const char *tensor, void *ptr);
    /* Optional. Free and total bytes of the memory mem_alloc takes from
     * (CUDA: the device's); without it the runtime reports physical
     * memory. */
    kiln_status (*memory_info)(size_t *free_bytes, size_t *total_bytes);

    /* ---- contexts ---- */
    /* The plan is the context's and outlives the backend context. */
    kiln_status (*context_create)(kiln_backend_engine *e, kiln_exec_plan *plan, kiln_backend_context **out);
    /* Waits for the context's work first. NULL-safe. */
    void (*context_destroy)(kiln_backend_context *c);
    /* Optional. The input shapes changed (and are valid): grow what
     * depends on them. Never called from enqueue. */
    kiln_status (*shapes_changed)(kiln_backend_context *c);
    /* Runs every layer (CPU) or only launches them on `stream` (CUDA: a
     * cudaStream_t, NULL = the context's own): no allocation, no
     * synchronization. Shapes are set. */
    kiln_status (*enqueue)(kiln_backend_context *c, void *stream);
    kiln_status (*synchronize)(kiln_backend_context *c);
    /* The CPU reference kernels over the context's inputs, outputs written
     * where enqueue writes them. Shapes are set. */
    kiln_status (*run_reference)(kiln_backend_context *c);
    /* Copies `bytes` (nonzero, the tensor's size) between host memory and
     * I/O tensor t; to_device: host -> tensor. */
    kiln_status (*copy)(kiln_backend_context *c, int32_t t, void *host, size_t bytes, int to_device);
    /* Copies `bytes` from I/O tensor src to I/O tensor dst in stream
     * order (optional: kiln_context_copy_between). */
    kiln_status (*copy_between)(kiln_backend_context *c, int32_t dst, int32_t src, size_t bytes);

    /* ---- graph mode and timing (optional) ---- */
    /* Captures enqueues into graphs and replays them (CUDA graphs); mode
     * is KILN_CUDA_GRAPH_OFF, ON or PAUSED (include/kiln/runtime.h),
     * checked by the runtime. */
    kiln_status (*set_graph_mode)(kiln_backend_context *c, int32_t mode);
    /* Launches (graph nodes) of the graph the last enqueue replayed. */
    kiln_status (*graph_nodes)(kiln_backend_context *c, size_t *n_nodes);
    /* Device milliseconds of the last enqueue. */
    kiln_status (*gpu_time)(kiln_backend_context *c, float *ms);
    /* Profiling turned on (plan->layer_ms exists): prepare per-layer timing. */
    kiln_status (*set_profiling)(kiln_backend_context *c);
    /* Fills plan->layer_ms from the last profiled enqueue, if the backend
     * times layers itself. */
    kiln_status (*layer_times)(kiln_backend_context *c);
    /* Bytes read + written per second by a copy of `bytes` (0: the
     * backend's default size) between two buffers of its memory allocated
     * for the call, the median of `reps` (1..64) timed runs after warm-up:
     * the ceiling kiln_backend_measure_copy_bandwidth reports. */
    kiln_status (*copy_bandwidth)(size_t bytes, int32_t reps, double *bytes_per_s);
    /* The name of the device a benchmark ran on (CUDA: the current GPU's;
     * the CPU: its model), NUL-terminated in name[size]. */
    kiln_status (*device_name)(char *name, size_t size);

    /* ---- build time (optional) ---- */
    /* Nonzero when a device is present; *arch receives its architecture
     * (CUDA: 10 * major + minor). */
    int (*device_arch)(int32_t *arch);
    /* Opens the device to time tactics on (build time only: allocates). */
    kiln_status (*tuner_create)(void **tuner);
    void (*tuner_destroy)(void *tuner);
    /* Times the candidates of layer L for operands of these shapes (data
     * unused) and stores the fastest in *tactic, -1 when the layer has none. */
    kiln_status (*tune_layer)(void *tuner, const kiln_layer *L, const kiln_exec_tensor *inputs,
                              const kiln_exec_tensor *outputs, int64_t *tactic);
} kiln_backend_i;

/* The table of `kind`, or NULL when this kiln was built without it. */
const kiln_backend_i *kiln_backend_find(kiln_backend kind);

/* The table for an engine whose header says `info`: fails with
 * KILN_ERROR_TARGET when the backend is not compiled in or cannot run here
 * (check_target), naming the target. */
kiln_status kiln_backend_for_target(const kiln_engine_header_info *info, const kiln_backend_i **out);

/* ---- GPU architectures ---------------------------------------------------------------------- */

/* "sm_80, sm_90" (or "no GPU architecture recorded") into buf. */
void kiln_gpu_archs_format(int32_t n, const int32_t *archs, char *buf, size_t size);

/* Parses a CMake CUDA architecture list ("90", "80;90-real",
 * "90-virtual"): at most `max` distinct architectures into archs, and in
 * ptx[i] whether the list carries PTX for archs[i] (a plain number or
 * "-virtual"; "-real" is code only). Returns how many. */
int32_t kiln_gpu_archs_parse(const char *list, int32_t *archs, int32_t *ptx, int32_t max);

#endif
