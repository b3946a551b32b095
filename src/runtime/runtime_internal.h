/* The engine and context objects behind include/kiln/engine.h and runtime.h,
 * and what the CLI and tests reach beyond the public API. */
#ifndef KILN_RUNTIME_INTERNAL_H
#define KILN_RUNTIME_INTERNAL_H

#include <kiln/runtime.h>
#include <pthread.h>

#include "../core/graph.h"
#include "../backend/cpu/cpu_backend.h"
#include "../engine/engine_file.h"

/* Memory blocks of arena_size + workspace_size bytes, shared by the
 * contexts of one engine. A destroyed context's block goes back on the free
 * list, so the number of blocks never exceeds the largest number of
 * contexts that were alive at once. */
typedef struct kiln_arena_pool {
    pthread_mutex_t lock;
    void **free_list;
    int32_t n_free, cap_free;
    int32_t n_allocated;   /* blocks in use plus blocks on the free list */
    size_t block_bytes;
    int32_t device;        /* 1: blocks are CUDA device memory */
} kiln_arena_pool;

#ifdef KILN_HAVE_CUDA
/* What a CUDA engine holds on the GPU (cuda_runtime.c). */
typedef struct kiln_cuda_engine kiln_cuda_engine;
typedef struct kiln_cuda_context kiln_cuda_context;
#endif

struct kiln_engine {
    kiln_registry *registry;      /* borrowed */
    kiln_graph graph;             /* plugin records resolved, prototypes created */
    kiln_engine_header_info info;
    void *image;                  /* the engine bytes constants point into */
    size_t image_size;
    int32_t image_mapped;         /* 1: munmap, 0: free */
    int32_t max_layer_inputs, max_layer_outputs;
    /* Byte offset of each tensor in a context's memory block, -1 for
     * constants and I/O tensors (which live in buffers of the context, or
     * in the caller's memory). The block is the activation arena, then the
     * plugin workspace at workspace_offset. */
    int64_t *offsets;
    /* The I/O tensors: inputs, then outputs that are not also inputs (an
     * input marked as an output is one tensor with one address). */
    int32_t *io;
    int32_t n_io;
    size_t workspace_offset;
    /* Context blocks: host memory on the CPU, device memory on CUDA. */
    kiln_arena_pool pool;
#ifdef KILN_HAVE_CUDA
    kiln_cuda_engine *cuda;       /* NULL for a CPU engine */
#endif
};

/* Frees the blocks on the free list (at engine destruction). */
void kiln_arena_pool_release(kiln_arena_pool *pool);

/* A block of pool->block_bytes (a free one when there is one) and back.
 * Device memory when pool->device. take returns NULL when out of memory. */
void *kiln_arena_pool_take(kiln_arena_pool *pool);
void kiln_arena_pool_give(kiln_arena_pool *pool, void *block);

/* Blocks the engine's pool has allocated (in use + free). */
int32_t kiln_engine_pool_blocks(kiln_engine *engine);

/* The JSON of kiln_engine_describe_json for a graph read with
 * kiln_engine_read, whether or not its plugins are resolved: `kiln inspect`
 * uses it on engines whose plugin libraries are not loaded. *out is
 * malloc'd. */
kiln_status kiln_engine_describe_graph_json(const kiln_graph *g, const kiln_engine_header_info *info,
                                            char **out);

