/* The CUDA backend: device state shared by an engine's contexts, and one
 * entry point that launches any layer of a graph on a stream. It mirrors
 * the CPU backend (src/backend/cpu/cpu_backend.h), whose kernels are its
 * numerical reference. Only launches work: no allocation, no
 * synchronization, so a whole enqueue can be captured in a CUDA graph.
 *
 * Compiled only when CMake finds nvcc (KILN_HAVE_CUDA); everything here
 * fails with KILN_ERROR_TARGET at run time when no GPU is present. */
#ifndef KILN_BACKEND_CUDA_H
#define KILN_BACKEND_CUDA_H

#include "../cpu/cpu_backend.h"

/* Per-device state an engine creates once: cuBLASLt handle and its
 * workspace, device properties. Shared read-only by all contexts of the
 * engine; each launch passes its own stream. */
typedef struct kiln_cuda_device kiln_cuda_device;

/* Nonzero when a usable GPU is present; *arch receives its compute
 * capability as 10*major + minor (e.g. 90). Never fails: no GPU is 0. */
int kiln_cuda_available(int32_t *arch);

kiln_status kiln_cuda_device_create(kiln_cuda_device **out);
void kiln_cuda_device_destroy(kiln_cuda_device *dev);

typedef struct kiln_cuda_args {
    const kiln_graph *graph;
    const kiln_layer *layer;
    const kiln_exec_tensor *inputs;   /* device pointers, layer->n_inputs */
    const kiln_exec_tensor *outputs;  /* device pointers, layer->n_outputs */
    kiln_plugin *plugin;              /* the context's instance for PLUGIN layers */
    void *workspace;                  /* device memory, layer->workspace bytes */
    kiln_cuda_device *device;
    void *stream;                     /* cudaStream_t */
} kiln_cuda_args;

/* Launches one layer on args->stream. Errors name the layer and, for a
 * failed CUDA call, the call, file and line. */
kiln_status kiln_cuda_run_layer(const kiln_cuda_args *args);

#endif
