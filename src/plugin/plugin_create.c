/* Creating plugin instances: the field schema is enforced here, before the
 * plugin sees anything, and whatever a plugin hands back is checked before
 * the rest of kiln touches it. */
#include "plugin/plugin_internal.h"

#include <kiln/kiln.h>

#include "core/error.h"
#include "core/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kiln_field_type_name(kiln_field_type type)
{
    static const char *const names[KILN_FIELD_TYPE_COUNT] = {
        [KILN_FIELD_F32] = "f32", [KILN_FIELD_F64] = "f64",       [KILN_FIELD_I32] = "i32",
        [KILN_FIELD_I64] = "i64", [KILN_FIELD_STRING] = "string",
    };
    return (unsigned)type < KILN_FIELD_TYPE_COUNT ? names[type] : "unknown";
}

/* The triple as messages print it: ScaleBias 1 "" */
#define TRIPLE_FMT "%s %s \"%s\""
#define TRIPLE_ARGS(c) (c)->name, (c)->version, (c)->plugin_namespace

/* ---- checking what a plugin returns ------------------------------------- */

kiln_status kiln_plugin_error(const char *plugin, const char *call, kiln_status s, unsigned long fails_before)
{
    if ((unsigned)s >= KILN_STATUS_COUNT || s == KILN_OK)
        s = KILN_ERROR_PLUGIN;
    if (kiln_host_fail_count() != fails_before)
        return kiln_fail_context(s, "plugin %s", plugin);
    return kiln_fail(s, "plugin %s: %s failed with %s and gave no message", plugin, call, kiln_status_name(s));
}

/* An error from a plugin must leave a message: if the plugin did not call
 * host->fail, say which plugin failed and how. */
static kiln_status plugin_error(const kiln_plugin_creator *c, const char *call, kiln_status s,
                                unsigned long fails_before)
{
    if ((unsigned)s >= KILN_STATUS_COUNT)
        s = KILN_ERROR_PLUGIN;
    if (kiln_host_fail_count() != fails_before) {
        if (c)
            return kiln_fail_context(s, "plugin " TRIPLE_FMT, TRIPLE_ARGS(c));
        return s;
    }
    if (c)
        return kiln_fail(s, "plugin " TRIPLE_FMT ": %s failed with %s and gave no message", TRIPLE_ARGS(c), call,
                         kiln_status_name(s));
    return kiln_fail(s, "plugin: %s failed with %s and gave no message", call, kiln_status_name(s));
}

kiln_status kiln_plugin_enqueue_error(const char *layer, kiln_status s, unsigned long fails_before)
{
    if ((unsigned)s >= KILN_STATUS_COUNT || s == KILN_OK)
        s = KILN_ERROR_PLUGIN;
    if (kiln_host_fail_count() != fails_before)
        return kiln_fail_context(s, "layer \"%s\"", layer);
    return kiln_fail(s, "layer \"%s\": the plugin's enqueue failed with %s and gave no message", layer,
                     kiln_status_name(s));
}

static kiln_status check_instance(const kiln_plugin_creator *c, const char *call, kiln_plugin *p)
{
    const char *problem = NULL;
    if (!p)
        problem = "returned no instance";
    else if (p->struct_size < KILN_PLUGIN_V1_SIZE)
        problem = "returned an instance whose struct_size is smaller than plugin ABI version 1's";
    else if (!p->ops)
        problem = "returned an instance without ops";
    else if (p->ops->struct_size < KILN_OPS_V1_SIZE)
        problem = "returned ops whose struct_size is smaller than plugin ABI version 1's";
    else if (p->ops->abi_version < 1 || p->ops->abi_version > KILN_PLUGIN_ABI_VERSION)
        problem = "returned ops of an unsupported plugin ABI version";
    else if (!p->ops->num_outputs || !p->ops->output_shapes || !p->ops->output_dtypes || !p->ops->supports ||
             !p->ops->enqueue || !p->ops->serialize || !p->ops->clone || !p->ops->destroy)
        problem = "returned ops with a missing function (all but workspace_size are required)";
    if (!problem)
        return KILN_OK;
    /* Free what can be freed safely: only through a destroy we can read. */
    if (p && p->struct_size >= KILN_PLUGIN_V1_SIZE && p->ops && p->ops->struct_size >= KILN_OPS_V1_SIZE &&
        p->ops->destroy)
        p->ops->destroy(p);
    if (c)
        return kiln_fail(KILN_ERROR_PLUGIN, "plugin " TRIPLE_FMT ": %s %s", TRIPLE_ARGS(c), call, problem);
    return kiln_fail(KILN_ERROR_PLUGIN, "plugin: %s %s", call, problem);
}

/* ---- the field schema ---------------------------------------------------- */

