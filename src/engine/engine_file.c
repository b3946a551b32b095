/* The engine file writer and reader. docs/engine-format.md is the spec:
 * every layout constant here is named there. */
#include "engine_file.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* The state struct on the stack: no allocation that could fail. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <kiln/kiln.h>

#include "../core/error.h"

/* ---- layout ------------------------------------------------------------------ */

#define HEADER_SIZE 96u
#define ENTRY_SIZE 32u
#define OFF_FORMAT_VERSION 8u
#define OFF_HEADER_SIZE 12u
#define OFF_KILN_VERSION 16u
#define OFF_BACKEND 32u
#define OFF_N_GPU_ARCHS 36u
#define OFF_GPU_ARCHS 40u
#define OFF_FILE_SIZE 72u
#define OFF_N_SECTIONS 80u
#define OFF_RESERVED 84u
#define OFF_HEADER_CHECKSUM 88u

#define WEIGHTS_PAGE 4096u
#define SECTION_ALIGN 8u

#define SECTION_PLAN KILN_FOURCC('P', 'L', 'A', 'N')
#define SECTION_WEIGHTS KILN_FOURCC('W', 'G', 'H', 'T')
#define SECTION_BLOBS KILN_FOURCC('B', 'L', 'O', 'B')

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The header checksum covers the header with its checksum field read as
 * zero, then the section table. */
static uint64_t header_checksum(const uint8_t *image, size_t table_bytes)
{
    static const uint8_t zero[8] = {0};
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    XXH64_update(&st, image, OFF_HEADER_CHECKSUM);
    XXH64_update(&st, zero, sizeof zero);
    XXH64_update(&st, image + OFF_HEADER_CHECKSUM + 8, HEADER_SIZE - OFF_HEADER_CHECKSUM - 8);
    XXH64_update(&st, image + HEADER_SIZE, table_bytes);
    return XXH64_digest(&st);
}

static void fourcc_str(uint32_t id, char out[5])
{
    for (int i = 0; i < 4; i++) {
        char c = (char)(id >> (8 * i));
        out[i] = (c >= 0x20 && c < 0x7f) ? c : '?';
    }
    out[4] = '\0';
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* ---- writing: the plan as JSON ------------------------------------------------- */

/* Builds JSON while remembering whether any allocation failed, so the
 * writer checks once at the end instead of after every call. */
typedef struct jbuild {
    int ok;
} jbuild;

static json_t *jb_check(jbuild *b, json_t *v)
{
    if (!v)
        b->ok = 0;
    return v;
}

static void jb_set(jbuild *b, json_t *obj, const char *key, json_t *v)
{
    if (!v || !obj || json_object_set_new(obj, key, v) != 0)
        b->ok = 0;
}

static void jb_push(jbuild *b, json_t *arr, json_t *v)
{
    if (!v || !arr || json_array_append_new(arr, v) != 0)
        b->ok = 0;
}

static json_t *jb_int(jbuild *b, int64_t v) { return jb_check(b, json_integer((json_int_t)v)); }

static json_t *jb_str(jbuild *b, const char *s) { return jb_check(b, json_string(s ? s : "")); }

static json_t *jb_i32s(jbuild *b, const int32_t *v, int32_t n)
{
    json_t *a = jb_check(b, json_array());
    for (int32_t i = 0; i < n; i++)
        jb_push(b, a, jb_int(b, v[i]));
    return a;
}

static json_t *jb_i64s(jbuild *b, const int64_t *v, int32_t n)
{
    json_t *a = jb_check(b, json_array());
    for (int32_t i = 0; i < n; i++)
        jb_push(b, a, jb_int(b, v[i]));
    return a;
}

static json_t *jb_pair(jbuild *b, uint64_t x, uint64_t y)
{
    json_t *a = jb_check(b, json_array());
    jb_push(b, a, jb_int(b, (int64_t)x));
    jb_push(b, a, jb_int(b, (int64_t)y));
    return a;
}

static json_t *jb_dims(jbuild *b, const kiln_dims *d)
{
    return jb_i64s(b, d->d, d->rank < 0 ? 0 : d->rank > KILN_MAX_RANK ? KILN_MAX_RANK : d->rank);
}

/* Rank of a layer's first input, or -1 when it has none. */
static int32_t first_input_rank(const kiln_graph *g, const kiln_layer *l)
{
    if (l->n_inputs < 1 || l->inputs[0] < 0 || l->inputs[0] >= g->n_tensors)
        return -1;
    return g->tensors[l->inputs[0]].rank;
}

static kiln_status layer_params_json(jbuild *b, const kiln_graph *g, const kiln_layer *l,
                                     json_t **out)
{
    const kiln_layer_params *p = &l->p;
    json_t *o = jb_check(b, json_object());
    int32_t rank = first_input_rank(g, l);
    switch (l->op) {
    case KILN_OP_MATMUL:
        jb_set(b, o, "transpose_a", jb_int(b, p->matmul.transpose_a));
        jb_set(b, o, "transpose_b", jb_int(b, p->matmul.transpose_b));
        break;
    case KILN_OP_BINARY: jb_set(b, o, "op", jb_int(b, p->binary.op)); break;
    case KILN_OP_UNARY: jb_set(b, o, "op", jb_int(b, p->unary.op)); break;
    case KILN_OP_REDUCE:
        jb_set(b, o, "op", jb_int(b, p->reduce.op));
        jb_set(b, o, "axes", jb_int(b, p->reduce.axes));
        jb_set(b, o, "keep_dims", jb_int(b, p->reduce.keep_dims));
        break;
    case KILN_OP_SOFTMAX: jb_set(b, o, "axis", jb_int(b, p->softmax.axis)); break;
    case KILN_OP_CONCAT: jb_set(b, o, "axis", jb_int(b, p->concat.axis)); break;
    case KILN_OP_GATHER: jb_set(b, o, "axis", jb_int(b, p->gather.axis)); break;
    case KILN_OP_SLICE:
        if (rank < 0 || rank > KILN_MAX_RANK) {
            json_decref(o);
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": slice input has no valid rank",
                             l->name ? l->name : "");
        }
        jb_set(b, o, "start", jb_i64s(b, p->slice.start, rank));
        jb_set(b, o, "stride", jb_i64s(b, p->slice.stride, rank));
        break;
    case KILN_OP_SHUFFLE:
        if (rank < 0 || rank > KILN_MAX_RANK || p->shuffle.mid_rank < 0 ||
            p->shuffle.mid_rank > KILN_MAX_RANK) {
            json_decref(o);
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "layer \"%s\": shuffle input rank %d or mid_rank %d is outside 0..%d",
                             l->name ? l->name : "", rank, p->shuffle.mid_rank, KILN_MAX_RANK);
        }
        if (p->shuffle.has_first)
            jb_set(b, o, "first", jb_i32s(b, p->shuffle.first, rank));
        jb_set(b, o, "mid", jb_i32s(b, p->shuffle.mid, p->shuffle.mid_rank));
        if (p->shuffle.has_second)
            jb_set(b, o, "second", jb_i32s(b, p->shuffle.second, p->shuffle.mid_rank));
        break;
    case KILN_OP_CAST: jb_set(b, o, "to", jb_int(b, p->cast.to)); break;
    case KILN_OP_PLUGIN: jb_set(b, o, "index", jb_int(b, p->plugin.index)); break;
    case KILN_OP_FUSED: {
        if (p->fused.n_steps < 0 || p->fused.n_steps > KILN_FUSED_MAX_STEPS) {
            json_decref(o);
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %d fused steps (at most %d)",
                             l->name ? l->name : "", p->fused.n_steps, KILN_FUSED_MAX_STEPS);
        }
        json_t *steps = jb_check(b, json_array());
        for (int32_t i = 0; i < p->fused.n_steps; i++) {
            const kiln_fused_step *s = &p->fused.steps[i];
            int32_t v[5] = {s->is_binary, s->op, s->a, s->b, s->src_layer};
            jb_push(b, steps, jb_i32s(b, v, 5));
        }
        jb_set(b, o, "steps", steps);
        break;
    }
    case KILN_OP_CONSTANT:
    case KILN_OP_COUNT: break;
    }
    *out = o;
    return KILN_OK;
}

/* Where each constant and blob landed, computed before the plan is written
 * because the plan records them. */
typedef struct write_layout {
    uint64_t *const_offset;   /* per tensor, into the weights section */
    uint64_t weights_size;
    uint64_t *blob_offset;    /* per plugin, into the blobs section */
    size_t *blob_size;
    uint32_t *blob_version;
    uint8_t **blob_data;      /* per plugin; owned when blob_owned */
    int32_t *blob_owned;
    uint64_t blobs_size;
} write_layout;

