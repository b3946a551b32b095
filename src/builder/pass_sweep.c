/* Pass 3, dead-layer removal, and the compaction every rewriting pass ends
 * with: layers go, unreferenced tensors and plugin records go, and every
 * index into the graph is remapped. */
#include "builder/builder_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Follows redirects to the layer that finally holds layer i (-1: none). A
 * chain longer than the layer count would be a cycle: treat it as removed. */
static int32_t final_layer(const int32_t *redirect, int32_t n, int32_t i)
{
    for (int32_t steps = 0; steps <= n; steps++) {
        int32_t j = redirect[i];
        if (j < 0 || j >= n)
            return -1;
        if (j == i)
            return i;
        i = j;
    }
    return -1;
}

kiln_status kiln_builder_sweep(kiln_graph *g, const int32_t *redirect, int32_t *removed_layers,
                               int32_t *removed_tensors)
{
    int32_t nl = g->n_layers, nt = g->n_tensors, np = g->n_plugins;
    /* keep: -1 removed, else the layer that survives (itself when kept). */
    int32_t *keep = malloc((size_t)(nl > 0 ? nl : 1) * sizeof *keep);
    int32_t *layer_map = malloc((size_t)(nl > 0 ? nl : 1) * sizeof *layer_map);
    int32_t *tensor_map = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *tensor_map);
    int32_t *plugin_map = malloc((size_t)(np > 0 ? np : 1) * sizeof *plugin_map);
    unsigned char *live = calloc((size_t)(nt > 0 ? nt : 1), 1);
    if (!keep || !layer_map || !tensor_map || !plugin_map || !live) {
        free(keep);
        free(layer_map);
        free(tensor_map);
        free(plugin_map);
        free(live);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "compacting a graph of %d layers", nl);
    }
    for (int32_t i = 0; i < nl; i++)
        keep[i] = redirect ? final_layer(redirect, nl, i) : i;

    /* Liveness, backwards: a layer lives when one of its outputs is live. */
    for (int32_t i = 0; i < g->n_outputs; i++)
        live[g->outputs[i]] = 1;
    for (int32_t i = nl - 1; i >= 0; i--) {
        if (keep[i] != i)
            continue;
        const kiln_layer *l = &g->layers[i];
        int used = 0;
        for (int32_t k = 0; k < l->n_outputs; k++)
            used |= live[l->outputs[k]];
        if (!used) {
            keep[i] = -1;
            continue;
        }
        for (int32_t k = 0; k < l->n_inputs; k++)
            live[l->inputs[k]] = 1;
    }
    /* A layer merged into a layer that turned out dead goes with it. */
    for (int32_t i = 0; i < nl; i++)
        if (keep[i] >= 0 && keep[keep[i]] != keep[i])
            keep[i] = -1;

    /* New layer indices, and the tensors and plugins that stay referenced. */
    int32_t n_kept = 0;
    for (int32_t i = 0; i < nl; i++)
        layer_map[i] = keep[i] == i ? n_kept++ : -1;
    memset(live, 0, (size_t)(nt > 0 ? nt : 1));
    for (int32_t i = 0; i < np; i++)
        plugin_map[i] = -1;
    for (int32_t i = 0; i < g->n_inputs; i++)
        live[g->inputs[i]] = 1;
    for (int32_t i = 0; i < g->n_outputs; i++)
        live[g->outputs[i]] = 1;
    for (int32_t i = 0; i < nl; i++) {
        if (layer_map[i] < 0)
            continue;
        const kiln_layer *l = &g->layers[i];
        for (int32_t k = 0; k < l->n_inputs; k++)
            live[l->inputs[k]] = 1;
        for (int32_t k = 0; k < l->n_outputs; k++)
            live[l->outputs[k]] = 1;
        if (l->op == KILN_OP_PLUGIN && l->p.plugin.index >= 0 && l->p.plugin.index < np)
            plugin_map[l->p.plugin.index] = 0;
    }
    int32_t n_tensors = 0, n_plugins = 0;
    for (int32_t i = 0; i < nt; i++)
        tensor_map[i] = live[i] ? n_tensors++ : -1;
    for (int32_t i = 0; i < np; i++)
        plugin_map[i] = plugin_map[i] == 0 ? n_plugins++ : -1;

    /* Constraints follow their layer into the layer that absorbed it; a
     * removed layer's constraints no longer bind any shape that runs. */
    int32_t nc = 0;
    for (int32_t i = 0; i < g->n_constraints; i++) {
        kiln_constraint c = g->constraints[i];
        int32_t to = c.layer >= 0 && c.layer < nl ? keep[c.layer] : -1;
        if (c.layer >= 0 && (to < 0 || layer_map[to] < 0)) {
            free(c.what);
            continue;
        }
        if (c.layer >= 0)
            c.layer = layer_map[to];
        g->constraints[nc++] = c;
    }
    g->n_constraints = nc;

    /* Layers. */
    for (int32_t i = 0; i < nl; i++) {
        kiln_layer *l = &g->layers[i];
        if (layer_map[i] < 0) {
            kiln_layer_free(l);
            continue;
        }
        for (int32_t k = 0; k < l->n_inputs; k++)
            l->inputs[k] = tensor_map[l->inputs[k]];
        for (int32_t k = 0; k < l->n_outputs; k++)
            l->outputs[k] = tensor_map[l->outputs[k]];
        if (l->op == KILN_OP_PLUGIN)
            l->p.plugin.index = plugin_map[l->p.plugin.index];
        g->layers[layer_map[i]] = *l;
    }
    g->n_layers = n_kept;

    /* Tensors. */
    for (int32_t i = 0; i < nt; i++) {
        kiln_tensor_rec *t = &g->tensors[i];
        if (tensor_map[i] < 0) {
            kiln_tensor_rec_free(t);
            continue;
        }
        if (t->producer >= 0)
            t->producer = t->producer < nl ? layer_map[t->producer] : -1;
        g->tensors[tensor_map[i]] = *t;
    }
    g->n_tensors = n_tensors;

    /* Plugins. */
    for (int32_t i = 0; i < np; i++) {
        if (plugin_map[i] < 0)
            kiln_plugin_rec_free(&g->plugins[i]);
        else
            g->plugins[plugin_map[i]] = g->plugins[i];
    }
    g->n_plugins = n_plugins;

    for (int32_t i = 0; i < g->n_inputs; i++)
        g->inputs[i] = tensor_map[g->inputs[i]];
    for (int32_t i = 0; i < g->n_outputs; i++)
        g->outputs[i] = tensor_map[g->outputs[i]];
    for (int32_t i = 0; i < g->n_symbols; i++)
        if (g->symbols[i].tensor >= 0 && g->symbols[i].tensor < nt)
            g->symbols[i].tensor = tensor_map[g->symbols[i].tensor];

    if (removed_layers)
        *removed_layers += nl - n_kept;
    if (removed_tensors)
        *removed_tensors += nt - n_tensors;
    free(keep);
    free(layer_map);
    free(tensor_map);
    free(plugin_map);
    free(live);
    return KILN_OK;
}

