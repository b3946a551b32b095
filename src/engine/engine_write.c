/* The engine file writer. docs/engine-format.md is the spec: every layout
 * constant here is named there. */
#include "engine/engine_format.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include <kiln/kiln.h>

#include "core/atomic_write.h"
#include "core/error.h"
#include "core/file.h"
#include "core/op_table.h"
#include "plugin/plugin_internal.h"

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

/* One attribute of the op table (core/op_table.h) into "params". Lengths
 * that would index past an array fail; values are left to the reader's
 * checks, which the writer runs on what it wrote. */
static kiln_status attr_json(jbuild *b, const kiln_graph *g, const kiln_layer *l, const kiln_op_attr *a, json_t *o)
{
    const kiln_layer_params *p = &l->p;
    const uint8_t *field = (const uint8_t *)p + a->offset;
    int32_t rank = first_input_rank(g, l), n = 0;
    const char *name = l->name ? l->name : "";
    switch (a->type) {
    case KILN_ATTR_I32: {
        int32_t v;
        memcpy(&v, field, sizeof v);
        jb_set(b, o, a->key, jb_int(b, v));
        return KILN_OK;
    }
    case KILN_ATTR_AXES: {
        uint32_t v;
        memcpy(&v, field, sizeof v);
        jb_set(b, o, a->key, jb_int(b, v));
        return KILN_OK;
    }
    case KILN_ATTR_I64_RANK: {
        if (rank < 0 || rank > KILN_MAX_RANK)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %s input has no valid rank", name,
                             kiln_op_name(l->op));
        int64_t v[KILN_MAX_RANK];
        memcpy(v, field, sizeof(int64_t) * (size_t)rank);
        jb_set(b, o, a->key, jb_i64s(b, v, rank));
        return KILN_OK;
    }
    case KILN_ATTR_PERM: {
        int32_t has;
        memcpy(&has, (const uint8_t *)p + a->aux, sizeof has);
        if (!has)
            return KILN_OK;
        n = (int32_t)kiln_op_attr_hi(a, rank, p->shuffle.mid_rank, g->n_plugins) + 1;
        if (n < 0 || n > KILN_MAX_RANK)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %s has %d entries (at most %d)", name, a->key,
                             n, KILN_MAX_RANK);
        jb_set(b, o, a->key, jb_i32s(b, (const int32_t *)(const void *)field, n));
        return KILN_OK;
    }
    case KILN_ATTR_EXPRS:
        memcpy(&n, (const uint8_t *)p + a->aux, sizeof n);
        if (n < 0 || n > KILN_MAX_RANK)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %s has %d entries (at most %d)", name, a->key,
                             n, KILN_MAX_RANK);
        jb_set(b, o, a->key, jb_i32s(b, (const int32_t *)(const void *)field, n));
        return KILN_OK;
    case KILN_ATTR_STEPS: {
        if (p->fused.n_steps < 0 || p->fused.n_steps > KILN_FUSED_MAX_STEPS)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %d fused steps (at most %d)", name,
                             p->fused.n_steps, KILN_FUSED_MAX_STEPS);
        json_t *steps = jb_check(b, json_array());
        for (int32_t i = 0; i < p->fused.n_steps; i++) {
            const kiln_fused_step *s = &p->fused.steps[i];
            int32_t v[5] = {s->is_binary, s->op, s->a, s->b, s->src_layer};
            jb_push(b, steps, jb_i32s(b, v, 5));
        }
        jb_set(b, o, a->key, steps);
        return KILN_OK;
    }
    case KILN_ATTR_TYPE_COUNT: break;
    }
    return kiln_fail(KILN_ERROR_INTERNAL, "attribute \"%s\" has no writer", a->key);
}