static void write_layout_free(write_layout *w, int32_t n_plugins)
{
    if (w->blob_data)
        for (int32_t i = 0; i < n_plugins; i++)
            if (w->blob_owned[i])
                free(w->blob_data[i]);
    free(w->const_offset);
    free(w->blob_offset);
    free(w->blob_size);
    free(w->blob_version);
    free(w->blob_data);
    free(w->blob_owned);
}

static kiln_status fits_i64(uint64_t v, const char *what)
{
    if (v > (uint64_t)INT64_MAX)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s (%" PRIu64 ") is too large for an engine", what, v);
    return KILN_OK;
}

static kiln_status plan_to_json(const kiln_graph *g, const write_layout *w, char **text)
{
    KILN_TRY(fits_i64(g->arena_size, "arena_size"));
    KILN_TRY(fits_i64(g->workspace_size, "workspace_size"));
    jbuild b = {1};
    json_t *root = jb_check(&b, json_object());
    kiln_status s = KILN_OK;

    jb_set(&b, root, "arena_size", jb_int(&b, (int64_t)g->arena_size));
    jb_set(&b, root, "workspace_size", jb_int(&b, (int64_t)g->workspace_size));

    json_t *symbols = jb_check(&b, json_array());
    for (int32_t i = 0; i < g->n_symbols; i++) {
        int32_t v[2] = {g->symbols[i].tensor, g->symbols[i].axis};
        jb_push(&b, symbols, jb_i32s(&b, v, 2));
    }
    jb_set(&b, root, "symbols", symbols);

    json_t *exprs = jb_check(&b, json_array());
    for (int32_t i = 0; i < g->exprs.n; i++) {
        const kiln_expr_node *n = &g->exprs.nodes[i];
        json_t *e = jb_check(&b, json_array());
        jb_push(&b, e, jb_int(&b, n->kind));
        jb_push(&b, e, jb_int(&b, n->a));
        jb_push(&b, e, jb_int(&b, n->b));
        jb_push(&b, e, jb_int(&b, n->value));
        jb_push(&b, exprs, e);
    }
    jb_set(&b, root, "exprs", exprs);

    json_t *plugins = jb_check(&b, json_array());
    for (int32_t i = 0; i < g->n_plugins; i++) {
        const kiln_plugin_rec *r = &g->plugins[i];
        json_t *o = jb_check(&b, json_object());
        jb_set(&b, o, "name", jb_str(&b, r->name));
        jb_set(&b, o, "version", jb_str(&b, r->version));
        jb_set(&b, o, "namespace", jb_str(&b, r->plugin_namespace));
        jb_set(&b, o, "library", jb_str(&b, r->library));
        jb_set(&b, o, "blob_version", jb_int(&b, w->blob_version[i]));
        jb_set(&b, o, "blob", jb_pair(&b, w->blob_offset[i], w->blob_size[i]));
        jb_push(&b, plugins, o);
    }
    jb_set(&b, root, "plugins", plugins);

    json_t *tensors = jb_check(&b, json_array());
    for (int32_t i = 0; i < g->n_tensors && s == KILN_OK; i++) {
        const kiln_tensor_rec *t = &g->tensors[i];
        if (t->rank < 0 || t->rank > KILN_MAX_RANK) {
            s = kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\": rank %d is outside 0..%d",
                          t->name ? t->name : "", t->rank, KILN_MAX_RANK);
            break;
        }
        s = fits_i64(t->max_bytes, "tensor max_bytes");
        json_t *o = jb_check(&b, json_object());
        jb_set(&b, o, "name", jb_str(&b, t->name));
        jb_set(&b, o, "dtype", jb_int(&b, t->dtype));
        jb_set(&b, o, "flags", jb_int(&b, t->flags));
        jb_set(&b, o, "dims", jb_i32s(&b, t->dims, t->rank));
        jb_set(&b, o, "producer", jb_int(&b, t->producer));
        jb_set(&b, o, "arena_offset", jb_int(&b, t->arena_offset));
        jb_set(&b, o, "max_bytes", jb_int(&b, (int64_t)t->max_bytes));
        if (t->flags & KILN_TENSOR_CONSTANT)
            jb_set(&b, o, "data", jb_pair(&b, w->const_offset[i], t->data_size));
        jb_push(&b, tensors, o);
    }
    jb_set(&b, root, "tensors", tensors);

    json_t *layers = jb_check(&b, json_array());
    for (int32_t i = 0; i < g->n_layers && s == KILN_OK; i++) {
        const kiln_layer *l = &g->layers[i];
        json_t *params = NULL;
        s = layer_params_json(&b, g, l, &params);
        if (s == KILN_OK)
            s = fits_i64(l->workspace, "layer workspace");
        json_t *o = jb_check(&b, json_object());
        jb_set(&b, o, "name", jb_str(&b, l->name));
        jb_set(&b, o, "op", jb_int(&b, l->op));
        jb_set(&b, o, "inputs", jb_i32s(&b, l->inputs, l->n_inputs));
        jb_set(&b, o, "outputs", jb_i32s(&b, l->outputs, l->n_outputs));
        jb_set(&b, o, "params", params);
        jb_set(&b, o, "workspace", jb_int(&b, (int64_t)l->workspace));
        jb_set(&b, o, "tactic", jb_int(&b, l->tactic));
        jb_push(&b, layers, o);
    }
    jb_set(&b, root, "layers", layers);

    jb_set(&b, root, "inputs", jb_i32s(&b, g->inputs, g->n_inputs));
    jb_set(&b, root, "outputs", jb_i32s(&b, g->outputs, g->n_outputs));

    json_t *profiles = jb_check(&b, json_array());
    for (int32_t p = 0; p < g->n_profiles; p++) {
        json_t *row = jb_check(&b, json_array());
        for (int32_t i = 0; i < g->n_inputs; i++) {
            const kiln_profile_dims *pd = &g->profiles[(size_t)p * (size_t)g->n_inputs + (size_t)i];
            json_t *o = jb_check(&b, json_object());
            jb_set(&b, o, "min", jb_dims(&b, &pd->min));
            jb_set(&b, o, "opt", jb_dims(&b, &pd->opt));
            jb_set(&b, o, "max", jb_dims(&b, &pd->max));
            jb_push(&b, row, o);
        }
        jb_push(&b, profiles, row);
    }
    jb_set(&b, root, "profiles", profiles);

    json_t *constraints = jb_check(&b, json_array());
    for (int32_t i = 0; i < g->n_constraints; i++) {
        const kiln_constraint *c = &g->constraints[i];
        json_t *o = jb_check(&b, json_object());
        jb_set(&b, o, "kind", jb_int(&b, c->kind));
        jb_set(&b, o, "a", jb_int(&b, c->a));
        jb_set(&b, o, "b", jb_int(&b, c->b));
        jb_set(&b, o, "layer", jb_int(&b, c->layer));
        jb_set(&b, o, "what", jb_str(&b, c->what));
        jb_push(&b, constraints, o);
    }
    jb_set(&b, root, "constraints", constraints);

    if (s == KILN_OK && !b.ok)
        s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY,
                      "building the engine plan failed: out of memory, or a name is not UTF-8");
    if (s == KILN_OK) {
        *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!*text)
            s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "serializing the engine plan");
    }
    json_decref(root);
    return s;
}

/* ---- writing: layout and image ------------------------------------------------- */

/* Serializes every plugin instance now (two-call protocol) or takes the
 * stored blob of a record without one. */
