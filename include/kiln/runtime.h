/* kiln/runtime.h — execution contexts.
 *
 * An engine has any number of contexts. A context owns all mutable state of
 * one inference: input shapes, bound addresses, its activation arena (from
 * the engine's pool), plugin workspace and cloned plugin instances. A
 * context is used by one thread at a time; contexts of one engine run
 * concurrently on different threads or streams.
 */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include <kiln/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_context kiln_context;

/* Creates a context using profile 0. Its arena is taken from the engine's
 * pool (reused after a context is destroyed, so create/destroy in a loop
 * does not grow memory). `engine` must outlive the context. */
KILN_API kiln_status kiln_context_create(kiln_engine *engine, kiln_context **out);

/* NULL is a no-op. Returns the arena to the engine's pool. */
KILN_API void kiln_context_destroy(kiln_context *ctx);

/* Selects the optimization profile whose bounds input shapes must respect. */
KILN_API kiln_status kiln_context_set_profile(kiln_context *ctx, int32_t profile);

/* Sets the shape of a dynamic input. A dim outside the profile's [min, max]
 * is KILN_ERROR_SHAPE, naming the input, the dim and the bounds. */
KILN_API kiln_status kiln_context_set_input_shape(kiln_context *ctx, const char *name, const kiln_dims *dims);

/* Shape of any I/O tensor once all input shapes are set (outputs are
 * inferred). KILN_ERROR_SHAPE when an input shape is still unset. */
KILN_API kiln_status kiln_context_tensor_shape(kiln_context *ctx, const char *name, kiln_dims *out);

/* Binds caller memory to an I/O tensor (device memory on CUDA). Borrowed
 * until unbound (NULL) or the context is destroyed. Without a binding the
 * context's own buffer is used; kiln_context_tensor_address returns it.
 * That buffer is sized to the tensor's current shape (allocated when the
 * shapes are set or the tensor is unbound, never in enqueue), so ask for
 * its address again after changing shapes: it moves when it has to grow.
 * A bound tensor has no buffer of the context's. */
KILN_API kiln_status kiln_context_set_tensor_address(kiln_context *ctx, const char *name, void *ptr);
KILN_API kiln_status kiln_context_tensor_address(kiln_context *ctx, const char *name, void **ptr);

/* Runs the engine. On the CPU backend it runs to completion on the calling
 * thread and the engine's thread pool (`stream` ignored). On CUDA it only
 * launches work on `stream` (a cudaStream_t, NULL = the context's own). */
KILN_API kiln_status kiln_context_enqueue(kiln_context *ctx, void *stream);

/* Waits for work enqueued on the context's stream (no-op on the CPU). */
KILN_API kiln_status kiln_context_synchronize(kiln_context *ctx);

/* Runs the engine layer by layer on the reference path: unfused, single
 * thread, naive f32 kernels, plugins' CPU enqueue. Host memory for all
 * I/O. Used by `kiln exec --check`. Inputs are read from, and outputs
 * written to, the context's CPU-visible buffers. */
KILN_API kiln_status kiln_context_run_reference(kiln_context *ctx);

/* ---- host copies, timing, CUDA graphs ------------------------------------ */

/* Copies `bytes` (exactly the tensor's size at the current shapes) from
 * host memory into an I/O tensor's memory (bound or the context's own).
 * On CUDA the copy goes through a pinned staging buffer of the context and
 * is enqueued on the context's stream: `host` is read before the call
 * returns, the device copy completes in stream order. Staging buffers are
 * allocated here or on a shape change, never in enqueue. On the CPU it is
 * a memcpy. */
KILN_API kiln_status kiln_context_copy_input(kiln_context *ctx, const char *name, const void *host, size_t bytes);

/* Copies an I/O tensor's current contents to host memory. On CUDA the
 * device-to-staging copy is enqueued on the context's stream and the
 * staging-to-`host` copy happens in kiln_context_synchronize (or when the
 * same tensor is copied out again): `host` must stay valid and is filled
 * only after kiln_context_synchronize. On the CPU it is a memcpy. */
KILN_API kiln_status kiln_context_copy_output(kiln_context *ctx, const char *name, void *host, size_t bytes);