struct kiln_context {
    kiln_engine *engine;
    int32_t profile;
    kiln_plugin **plugins;        /* clones, one per plugin record */
    int64_t *symbols;             /* graph.n_symbols */
    int64_t *values;              /* graph.exprs.n, scratch for evaluation */
    kiln_dims *dims;              /* graph.n_tensors, valid when shapes_ready */
    int32_t *input_set;           /* graph.n_inputs */
    int32_t shapes_ready;
    void **bound;                 /* graph.n_tensors, caller bindings */
    unsigned char *block;         /* arena + workspace (device memory on CUDA) */
    /* Buffers of the unbound I/O tensors (graph.n_tensors, NULL for the
     * rest), grown to the current shape when shapes are set or a tensor is
     * unbound, never in enqueue; io_cap holds their byte sizes. Device
     * memory on CUDA. */
    void **io_buf;
    size_t *io_cap;
    kiln_exec_tensor *in_args, *out_args; /* scratch for one layer */
    /* Per-layer timing (kiln_context_set_profiling): milliseconds of the
     * last profiled run, graph.n_layers entries, NULL when off. */
    double *layer_ms;
#ifdef KILN_HAVE_CUDA
    kiln_cuda_context *cuda;      /* NULL for a CPU engine */
#endif
};

/* Where layers read and write tensor t (host or device memory as the
 * backend has it). */
void *kiln_context_tensor_data(const kiln_context *ctx, int32_t t);
/* KILN_OK once every input shape is set. */
kiln_status kiln_context_require_shapes(const kiln_context *ctx);
/* Runs every layer on the CPU backend. With host_block, arena tensors live
 * in it at their engine offsets and I/O tensor t at host_io[t]
 * (graph.n_tensors entries); NULL: the context's bindings, buffers and
 * block. */
kiln_status kiln_context_run_cpu(kiln_context *ctx, int reference, unsigned char *host_block,
                                 void **host_io);

#ifdef KILN_HAVE_CUDA
/* ---- the CUDA side of engines and contexts (cuda_runtime.c) ---- */

/* Checks that a GPU is present and that the engine holds code for it. */
kiln_status kiln_cuda_check_target(const kiln_engine_header_info *info);
/* Creates the device state and uploads every constant, once per engine. */
kiln_status kiln_cuda_engine_create(kiln_engine *e);
/* NULL-safe (e->cuda NULL). */
void kiln_cuda_engine_destroy(kiln_engine *e);
/* Device pointer of constant tensor t. */
void *kiln_cuda_engine_constant(const kiln_engine *e, int32_t t);
void *kiln_cuda_block_alloc(size_t bytes);
void kiln_cuda_block_free(void *block);

/* KILN_OK when ptr is device (or managed) memory. */
kiln_status kiln_cuda_check_binding(const char *name, void *ptr);

kiln_status kiln_cuda_context_create(kiln_context *ctx);
/* NULL-safe (ctx->cuda NULL); waits for the context's stream first. */
void kiln_cuda_context_destroy(kiln_context *ctx);
/* Called when the input shapes change: staging buffers grow here. */
kiln_status kiln_cuda_context_shapes_changed(kiln_context *ctx);
kiln_status kiln_cuda_context_enqueue(kiln_context *ctx, void *stream);
kiln_status kiln_cuda_context_synchronize(kiln_context *ctx);
kiln_status kiln_cuda_context_run_reference(kiln_context *ctx);
/* Copies through tensor t's pinned staging buffer; to_device: host -> t. */
kiln_status kiln_cuda_context_copy(kiln_context *ctx, int32_t t, void *host, size_t bytes,
                                   int to_device);
kiln_status kiln_cuda_context_set_graph(kiln_context *ctx, int32_t enable);
kiln_status kiln_cuda_context_gpu_time(kiln_context *ctx, float *ms);
/* Creates the per-layer events (ctx->layer_ms is allocated). */
kiln_status kiln_cuda_context_set_profiling(kiln_context *ctx);
/* Fills ctx->layer_ms from the last profiled enqueue's events. */
kiln_status kiln_cuda_context_layer_times(kiln_context *ctx);
/* Median over `reps` (after warm-up) of a device-to-device copy of `bytes`
 * between two buffers allocated here, as bytes read + written per second.
 * KILN_ERROR_TARGET without a GPU. */
kiln_status kiln_cuda_copy_bandwidth(size_t bytes, int32_t reps, double *bytes_per_s);
#endif

#endif
