/* Loading an engine: mapping, validation, target check (the backend table
 * of the engine's target), plugin resolution. */
#include "runtime/runtime_internal.h"

#include <kiln/kiln.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "plugin/plugin_internal.h"
#include "runtime/engine_image.h"

/* ---- plugin resolution ------------------------------------------------------------- */

static const kiln_layer *plugin_layer(const kiln_graph *g, int32_t index)
{
    for (int32_t i = 0; i < g->n_layers; i++)
        if (g->layers[i].op == KILN_OP_PLUGIN && g->layers[i].p.plugin.index == index)
            return &g->layers[i];
    return NULL;
}

static const char *plugin_layer_name(const kiln_graph *g, int32_t index)
{
    const kiln_layer *L = plugin_layer(g, index);
    return L ? L->name : "?";
}

static int same_triple(const kiln_plugin_rec *a, const kiln_plugin_rec *b)
{
    return strcmp(a->name, b->name) == 0 && strcmp(a->version, b->version) == 0 &&
           strcmp(a->plugin_namespace, b->plugin_namespace) == 0;
}

/* Appends printf output to a fixed buffer, truncating. */
static void appendf(char *buf, size_t size, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void appendf(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = (size_t)n >= size - *len ? size : *len + (size_t)n;
}

/* Looks every record up and reports all missing triples at once, so a
 * user fixes the command line in one go rather than one library per try. */
static kiln_status resolve_plugins(kiln_registry *reg, kiln_graph *g)
{
    char missing[768] = "", near[512] = "";
    size_t mlen = 0, nlen = 0;
    int32_t n_missing = 0;
    for (int32_t i = 0; i < g->n_plugins; i++) {
        kiln_plugin_rec *r = &g->plugins[i];
        const char *lib = NULL;
        r->creator = reg ? kiln_registry_find(reg, r->name, r->version, r->plugin_namespace, &lib) : NULL;
        if (r->creator)
            continue;
        int dup = 0;
        for (int32_t j = 0; j < i; j++)
            dup |= !g->plugins[j].creator && same_triple(&g->plugins[j], r);
        if (dup)
            continue;
        n_missing++;
        const char *from = r->library ? r->library : "an unknown library";
        if (strcmp(from, KILN_BUILTIN_LIBRARY) == 0)
            appendf(missing, sizeof missing, &mlen,
                    "%s\"%s\" version \"%s\" namespace \"%s\" (a kiln built-in plugin this kiln lacks)",
                    n_missing > 1 ? "; " : "", r->name, r->version, r->plugin_namespace);
        else
            appendf(missing, sizeof missing, &mlen,
                    "%s\"%s\" version \"%s\" namespace \"%s\" (from %s — load it with --plugins)",
                    n_missing > 1 ? "; " : "", r->name, r->version, r->plugin_namespace, from);
        if (reg) {
            char one[256];
            kiln_registry_near_misses(reg, r->name, r->version, r->plugin_namespace, one, sizeof one);
            if (one[0])
                appendf(near, sizeof near, &nlen, "%s%s", nlen ? "; " : "", one);
        }
    }
    if (n_missing == 0)
        return KILN_OK;
    return kiln_fail(KILN_ERROR_PLUGIN, "engine needs %d plugin%s that %s not registered: %s%s%s", (int)n_missing,
                     n_missing == 1 ? "" : "s", n_missing == 1 ? "is" : "are", missing,
                     near[0] ? "; near misses: " : "", near);
}

/* Recreates each plugin's prototype instance from its blob. Contexts clone
 * these, so the engine itself never runs a plugin. */
/* The engine's record of a plugin layer's outputs must be what the plugin
 * says for its inputs, and the plugin must accept those dtypes: a plan that
 * shrank an output or changed a dtype would otherwise have the plugin write
 * past the memory planned for it. Same checks and messages as at build
 * (kiln_plugin_check_layer). */
static kiln_status check_plugin_outputs(kiln_graph *g, const kiln_layer *L, const kiln_plugin_rec *r,
                                        kiln_backend backend)
{
    const kiln_plugin_ops *ops = r->instance->ops;
    int32_t ni = L->n_inputs, no = L->n_outputs;
    if (ni > KILN_PLUGIN_MAX_INPUTS || no > KILN_PLUGIN_MAX_OUTPUTS)
        return kiln_fail(KILN_ERROR_FORMAT, "layer \"%s\": %d inputs and %d outputs exceed the limits", L->name, ni,
                         no);
    kiln_shape_expr in_shapes[KILN_PLUGIN_MAX_INPUTS], out_shapes[KILN_PLUGIN_MAX_OUTPUTS];
    kiln_dtype in_types[KILN_PLUGIN_MAX_INPUTS], out_types[KILN_PLUGIN_MAX_OUTPUTS];
    memset(in_shapes, 0, sizeof in_shapes);
    memset(out_shapes, 0, sizeof out_shapes);
    for (int32_t i = 0; i < ni; i++) {
        const kiln_tensor_rec *t = &g->tensors[L->inputs[i]];
        in_types[i] = t->dtype;
        in_shapes[i].rank = t->rank;
        memcpy(in_shapes[i].d, t->dims, sizeof t->dims);
    }
    for (int32_t o = 0; o < no; o++)
        out_types[o] = KILN_DTYPE_COUNT;
    char who[256];
    snprintf(who, sizeof who, "%s %s", r->name, r->version);
    unsigned long fails = kiln_host_fail_count();
    kiln_status s = ops->output_dtypes(r->instance, in_types, ni, out_types, no);
    if (s != KILN_OK)
        return kiln_fail_context(kiln_plugin_error(who, "output_dtypes", s, fails), "layer \"%s\"", L->name);
    fails = kiln_host_fail_count();
    /* Equal expressions are the same node of the pool (it hash-conses), so
     * the plugin's answer is compared by index. */
    s = ops->output_shapes(r->instance, in_shapes, ni, out_shapes, no, &g->exprs);
    if (s != KILN_OK)
        return kiln_fail_context(kiln_plugin_error(who, "output_shapes", s, fails), "layer \"%s\"", L->name);
    for (int32_t o = 0; o < no; o++) {
        const kiln_tensor_rec *t = &g->tensors[L->outputs[o]];
        int same = out_types[o] == t->dtype && out_shapes[o].rank == t->rank;
        for (int32_t k = 0; same && k < t->rank; k++)
            same = out_shapes[o].d[k] == t->dims[k];
        if (!same)
            return kiln_fail(KILN_ERROR_FORMAT,
                             "layer \"%s\": output \"%s\" (%s, rank %d) is not what plugin %s gives for "
                             "its inputs",
                             L->name, t->name, kiln_dtype_name(t->dtype), t->rank, who);
    }
    return kiln_plugin_check_layer(g, L, backend);
}

static kiln_status deserialize_plugins(kiln_graph *g, kiln_backend backend)
{
    for (int32_t i = 0; i < g->n_plugins; i++) {
        kiln_plugin_rec *r = &g->plugins[i];
        const char *layer = plugin_layer_name(g, i);
        kiln_plugin *inst = NULL;
        if (!r->creator->deserialize)
            return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": plugin \"%s\" cannot deserialize", layer, r->name);
        /* A plugin that fails without a message must not leave an older,
         * unrelated one to be reported. */
        unsigned long fails = kiln_host_fail_count();
        kiln_status s = r->creator->deserialize(r->creator, r->blob_version, r->blob, r->blob_size, &inst);
        if ((unsigned)s >= KILN_STATUS_COUNT)
            s = KILN_ERROR_PLUGIN;
        if (s != KILN_OK && kiln_host_fail_count() == fails)
            kiln_fail(s, "plugin \"%s\" refused its blob (version %u, %zu bytes) with %s and gave no message", r->name,
                      (unsigned)r->blob_version, r->blob_size, kiln_status_name(s));
        if (s != KILN_OK)
            return kiln_fail_context(s, "layer \"%s\"", layer);
        if (!inst)
            return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": plugin \"%s\" deserialize returned no instance", layer,
                             r->name);
        const kiln_plugin_ops *ops = inst->ops;
        if (!ops || ops->struct_size < offsetof(kiln_plugin_ops, destroy) + sizeof ops->destroy || !ops->enqueue ||
            !ops->clone || !ops->destroy) {
            /* Without a destroy the instance cannot be freed: it leaks
             * rather than crash the graph's cleanup. */
            if (ops && ops->struct_size >= offsetof(kiln_plugin_ops, destroy) + sizeof ops->destroy && ops->destroy)
                ops->destroy(inst);
            return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": plugin \"%s\" instance lacks enqueue, clone or destroy",
                             layer, r->name);
        }
        r->instance = inst;
        /* The layer's output count was fixed at build time; a plugin that
         * now claims another would write past the outputs it is given. */
        const kiln_layer *L = plugin_layer(g, i);
        if (L && ops->num_outputs && ops->num_outputs(inst) != L->n_outputs)
            return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": plugin \"%s\" has %d outputs, the engine has %d", layer,
                             r->name, (int)ops->num_outputs(inst), (int)L->n_outputs);
        if (!(ops->backends & KILN_BACKEND_BIT(KILN_BACKEND_CPU)))
            return kiln_fail(KILN_ERROR_TARGET, "layer \"%s\": plugin \"%s\" has no CPU enqueue", layer, r->name);
        if (!(ops->backends & KILN_BACKEND_BIT(backend)))
            return kiln_fail(KILN_ERROR_TARGET, "layer \"%s\": plugin \"%s\" has no %s enqueue", layer, r->name,
                             kiln_backend_name(backend));
        if (L)
            KILN_TRY(check_plugin_outputs(g, L, r, backend));
    }
    return KILN_OK;
}