static kiln_status layer_params_json(jbuild *b, const kiln_graph *g, const kiln_layer *l, json_t **out)
{
    const kiln_op_info *op = kiln_op_info_get(l->op);
    if (!op)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": op %d is not a kiln_op", l->name ? l->name : "",
                         (int)l->op);
    json_t *o = jb_check(b, json_object());
    for (int32_t i = 0; i < op->n_attrs; i++) {
        kiln_status s = attr_json(b, g, l, &op->attrs[i], o);
        if (s != KILN_OK) {
            json_decref(o);
            return s;
        }
    }
    *out = o;
    return KILN_OK;
}

/* Where each constant and blob landed, computed before the plan is written
 * because the plan records them. */
typedef struct write_layout {
    uint64_t *const_offset; /* per tensor, into the weights section */
    uint64_t weights_size;
    uint64_t *blob_offset; /* per plugin, into the blobs section */
    size_t *blob_size;
    uint32_t *blob_version;
    uint8_t **blob_data; /* per plugin; owned when blob_owned */
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
            unsigned long fails = kiln_host_fail_count();
            kiln_status s = ops->serialize(r->instance, NULL, &size);
            if (s != KILN_OK)
                return kiln_plugin_error(name, "serialize (asking the size)", s, fails);
            uint8_t *buf = malloc(size ? size : 1);
            if (!buf)
                return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "serializing plugin \"%s\": %zu bytes", name, size);
            w->blob_data[i] = buf;
            w->blob_owned[i] = 1;
            size_t cap = size;
            fails = kiln_host_fail_count();
            s = ops->serialize(r->instance, buf, &cap);
            if (s != KILN_OK)
                return kiln_plugin_error(name, "serialize", s, fails);
            if (cap > size)
                return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" wrote %zu bytes into a %zu-byte serialize buffer",
                                 name, cap, size);
            w->blob_size[i] = cap;
            w->blob_version[i] = r->creator ? r->creator->blob_version : r->blob_version;
        } else {
            if (r->blob_size > 0 && !r->blob)
                return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin \"%s\": blob_size %zu but no blob", name,
                                 r->blob_size);
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
    const void *data; /* NULL: filled in place (weights, blobs) */
    uint64_t size;
    uint64_t offset;
} out_section;

/* Runs the reader's plan checks on what was just written, so a graph the
 * reader would refuse fails here, at build time, naming the problem,
 * instead of when the engine is loaded. */
static kiln_status check_written_plan(const uint8_t *image, const out_section *secs, size_t n_secs);

/* The engine laid out: `head` holds every byte before the weights section
 * (header with every checksum, plan, blobs, extra sections, padding), the
 * weights section starts at head_size and the file is `total` bytes. */
typedef struct engine_head {
    uint8_t *head;
    uint64_t head_size, total;
    write_layout w;
} engine_head;

static const uint8_t zeros[4096];

/* XXH64 of the weights section as the writer lays it out (constants at
 * their offsets, zeros between), streamed from the constants in place. */
static kiln_status weights_checksum(const kiln_graph *g, const write_layout *w, uint64_t *sum)
{
    XXH64_state_t *st = XXH64_createState();
    if (!st)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "hashing the engine weights");
    XXH64_reset(st, 0);
    uint64_t pos = 0;
    for (int32_t i = 0; i < g->n_tensors; i++) {
        const kiln_tensor_rec *t = &g->tensors[i];
        if (!(t->flags & KILN_TENSOR_CONSTANT) || !t->data_size)
            continue;
        while (pos < w->const_offset[i]) {
            size_t n = w->const_offset[i] - pos < sizeof zeros ? (size_t)(w->const_offset[i] - pos) : sizeof zeros;
            XXH64_update(st, zeros, n);
            pos += n;
        }
        XXH64_update(st, t->data, t->data_size);
        pos += t->data_size;
    }
    *sum = XXH64_digest(st);
    XXH64_freeState(st);
    return KILN_OK;
}

static void engine_head_free(engine_head *h, const kiln_graph *g)
{
    free(h->head);
    write_layout_free(&h->w, g->n_plugins);
}