kiln_status kiln_builder_remove_dead(kiln_graph *g)
{
    /* Names are logged before the sweep frees them. */
    int32_t nl = g->n_layers;
    const char **dead = calloc((size_t)(nl > 0 ? nl : 1), sizeof *dead);
    unsigned char *live = calloc((size_t)(g->n_tensors > 0 ? g->n_tensors : 1), 1);
    if (!dead || !live) {
        free(dead);
        free(live);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "dead-layer removal over %d layers", nl);
    }
    int32_t n_dead = 0;
    for (int32_t i = 0; i < g->n_outputs; i++)
        live[g->outputs[i]] = 1;
    for (int32_t i = nl - 1; i >= 0; i--) {
        const kiln_layer *l = &g->layers[i];
        int used = 0;
        for (int32_t k = 0; k < l->n_outputs; k++)
            used |= live[l->outputs[k]];
        if (!used) {
            dead[n_dead++] = l->name;
            continue;
        }
        for (int32_t k = 0; k < l->n_inputs; k++)
            live[l->inputs[k]] = 1;
    }
    char names[512] = "";
    kiln_builder_name_list(names, sizeof names, dead, n_dead, 8);
    int32_t n_plugins = g->n_plugins;
    int32_t removed_layers = 0, removed_tensors = 0;
    kiln_status s = kiln_builder_sweep(g, NULL, &removed_layers, &removed_tensors);
    if (s == KILN_OK) {
        if (removed_layers > 0)
            kiln_log(KILN_LOG_INFO, "dead-layer removal: removed %d layers (%s), %d tensors, %d plugin records",
                     removed_layers, names, removed_tensors, n_plugins - g->n_plugins);
        else
            kiln_log(KILN_LOG_INFO,
                     "dead-layer removal: every layer reaches an output "
                     "(%d tensors dropped)",
                     removed_tensors);
    }
    free(dead);
    free(live);
    return s;
}