static const kiln_field_spec *find_spec(const kiln_plugin_creator *c, const char *name)
{
    for (int32_t i = 0; i < c->n_fields; i++)
        if (strcmp(c->fields[i].name, name) == 0)
            return &c->fields[i];
    return NULL;
}

static kiln_status unknown_field(const kiln_plugin_creator *c, const char *name)
{
    char list[512];
    size_t used = 0;
    list[0] = '\0';
    for (int32_t i = 0; i < c->n_fields && used < sizeof list - 1; i++) {
        int n = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", c->fields[i].name);
        if (n < 0)
            break;
        used += (size_t)n < sizeof list - used ? (size_t)n : sizeof list - used - 1;
    }
    if (c->n_fields == 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "plugin " TRIPLE_FMT ": unknown field \"%s\" (it takes no fields)", TRIPLE_ARGS(c), name);
    return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin " TRIPLE_FMT ": unknown field \"%s\" (fields: %s)",
                     TRIPLE_ARGS(c), name, list);
}

static kiln_status check_field(const kiln_plugin_creator *c, const kiln_field *f, int32_t index,
                               const kiln_field_spec **spec_out)
{
    if (f->struct_size < KILN_FIELD_V1_SIZE)
        return kiln_fail(KILN_ERROR_VERSION,
                         "plugin " TRIPLE_FMT ": field %d has struct_size %u, smaller than plugin ABI version 1's %zu",
                         TRIPLE_ARGS(c), (int)index, f->struct_size, KILN_FIELD_V1_SIZE);
    if (!f->name)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin " TRIPLE_FMT ": field %d has no name", TRIPLE_ARGS(c),
                         (int)index);
    const kiln_field_spec *spec = find_spec(c, f->name);
    if (!spec)
        return unknown_field(c, f->name);
    if (f->type != spec->type)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin " TRIPLE_FMT ": field \"%s\" has type %s, expected %s",
                         TRIPLE_ARGS(c), f->name, kiln_field_type_name(f->type), kiln_field_type_name(spec->type));
    if (spec->count == KILN_FIELD_ANY_COUNT) {
        if (f->count < 1)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "plugin " TRIPLE_FMT ": field \"%s\" has %lld values, expected at least 1", TRIPLE_ARGS(c),
                             f->name, (long long)f->count);
    } else if (f->count != spec->count) {
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "plugin " TRIPLE_FMT ": field \"%s\" has %lld values, expected %lld", TRIPLE_ARGS(c), f->name,
                         (long long)f->count, (long long)spec->count);
    }
    if (!f->data)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin " TRIPLE_FMT ": field \"%s\" has no data", TRIPLE_ARGS(c),
                         f->name);
    *spec_out = spec;
    return KILN_OK;
}

/* Fills out[] in schema order with the given fields and the defaults of
 * optional ones left out; *n_out receives how many. */
static kiln_status apply_schema(const kiln_plugin_creator *c, const kiln_field *fields, int32_t n_fields,
                                kiln_field *out, int32_t *n_out)
{
    const kiln_field **given = NULL;
    if (c->n_fields > 0) {
        given = calloc((size_t)c->n_fields, sizeof *given);
        if (!given)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "plugin " TRIPLE_FMT ": out of memory", TRIPLE_ARGS(c));
    }
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < n_fields && s == KILN_OK; i++) {
        const kiln_field_spec *spec = NULL;
        s = check_field(c, &fields[i], i, &spec);
        if (s != KILN_OK)
            break;
        size_t k = (size_t)(spec - c->fields);
        if (given[k])
            s = kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin " TRIPLE_FMT ": field \"%s\" is given twice",
                          TRIPLE_ARGS(c), spec->name);
        given[k] = &fields[i];
    }
    int32_t n = 0;
    for (int32_t k = 0; k < c->n_fields && s == KILN_OK; k++) {
        const kiln_field_spec *spec = &c->fields[k];
        kiln_field f = {.struct_size = sizeof(kiln_field),
                        .abi_version = KILN_PLUGIN_ABI_VERSION,
                        .name = spec->name,
                        .type = spec->type};
        if (given[k]) {
            f.count = given[k]->count;
            f.data = given[k]->data;
        } else if (spec->required) {
            s = kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin " TRIPLE_FMT ": missing required field \"%s\"",
                          TRIPLE_ARGS(c), spec->name);
            break;
        } else if (spec->default_data) {
            f.count = spec->default_count;
            f.data = spec->default_data;
        } else {
            continue;
        }
        out[n++] = f;
    }
    free(given);
    if (s == KILN_OK)
        *n_out = n;
    return s;
}

