/* kiln/registry.h — the plugin registry and plugin library loading (host side).
 *
 * A registry maps the exact (name, version, namespace) triple to a creator.
 * kiln_registry_create() registers kiln's built-in plugins; plugin
 * libraries add theirs through kiln_registry_load_library().
 * A registry is not thread-safe for registration; lookups from many threads
 * after loading are safe.
 */
#ifndef KILN_REGISTRY_H
#define KILN_REGISTRY_H

#include <kiln/plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Name recorded as the library of kiln's built-in plugins. */
#define KILN_BUILTIN_LIBRARY "builtin"

/* Creates a registry holding the built-in plugins. *out is owned by the
 * caller; free with kiln_registry_destroy. */
KILN_API kiln_status kiln_registry_create(kiln_registry **out);

/* Frees the registry and unloads its libraries. NULL is a no-op. Engines
 * and networks that used it must be destroyed first. */
KILN_API void kiln_registry_destroy(kiln_registry *reg);

/* dlopens a plugin library, checks its ABI and calls its init function.
 * Loading the same file again (same inode, any path) is a no-op. Errors:
 * KILN_ERROR_IO (cannot open, message from dlerror), KILN_ERROR_PLUGIN (no
 * init symbol, init failed, or a triple already registered: the message names
 * both libraries), KILN_ERROR_VERSION (ABI too old/new). On failure nothing
 * from the library stays registered. `path` is copied. */
KILN_API kiln_status kiln_registry_load_library(kiln_registry *reg, const char *path);

/* Looks up the exact triple. Returns NULL when absent (no error set).
 * Borrowed: valid while the registry lives. `library` (may be NULL)
 * receives the path of the library that registered it, or
 * KILN_BUILTIN_LIBRARY. */
KILN_API const kiln_plugin_creator *kiln_registry_find(const kiln_registry *reg, const char *name, const char *version,
                                                       const char *plugin_namespace, const char **library);

/* Number of registered creators, and the i-th in registration order (NULL
 * out of range); `library` as in kiln_registry_find. */
KILN_API int32_t kiln_registry_count(const kiln_registry *reg);
KILN_API const kiln_plugin_creator *kiln_registry_get(const kiln_registry *reg, int32_t i, const char **library);

/* Writes into buf (NUL-terminated, truncated to size) a description of the
 * registered creators whose name matches but whose version or namespace
 * differ, e.g. "ScaleBias 2 (namespace \"\") from ./libx.so". Empty when
 * none. Used to report near misses. */
KILN_API void kiln_registry_near_misses(const kiln_registry *reg, const char *name, const char *version,
                                        const char *plugin_namespace, char *buf, size_t size);

/* Validates `fields` against the creator's schema and creates an instance.
 * Errors name the plugin triple and the field: unknown field, wrong type,
 * wrong count, missing required field, or the plugin's own refusal.
 * *out is owned by the caller (destroy via (*out)->ops->destroy). */
KILN_API kiln_status kiln_plugin_create(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                                        kiln_plugin **out);

/* The host API table handed to plugins (static storage). */
KILN_API const kiln_host_api *kiln_host(void);

#ifdef __cplusplus
}
#endif

#endif