static kiln_status collect_blobs(const kiln_graph *g, write_layout *w)
{
    size_t n = g->n_plugins > 0 ? (size_t)g->n_plugins : 1;
    w->blob_offset = calloc(n, sizeof *w->blob_offset);
    w->blob_size = calloc(n, sizeof *w->blob_size);
    w->blob_version = calloc(n, sizeof *w->blob_version);
    w->blob_data = calloc(n, sizeof *w->blob_data);
    w->blob_owned = calloc(n, sizeof *w->blob_owned);
    if (!w->blob_offset || !w->blob_size || !w->blob_version || !w->blob_data || !w->blob_owned)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "collecting plugin blobs");
    uint64_t pos = 0;
    for (int32_t i = 0; i < g->n_plugins; i++) {
        const kiln_plugin_rec *r = &g->plugins[i];
        const char *name = r->name ? r->name : "";
        if (r->instance) {
            const kiln_plugin_ops *ops = r->instance->ops;
            if (!ops || !ops->serialize)
                return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" has no serialize()", name);
            size_t size = 0;
            kiln_status s = ops->serialize(r->instance, NULL, &size);
            if (s != KILN_OK)
                return kiln_fail_context(s, "serializing plugin \"%s\"", name);
            uint8_t *buf = malloc(size ? size : 1);
            if (!buf)
                return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "serializing plugin \"%s\": %zu bytes", name, size);
            w->blob_data[i] = buf;
            w->blob_owned[i] = 1;
            size_t cap = size;
            s = ops->serialize(r->instance, buf, &cap);
            if (s != KILN_OK)
                return kiln_fail_context(s, "serializing plugin \"%s\"", name);
            if (cap > size)
                return kiln_fail(KILN_ERROR_PLUGIN,
                                 "plugin \"%s\" wrote %zu bytes into a %zu-byte serialize buffer", name,
                                 cap, size);
            w->blob_size[i] = cap;
            w->blob_version[i] = r->creator ? r->creator->blob_version : r->blob_version;
        } else {
            if (r->blob_size > 0 && !r->blob)
                return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin \"%s\": blob_size %zu but no blob",
                                 name, r->blob_size);
            w->blob_data[i] = r->blob;
            w->blob_size[i] = r->blob_size;
            w->blob_version[i] = r->blob_version;
        }
        w->blob_offset[i] = pos;
        if (__builtin_add_overflow(pos, (uint64_t)w->blob_size[i], &pos))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin blobs are too large");
    }
    w->blobs_size = pos;
    return KILN_OK;
}

static kiln_status layout_weights(const kiln_graph *g, write_layout *w)
{
    w->const_offset = calloc(g->n_tensors > 0 ? (size_t)g->n_tensors : 1, sizeof *w->const_offset);
    if (!w->const_offset)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "laying out constants");
    uint64_t pos = 0;
    for (int32_t i = 0; i < g->n_tensors; i++) {
        const kiln_tensor_rec *t = &g->tensors[i];
        if (!(t->flags & KILN_TENSOR_CONSTANT))
            continue;
        if (t->data_size > 0 && !t->data)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "constant \"%s\" has %zu bytes but no data",
                             t->name ? t->name : "", t->data_size);
        pos = align_up(pos, KILN_ENGINE_WEIGHT_ALIGN);
        w->const_offset[i] = pos;
        if (__builtin_add_overflow(pos, (uint64_t)t->data_size, &pos) || pos > (uint64_t)INT64_MAX)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "constants are too large for an engine");
    }
    w->weights_size = pos;
    return KILN_OK;
}

typedef struct out_section {
    uint32_t id;
    const void *data;   /* NULL: filled in place (weights, blobs) */
    uint64_t size;
    uint64_t offset;
} out_section;

/* Runs the reader's plan checks on what was just written, so a graph the
 * reader would refuse fails here, at build time, naming the problem,
 * instead of when the engine is loaded. */
static kiln_status check_written_plan(const uint8_t *image, const out_section *secs, size_t n_secs);

kiln_status kiln_engine_write(const kiln_graph *g, kiln_buffer *out)
{
    if (!g || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_write: graph and out are required");
    if ((unsigned)g->backend >= KILN_BACKEND_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "engine backend %d is not a kiln_backend", (int)g->backend);
    if (g->n_gpu_archs < 0 || g->n_gpu_archs > 8)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%d GPU architectures (at most 8)", g->n_gpu_archs);
    for (int32_t i = 0; i < g->n_sections; i++) {
        uint32_t id = g->sections[i].id;
        char cc[5];
        fourcc_str(id, cc);
        if (id == SECTION_PLAN || id == SECTION_WEIGHTS || id == SECTION_BLOBS)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "extra section id %s is reserved by the engine format", cc);
        if (g->sections[i].size > 0 && !g->sections[i].data)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "extra section %s has %zu bytes but no data", cc,
                             g->sections[i].size);
    }

    write_layout w;
    memset(&w, 0, sizeof w);
    char *plan = NULL;
    out_section *secs = NULL;
    kiln_status s = collect_blobs(g, &w);
    if (s == KILN_OK)
        s = layout_weights(g, &w);
    if (s == KILN_OK)
        s = plan_to_json(g, &w, &plan);
    size_t n_secs = 3 + (size_t)(g->n_sections > 0 ? g->n_sections : 0);
    if (s == KILN_OK && !(secs = calloc(n_secs, sizeof *secs)))
        s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "laying out the engine");
    uint8_t *image = NULL;
    uint64_t total = 0;
    if (s == KILN_OK) {
        /* PLAN, BLOB, the extra sections, then the weights last so that they
         * start on a page of their own. */
        secs[0] = (out_section){SECTION_PLAN, plan, strlen(plan), 0};
        secs[1] = (out_section){SECTION_BLOBS, NULL, w.blobs_size, 0};
        for (int32_t i = 0; i < g->n_sections; i++)
            secs[2 + i] = (out_section){g->sections[i].id, g->sections[i].data, g->sections[i].size, 0};
        secs[n_secs - 1] = (out_section){SECTION_WEIGHTS, NULL, w.weights_size, 0};
        uint64_t pos = HEADER_SIZE + (uint64_t)ENTRY_SIZE * n_secs;
        int overflow = 0;
        for (size_t i = 0; i < n_secs; i++) {
            pos = align_up(pos, i == n_secs - 1 ? WEIGHTS_PAGE : SECTION_ALIGN);
            secs[i].offset = pos;
            overflow |= __builtin_add_overflow(pos, secs[i].size, &pos);
        }
        total = pos;
        if (overflow || total > (uint64_t)SIZE_MAX)
            s = kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "the engine would be too large");
        else if (!(image = calloc(1, (size_t)total)))
            s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "allocating a %" PRIu64 "-byte engine", total);
    }
    if (s == KILN_OK) {
        for (size_t i = 0; i < n_secs; i++)
            if (secs[i].data && secs[i].size)
                memcpy(image + secs[i].offset, secs[i].data, (size_t)secs[i].size);
        uint8_t *blobs = image + secs[1].offset;
        for (int32_t i = 0; i < g->n_plugins; i++)
            if (w.blob_size[i])
                memcpy(blobs + w.blob_offset[i], w.blob_data[i], w.blob_size[i]);
        uint8_t *weights = image + secs[n_secs - 1].offset;
        for (int32_t i = 0; i < g->n_tensors; i++) {
            const kiln_tensor_rec *t = &g->tensors[i];
            if ((t->flags & KILN_TENSOR_CONSTANT) && t->data_size)
                memcpy(weights + w.const_offset[i], t->data, t->data_size);
        }

        memcpy(image, KILN_ENGINE_MAGIC, 8);
        put_u32(image + OFF_FORMAT_VERSION, KILN_ENGINE_FORMAT_VERSION);
        put_u32(image + OFF_HEADER_SIZE, HEADER_SIZE);
        strncpy((char *)image + OFF_KILN_VERSION, KILN_VERSION_STRING, 15);
        put_u32(image + OFF_BACKEND, (uint32_t)g->backend);
        put_u32(image + OFF_N_GPU_ARCHS, (uint32_t)g->n_gpu_archs);
        for (int32_t i = 0; i < g->n_gpu_archs; i++)
            put_u32(image + OFF_GPU_ARCHS + 4 * (size_t)i, (uint32_t)g->gpu_archs[i]);
        put_u64(image + OFF_FILE_SIZE, total);
        put_u32(image + OFF_N_SECTIONS, (uint32_t)n_secs);
        put_u32(image + OFF_RESERVED, 0);
        for (size_t i = 0; i < n_secs; i++) {
            uint8_t *e = image + HEADER_SIZE + ENTRY_SIZE * i;
            put_u32(e, secs[i].id);
            put_u32(e + 4, 0);
            put_u64(e + 8, secs[i].offset);
            put_u64(e + 16, secs[i].size);
            put_u64(e + 24, XXH64(image + secs[i].offset, (size_t)secs[i].size, 0));
        }
        put_u64(image + OFF_HEADER_CHECKSUM, header_checksum(image, ENTRY_SIZE * n_secs));
        s = check_written_plan(image, secs, n_secs);
    }
    if (s == KILN_OK) {
        out->data = image;
        out->size = (size_t)total;
    } else {
        free(image);
    }
    free(secs);
    free(plan);
    write_layout_free(&w, g->n_plugins);
    return s;
}

/* ---- reading: the fixed header ----------------------------------------------- */

typedef struct header_view {
    kiln_engine_header_info info;
    uint32_t n_sections;
    uint64_t table_end;
} header_view;