/* ---- plan checks --------------------------------------------------------------------
 * The reader validates the file; these guard the invariants the runtime
 * relies on for memory safety, cheaply, once per load. */

#define KILN_BLOCK_ALIGN 256u

/* Rounds v up to KILN_BLOCK_ALIGN; nonzero on overflow. */
static int align_up(size_t v, size_t *out)
{
    if (kiln_add_overflow(v, KILN_BLOCK_ALIGN - 1, out))
        return 1;
    *out &= ~(size_t)(KILN_BLOCK_ALIGN - 1);
    return 0;
}

static int is_io(const kiln_tensor_rec *r)
{
    return !(r->flags & KILN_TENSOR_CONSTANT) && (r->flags & (KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT));
}

static kiln_status check_tensor_ref(const kiln_engine *e, const kiln_layer *L, int32_t t)
{
    const kiln_graph *g = &e->graph;
    if (t < 0 || t >= g->n_tensors)
        return kiln_fail(KILN_ERROR_FORMAT, "layer \"%s\": tensor index %d out of range", L->name, (int)t);
    if (!(g->tensors[t].flags & KILN_TENSOR_CONSTANT) && !is_io(&g->tensors[t]) && e->offsets[t] < 0)
        return kiln_fail(KILN_ERROR_FORMAT, "layer \"%s\": tensor \"%s\" has no arena memory", L->name,
                         g->tensors[t].name);
    return KILN_OK;
}

