/* The CUDA backend: its table for the runtime (kiln_backend_cuda,
 * cuda_runtime.c), device state shared by an engine's contexts, and one
 * entry point that launches any layer of a graph on a stream. It mirrors
 * the CPU backend (src/backend/cpu/cpu_backend.h), whose kernels are its
 * numerical reference. Only launches work: no allocation, no
 * synchronization, so a whole enqueue can be captured in a CUDA graph.
 *
 * Files: cuda_runtime.c (the table: engines, contexts, streams, staging,
 * graphs, timing), cuda_backend.c (the device, layer dispatch, plugins),
 * and per op family a .cu of kernels and launchers beside a .c of op
 * entries: cuda_elementwise (binary, unary, fused chains), cuda_reduce
 * (reductions, softmax), cuda_movement (concat, slice, shuffle, gather,
 * cast), cuda_matmul.c (cuBLASLt). cuda_common.cuh is what every kernel
 * shares (launch, PDL, element access).
 *
 * Compiled only when CMake finds nvcc (KILN_HAVE_CUDA); everything here
 * fails with KILN_ERROR_TARGET at run time when no GPU is present. */
#ifndef KILN_BACKEND_CUDA_H
#define KILN_BACKEND_CUDA_H

#include "backend/cpu/cpu_backend.h"

/* Per-device state an engine creates once: cuBLASLt handle and its
 * workspace, device properties. Shared read-only by all contexts of the
 * engine; each launch passes its own stream. */
typedef struct kiln_cuda_device kiln_cuda_device;

/* The CUDA backend's table (cuda_runtime.c). */
extern const kiln_backend_i kiln_backend_cuda;

/* Nonzero when a usable GPU is present; *arch receives its compute
 * capability as 10*major + minor (e.g. 90). Never fails: no GPU is 0. */
int kiln_cuda_available(int32_t *arch);

kiln_status kiln_cuda_device_create(kiln_cuda_device **out);
void kiln_cuda_device_destroy(kiln_cuda_device *dev);

typedef struct kiln_cuda_args {
    const kiln_graph *graph;
    const kiln_layer *layer;
    const kiln_exec_tensor *inputs;  /* device pointers, layer->n_inputs */
    const kiln_exec_tensor *outputs; /* device pointers, layer->n_outputs */
    kiln_plugin *plugin;             /* the context's instance for PLUGIN layers */
    void *workspace;                 /* device memory, layer->workspace bytes */
    kiln_cuda_device *device;
    void *stream; /* cudaStream_t */
} kiln_cuda_args;

/* Launches one layer on args->stream. Errors name the layer and, for a
 * failed CUDA call, the call, file and line. */
kiln_status kiln_cuda_run_layer(const kiln_cuda_args *args);

/* ---- device-side errors ------------------------------------------------------------
 * A kernel cannot return a status, so a gather index out of range is
 * clamped (the launch stays in bounds and writes every output element) and
 * recorded in an error word the device owns; the first error wins. The
 * runtime calls this after synchronizing the stream (never inside an
 * enqueue: it copies from the device): KILN_OK when nothing was recorded,
 * else KILN_ERROR_INVALID_ARGUMENT naming the layer of `graph` (may be NULL),
 * the index and its position, and the word is cleared. Shared by every
 * context of the device, so a report may come from another context's
 * launch of the same engine. */
kiln_status kiln_cuda_device_check(kiln_cuda_device *dev, const kiln_graph *graph);

/* ---- matmul tactics -------------------------------------------------------------------
 * A matmul's tactic picks a cuBLASLt algorithm per bucket of row counts m
 * (the rows of the GEMM as launched, batches folded): bucket b holds m in
 * (2^(b-1), 2^b] (bucket 0: m = 1; m past 2^(KILN_CUDA_TACTIC_BUCKETS - 1)
 * takes the last bucket). With KILN_CUDA_TACTIC_TUNED set, nibble b
 * (bits 4b..4b+3) is the index of the candidate that
 * cublasLtMatmulAlgoGetHeuristic (at most KILN_CUDA_MATMUL_CANDIDATES)
 * lists for the same problem at m = 2^b, or KILN_CUDA_TACTIC_DEFAULT; at
 * run time that algorithm is used when cublasLtMatmulAlgoCheck accepts it
 * for the actual m, else the heuristic's first candidate for the actual
 * shape, which is also what tactic -1 (no tuning: built without a GPU)
 * and any value without the flag (an index tuned at one unknown m by an
 * older build) mean. Plans are cached per device, keyed by the problem,
 * so the heuristic runs once per shape, not once per launch. f32 matmuls
 * compute in exact f32 (CUBLAS_COMPUTE_32F, no TF32) so they agree with
 * the CPU reference; f16/bf16 accumulate in f32. */
#define KILN_CUDA_MATMUL_CANDIDATES 8
#define KILN_CUDA_TACTIC_BUCKETS 15
#define KILN_CUDA_TACTIC_DEFAULT 15
#define KILN_CUDA_TACTIC_TUNED ((int64_t)1 << 62)

/* Times the heuristic candidates of matmul layer `layer` for operands of
 * the given dims and dtypes at each bucket's m = 2^b up to the bucket of
 * the dims' own m (the largest the layer runs: call with the profile's max
 * shapes), a few repetitions each with CUDA events on a private stream,
 * and stores the winners in *tactic (format above). `data` is ignored:
 * scratch buffers are allocated and freed here, so call it at build time
 * only. Results are remembered per problem in `dev`, so layers of one
 * shape are timed once. Buckets of at most KCU_GEMV_MAX_M rows, which the
 * GEMV kernel runs, keep the default. */
kiln_status kiln_cuda_matmul_tune(kiln_cuda_device *dev, const kiln_layer *layer, const kiln_exec_tensor *a,
                                  const kiln_exec_tensor *b, const kiln_exec_tensor *c, int64_t *tactic);

/* The device's plan cache (cuda_matmul.c), made and freed with the device. */
kiln_status kiln_cuda_matmul_cache_create(kiln_cuda_device *dev);
void kiln_cuda_matmul_cache_destroy(kiln_cuda_device *dev);

/* Bytes of cuBLASLt workspace the device preallocates (at create, never in
 * a launch). A matmul launch uses args->workspace instead when the layer
 * has a workspace (layer->workspace bytes, 256-byte aligned): give each
 * context its own, since the device's is shared by every stream and two
 * contexts running matmuls at once must not share scratch. */
#define KILN_CUDA_CUBLASLT_WORKSPACE KILN_GPU_MATMUL_WORKSPACE

#endif