static kiln_status parse_header(const uint8_t *d, size_t size, header_view *hv)
{
    if (!d && size)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "engine data is NULL");
    if (size >= 8 && memcmp(d, KILN_ENGINE_MAGIC, 8) != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "not a kiln engine (bad magic)");
    if (size < HEADER_SIZE)
        return kiln_fail(KILN_ERROR_FORMAT, "engine truncated: %zu bytes is less than the %u-byte header",
                         size, HEADER_SIZE);
    uint32_t version = get_u32(d + OFF_FORMAT_VERSION);
    if (version > KILN_ENGINE_FORMAT_VERSION)
        return kiln_fail(KILN_ERROR_VERSION, "engine format version %u is newer than this kiln reads (%u)",
                         version, KILN_ENGINE_FORMAT_VERSION);
    if (version == 0)
        return kiln_fail(KILN_ERROR_FORMAT, "engine format version 0 is invalid");
    uint32_t header_size = get_u32(d + OFF_HEADER_SIZE);
    if (header_size != HEADER_SIZE)
        return kiln_fail(KILN_ERROR_FORMAT, "engine header size %u, expected %u", header_size, HEADER_SIZE);
    uint64_t file_size = get_u64(d + OFF_FILE_SIZE);
    uint32_t n_sections = get_u32(d + OFF_N_SECTIONS);
    /* n_sections < 2^32, so this cannot overflow 64 bits. */
    uint64_t table_end = HEADER_SIZE + (uint64_t)ENTRY_SIZE * n_sections;
    if (table_end > size) {
        if (file_size > size)
            return kiln_fail(KILN_ERROR_FORMAT, "engine truncated: header says %" PRIu64 " bytes, file has %zu",
                             file_size, size);
        return kiln_fail(KILN_ERROR_FORMAT, "engine section table (%u entries) runs past the end of the data (%zu bytes)",
                         n_sections, size);
    }
    if (header_checksum(d, (size_t)(table_end - HEADER_SIZE)) != get_u64(d + OFF_HEADER_CHECKSUM))
        return kiln_fail(KILN_ERROR_CHECKSUM, "engine header checksum mismatch: the file is corrupted");

    kiln_engine_header_info info;
    memset(&info, 0, sizeof info);
    info.format_version = version;
    memcpy(info.kiln_version, d + OFF_KILN_VERSION, sizeof info.kiln_version);
    if (!memchr(info.kiln_version, 0, sizeof info.kiln_version))
        return kiln_fail(KILN_ERROR_FORMAT, "engine kiln version string is not NUL-terminated");
    uint32_t backend = get_u32(d + OFF_BACKEND);
    if (backend >= KILN_BACKEND_COUNT)
        return kiln_fail(KILN_ERROR_FORMAT, "engine backend %u is unknown", backend);
    info.backend = (kiln_backend)backend;
    uint32_t n_archs = get_u32(d + OFF_N_GPU_ARCHS);
    if (n_archs > 8)
        return kiln_fail(KILN_ERROR_FORMAT, "engine lists %u GPU architectures (at most 8)", n_archs);
    info.n_gpu_archs = (int32_t)n_archs;
    for (uint32_t i = 0; i < n_archs; i++)
        info.gpu_archs[i] = (int32_t)get_u32(d + OFF_GPU_ARCHS + 4 * (size_t)i);
    info.file_size = file_size;
    if (n_sections > INT32_MAX)
        return kiln_fail(KILN_ERROR_FORMAT, "engine has %u sections", n_sections);
    info.n_sections = (int32_t)n_sections;
    hv->info = info;
    hv->n_sections = n_sections;
    hv->table_end = table_end;
    return KILN_OK;
}

kiln_status kiln_engine_read_header(const void *data, size_t size, kiln_engine_header_info *info)
{
    if (!info)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_read_header: info is required");
    header_view hv;
    KILN_TRY(parse_header(data, size, &hv));
    *info = hv.info;
    return KILN_OK;
}

/* ---- reading: the section table ------------------------------------------------ */

typedef struct section_view {
    uint32_t id;
    uint64_t offset, size, checksum;
} section_view;

static int cmp_section_offset(const void *x, const void *y)
{
    const section_view *a = *(const section_view *const *)x, *b = *(const section_view *const *)y;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return a->size < b->size ? -1 : a->size > b->size;
}

/* Checks every entry's bounds, that sections do not overlap, that every
 * byte outside them is zero (so no bit of the file escapes a check) and
 * every checksum. */
static kiln_status check_sections(const uint8_t *d, size_t size, const header_view *hv, section_view *secs)
{
    char cc[5];
    uint32_t n = hv->n_sections;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = d + HEADER_SIZE + (size_t)ENTRY_SIZE * i;
        section_view *s = &secs[i];
        s->id = get_u32(e);
        s->offset = get_u64(e + 8);
        s->size = get_u64(e + 16);
        s->checksum = get_u64(e + 24);
        fourcc_str(s->id, cc);
        uint64_t end;
        if (s->offset < hv->table_end || __builtin_add_overflow(s->offset, s->size, &end) || end > size)
            return kiln_fail(KILN_ERROR_FORMAT,
                             "engine section %s (entry %u) at offset %" PRIu64 ", %" PRIu64
                             " bytes, lies outside the file's %zu data bytes", cc, i, s->offset, s->size, size);
    }
    const section_view **order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "checking %u engine sections", n);
    for (uint32_t i = 0; i < n; i++)
        order[i] = &secs[i];
    qsort(order, n, sizeof *order, cmp_section_offset);
    uint64_t pos = hv->table_end;
    kiln_status st = KILN_OK;
    for (uint32_t i = 0; i <= n && st == KILN_OK; i++) {
        uint64_t next = i < n ? order[i]->offset : size;
        if (next < pos) {
            fourcc_str(order[i]->id, cc);
            st = kiln_fail(KILN_ERROR_FORMAT, "engine section %s at offset %" PRIu64 " overlaps another section",
                           cc, next);
            break;
        }
        for (uint64_t p = pos; p < next; p++)
            if (d[p] != 0) {
                st = kiln_fail(KILN_ERROR_CHECKSUM,
                               "engine padding byte at offset %" PRIu64 " is not zero: the file is corrupted", p);
                break;
            }
        if (i < n)
            pos = order[i]->offset + order[i]->size;
    }
    free(order);
    KILN_TRY(st);
    for (uint32_t i = 0; i < n; i++) {
        const section_view *s = &secs[i];
        if (XXH64(d + s->offset, (size_t)s->size, 0) != s->checksum) {
            fourcc_str(s->id, cc);
            return kiln_fail(KILN_ERROR_CHECKSUM, "engine section %s checksum mismatch: the file is corrupted", cc);
        }
    }
    return KILN_OK;
}

/* ---- reading: the plan --------------------------------------------------------- */

typedef struct plan_reader {
    kiln_graph *g;
    const uint8_t *weights;
    uint64_t weights_size;
    const uint8_t *blobs;
    uint64_t blobs_size;
    int borrow;
    char ctx[96];           /* "tensor 3", "layer 7" ... for messages */
} plan_reader;

static kiln_status rd_fail(plan_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static kiln_status rd_fail(plan_reader *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_fail(KILN_ERROR_FORMAT, "engine plan: %s%s%s", r->ctx, r->ctx[0] ? ": " : "", msg);
}

static kiln_status rd_oom(void) { return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "reading the engine plan"); }

static kiln_status rd_field(plan_reader *r, json_t *obj, const char *key, json_t **out)
{
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    if (!v)
        return rd_fail(r, "missing field \"%s\"", key);
    *out = v;
    return KILN_OK;
}

static kiln_status rd_int_value(plan_reader *r, json_t *v, const char *what, int64_t lo, int64_t hi,
                                int64_t *out)
{
    if (!json_is_integer(v))
        return rd_fail(r, "%s is not an integer", what);
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi)
        return rd_fail(r, "%s = %" PRId64 " is outside %" PRId64 "..%" PRId64, what, x, lo, hi);
    *out = x;
    return KILN_OK;
}

static kiln_status rd_int(plan_reader *r, json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = NULL;
    KILN_TRY(rd_field(r, obj, key, &v));
    return rd_int_value(r, v, key, lo, hi, out);
}

static kiln_status rd_i32(plan_reader *r, json_t *obj, const char *key, int64_t lo, int64_t hi, int32_t *out)
{
    int64_t v = 0;
    KILN_TRY(rd_int(r, obj, key, lo, hi, &v));
    *out = (int32_t)v;
    return KILN_OK;
}

static kiln_status rd_array(plan_reader *r, json_t *obj, const char *key, size_t max, json_t **out)
{
    json_t *v = NULL;
    KILN_TRY(rd_field(r, obj, key, &v));
    if (!json_is_array(v))
        return rd_fail(r, "field \"%s\" is not an array", key);
    if (json_array_size(v) > max)
        return rd_fail(r, "field \"%s\" has %zu entries (at most %zu)", key, json_array_size(v), max);
    *out = v;
    return KILN_OK;
}

