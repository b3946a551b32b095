/* The backend registry, the layer loop and the GPU architecture helpers
 * every backend and the builder share. */
#include "backend/backend.h"

#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "backend/cpu/cpu_backend.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* ---- registry ---------------------------------------------------------------------------- */

/* The backends compiled in; the CUDA backend registers its table when
 * CMake built it. */
static const kiln_backend_i *const backends[] = {
    &kiln_backend_cpu,
#ifdef KILN_HAVE_CUDA
    &kiln_backend_cuda,
#endif
};

const kiln_backend_i *kiln_backend_find(kiln_backend kind)
{
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (backends[i]->kind == kind)
            return backends[i];
    return NULL;
}

kiln_status kiln_backend_for_target(const kiln_engine_header_info *info, const kiln_backend_i **out)
{
    if ((unsigned)info->backend >= KILN_BACKEND_COUNT)
        return kiln_fail(KILN_ERROR_TARGET, "engine targets unknown backend %d", (int)info->backend);
    const kiln_backend_i *b = kiln_backend_find(info->backend);
    if (!b) {
        static const char *const built[KILN_BACKEND_COUNT] = {"the CPU backend", "CUDA"};
        char archs[128];
        kiln_gpu_archs_format(info->n_gpu_archs, info->gpu_archs, archs, sizeof archs);
        return kiln_fail(KILN_ERROR_TARGET, "engine targets %s (%s), but this kiln was built without %s",
                         kiln_backend_name(info->backend), archs, built[info->backend]);
    }
    if (b->check_target)
        KILN_TRY(b->check_target(info));
    *out = b;
    return KILN_OK;
}

/* ---- the layer loop --------------------------------------------------------------------- */

void *kiln_exec_tensor_data(const kiln_exec_plan *p, int32_t t)
{
    const kiln_tensor_rec *r = &p->graph->tensors[t];
    if (r->flags & KILN_TENSOR_CONSTANT)
        return p->constants ? p->constants[t] : r->data;
    if (p->bound[t])
        return p->bound[t];
    if (p->offsets[t] < 0)
        return p->io_buf[t];
    return p->block + p->offsets[t];
}

void *kiln_exec_io_address(const kiln_exec_plan *p, int32_t t)
{
    return p->bound[t] ? p->bound[t] : kiln_exec_tensor_data(p, t);
}

static void *host_data(const kiln_exec_plan *p, const kiln_exec_host *host, int32_t t)
{
    if (!host)
        return kiln_exec_tensor_data(p, t);
    if (p->graph->tensors[t].flags & KILN_TENSOR_CONSTANT)
        return p->graph->tensors[t].data;
    if (p->offsets[t] < 0)
        return host->io[t];
    return host->block + p->offsets[t];
}

/* The run and layer this thread is in, for kiln_exec_upcoming_constants. */
static _Thread_local const kiln_exec_plan *running_plan;
static _Thread_local const kiln_exec_host *running_host;
static _Thread_local int32_t running_layer;

int32_t kiln_exec_upcoming_constants(int64_t budget, const void **ptr, int64_t *bytes, int32_t max)
{
    const kiln_exec_plan *p = running_plan;
    int32_t n = 0;
    if (!p || !ptr || !bytes)
        return 0;
    const kiln_graph *g = p->graph;
    for (int32_t l = running_layer + 1; l < g->n_layers && budget > 0 && n < max; l++) {
        const kiln_layer *L = &g->layers[l];
        if (L->op == KILN_OP_CONSTANT)
            continue;
        for (int32_t i = 0; i < L->n_inputs && budget > 0 && n < max; i++) {
            const kiln_tensor_rec *r = &g->tensors[L->inputs[i]];
            if (!(r->flags & KILN_TENSOR_CONSTANT) || r->data_size < 4096)
                continue;
            const void *d = host_data(p, running_host, L->inputs[i]);
            int seen = !d;
            for (int32_t k = 0; k < n; k++)
                seen |= ptr[k] == d;
            if (seen)
                continue;
            ptr[n] = d;
            bytes[n] = (int64_t)r->data_size < budget ? (int64_t)r->data_size : budget;
            budget -= bytes[n++];
        }
    }
    return n;
}

kiln_status kiln_exec_run(kiln_exec_plan *p, const kiln_exec_host *host, const kiln_exec_hooks *h)
{
    const kiln_graph *g = p->graph;
    unsigned char *block = host ? host->block : p->block;
    for (int32_t l = 0; l < g->n_layers; l++) {
        const kiln_layer *L = &g->layers[l];
        if (L->op != KILN_OP_CONSTANT) {
            for (int32_t i = 0; i < L->n_inputs; i++) {
                int32_t t = L->inputs[i];
                p->in_args[i] = (kiln_exec_tensor){host_data(p, host, t), g->tensors[t].dtype, p->dims[t]};
            }
            for (int32_t i = 0; i < L->n_outputs; i++) {
                int32_t t = L->outputs[i];
                p->out_args[i] = (kiln_exec_tensor){host_data(p, host, t), g->tensors[t].dtype, p->dims[t]};
            }
            kiln_exec_call call = {
                .graph = g,
                .layer = L,
                .index = l,
                .inputs = p->in_args,
                .outputs = p->out_args,
                .plugin = L->op == KILN_OP_PLUGIN ? p->plugins[L->p.plugin.index] : NULL,
                .workspace = block + p->workspace_offset,
            };
            running_plan = p, running_host = host, running_layer = l;
            kiln_status st = h->run(h->user, &call);
            running_plan = NULL;
            KILN_TRY(st);
        }
        if (h->after)
            KILN_TRY(h->after(h->user, l));
    }
    if (host || !h->copy)
        return KILN_OK;
    for (int32_t i = 0; i < g->n_outputs; i++) {
        int32_t t = g->outputs[i];
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes;
        void *src = kiln_exec_tensor_data(p, t);
        if ((r->flags & KILN_TENSOR_CONSTANT) && p->bound[t] && p->bound[t] != src &&
            kiln_dims_bytes(&p->dims[t], r->dtype, &bytes) == KILN_OK && bytes)
            KILN_TRY(h->copy(h->user, p->bound[t], src, bytes));
    }
    return KILN_OK;
}

/* ---- GPU architectures ------------------------------------------------------------------------ */

void kiln_gpu_archs_format(int32_t n, const int32_t *archs, char *buf, size_t size)
{
    size_t len = 0;
    if (n < 0 || n > 8)
        n = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < n && len < size; i++) {
        int w = snprintf(buf + len, size - len, "%ssm_%d", i ? ", " : "", (int)archs[i]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    if (n == 0)
        snprintf(buf, size, "no GPU architecture recorded");
}

int32_t kiln_gpu_archs_parse(const char *list, int32_t *archs, int32_t *ptx, int32_t max)
{
    int32_t n = 0;
    const char *p = list;
    while (*p) {
        while (*p == ';' || *p == ',' || *p == ' ')
            p++;
        char *end;
        long v = strtol(p, &end, 10);
        const char *stop = end;
        while (*stop && *stop != ';' && *stop != ',' && *stop != ' ')
            stop++;
        int real_only = (size_t)(stop - end) == 5 && strncmp(end, "-real", 5) == 0;
        if (end != p && v > 0 && v < 1000) {
            int32_t k = 0;
            while (k < n && archs[k] != (int32_t)v)
                k++;
            if (k == n && n < max) {
                archs[n] = (int32_t)v;
                ptx[n++] = 0;
            }
            if (k < n && !real_only)
                ptx[k] = 1;
        }
        if (stop == p)
            break;
        p = stop;
    }
    return n;
}
