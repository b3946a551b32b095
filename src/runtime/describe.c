/* kiln_engine_describe_json: everything an engine holds, as JSON, for
 * `kiln inspect` and for tools. */
#include "runtime/runtime_internal.h"

#include <kiln/kiln.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/op_table.h"

static json_t *dims_json(const kiln_dims *d)
{
    json_t *a = json_array();
    for (int32_t i = 0; i < d->rank && i < KILN_MAX_RANK; i++)
        json_array_append_new(a, json_integer(d->d[i]));
    return a;
}

static json_t *expr_json(const kiln_graph *g, kiln_expr e)
{
    char buf[256];
    buf[0] = '\0';
    return json_string(kiln_expr_format(&g->exprs, e, buf, sizeof buf));
}

static const char *tensor_name(const kiln_graph *g, int32_t t)
{
    return t >= 0 && t < g->n_tensors ? g->tensors[t].name : "?";
}

static json_t *tensor_names(const kiln_graph *g, const int32_t *idx, int32_t n)
{
    json_t *a = json_array();
    for (int32_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(tensor_name(g, idx[i])));
    return a;
}

static json_t *perm_json(const int32_t *perm, int32_t rank)
{
    json_t *a = json_array();
    for (int32_t i = 0; i < rank && i < KILN_MAX_RANK; i++)
        json_array_append_new(a, json_integer(perm[i]));
    return a;
}

static const char *binary_name(int32_t op)
{
    return op >= 0 && op < KILN_BINARY_OP_COUNT ? kiln_binary_op_name((kiln_binary_op)op) : "?";
}

static const char *unary_name(int32_t op)
{
    return op >= 0 && op < KILN_UNARY_OP_COUNT ? kiln_unary_op_name((kiln_unary_op)op) : "?";
}

static json_t *steps_json(const kiln_layer_params *p)
{
    json_t *steps = json_array();
    for (int32_t i = 0; i < p->fused.n_steps && i < KILN_FUSED_MAX_STEPS; i++) {
        const kiln_fused_step *s = &p->fused.steps[i];
        json_t *ops = json_array();
        json_array_append_new(ops, json_integer(s->a));
        if (s->is_binary)
            json_array_append_new(ops, json_integer(s->b));
        json_array_append_new(steps,
                              json_pack("{s:s, s:o, s:i}", "op", s->is_binary ? binary_name(s->op) : unary_name(s->op),
                                        "operands", ops, "src_layer", s->src_layer));
    }
    return steps;
}

/* One attribute of the op table (core/op_table.h), readable: enum values
 * by name, axis masks as lists, expressions as text. */
static json_t *attr_json(const kiln_graph *g, const kiln_layer *L, const kiln_op_attr *a, int32_t in_rank)
{
    const kiln_layer_params *p = &L->p;
    const uint8_t *field = (const uint8_t *)p + a->offset;
    int32_t n = 0;
    switch (a->type) {
    case KILN_ATTR_I32: {
        int32_t v;
        memcpy(&v, field, sizeof v);
        if (a->value_name)
            return json_string(v >= a->lo && v <= a->hi ? a->value_name(v) : "?");
        return json_integer(v);
    }
    case KILN_ATTR_AXES: {
        uint32_t v;
        memcpy(&v, field, sizeof v);
        json_t *axes = json_array();
        for (int32_t i = 0; i < 32; i++)
            if (v & (1u << i))
                json_array_append_new(axes, json_integer(i));
        return axes;
    }
    case KILN_ATTR_I64_RANK: {
        json_t *arr = json_array();
        for (int32_t i = 0; i < in_rank && i < KILN_MAX_RANK; i++) {
            int64_t v;
            memcpy(&v, field + sizeof v * (size_t)i, sizeof v);
            json_array_append_new(arr, json_integer(v));
        }
        return arr;
    }
    case KILN_ATTR_PERM:
        memcpy(&n, (const uint8_t *)p + a->aux, sizeof n);
        if (!n)
            return NULL;
        n = (int32_t)kiln_op_attr_hi(a, in_rank, p->shuffle.mid_rank, g->n_plugins) + 1;
        return perm_json((const int32_t *)(const void *)field, n);
    case KILN_ATTR_EXPRS: {
        memcpy(&n, (const uint8_t *)p + a->aux, sizeof n);
        json_t *arr = json_array();
        for (int32_t i = 0; i < n && i < KILN_MAX_RANK; i++) {
            int32_t e;
            memcpy(&e, field + sizeof e * (size_t)i, sizeof e);
            json_array_append_new(arr, expr_json(g, e));
        }
        return arr;
    }
    case KILN_ATTR_STEPS: return steps_json(p);
    case KILN_ATTR_TYPE_COUNT: break;
    }
    return NULL;
}