static kiln_status rd_str(plan_reader *r, json_t *obj, const char *key, char **out)
{
    json_t *v = NULL;
    KILN_TRY(rd_field(r, obj, key, &v));
    if (!json_is_string(v))
        return rd_fail(r, "field \"%s\" is not a string", key);
    char *s = kiln_strdup(json_string_value(v));
    if (!s)
        return rd_oom();
    *out = s;
    return KILN_OK;
}

/* A fixed-size array of int32 values in [lo, hi], at most max entries. */
static kiln_status rd_i32s(plan_reader *r, json_t *obj, const char *key, size_t max, int64_t lo, int64_t hi,
                           int32_t *dst, int32_t *n)
{
    json_t *a = NULL;
    KILN_TRY(rd_array(r, obj, key, max, &a));
    char what[64];
    for (size_t i = 0; i < json_array_size(a); i++) {
        int64_t v = 0;
        snprintf(what, sizeof what, "%s[%zu]", key, i);
        KILN_TRY(rd_int_value(r, json_array_get(a, i), what, lo, hi, &v));
        dst[i] = (int32_t)v;
    }
    *n = (int32_t)json_array_size(a);
    return KILN_OK;
}

/* Like rd_i32s into a new malloc'd array (NULL when empty). */
static kiln_status rd_i32s_alloc(plan_reader *r, json_t *obj, const char *key, int64_t lo, int64_t hi,
                                 int32_t **dst, int32_t *n)
{
    json_t *a = NULL;
    KILN_TRY(rd_array(r, obj, key, INT32_MAX, &a));
    size_t count = json_array_size(a);
    int32_t *v = NULL;
    if (count && !(v = calloc(count, sizeof *v)))
        return rd_oom();
    int32_t got = 0;
    kiln_status s = rd_i32s(r, obj, key, count, lo, hi, v, &got);
    if (s != KILN_OK) {
        free(v);
        return s;
    }
    *dst = v;
    *n = got;
    return KILN_OK;
}

/* [offset, size] inside a section of `limit` bytes. */
static kiln_status rd_range(plan_reader *r, json_t *obj, const char *key, uint64_t limit, uint64_t *off,
                            uint64_t *size)
{
    json_t *a = NULL;
    KILN_TRY(rd_array(r, obj, key, 2, &a));
    if (json_array_size(a) != 2)
        return rd_fail(r, "field \"%s\" is not an [offset, size] pair", key);
    int64_t o = 0, n = 0;
    KILN_TRY(rd_int_value(r, json_array_get(a, 0), "offset", 0, INT64_MAX, &o));
    KILN_TRY(rd_int_value(r, json_array_get(a, 1), "size", 0, INT64_MAX, &n));
    uint64_t end;
    if (__builtin_add_overflow((uint64_t)o, (uint64_t)n, &end) || end > limit || (uint64_t)n > SIZE_MAX)
        return rd_fail(r, "%s [%" PRId64 ", +%" PRId64 ") lies outside its %" PRIu64 "-byte section", key, o,
                       n, limit);
    *off = (uint64_t)o;
    *size = (uint64_t)n;
    return KILN_OK;
}

/* Copies or borrows bytes of a section. Empty ranges give NULL. */
static kiln_status take_bytes(plan_reader *r, const uint8_t *base, uint64_t off, uint64_t size, int borrow,
                              void **data, int32_t *owned)
{
    *data = NULL;
    *owned = 0;
    if (size == 0)
        return KILN_OK;
    if (borrow) {
        *data = (void *)(uintptr_t)(base + off);
        return KILN_OK;
    }
    void *p = malloc((size_t)size);
    if (!p)
        return rd_oom();
    memcpy(p, base + off, (size_t)size);
    *data = p;
    *owned = 1;
    return KILN_OK;
}

static kiln_status rd_exprs(plan_reader *r, json_t *arr, int32_t n_symbols)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    kiln_expr_node *nodes = calloc(n, sizeof *nodes);
    if (!nodes)
        return rd_oom();
    /* The pool owns the nodes from here; its hash table is rebuilt on the
     * first insertion (expr.c), so none is stored. */
    g->exprs.nodes = nodes;
    g->exprs.n = g->exprs.cap = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        snprintf(r->ctx, sizeof r->ctx, "expression %zu", i);
        json_t *e = json_array_get(arr, i);
        if (!json_is_array(e) || json_array_size(e) != 4)
            return rd_fail(r, "not a [kind, a, b, value] array");
        int64_t kind = 0, a = 0, b = 0, value = 0;
        KILN_TRY(rd_int_value(r, json_array_get(e, 0), "kind", 0, KILN_EXPR_NODE_SYMBOL, &kind));
        KILN_TRY(rd_int_value(r, json_array_get(e, 1), "a", -1, (int64_t)i - 1, &a));
        KILN_TRY(rd_int_value(r, json_array_get(e, 2), "b", -1, (int64_t)i - 1, &b));
        KILN_TRY(rd_int_value(r, json_array_get(e, 3), "value", INT64_MIN, INT64_MAX, &value));
        if (kind == KILN_EXPR_NODE_CONST || kind == KILN_EXPR_NODE_SYMBOL) {
            if (a != -1 || b != -1)
                return rd_fail(r, "a leaf has operands %" PRId64 ", %" PRId64, a, b);
            if (kind == KILN_EXPR_NODE_SYMBOL && (value < 0 || value >= n_symbols))
                return rd_fail(r, "symbol %" PRId64 " does not exist (%d symbols)", value, n_symbols);
        } else {
            if (a < 0 || b < 0)
                return rd_fail(r, "operation has operands %" PRId64 ", %" PRId64, a, b);
            if (value != 0)
                return rd_fail(r, "operation has value %" PRId64, value);
        }
        nodes[i] = (kiln_expr_node){(int32_t)kind, (kiln_expr)a, (kiln_expr)b, value};
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_plugins(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->plugins = calloc(n, sizeof *g->plugins)))
        return rd_oom();
    g->n_plugins = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        kiln_plugin_rec *p = &g->plugins[i];
        json_t *o = json_array_get(arr, i);
        snprintf(r->ctx, sizeof r->ctx, "plugin %zu", i);
        if (!json_is_object(o))
            return rd_fail(r, "not an object");
        KILN_TRY(rd_str(r, o, "name", &p->name));
        KILN_TRY(rd_str(r, o, "version", &p->version));
        KILN_TRY(rd_str(r, o, "namespace", &p->plugin_namespace));
        KILN_TRY(rd_str(r, o, "library", &p->library));
        int64_t bv = 0;
        KILN_TRY(rd_int(r, o, "blob_version", 0, UINT32_MAX, &bv));
        p->blob_version = (uint32_t)bv;
        uint64_t off, size;
        KILN_TRY(rd_range(r, o, "blob", r->blobs_size, &off, &size));
        /* Blobs are always copied: the record owns its blob. */
        int32_t owned;
        KILN_TRY(take_bytes(r, r->blobs, off, size, 0, &p->blob, &owned));
        p->blob_size = (size_t)size;
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_tensors(plan_reader *r, json_t *arr, int32_t n_layers)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->tensors = calloc(n, sizeof *g->tensors)))
        return rd_oom();
    g->n_tensors = g->cap_tensors = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        kiln_tensor_rec *t = &g->tensors[i];
        json_t *o = json_array_get(arr, i);
        snprintf(r->ctx, sizeof r->ctx, "tensor %zu", i);
        if (!json_is_object(o))
            return rd_fail(r, "not an object");
        KILN_TRY(rd_str(r, o, "name", &t->name));
        snprintf(r->ctx, sizeof r->ctx, "tensor %zu \"%.48s\"", i, t->name);
        int32_t dtype = 0, rank = 0;
        int64_t flags = 0, arena_offset = 0, max_bytes = 0;
        /* Unused dims read as -1, as kiln_graph_add_tensor leaves them. */
        for (int32_t k = 0; k < KILN_MAX_RANK; k++)
            t->dims[k] = -1;
        KILN_TRY(rd_i32(r, o, "dtype", 0, KILN_DTYPE_COUNT - 1, &dtype));
        t->dtype = (kiln_dtype)dtype;
        KILN_TRY(rd_int(r, o, "flags", 0, KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT | KILN_TENSOR_CONSTANT, &flags));
        t->flags = (uint32_t)flags;
        KILN_TRY(rd_i32s(r, o, "dims", KILN_MAX_RANK, 0, (int64_t)g->exprs.n - 1, t->dims, &rank));
        t->rank = rank;
        KILN_TRY(rd_i32(r, o, "producer", -1, (int64_t)n_layers - 1, &t->producer));
        KILN_TRY(rd_int(r, o, "arena_offset", -1, INT64_MAX, &arena_offset));
        KILN_TRY(rd_int(r, o, "max_bytes", 0, INT64_MAX, &max_bytes));
        t->arena_offset = arena_offset;
        t->max_bytes = (size_t)max_bytes;
        uint64_t end;
        if (arena_offset >= 0 && (__builtin_add_overflow((uint64_t)arena_offset, (uint64_t)max_bytes, &end) ||
                                  end > g->arena_size))
            return rd_fail(r, "arena range [%" PRId64 ", +%" PRId64 ") exceeds the %zu-byte arena", arena_offset,
                           max_bytes, g->arena_size);
        json_t *data = json_object_get(o, "data");
        if (!(t->flags & KILN_TENSOR_CONSTANT)) {
            if (data)
                return rd_fail(r, "has data but is not a constant");
            continue;
        }
        uint64_t off, size;
        KILN_TRY(rd_range(r, o, "data", r->weights_size, &off, &size));
        if (off % KILN_ENGINE_WEIGHT_ALIGN)
            return rd_fail(r, "data offset %" PRIu64 " is not a multiple of %u", off, KILN_ENGINE_WEIGHT_ALIGN);
        /* The bytes must match the static shape so kernels never read past
         * them. */
        uint64_t bytes = kiln_dtype_size(t->dtype);
        for (int32_t k = 0; k < t->rank; k++) {
            const kiln_expr_node *e = &g->exprs.nodes[t->dims[k]];
            if (e->kind != KILN_EXPR_NODE_CONST || e->value < 0)
                return rd_fail(r, "constant dim %d is not a non-negative constant", k);
            if (__builtin_mul_overflow(bytes, (uint64_t)e->value, &bytes))
                return rd_fail(r, "constant size overflows");
        }
        if (bytes != size)
            return rd_fail(r, "constant has %" PRIu64 " bytes, its shape needs %" PRIu64, size, bytes);
        KILN_TRY(take_bytes(r, r->weights, off, size, r->borrow, &t->data, &t->data_owned));
        t->data_size = (size_t)size;
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_perm(plan_reader *r, json_t *o, const char *key, int32_t rank, int32_t *perm)
{
    int32_t n = 0;
    KILN_TRY(rd_i32s(r, o, key, KILN_MAX_RANK, 0, KILN_MAX_RANK - 1, perm, &n));
    if (n != rank)
        return rd_fail(r, "%s has %d entries for rank %d", key, n, rank);
    uint32_t seen = 0;
    for (int32_t i = 0; i < n; i++) {
        if (perm[i] >= rank || (seen & (1u << perm[i])))
            return rd_fail(r, "%s is not a permutation of 0..%d", key, rank - 1);
        seen |= 1u << perm[i];
    }
    return KILN_OK;
}