typedef struct byte_range {
    size_t begin, end;
} byte_range;

static int cmp_range(const void *a, const void *b)
{
    const byte_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Bytes of the removed ranges that lie wholly below `at`. */
static size_t removed_below(const byte_range *r, int32_t n, size_t at)
{
    size_t sum = 0;
    for (int32_t i = 0; i < n && r[i].end <= at; i++)
        sum += r[i].end - r[i].begin;
    return sum;
}

/* I/O tensors live outside the context's block, in buffers the context
 * sizes to their current shape (context.c), because an I/O tensor's max
 * shape can be enormous (an LLM's KV cache at n_blocks = 2^24) while the
 * caller binds its own memory anyway. The builder may still have planned
 * them inside the arena: an I/O tensor is live for the whole run, so no
 * other tensor shares its bytes, and cutting the aligned part of its range
 * out of the arena (shifting what lies above down) keeps every other
 * tensor's range disjoint and aligned. */
static kiln_status check_plan(kiln_engine *e)
{
    const kiln_graph *g = &e->graph;
    size_t end, total, arena = g->arena_size;
    e->offsets = malloc(sizeof *e->offsets * (size_t)(g->n_tensors ? g->n_tensors : 1));
    byte_range *cut = malloc(sizeof *cut * (size_t)(g->n_tensors ? g->n_tensors : 1));
    int32_t n_cut = 0;
    if (!e->offsets || !cut) {
        free(cut);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory loading an engine");
    }
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        e->offsets[t] = -1;
        if (r->flags & KILN_TENSOR_CONSTANT) {
            if (!r->data && r->data_size) {
                free(cut);
                return kiln_fail(KILN_ERROR_FORMAT, "constant \"%s\" has no data", r->name);
            }
            continue;
        }
        if (r->arena_offset < 0)
            continue;
        if (kiln_add_overflow((size_t)r->arena_offset, r->max_bytes, &end) || end > g->arena_size) {
            free(cut);
            return kiln_fail(KILN_ERROR_FORMAT, "tensor \"%s\": arena range [%lld, +%zu) exceeds the arena (%zu bytes)",
                             r->name, (long long)r->arena_offset, r->max_bytes, g->arena_size);
        }
        if (is_io(r)) {
            size_t b, en = end & ~(size_t)(KILN_BLOCK_ALIGN - 1);
            if (!align_up((size_t)r->arena_offset, &b) && b < en)
                cut[n_cut++] = (byte_range){b, en};
        } else {
            e->offsets[t] = r->arena_offset;
        }
    }
    qsort(cut, (size_t)n_cut, sizeof *cut, cmp_range);
    /* Two I/O tensors never overlap in a valid plan; a corrupt one could
     * make them, and the cut below must not count bytes twice. */
    for (int32_t i = 1; i < n_cut; i++)
        if (cut[i].begin < cut[i - 1].end) {
            free(cut);
            return kiln_fail(KILN_ERROR_FORMAT, "the memory plan overlaps two I/O tensors");
        }
    arena -= removed_below(cut, n_cut, SIZE_MAX);
    for (int32_t t = 0; t < g->n_tensors; t++) {
        if (e->offsets[t] < 0)
            continue;
        e->offsets[t] -= (int64_t)removed_below(cut, n_cut, (size_t)e->offsets[t]);
        /* Only a corrupt plan puts a tensor across an I/O tensor's bytes. */
        if ((size_t)e->offsets[t] + g->tensors[t].max_bytes > arena) {
            const char *name = g->tensors[t].name;
            free(cut);
            return kiln_fail(KILN_ERROR_FORMAT, "tensor \"%s\" overlaps an I/O tensor in the memory plan", name);
        }
    }
    free(cut);
    if (align_up(arena, &e->workspace_offset) || kiln_add_overflow(e->workspace_offset, g->workspace_size, &total))
        return kiln_fail(KILN_ERROR_FORMAT, "arena plus workspace size overflows");
    for (int32_t l = 0; l < g->n_layers; l++) {
        const kiln_layer *L = &g->layers[l];
        if (L->workspace > g->workspace_size)
            return kiln_fail(KILN_ERROR_FORMAT, "layer \"%s\": workspace %zu bytes exceeds the engine's %zu", L->name,
                             L->workspace, g->workspace_size);
        if (L->op == KILN_OP_PLUGIN && (L->p.plugin.index < 0 || L->p.plugin.index >= g->n_plugins))
            return kiln_fail(KILN_ERROR_FORMAT, "layer \"%s\": plugin index %d out of range", L->name,
                             (int)L->p.plugin.index);
        if (L->op == KILN_OP_CONSTANT)
            continue;
        for (int32_t i = 0; i < L->n_inputs; i++)
            KILN_TRY(check_tensor_ref(e, L, L->inputs[i]));
        for (int32_t i = 0; i < L->n_outputs; i++)
            KILN_TRY(check_tensor_ref(e, L, L->outputs[i]));
        if (L->n_inputs > e->max_layer_inputs)
            e->max_layer_inputs = L->n_inputs;
        if (L->n_outputs > e->max_layer_outputs)
            e->max_layer_outputs = L->n_outputs;
    }
    e->pool.block_bytes = total;

    size_t n_io;
    if (kiln_add_overflow((size_t)g->n_inputs, (size_t)g->n_outputs, &n_io) ||
        !(e->io = malloc(sizeof *e->io * (n_io ? n_io : 1))))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory loading an engine");
    for (int32_t i = 0; i < g->n_inputs; i++)
        e->io[e->n_io++] = g->inputs[i];
    for (int32_t i = 0; i < g->n_outputs; i++) {
        int listed = 0;
        for (int32_t k = 0; k < g->n_inputs; k++)
            listed |= g->inputs[k] == g->outputs[i];
        if (!listed)
            e->io[e->n_io++] = g->outputs[i];
    }
    return KILN_OK;
}

