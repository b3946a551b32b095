/* The CPU backend: one entry point that runs any layer of a graph. Kernels
 * store f16/bf16 but compute in f32. The same kernels are the numerical
 * reference for every other backend (reference mode: one thread, naive
 * matmul with f64 accumulation, fused chains run step by step). */
#ifndef KILN_BACKEND_CPU_H
#define KILN_BACKEND_CPU_H

#include "backend/backend.h"
#include "core/threadpool.h"

typedef struct kiln_cpu_args {
    const kiln_graph *graph;
    const kiln_layer *layer;
    const kiln_exec_tensor *inputs;  /* layer->n_inputs */
    const kiln_exec_tensor *outputs; /* layer->n_outputs, memory allocated */
    kiln_plugin *plugin;             /* the context's instance for PLUGIN layers */
    void *workspace;                 /* layer->workspace bytes (plugins) */
    kiln_threadpool *pool;           /* NULL: run on the calling thread */
    int32_t reference;               /* 1: the reference path */
} kiln_cpu_args;

/* Runs one layer. Errors (e.g. a gather index out of range) name the layer. */
kiln_status kiln_cpu_run_layer(const kiln_cpu_args *args);

/* The CPU backend's table (cpu_runtime.c). */
extern const kiln_backend_i kiln_backend_cpu;

/* Runs every layer of the plan with the CPU kernels (the reference path
 * when `reference`), in the plan's memory or in `host` (see kiln_exec_run).
 * With plan->layer_ms, each layer's host time goes there. */
kiln_status kiln_cpu_exec(kiln_exec_plan *plan, const kiln_exec_host *host, int reference);

/* The table's copy_bandwidth (cpu_bandwidth.c): memcpy split over one
 * thread per online CPU; 256 MiB when bytes is 0. */
kiln_status kiln_cpu_copy_bandwidth(size_t bytes, int32_t reps, double *bytes_per_s);

/* The table's device_name (cpu_bandwidth.c): /proc/cpuinfo's first
 * "model name" (another machine's word for it where there is none). */
kiln_status kiln_cpu_device_name(char *name, size_t size);

#endif