/* Inputs and outputs each op takes; -1: any number. */
static void op_arity(kiln_op op, int32_t *min_in, int32_t *max_in, int32_t *min_out, int32_t *max_out)
{
    *min_out = *max_out = 1;
    switch (op) {
    case KILN_OP_CONSTANT: *min_in = *max_in = 0; break;
    case KILN_OP_MATMUL:
    case KILN_OP_BINARY:
    case KILN_OP_GATHER: *min_in = *max_in = 2; break;
    case KILN_OP_CONCAT: *min_in = 1; *max_in = -1; break;
    case KILN_OP_PLUGIN: *min_in = 0; *max_in = KILN_PLUGIN_MAX_INPUTS; *max_out = KILN_PLUGIN_MAX_OUTPUTS; break;
    case KILN_OP_FUSED: *min_in = 1; *max_in = KILN_FUSED_MAX_INPUTS; break;
    default: *min_in = *max_in = 1; break;
    }
}

static kiln_status rd_params(plan_reader *r, json_t *o, kiln_layer *l)
{
    kiln_graph *g = r->g;
    kiln_layer_params *p = &l->p;
    int32_t rank = l->n_inputs > 0 ? g->tensors[l->inputs[0]].rank : 0;
    int32_t n = 0;
    int64_t v = 0;
    switch (l->op) {
    case KILN_OP_MATMUL:
        KILN_TRY(rd_i32(r, o, "transpose_a", 0, 1, &p->matmul.transpose_a));
        return rd_i32(r, o, "transpose_b", 0, 1, &p->matmul.transpose_b);
    case KILN_OP_BINARY:
        KILN_TRY(rd_int(r, o, "op", 0, KILN_BINARY_OP_COUNT - 1, &v));
        p->binary.op = (kiln_binary_op)v;
        return KILN_OK;
    case KILN_OP_UNARY:
        KILN_TRY(rd_int(r, o, "op", 0, KILN_UNARY_OP_COUNT - 1, &v));
        p->unary.op = (kiln_unary_op)v;
        return KILN_OK;
    case KILN_OP_REDUCE:
        KILN_TRY(rd_int(r, o, "op", 0, KILN_REDUCE_OP_COUNT - 1, &v));
        p->reduce.op = (kiln_reduce_op)v;
        KILN_TRY(rd_int(r, o, "axes", 0, (int64_t)(1u << rank) - 1, &v));
        p->reduce.axes = (uint32_t)v;
        return rd_i32(r, o, "keep_dims", 0, 1, &p->reduce.keep_dims);
    case KILN_OP_SOFTMAX: return rd_i32(r, o, "axis", 0, rank - 1, &p->softmax.axis);
    case KILN_OP_GATHER: return rd_i32(r, o, "axis", 0, rank - 1, &p->gather.axis);
    case KILN_OP_CONCAT:
        for (int32_t i = 1; i < l->n_inputs; i++)
            if (g->tensors[l->inputs[i]].rank != rank)
                return rd_fail(r, "concat inputs have ranks %d and %d", rank, g->tensors[l->inputs[i]].rank);
        return rd_i32(r, o, "axis", 0, rank - 1, &p->concat.axis);
    case KILN_OP_SLICE: {
        json_t *a[2] = {NULL, NULL};
        KILN_TRY(rd_array(r, o, "start", KILN_MAX_RANK, &a[0]));
        KILN_TRY(rd_array(r, o, "stride", KILN_MAX_RANK, &a[1]));
        for (int k = 0; k < 2; k++) {
            if ((int32_t)json_array_size(a[k]) != rank)
                return rd_fail(r, "slice %s has %zu entries for rank %d", k ? "stride" : "start",
                               json_array_size(a[k]), rank);
            for (int32_t i = 0; i < rank; i++) {
                KILN_TRY(rd_int_value(r, json_array_get(a[k], (size_t)i), k ? "stride" : "start", k ? 1 : 0,
                                      INT64_MAX, &v));
                (k ? p->slice.stride : p->slice.start)[i] = v;
            }
        }
        return KILN_OK;
    }
    case KILN_OP_SHUFFLE:
        KILN_TRY(rd_i32s(r, o, "mid", KILN_MAX_RANK, 0, (int64_t)g->exprs.n - 1, p->shuffle.mid, &n));
        p->shuffle.mid_rank = n;
        if (json_object_get(o, "first")) {
            p->shuffle.has_first = 1;
            KILN_TRY(rd_perm(r, o, "first", rank, p->shuffle.first));
        }
        if (json_object_get(o, "second")) {
            p->shuffle.has_second = 1;
            KILN_TRY(rd_perm(r, o, "second", p->shuffle.mid_rank, p->shuffle.second));
        }
        return KILN_OK;
    case KILN_OP_CAST:
        KILN_TRY(rd_int(r, o, "to", 0, KILN_DTYPE_COUNT - 1, &v));
        p->cast.to = (kiln_dtype)v;
        return KILN_OK;
    case KILN_OP_PLUGIN: return rd_i32(r, o, "index", 0, (int64_t)g->n_plugins - 1, &p->plugin.index);
    case KILN_OP_FUSED: {
        json_t *steps = NULL;
        KILN_TRY(rd_array(r, o, "steps", KILN_FUSED_MAX_STEPS, &steps));
        n = (int32_t)json_array_size(steps);
        if (n < 1)
            return rd_fail(r, "a fused layer has no steps");
        p->fused.n_steps = n;
        for (int32_t i = 0; i < n; i++) {
            json_t *e = json_array_get(steps, (size_t)i);
            kiln_fused_step *s = &p->fused.steps[i];
            if (!json_is_array(e) || json_array_size(e) != 5)
                return rd_fail(r, "fused step %d is not [is_binary, op, a, b, src_layer]", i);
            int64_t f[5] = {0};
            /* Operands name layer inputs or earlier steps only. */
            int64_t last = (int64_t)l->n_inputs + i - 1;
            KILN_TRY(rd_int_value(r, json_array_get(e, 0), "fused is_binary", 0, 1, &f[0]));
            KILN_TRY(rd_int_value(r, json_array_get(e, 1), "fused op", 0,
                                  f[0] ? KILN_BINARY_OP_COUNT - 1 : KILN_UNARY_OP_COUNT - 1, &f[1]));
            KILN_TRY(rd_int_value(r, json_array_get(e, 2), "fused operand a", 0, last, &f[2]));
            KILN_TRY(rd_int_value(r, json_array_get(e, 3), "fused operand b", f[0] ? 0 : INT32_MIN,
                                  f[0] ? last : INT32_MAX, &f[3]));
            KILN_TRY(rd_int_value(r, json_array_get(e, 4), "fused src_layer", -1, INT32_MAX, &f[4]));
            *s = (kiln_fused_step){(int32_t)f[0], (int32_t)f[1], (int32_t)f[2], (int32_t)f[3], (int32_t)f[4]};
        }
        return KILN_OK;
    }
    case KILN_OP_CONSTANT:
    case KILN_OP_COUNT: break;
    }
    return KILN_OK;
}