static json_t *params_json(const kiln_graph *g, const kiln_layer *L)
{
    int32_t in_rank =
        L->n_inputs > 0 && L->inputs[0] >= 0 && L->inputs[0] < g->n_tensors ? g->tensors[L->inputs[0]].rank : 0;
    json_t *o = json_object();
    const kiln_op_info *op = kiln_op_info_get(L->op);
    for (int32_t i = 0; op && i < op->n_attrs; i++) {
        json_t *v = attr_json(g, L, &op->attrs[i], in_rank);
        if (v)
            json_object_set_new(o, op->attrs[i].key, v);
    }
    /* A plugin layer also shows which plugin its index names. */
    if (L->op == KILN_OP_PLUGIN && L->p.plugin.index >= 0 && L->p.plugin.index < g->n_plugins) {
        const kiln_plugin_rec *r = &g->plugins[L->p.plugin.index];
        json_object_set_new(o, "name", json_string(r->name ? r->name : ""));
        json_object_set_new(o, "version", json_string(r->version ? r->version : ""));
        json_object_set_new(o, "namespace", json_string(r->plugin_namespace ? r->plugin_namespace : ""));
    }
    return o;
}

static json_t *flags_json(uint32_t flags)
{
    json_t *a = json_array();
    if (flags & KILN_TENSOR_INPUT)
        json_array_append_new(a, json_string("input"));
    if (flags & KILN_TENSOR_OUTPUT)
        json_array_append_new(a, json_string("output"));
    if (flags & KILN_TENSOR_CONSTANT)
        json_array_append_new(a, json_string("constant"));
    return a;
}

