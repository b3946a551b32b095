/* The engine and context objects behind include/kiln/engine.h and runtime.h,
 * and what the CLI and tests reach beyond the public API. */
#ifndef KILN_RUNTIME_INTERNAL_H
#define KILN_RUNTIME_INTERNAL_H

#include <kiln/runtime.h>
#include <pthread.h>

#include "backend/backend.h"
#include "core/graph.h"
#include "engine/engine_file.h"

/* Memory blocks of arena_size + workspace_size bytes, shared by the
 * contexts of one engine. A destroyed context's block goes back on the free
 * list, so the number of blocks never exceeds the largest number of
 * contexts that were alive at once. */
typedef struct kiln_arena_pool {
    pthread_mutex_t lock;
    void **free_list;
    int32_t n_free, cap_free;
    int32_t n_allocated; /* blocks in use plus blocks on the free list */
    size_t block_bytes;
    const kiln_backend_i *backend; /* whose memory the blocks are */
} kiln_arena_pool;

struct kiln_engine {
    kiln_registry *registry; /* borrowed */
    kiln_graph graph;        /* plugin records resolved, prototypes created */
    kiln_engine_header_info info;
    void *image; /* the engine bytes constants point into */
    size_t image_size;
    int32_t image_mapped; /* 1: munmap, 0: free */
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
    /* Context blocks, in the backend's memory. */
    kiln_arena_pool pool;
    const kiln_backend_i *backend;       /* the table of info.backend */
    kiln_backend_engine *backend_engine; /* the backend's state (may be NULL) */
    void *const *constants;              /* the backend's constant copies, NULL: graph data */
};

/* Frees the blocks on the free list (at engine destruction). */
void kiln_arena_pool_release(kiln_arena_pool *pool);

/* A block of pool->block_bytes (a free one when there is one) and back.
 * take returns NULL when out of memory. */
void *kiln_arena_pool_take(kiln_arena_pool *pool);
void kiln_arena_pool_give(kiln_arena_pool *pool, void *block);

/* Blocks the engine's pool has allocated (in use + free). */
int32_t kiln_engine_pool_blocks(kiln_engine *engine);

/* The JSON of kiln_engine_describe_json for a graph read with
 * kiln_engine_read, whether or not its plugins are resolved: `kiln inspect`
 * uses it on engines whose plugin libraries are not loaded. *out is
 * malloc'd. */
kiln_status kiln_engine_describe_graph_json(const kiln_graph *g, const kiln_engine_header_info *info, char **out);

struct kiln_context {
    kiln_engine *engine;
    int32_t profile;
    /* What the backend sees: bindings, buffers, block, shapes, plugin
     * clones, scratch and layer times (src/backend/backend.h). */
    kiln_exec_plan plan;
    int64_t *values;      /* graph.exprs.n, scratch for evaluation */
    int32_t *input_set;   /* graph.n_inputs */
    int32_t shapes_ready; /* plan.dims are valid */
    /* Byte sizes of plan.io_buf: the buffers of the unbound I/O tensors,
     * grown to the current shape when shapes are set or a tensor is
     * unbound, never in enqueue. */
    size_t *io_cap;
    kiln_backend_context *backend_context;
    /* kiln_context_io_span's memory, NULL: none. */
    void *span;
    size_t span_bytes;
};

/* KILN_OK once every input shape is set. */
kiln_status kiln_context_require_shapes(const kiln_context *ctx);

/* One block of the backend's I/O memory (device memory on CUDA) owned by
 * the context and freed with it, for a caller that binds several inputs
 * inside it and fills them all with one copy (the LLM step's inputs,
 * src/llm/step.c). A second call replaces the first. */
kiln_status kiln_context_io_span(kiln_context *ctx, size_t bytes, void **ptr);

/* Copies host[0..bytes) to the start of the span, enqueued in stream order
 * as kiln_context_copy_input is: `first` names the input bound at the
 * span's start (its staging buffer carries the copy on CUDA). Fails when
 * that input is not bound there or bytes exceed the span. */
kiln_status kiln_context_copy_span(kiln_context *ctx, const char *first, const void *host, size_t bytes);

/* Copies the first `bytes` of I/O tensor `src` over the start of input
 * `dst`, in stream order after what is enqueued (on CUDA a device copy on
 * the context's stream; on the CPU a memcpy): a step's output fed to the
 * next step without a trip through the host (the LLM's decode steps run
 * ahead, src/llm/scheduler.c). */
kiln_status kiln_context_copy_between(kiln_context *ctx, const char *dst, const char *src, size_t bytes);

#endif