kiln_status kiln_plugin_create(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                               kiln_plugin **out)
{
    if (!creator || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_plugin_create: %s is NULL", creator ? "out" : "creator");
    if (n_fields < 0 || (n_fields > 0 && !fields))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "plugin " TRIPLE_FMT ": %d fields at %p", TRIPLE_ARGS(creator),
                         (int)n_fields, (const void *)fields);
    kiln_field *checked = NULL;
    if (creator->n_fields > 0) {
        checked = calloc((size_t)creator->n_fields, sizeof *checked);
        if (!checked)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "plugin " TRIPLE_FMT ": out of memory", TRIPLE_ARGS(creator));
    }
    int32_t n_checked = 0;
    kiln_status s = apply_schema(creator, fields, n_fields, checked, &n_checked);
    if (s != KILN_OK) {
        free(checked);
        return s;
    }
    kiln_plugin *p = NULL;
    unsigned long fails_before = kiln_host_fail_count();
    s = creator->create(creator, checked, n_checked, &p);
    free(checked);
    if (s != KILN_OK)
        return plugin_error(creator, "create", s, fails_before);
    KILN_TRY(check_instance(creator, "create", p));
    *out = p;
    return KILN_OK;
}

kiln_status kiln_plugin_deserialize(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob,
                                    size_t size, kiln_plugin **out)
{
    if (!creator || !out || (size > 0 && !blob))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_plugin_deserialize: invalid argument");
    kiln_plugin *p = NULL;
    unsigned long fails_before = kiln_host_fail_count();
    kiln_status s = creator->deserialize(creator, blob_version, blob, size, &p);
    if (s != KILN_OK)
        return plugin_error(creator, "deserialize", s, fails_before);
    KILN_TRY(check_instance(creator, "deserialize", p));
    *out = p;
    return KILN_OK;
}

kiln_status kiln_plugin_clone(const kiln_plugin_creator *creator, const kiln_plugin *self, kiln_plugin **out)
{
    if (!self || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_plugin_clone: %s is NULL", self ? "out" : "self");
    kiln_plugin *p = NULL;
    unsigned long fails_before = kiln_host_fail_count();
    kiln_status s = self->ops->clone(self, &p);
    if (s != KILN_OK)
        return plugin_error(creator, "clone", s, fails_before);
    KILN_TRY(check_instance(creator, "clone", p));
    *out = p;
    return KILN_OK;
}

/* ---- plugin layers ------------------------------------------------------- */

kiln_status kiln_plugin_check_layer(const kiln_graph *g, const kiln_layer *l, kiln_backend backend)
{
    int32_t pi = l->p.plugin.index;
    if (pi < 0 || pi >= g->n_plugins)
        return kiln_fail(KILN_ERROR_INTERNAL, "layer \"%s\": plugin record %d of %d", l->name, pi, g->n_plugins);
    const kiln_plugin_rec *rec = &g->plugins[pi];
    if (!rec->instance || !rec->instance->ops)
        return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": plugin %s %s (namespace \"%s\") is not resolved", l->name,
                         rec->name, rec->version, rec->plugin_namespace ? rec->plugin_namespace : "");
    const kiln_plugin_ops *ops = rec->instance->ops;
    if (!(ops->backends & KILN_BACKEND_BIT(backend)))
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "layer \"%s\": plugin %s %s (namespace \"%s\") has no %s implementation", l->name, rec->name,
                         rec->version, rec->plugin_namespace ? rec->plugin_namespace : "", kiln_backend_name(backend));
    int32_t n = l->n_inputs + l->n_outputs;
    kiln_tensor_desc *descs = calloc(n > 0 ? (size_t)n : 1, sizeof *descs);
    if (!descs)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": checking dtypes", l->name);
    for (int32_t k = 0; k < n; k++) {
        const kiln_tensor_rec *t = &g->tensors[k < l->n_inputs ? l->inputs[k] : l->outputs[k - l->n_inputs]];
        descs[k].struct_size = (uint32_t)sizeof descs[k];
        descs[k].abi_version = KILN_PLUGIN_ABI_VERSION;
        descs[k].dtype = t->dtype;
        descs[k].format = KILN_FORMAT_LINEAR;
        descs[k].dims.rank = t->rank;
    }
    int ok = ops->struct_size >= offsetof(kiln_plugin_ops, supports) + sizeof ops->supports && ops->supports &&
             ops->supports(rec->instance, backend, descs, l->n_inputs, l->n_outputs);
    kiln_status s = KILN_OK;
    if (!ok) {
        char list[256] = "";
        size_t pos = 0;
        for (int32_t k = 0; k < n && pos < sizeof list; k++) {
            int w = snprintf(list + pos, sizeof list - pos, "%s%s",
                             k == 0             ? ""
                             : k == l->n_inputs ? " -> "
                                                : ", ",
                             kiln_dtype_name(descs[k].dtype));
            if (w < 0)
                break;
            pos += (size_t)w;
        }
        s = kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": plugin %s %s does not support dtypes (%s) on %s", l->name,
                      rec->name, rec->version, list, kiln_backend_name(backend));
    }
    free(descs);
    return s;
}