static json_t *describe(const kiln_graph *g, const kiln_engine_header_info *info)
{
    json_t *root = json_object();

    json_object_set_new(root, "header",
                        json_pack("{s:i, s:s, s:I, s:i}", "format_version", (int)info->format_version, "kiln_version",
                                  info->kiln_version[15] ? "?" : info->kiln_version, "file_size",
                                  (json_int_t)info->file_size, "sections", (int)info->n_sections));
    json_t *archs = json_array();
    for (int32_t i = 0; i < info->n_gpu_archs && i < 8; i++)
        json_array_append_new(archs, json_integer(info->gpu_archs[i]));
    json_object_set_new(root, "target",
                        json_pack("{s:s, s:o}", "backend",
                                  (unsigned)info->backend < KILN_BACKEND_COUNT ? kiln_backend_name(info->backend) : "?",
                                  "gpu_archs", archs));

    json_object_set_new(root, "inputs", tensor_names(g, g->inputs, g->n_inputs));
    json_object_set_new(root, "outputs", tensor_names(g, g->outputs, g->n_outputs));

    json_t *syms = json_array();
    for (int32_t s = 0; s < g->n_symbols; s++)
        json_array_append_new(
            syms, json_pack("{s:s, s:i}", "tensor", tensor_name(g, g->symbols[s].tensor), "axis", g->symbols[s].axis));
    json_object_set_new(root, "symbols", syms);

    json_t *profiles = json_array();
    for (int32_t p = 0; p < g->n_profiles; p++) {
        json_t *inputs = json_object();
        for (int32_t i = 0; i < g->n_inputs; i++) {
            const kiln_profile_dims *d = &g->profiles[(size_t)p * (size_t)g->n_inputs + (size_t)i];
            json_object_set_new(inputs, tensor_name(g, g->inputs[i]),
                                json_pack("{s:o, s:o, s:o}", "min", dims_json(&d->min), "opt", dims_json(&d->opt),
                                          "max", dims_json(&d->max)));
        }
        json_array_append_new(profiles, inputs);
    }
    json_object_set_new(root, "profiles", profiles);

    json_t *tensors = json_array();
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        json_t *dims = json_array();
        for (int32_t i = 0; i < r->rank && i < KILN_MAX_RANK; i++)
            json_array_append_new(dims, expr_json(g, r->dims[i]));
        json_t *o = json_pack("{s:s, s:s, s:o, s:o}", "name", r->name, "dtype", kiln_dtype_name(r->dtype), "dims", dims,
                              "flags", flags_json(r->flags));
        if (r->flags & KILN_TENSOR_CONSTANT) {
            json_object_set_new(o, "data_bytes", json_integer((json_int_t)r->data_size));
        } else {
            json_object_set_new(o, "arena_offset", json_integer(r->arena_offset));
            json_object_set_new(o, "max_bytes", json_integer((json_int_t)r->max_bytes));
        }
        json_array_append_new(tensors, o);
    }
    json_object_set_new(root, "tensors", tensors);

    json_t *layers = json_array();
    for (int32_t l = 0; l < g->n_layers; l++) {
        const kiln_layer *L = &g->layers[l];
        json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:o}", "name", L->name, "op", kiln_op_name(L->op), "inputs",
                              tensor_names(g, L->inputs, L->n_inputs), "outputs",
                              tensor_names(g, L->outputs, L->n_outputs), "params", params_json(g, L));
        if (L->workspace)
            json_object_set_new(o, "workspace", json_integer((json_int_t)L->workspace));
        if (L->tactic >= 0)
            json_object_set_new(o, "tactic", json_integer(L->tactic));
        json_array_append_new(layers, o);
    }
    json_object_set_new(root, "layers", layers);

    json_object_set_new(root, "memory",
                        json_pack("{s:I, s:I}", "arena_bytes", (json_int_t)g->arena_size, "workspace_bytes",
                                  (json_int_t)g->workspace_size));

    json_t *plugins = json_array();
    for (int32_t i = 0; i < g->n_plugins; i++) {
        const kiln_plugin_rec *r = &g->plugins[i];
        json_array_append_new(plugins,
                              json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:b}", "name", r->name, "version", r->version,
                                        "namespace", r->plugin_namespace, "library", r->library ? r->library : "",
                                        "blob_version", (json_int_t)r->blob_version, "blob_bytes",
                                        (json_int_t)r->blob_size, "resolved", r->creator != NULL));
    }
    json_object_set_new(root, "plugins", plugins);

    json_t *sections = json_array();
    for (int32_t i = 0; i < g->n_sections; i++) {
        char id[5];
        for (int k = 0; k < 4; k++) {
            char c = (char)((g->sections[i].id >> (8 * k)) & 0xff);
            id[k] = c >= 0x20 && c < 0x7f ? c : '?';
        }
        id[4] = '\0';
        json_array_append_new(sections, json_pack("{s:s, s:I}", "id", id, "bytes", (json_int_t)g->sections[i].size));
    }
    json_object_set_new(root, "sections", sections);
    return root;
}

/* root's text into *out; takes root */
static kiln_status dump(json_t *root, char **out)
{
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory describing an engine");
    *out = text;
    return KILN_OK;
}

kiln_status kiln_engine_describe_graph_json(const kiln_graph *g, const kiln_engine_header_info *info, char **out)
{
    return dump(describe(g, info), out);
}

kiln_status kiln_engine_describe_json(const kiln_engine *engine, char **out)
{
    if (!engine || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_describe_json: engine and out are required");
    json_t *root = describe(&engine->graph, &engine->info);
    /* A loaded engine knows what a context really takes: the plan's arena
     * less the I/O tensors (sized to their current shapes when bound, and
     * at their max shapes as large as an LLM's whole KV cache), plus the
     * plugins' workspace. */
    if (root)
        json_object_set_new(json_object_get(root, "memory"), "context_bytes",
                            json_integer((json_int_t)engine->pool.block_bytes));
    return dump(root, out);
}