/* ---- load / destroy -------------------------------------------------------------- */

static void release_image(void *image, size_t size, int mapped)
{
    if (!image)
        return;
    if (mapped)
        munmap(image, size);
    else
        free(image);
}

/* Takes ownership of the image in every case. */
static kiln_status engine_from_image(kiln_registry *reg, void *image, size_t size, int mapped, kiln_engine **out)
{
    kiln_engine *e = calloc(1, sizeof *e);
    if (!e) {
        release_image(image, size, mapped);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory loading an engine");
    }
    e->registry = reg;
    e->image = image;
    e->image_size = size;
    e->image_mapped = mapped;
    kiln_graph_init(&e->graph);
    kiln_status s = kiln_engine_read(image, size, 1, &e->graph, &e->info);
    if (s == KILN_OK)
        s = kiln_backend_for_target(&e->info, &e->backend);
    if (s == KILN_OK)
        s = check_plan(e);
    if (s == KILN_OK)
        s = resolve_plugins(reg, &e->graph);
    if (s == KILN_OK)
        s = deserialize_plugins(&e->graph, e->info.backend);
    if (s == KILN_OK && pthread_mutex_init(&e->pool.lock, NULL) != 0)
        s = kiln_fail(KILN_ERROR_INTERNAL, "cannot create the engine's pool lock");
    int lock_made = s == KILN_OK;
    if (s == KILN_OK) {
        e->pool.backend = e->backend;
        s = e->backend->engine_create(&e->graph, &e->backend_engine, &e->constants);
    }
    if (s != KILN_OK) {
        if (lock_made)
            pthread_mutex_destroy(&e->pool.lock);
        kiln_graph_free(&e->graph);
        release_image(image, size, mapped);
        free(e->offsets);
        free(e->io);
        free(e);
        return s;
    }
    *out = e;
    return KILN_OK;
}