static kiln_status rd_layers(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->layers = calloc(n, sizeof *g->layers)))
        return rd_oom();
    g->n_layers = g->cap_layers = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        kiln_layer *l = &g->layers[i];
        json_t *o = json_array_get(arr, i);
        snprintf(r->ctx, sizeof r->ctx, "layer %zu", i);
        if (!json_is_object(o))
            return rd_fail(r, "not an object");
        KILN_TRY(rd_str(r, o, "name", &l->name));
        snprintf(r->ctx, sizeof r->ctx, "layer %zu \"%.48s\"", i, l->name);
        int32_t op = 0;
        KILN_TRY(rd_i32(r, o, "op", 0, KILN_OP_COUNT - 1, &op));
        l->op = (kiln_op)op;
        KILN_TRY(rd_i32s_alloc(r, o, "inputs", 0, (int64_t)g->n_tensors - 1, &l->inputs, &l->n_inputs));
        KILN_TRY(rd_i32s_alloc(r, o, "outputs", 0, (int64_t)g->n_tensors - 1, &l->outputs, &l->n_outputs));
        int32_t min_in, max_in, min_out, max_out;
        op_arity(l->op, &min_in, &max_in, &min_out, &max_out);
        if (l->n_inputs < min_in || (max_in >= 0 && l->n_inputs > max_in) || l->n_outputs < min_out ||
            (max_out >= 0 && l->n_outputs > max_out))
            return rd_fail(r, "%s with %d inputs and %d outputs", kiln_op_name(l->op), l->n_inputs,
                           l->n_outputs);
        json_t *params = NULL;
        KILN_TRY(rd_field(r, o, "params", &params));
        if (!json_is_object(params))
            return rd_fail(r, "field \"params\" is not an object");
        KILN_TRY(rd_params(r, params, l));
        int64_t ws = 0;
        KILN_TRY(rd_int(r, o, "workspace", 0, INT64_MAX, &ws));
        l->workspace = (size_t)ws;
        KILN_TRY(rd_int(r, o, "tactic", INT64_MIN, INT64_MAX, &l->tactic));
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_symbol(plan_reader *r, json_t *e, size_t i, const uint8_t *is_input)
{
    kiln_graph *g = r->g;
    snprintf(r->ctx, sizeof r->ctx, "symbol %zu", i);
    if (!json_is_array(e) || json_array_size(e) != 2)
        return rd_fail(r, "not a [tensor, axis] pair");
    int64_t t = 0, axis = 0;
    KILN_TRY(rd_int_value(r, json_array_get(e, 0), "tensor", 0, (int64_t)g->n_tensors - 1, &t));
    if (!is_input[t])
        return rd_fail(r, "tensor %" PRId64 " is not a network input", t);
    KILN_TRY(rd_int_value(r, json_array_get(e, 1), "axis", 0, (int64_t)g->tensors[t].rank - 1, &axis));
    g->symbols[i] = (kiln_symbol){(int32_t)t, (int32_t)axis};
    return KILN_OK;
}

static kiln_status rd_symbols(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->symbols = calloc(n, sizeof *g->symbols)))
        return rd_oom();
    g->n_symbols = (int32_t)n;
    /* A table, not a search per symbol: the counts come from the file, and
     * symbols × inputs could be made large enough to hang. */
    uint8_t *is_input = calloc((size_t)g->n_tensors + 1, 1);
    if (!is_input)
        return rd_oom();
    for (int32_t k = 0; k < g->n_inputs; k++)
        is_input[g->inputs[k]] = 1;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && st == KILN_OK; i++)
        st = rd_symbol(r, json_array_get(arr, i), i, is_input);
    free(is_input);
    r->ctx[0] = '\0';
    return st;
}

static kiln_status rd_dims(plan_reader *r, json_t *o, const char *key, int32_t rank, kiln_dims *d)
{
    json_t *a = NULL;
    KILN_TRY(rd_array(r, o, key, KILN_MAX_RANK, &a));
    if ((int32_t)json_array_size(a) != rank)
        return rd_fail(r, "%s has %zu dims for rank %d", key, json_array_size(a), rank);
    d->rank = rank;
    for (int32_t i = 0; i < rank; i++)
        KILN_TRY(rd_int_value(r, json_array_get(a, (size_t)i), key, 0, INT64_MAX, &d->d[i]));
    return KILN_OK;
}

