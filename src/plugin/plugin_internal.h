/* Internals of the plugin module shared by the registry, the host API table
 * and the field-schema checks; the last three functions are for the engine
 * reader and the runtime, which call plugins outside kiln_plugin_create. */
#ifndef KILN_PLUGIN_INTERNAL_H
#define KILN_PLUGIN_INTERNAL_H

#include <kiln/registry.h>

#include <stddef.h>

/* Sizes of the ABI version 1 structs: the end of their last v1 member. A
 * plugin's struct_size must cover at least this much; later members are
 * read only when struct_size covers them. */
#define KILN_CREATOR_V1_SIZE (offsetof(kiln_plugin_creator, user_data) + sizeof(void *))
#define KILN_OPS_V1_SIZE (offsetof(kiln_plugin_ops, destroy) + sizeof(void (*)(void)))
#define KILN_PLUGIN_V1_SIZE (offsetof(kiln_plugin, ops) + sizeof(void *))
#define KILN_FIELD_V1_SIZE (offsetof(kiln_field, data) + sizeof(void *))
#define KILN_FIELD_SPEC_V1_SIZE (offsetof(kiln_field_spec, doc) + sizeof(void *))
#define KILN_HOST_V1_SIZE (offsetof(kiln_host_api, float_to_bf16) + sizeof(void (*)(void)))

/* The host's register_creator (kiln_host()->register_creator). */
kiln_status kiln_registry_register(kiln_registry *reg, const kiln_plugin_creator *creator);

/* Counts the messages recorded on the calling thread (host->fail and
 * kiln_fail alike), so the host can tell whether a plugin that returned an
 * error also left a message. */
unsigned long kiln_host_fail_count(void);

/* "f32", "i64", "string", ... */
const char *kiln_field_type_name(kiln_field_type type);

/* The error of a plugin call `call` that returned s: when the plugin
 * called host->fail since kiln_host_fail_count() was fails_before, its
 * message prefixed with the plugin's name; otherwise "... failed with
 * KILN_ERROR_... and gave no message". */
kiln_status kiln_plugin_error(const char *plugin, const char *call, kiln_status s, unsigned long fails_before);

/* The error of a plugin layer `layer` whose enqueue returned s, in the
 * same two forms. */
kiln_status kiln_plugin_enqueue_error(const char *layer, kiln_status s, unsigned long fails_before);

/* A plugin layer of g can run on `backend`: its record is resolved, the
 * plugin has that backend and supports() the layer's dtypes. Used by the
 * builder and by the runtime at load, with the same messages. */
struct kiln_graph;
struct kiln_layer;
kiln_status kiln_plugin_check_layer(const struct kiln_graph *g, const struct kiln_layer *l, kiln_backend backend);

/* Calls creator->deserialize and checks what comes back exactly as
 * kiln_plugin_create checks create(): an error always carries a message
 * naming the plugin, and a returned instance has a complete ops table. */
kiln_status kiln_plugin_deserialize(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob,
                                    size_t size, kiln_plugin **out);

/* self->ops->clone with the same checks. `creator` names the plugin in
 * messages and may be NULL. */
kiln_status kiln_plugin_clone(const kiln_plugin_creator *creator, const kiln_plugin *self, kiln_plugin **out);

#endif