/* Modes of kiln_context_set_cuda_graph. */
enum {
    KILN_CUDA_GRAPH_OFF = 0,    /* launch directly; captured graphs are dropped */
    KILN_CUDA_GRAPH_ON = 1,     /* capture each new set of shapes, replay known ones */
    KILN_CUDA_GRAPH_PAUSED = 2, /* launch directly, keeping the captured graphs for ON */
};

/* CUDA only: in mode ON, each enqueue captures its launches into a CUDA
 * graph the first time it sees a set of input shapes and bound addresses,
 * and replays that graph afterwards (16 sets are cached, the least
 * recently used evicted). PAUSED lets a caller run shapes it does not want
 * captured (an LLM's prefill steps) between replays. Turning ON fails,
 * naming the plugin and its layer, when a plugin of the engine is not
 * marked KILN_PLUGIN_FLAG_CAPTURE_SAFE; KILN_ERROR_TARGET on a CPU engine. */
KILN_API kiln_status kiln_context_set_cuda_graph(kiln_context *ctx, int32_t mode);

/* CUDA only: kernel launches (graph nodes) of the graph the last enqueue
 * replayed or captured. KILN_ERROR_INVALID_ARGUMENT when the last enqueue
 * was not a graph; KILN_ERROR_TARGET on a CPU engine. */
KILN_API kiln_status kiln_context_graph_nodes(kiln_context *ctx, size_t *n_nodes);


/* CUDA only: GPU milliseconds of the last enqueue, measured with CUDA
 * events around its launches (waits for it to finish). KILN_ERROR_TARGET
 * on a CPU engine, KILN_ERROR_INVALID_ARGUMENT before any enqueue or when
 * the last enqueue was captured by the caller. */
KILN_API kiln_status kiln_context_gpu_time(kiln_context *ctx, float *ms);

/* CPU engines: runs this context's layers on a thread pool of its own with
 * n_threads threads (1..1024, the calling thread counted), or, with 0, on
 * the process-wide pool, which has one thread per physical core this
 * process may run on (SMT siblings counted once). OpenBLAS, where a layer
 * calls it, is given the same count. KILN_ERROR_TARGET on other backends. */
KILN_API kiln_status kiln_context_set_threads(kiln_context *ctx, int32_t n_threads);

/* Per-layer timing: with `enable` nonzero, each later enqueue times every
 * layer (CPU: host clock; CUDA: events between launches, not in graph
 * mode). */
KILN_API kiln_status kiln_context_set_profiling(kiln_context *ctx, int32_t enable);

/* Layers of the engine, in execution order (constants included, with time
 * 0). */
KILN_API int32_t kiln_context_num_layers(const kiln_context *ctx);

/* Name (borrowed), op name and milliseconds of layer i in the last profiled
 * run (waits for it on CUDA). */
KILN_API kiln_status kiln_context_layer_time(kiln_context *ctx, int32_t i, const char **name, const char **op,
                                             double *ms);

/* ---- memory bandwidth ---------------------------------------------------- */

/* Measures the memory bandwidth of a backend, the ceiling a memory-bound
 * step (LLM decode) is judged against: a copy of `bytes` (0: 1 GiB on
 * CUDA, 256 MiB on the CPU) between two buffers allocated for the call —
 * device to device on CUDA, memcpy split over one thread per online CPU on
 * the CPU — timed `reps` times (1..64) after warm-up. *bytes_per_s is the
 * median run's bytes read plus bytes written per second (STREAM's
 * convention). KILN_ERROR_TARGET when the backend is not available here. */
KILN_API kiln_status kiln_backend_measure_copy_bandwidth(kiln_backend backend, size_t bytes, int32_t reps,
                                                         double *bytes_per_s);

/* The name of the device a backend runs on, for a benchmark to print beside
 * its figures: the current GPU's on CUDA ("NVIDIA H100 80GB HBM3"), the
 * CPU's model on the CPU ("unknown CPU" where the system does not say).
 * NUL-terminated in name[size], cut to fit. KILN_ERROR_TARGET when the
 * backend is not available here. */
KILN_API kiln_status kiln_backend_device_name(kiln_backend backend, char *name, size_t size);

#ifdef __cplusplus
}
#endif

#endif