static kiln_status rd_profiles(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr), total;
    if (n == 0 || g->n_inputs == 0) {
        g->n_profiles = (int32_t)n;
        for (size_t p = 0; p < n; p++) {
            json_t *row = json_array_get(arr, p);
            if (!json_is_array(row) || json_array_size(row) != 0) {
                snprintf(r->ctx, sizeof r->ctx, "profile %zu", p);
                return rd_fail(r, "not an array of %d inputs", g->n_inputs);
            }
        }
        return KILN_OK;
    }
    if (kiln_mul_overflow(n, (size_t)g->n_inputs, &total) || total > INT32_MAX)
        return rd_fail(r, "%zu profiles of %d inputs is too many", n, g->n_inputs);
    if (!(g->profiles = calloc(total, sizeof *g->profiles)))
        return rd_oom();
    g->n_profiles = (int32_t)n;
    for (size_t p = 0; p < n; p++) {
        json_t *row = json_array_get(arr, p);
        snprintf(r->ctx, sizeof r->ctx, "profile %zu", p);
        if (!json_is_array(row) || json_array_size(row) != (size_t)g->n_inputs)
            return rd_fail(r, "not an array of %d inputs", g->n_inputs);
        for (int32_t i = 0; i < g->n_inputs; i++) {
            kiln_profile_dims *pd = &g->profiles[p * (size_t)g->n_inputs + (size_t)i];
            json_t *o = json_array_get(row, (size_t)i);
            int32_t rank = g->tensors[g->inputs[i]].rank;
            snprintf(r->ctx, sizeof r->ctx, "profile %zu input %d", p, i);
            if (!json_is_object(o))
                return rd_fail(r, "not an object");
            KILN_TRY(rd_dims(r, o, "min", rank, &pd->min));
            KILN_TRY(rd_dims(r, o, "opt", rank, &pd->opt));
            KILN_TRY(rd_dims(r, o, "max", rank, &pd->max));
            for (int32_t k = 0; k < rank; k++)
                if (pd->min.d[k] > pd->opt.d[k] || pd->opt.d[k] > pd->max.d[k])
                    return rd_fail(r, "dim %d has min %" PRId64 ", opt %" PRId64 ", max %" PRId64
                                   " out of order", k, pd->min.d[k], pd->opt.d[k], pd->max.d[k]);
        }
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_constraints(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->constraints = calloc(n, sizeof *g->constraints)))
        return rd_oom();
    g->n_constraints = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        kiln_constraint *c = &g->constraints[i];
        json_t *o = json_array_get(arr, i);
        snprintf(r->ctx, sizeof r->ctx, "constraint %zu", i);
        if (!json_is_object(o))
            return rd_fail(r, "not an object");
        int32_t kind = 0;
        KILN_TRY(rd_i32(r, o, "kind", 0, KILN_CONSTRAINT_KIND_COUNT - 1, &kind));
        c->kind = (kiln_constraint_kind)kind;
        int unary = c->kind == KILN_CONSTRAINT_POSITIVE || c->kind == KILN_CONSTRAINT_NONNEGATIVE;
        KILN_TRY(rd_i32(r, o, "a", 0, (int64_t)g->exprs.n - 1, &c->a));
        KILN_TRY(rd_i32(r, o, "b", unary ? -1 : 0, (int64_t)g->exprs.n - 1, &c->b));
        KILN_TRY(rd_i32(r, o, "layer", -1, (int64_t)g->n_layers - 1, &c->layer));
        KILN_TRY(rd_str(r, o, "what", &c->what));
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status parse_plan(plan_reader *r, const uint8_t *text, size_t size)
{
    kiln_graph *g = r->g;
    json_error_t err;
    json_t *root = json_loadb((const char *)text, size, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return kiln_fail(KILN_ERROR_FORMAT, "engine plan: JSON error at byte %d: %s", err.position, err.text);
    kiln_status s = KILN_OK;
    json_t *a_sym = NULL, *a_exprs = NULL, *a_plugins = NULL, *a_tensors = NULL, *a_layers = NULL;
    json_t *a_constraints = NULL, *a_profiles = NULL;
    int64_t arena = 0, ws = 0;
    r->ctx[0] = '\0';
    if (!json_is_object(root))
        s = rd_fail(r, "not a JSON object");
    if (s == KILN_OK)
        s = rd_int(r, root, "arena_size", 0, INT64_MAX, &arena);
    if (s == KILN_OK && (s = rd_int(r, root, "workspace_size", 0, INT64_MAX, &ws)) == KILN_OK) {
        g->arena_size = (size_t)arena;
        g->workspace_size = (size_t)ws;
    }
    if (s == KILN_OK)
        s = rd_array(r, root, "symbols", INT32_MAX, &a_sym);
    if (s == KILN_OK)
        s = rd_array(r, root, "exprs", INT32_MAX, &a_exprs);
    if (s == KILN_OK)
        s = rd_array(r, root, "plugins", INT32_MAX, &a_plugins);
    if (s == KILN_OK)
        s = rd_array(r, root, "tensors", INT32_MAX, &a_tensors);
    if (s == KILN_OK)
        s = rd_array(r, root, "layers", INT32_MAX, &a_layers);
    if (s == KILN_OK)
        s = rd_array(r, root, "profiles", INT32_MAX, &a_profiles);
    if (s == KILN_OK)
        s = rd_array(r, root, "constraints", INT32_MAX, &a_constraints);
    /* Each part is checked against the parts before it, so the order
     * matters: symbols' count, expressions, plugins, tensors, layers. */
    if (s == KILN_OK)
        s = rd_exprs(r, a_exprs, (int32_t)json_array_size(a_sym));
    if (s == KILN_OK)
        s = rd_plugins(r, a_plugins);
    if (s == KILN_OK)
        s = rd_tensors(r, a_tensors, (int32_t)json_array_size(a_layers));
    if (s == KILN_OK)
        s = rd_layers(r, a_layers);
    if (s == KILN_OK)
        s = rd_i32s_alloc(r, root, "inputs", 0, (int64_t)g->n_tensors - 1, &g->inputs, &g->n_inputs);
    if (s == KILN_OK)
        s = rd_i32s_alloc(r, root, "outputs", 0, (int64_t)g->n_tensors - 1, &g->outputs, &g->n_outputs);
    if (s == KILN_OK)
        s = rd_symbols(r, a_sym);
    if (s == KILN_OK)
        s = rd_profiles(r, a_profiles);
    if (s == KILN_OK)
        s = rd_constraints(r, a_constraints);
    json_decref(root);
    return s;
}

/* ---- reading: the whole engine -------------------------------------------------- */

static kiln_status rd_extra_sections(kiln_graph *g, const uint8_t *d, const section_view *secs, uint32_t n,
                                     int borrow)
{
    uint32_t count = 0;
    for (uint32_t i = 0; i < n; i++)
        count += secs[i].id != SECTION_PLAN && secs[i].id != SECTION_WEIGHTS && secs[i].id != SECTION_BLOBS;
    if (count == 0)
        return KILN_OK;
    if (!(g->sections = calloc(count, sizeof *g->sections)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "reading %u engine sections", count);
    for (uint32_t i = 0; i < n; i++) {
        const section_view *s = &secs[i];
        if (s->id == SECTION_PLAN || s->id == SECTION_WEIGHTS || s->id == SECTION_BLOBS)
            continue;
        kiln_section_rec *rec = &g->sections[g->n_sections++];
        rec->id = s->id;
        rec->size = (size_t)s->size;
        if (s->size == 0)
            continue;
        if (borrow) {
            rec->data = (void *)(uintptr_t)(d + s->offset);
        } else {
            if (!(rec->data = malloc((size_t)s->size)))
                return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "copying a %" PRIu64 "-byte engine section", s->size);
            memcpy(rec->data, d + s->offset, (size_t)s->size);
            rec->data_owned = 1;
        }
    }
    return KILN_OK;
}

kiln_status kiln_engine_read(const void *data, size_t size, int borrow, kiln_graph *out,
                             kiln_engine_header_info *info)
{
    if (!out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_read: out is required");
    const uint8_t *d = data;
    header_view hv;
    KILN_TRY(parse_header(d, size, &hv));
    if (hv.info.file_size != size)
        return kiln_fail(KILN_ERROR_FORMAT, "engine %s: header says %" PRIu64 " bytes, file has %zu",
                         hv.info.file_size > size ? "truncated" : "size mismatch", hv.info.file_size, size);
    section_view *secs = malloc((hv.n_sections ? hv.n_sections : 1) * sizeof *secs);
    if (!secs)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "reading %u engine sections", hv.n_sections);
    kiln_status s = check_sections(d, size, &hv, secs);
    const section_view *plan = NULL, *weights = NULL, *blobs = NULL;
    for (uint32_t i = 0; i < hv.n_sections && s == KILN_OK; i++) {
        const section_view **slot = secs[i].id == SECTION_PLAN      ? &plan
                                    : secs[i].id == SECTION_WEIGHTS ? &weights
                                    : secs[i].id == SECTION_BLOBS   ? &blobs
                                                                    : NULL;
        if (!slot)
            continue;
        if (*slot) {
            char cc[5];
            fourcc_str(secs[i].id, cc);
            s = kiln_fail(KILN_ERROR_FORMAT, "engine has two %s sections", cc);
        }
        *slot = &secs[i];
    }
    if (s == KILN_OK && (!plan || !weights || !blobs))
        s = kiln_fail(KILN_ERROR_FORMAT, "engine lacks its %s section", !plan ? "PLAN" : !weights ? "WGHT" : "BLOB");
    if (s == KILN_OK && weights->offset % WEIGHTS_PAGE)
        s = kiln_fail(KILN_ERROR_FORMAT, "engine weights section at offset %" PRIu64 " is not %u-aligned",
                      weights->offset, WEIGHTS_PAGE);
    kiln_graph g;
    kiln_graph_init(&g);
    if (s == KILN_OK) {
        g.backend = hv.info.backend;
        g.n_gpu_archs = hv.info.n_gpu_archs;
        memcpy(g.gpu_archs, hv.info.gpu_archs, sizeof g.gpu_archs);
        plan_reader r;
        memset(&r, 0, sizeof r);
        r.g = &g;
        r.weights = d + weights->offset;
        r.weights_size = weights->size;
        r.blobs = d + blobs->offset;
        r.blobs_size = blobs->size;
        r.borrow = borrow;
        s = parse_plan(&r, d + plan->offset, (size_t)plan->size);
    }
    if (s == KILN_OK)
        s = rd_extra_sections(&g, d, secs, hv.n_sections, borrow);
    free(secs);
    if (s != KILN_OK) {
        kiln_graph_free(&g);
        return s;
    }
    *out = g;
    if (info)
        *info = hv.info;
    return KILN_OK;
}

static kiln_status check_written_plan(const uint8_t *image, const out_section *secs, size_t n_secs)
{
    kiln_graph g;
    kiln_graph_init(&g);
    plan_reader r;
    memset(&r, 0, sizeof r);
    r.g = &g;
    r.blobs = image + secs[1].offset;
    r.blobs_size = secs[1].size;
    r.weights = image + secs[n_secs - 1].offset;
    r.weights_size = secs[n_secs - 1].size;
    r.borrow = 1;
    kiln_status s = parse_plan(&r, image + secs[0].offset, (size_t)secs[0].size);
    kiln_graph_free(&g);
    if (s != KILN_OK)
        return kiln_fail_context(s == KILN_ERROR_OUT_OF_MEMORY ? s : KILN_ERROR_INVALID_ARGUMENT,
                                 "the graph cannot be written as an engine");
    return KILN_OK;
}