static kiln_status engine_head_make(const kiln_graph *g, engine_head *h)
{
    memset(h, 0, sizeof *h);
    if (!g)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_write: graph is required");
    if ((unsigned)g->backend >= KILN_BACKEND_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "engine backend %d is not a kiln_backend", (int)g->backend);
    if (g->n_gpu_archs < 0 || g->n_gpu_archs > 8)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%d GPU architectures (at most 8)", g->n_gpu_archs);
    for (int32_t i = 0; i < g->n_sections; i++) {
        uint32_t id = g->sections[i].id;
        char cc[5];
        kiln_engine_fourcc_str(id, cc);
        if (id == SECTION_PLAN || id == SECTION_WEIGHTS || id == SECTION_BLOBS)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "extra section id %s is reserved by the engine format", cc);
        if (g->sections[i].size > 0 && !g->sections[i].data)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "extra section %s has %zu bytes but no data", cc,
                             g->sections[i].size);
    }

    write_layout *w = &h->w;
    char *plan = NULL;
    out_section *secs = NULL;
    kiln_status s = collect_blobs(g, w);
    if (s == KILN_OK)
        s = layout_weights(g, w);
    if (s == KILN_OK)
        s = plan_to_json(g, w, &plan);
    size_t n_secs = 3 + (size_t)(g->n_sections > 0 ? g->n_sections : 0);
    if (s == KILN_OK && !(secs = calloc(n_secs, sizeof *secs)))
        s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "laying out the engine");
    uint8_t *image = NULL;
    uint64_t total = 0, weights_sum = 0;
    if (s == KILN_OK) {
        /* PLAN, BLOB, the extra sections, then the weights last so that they
         * start on a page of their own. */
        secs[0] = (out_section){SECTION_PLAN, plan, strlen(plan), 0};
        secs[1] = (out_section){SECTION_BLOBS, NULL, w->blobs_size, 0};
        for (int32_t i = 0; i < g->n_sections; i++)
            secs[2 + i] = (out_section){g->sections[i].id, g->sections[i].data, g->sections[i].size, 0};
        secs[n_secs - 1] = (out_section){SECTION_WEIGHTS, NULL, w->weights_size, 0};
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
        else if (!(image = calloc(1, (size_t)secs[n_secs - 1].offset)))
            s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "allocating a %" PRIu64 "-byte engine header",
                          secs[n_secs - 1].offset);
    }
    if (s == KILN_OK)
        s = weights_checksum(g, w, &weights_sum);
    if (s == KILN_OK) {
        for (size_t i = 0; i + 1 < n_secs; i++)
            if (secs[i].data && secs[i].size)
                memcpy(image + secs[i].offset, secs[i].data, (size_t)secs[i].size);
        uint8_t *blobs = image + secs[1].offset;
        for (int32_t i = 0; i < g->n_plugins; i++)
            if (w->blob_size[i])
                memcpy(blobs + w->blob_offset[i], w->blob_data[i], w->blob_size[i]);

        memcpy(image, KILN_ENGINE_MAGIC, 8);
        kiln_put_u32(image + OFF_FORMAT_VERSION, KILN_ENGINE_FORMAT_VERSION);
        kiln_put_u32(image + OFF_HEADER_SIZE, HEADER_SIZE);
        strncpy((char *)image + OFF_KILN_VERSION, KILN_VERSION_STRING, 15);
        kiln_put_u32(image + OFF_BACKEND, (uint32_t)g->backend);
        kiln_put_u32(image + OFF_N_GPU_ARCHS, (uint32_t)g->n_gpu_archs);
        for (int32_t i = 0; i < g->n_gpu_archs; i++)
            kiln_put_u32(image + OFF_GPU_ARCHS + 4 * (size_t)i, (uint32_t)g->gpu_archs[i]);
        kiln_put_u64(image + OFF_FILE_SIZE, total);
        kiln_put_u32(image + OFF_N_SECTIONS, (uint32_t)n_secs);
        kiln_put_u32(image + OFF_RESERVED, 0);
        for (size_t i = 0; i < n_secs; i++) {
            uint8_t *e = image + HEADER_SIZE + ENTRY_SIZE * i;
            kiln_put_u32(e, secs[i].id);
            kiln_put_u32(e + 4, 0);
            kiln_put_u64(e + 8, secs[i].offset);
            kiln_put_u64(e + 16, secs[i].size);
            kiln_put_u64(e + 24, i + 1 < n_secs ? XXH64(image + secs[i].offset, (size_t)secs[i].size, 0) : weights_sum);
        }
        kiln_put_u64(image + OFF_HEADER_CHECKSUM, kiln_engine_header_checksum(image, ENTRY_SIZE * n_secs));
        s = check_written_plan(image, secs, n_secs);
    }
    if (s == KILN_OK) {
        h->head = image;
        h->head_size = secs[n_secs - 1].offset;
        h->total = total;
    } else {
        free(image);
        write_layout_free(w, g->n_plugins);
    }
    free(secs);
    free(plan);
    return s;
}