/* Host memory for an engine image that the CPU will read every step: 2 MiB
 * aligned and offered transparent huge pages (where the kernel allows them
 * on request, as "madvise" mode does). A decode step streams all the
 * weights; with 4 KiB pages every page is a TLB miss, which a VM pays for
 * twice over. Measured on the 2-core host (SmolLM2, 512-token prompt): the
 * layers' GEMVs 10-15% faster, decode 106-108 -> 118-123 tok/s. */
static void *host_image_alloc(size_t size)
{
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (size < 2 * huge) /* a small engine (the tests' many) gains nothing from it */
        return posix_memalign(&p, 4096, size ? size : 1) == 0 ? p : NULL;
    size_t rounded = (size + huge - 1) / huge * huge;
    if (posix_memalign(&p, huge, rounded) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice: without it the image still works */
#endif
    return p;
}

/* A CPU engine's file read into host_image_alloc memory, a slice at a time
 * from its mapping with each slice dropped once copied, so the process
 * never holds the file twice (peak resident memory is a measured target).
 * Other targets keep the mapping: their weights are copied to the device
 * once. Takes ownership of the mapping. */
static kiln_status host_image_from_map(void *map, size_t size, void **image)
{
    void *copy = host_image_alloc(size);
    if (!copy) {
        munmap(map, size);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a %zu-byte engine", size);
    }
    const size_t slice = (size_t)8 << 20; /* a multiple of the page size */
    for (size_t off = 0; off < size; off += slice) {
        size_t n = size - off < slice ? size - off : slice;
        memcpy((char *)copy + off, (char *)map + off, n);
        (void)madvise((char *)map + off, n, MADV_DONTNEED);
    }
    munmap(map, size);
    *image = copy;
    return KILN_OK;
}

kiln_status kiln_engine_load(kiln_registry *reg, const char *path, kiln_engine **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_load: path and out are required");
    void *map;
    size_t size;
    KILN_TRY(kiln_engine_map_file(path, &map, &size));
    kiln_engine_header_info hdr;
    int mapped = 1;
    if (kiln_engine_read_header(map, size, &hdr) == KILN_OK && hdr.backend == KILN_BACKEND_CPU) {
        kiln_status hs = host_image_from_map(map, size, &map);
        if (hs != KILN_OK)
            return kiln_fail_context(hs, "%s", path);
        mapped = 0;
    }
    kiln_status s = engine_from_image(reg, map, size, mapped, out);
    if (s != KILN_OK)
        return kiln_fail_context(s, "%s", path);
    return KILN_OK;
}

kiln_status kiln_engine_load_memory(kiln_registry *reg, const void *data, size_t size, kiln_engine **out)
{
    if (!data || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_load_memory: data and out are required");
    /* Aligned at least like a mapping, so weights keep the alignment the
     * file gives them. */
    void *copy = host_image_alloc(size);
    if (!copy)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory copying a %zu-byte engine", size);
    memcpy(copy, data, size);
    return engine_from_image(reg, copy, size, 0, out);
}

void kiln_engine_destroy(kiln_engine *engine)
{
    if (!engine)
        return;
    kiln_arena_pool_release(&engine->pool);
    pthread_mutex_destroy(&engine->pool.lock);
    engine->backend->engine_destroy(engine->backend_engine);
    kiln_graph_free(&engine->graph);
    free(engine->offsets);
    free(engine->io);
    release_image(engine->image, engine->image_size, engine->image_mapped);
    free(engine);
}

int32_t kiln_engine_pool_blocks(kiln_engine *engine)
{
    pthread_mutex_lock(&engine->pool.lock);
    int32_t n = engine->pool.n_allocated;
    pthread_mutex_unlock(&engine->pool.lock);
    return n;
}

/* ---- queries ----------------------------------------------------------------------- */

kiln_backend kiln_engine_backend(const kiln_engine *engine) { return engine->info.backend; }

kiln_status kiln_engine_memory_info(const kiln_engine *engine, size_t *free_bytes, size_t *total_bytes)
{
    if (engine->backend->memory_info)
        return engine->backend->memory_info(free_bytes, total_bytes);
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || avail < 0 || page <= 0)
        return kiln_fail(KILN_ERROR_BACKEND, "cannot read the size of physical memory (sysconf)");
    *free_bytes = (size_t)avail * (size_t)page;
    *total_bytes = (size_t)pages * (size_t)page;
    return KILN_OK;
}

int32_t kiln_engine_num_io_tensors(const kiln_engine *engine) { return engine->n_io; }

const char *kiln_engine_io_tensor_name(const kiln_engine *engine, int32_t i)
{
    return i < 0 || i >= engine->n_io ? NULL : engine->graph.tensors[engine->io[i]].name;
}

kiln_status kiln_engine_io_tensor_info(const kiln_engine *engine, const char *name, kiln_dtype *dtype,
                                       int32_t *is_input, kiln_dims *dims)
{
    const kiln_graph *g = &engine->graph;
    int32_t t = name ? kiln_graph_find_tensor(g, name) : -1;
    if (t < 0 || !(g->tensors[t].flags & (KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT)))
        return kiln_fail(KILN_ERROR_NOT_FOUND, "engine has no input or output named \"%s\"", name ? name : "(null)");
    const kiln_tensor_rec *r = &g->tensors[t];
    kiln_dims d;
    memset(&d, 0, sizeof d);
    d.rank = r->rank;
    for (int32_t i = 0; i < r->rank; i++) {
        int64_t v;
        d.d[i] = kiln_expr_is_const(&g->exprs, r->dims[i], &v) ? v : -1;
    }
    if (dtype)
        *dtype = r->dtype;
    if (is_input)
        *is_input = (r->flags & KILN_TENSOR_INPUT) ? 1 : 0;
    if (dims)
        *dims = d;
    return KILN_OK;
}

int32_t kiln_engine_num_profiles(const kiln_engine *engine) { return engine->graph.n_profiles; }

kiln_status kiln_engine_profile_shape(const kiln_engine *engine, int32_t profile, const char *input, kiln_dims *min,
                                      kiln_dims *opt, kiln_dims *max)
{
    const kiln_graph *g = &engine->graph;
    if (profile < 0 || profile >= g->n_profiles)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "profile %d out of range (engine has %d)", (int)profile,
                         (int)g->n_profiles);
    for (int32_t i = 0; i < g->n_inputs; i++) {
        if (!input || strcmp(g->tensors[g->inputs[i]].name, input) != 0)
            continue;
        const kiln_profile_dims *p = &g->profiles[(size_t)profile * (size_t)g->n_inputs + (size_t)i];
        if (min)
            *min = p->min;
        if (opt)
            *opt = p->opt;
        if (max)
            *max = p->max;
        return KILN_OK;
    }
    return kiln_fail(KILN_ERROR_NOT_FOUND, "engine has no input named \"%s\"", input ? input : "(null)");
}