kiln_status kiln_engine_write(const kiln_graph *g, kiln_buffer *out)
{
    if (!g || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_write: graph and out are required");
    engine_head h;
    KILN_TRY(engine_head_make(g, &h));
    uint8_t *image = calloc(1, (size_t)h.total);
    if (!image) {
        engine_head_free(&h, g);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "allocating a %" PRIu64 "-byte engine", h.total);
    }
    memcpy(image, h.head, (size_t)h.head_size);
    for (int32_t i = 0; i < g->n_tensors; i++) {
        const kiln_tensor_rec *t = &g->tensors[i];
        if ((t->flags & KILN_TENSOR_CONSTANT) && t->data_size)
            memcpy(image + h.head_size + h.w.const_offset[i], t->data, t->data_size);
    }
    out->data = image;
    out->size = (size_t)h.total;
    engine_head_free(&h, g);
    return KILN_OK;
}

kiln_status kiln_engine_write_file(const kiln_graph *g, const char *path)
{
    if (!g || !path)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_write_file: graph and path are required");
    KILN_TRY(kiln_file_check_output(path));
    engine_head h;
    KILN_TRY(engine_head_make(g, &h));
    kiln_atomic_file f = {-1, path, NULL};
    kiln_status s = kiln_atomic_file_open(path, &f);
    if (s == KILN_OK)
        s = kiln_atomic_file_write(&f, h.head, (size_t)h.head_size);
    uint64_t pos = 0;
    for (int32_t i = 0; s == KILN_OK && i < g->n_tensors; i++) {
        const kiln_tensor_rec *t = &g->tensors[i];
        if (!(t->flags & KILN_TENSOR_CONSTANT) || !t->data_size)
            continue;
        while (s == KILN_OK && pos < h.w.const_offset[i]) {
            size_t n = (size_t)(sizeof zeros < h.w.const_offset[i] - pos ? sizeof zeros : h.w.const_offset[i] - pos);
            s = kiln_atomic_file_write(&f, zeros, n);
            pos += n;
        }
        if (s == KILN_OK)
            s = kiln_atomic_file_write(&f, t->data, t->data_size);
        pos += t->data_size;
    }
    if (s == KILN_OK)
        s = kiln_atomic_file_commit(&f);
    else if (f.fd >= 0)
        kiln_atomic_file_abort(&f);
    engine_head_free(&h, g);
    return s;
}

static kiln_status check_written_plan(const uint8_t *image, const out_section *secs, size_t n_secs)
{
    kiln_graph g;
    kiln_graph_init(&g);
    /* weights NULL: the check reads no weight byte, only their offsets and sizes */
    kiln_engine_sections es = {image + secs[1].offset, secs[1].size, NULL, secs[n_secs - 1].size};
    kiln_status s = kiln_engine_parse_plan(image + secs[0].offset, (size_t)secs[0].size, &es, 1, &g);
    kiln_graph_free(&g);
    if (s != KILN_OK)
        return kiln_fail_context(s == KILN_ERROR_OUT_OF_MEMORY ? s : KILN_ERROR_INVALID_ARGUMENT,
                                 "the graph cannot be written as an engine");
    return KILN_OK;
}
