/* The plugin registry: creators keyed by the exact (name, version,
 * namespace) triple, and the loader of plugin libraries. */
#include "plugin/plugin_internal.h"

#include "builtin.h"
#include "core/error.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct registry_entry {
    const kiln_plugin_creator *creator; /* borrowed from its library */
    int32_t library;                    /* index into libraries, -1: built-in */
} registry_entry;

typedef struct registry_library {
    char *path; /* as the caller gave it: that is the name users recognise */
    void *handle;
    dev_t dev; /* identity of the file, whatever path reached it */
    ino_t ino;
} registry_library;

struct kiln_registry {
    registry_entry *entries;
    int32_t n_entries, cap_entries;
    registry_library *libraries;
    int32_t n_libraries, cap_libraries;
    /* While a library's init runs: its path (registrations made now belong
     * to it) and the first failed registration, which fails the load even if
     * the init function ignored the error. */
    const char *loading_path;
    kiln_status loading_failure;
    char loading_message[1024];
};

kiln_status kiln_registry_create(kiln_registry **out)
{
    if (!out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_registry_create: out is NULL");
    kiln_registry *reg = calloc(1, sizeof *reg);
    if (!reg)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "kiln_registry_create: out of memory");
    kiln_status s = kiln_register_builtin_plugins(kiln_host(), reg);
    if (s != KILN_OK) {
        kiln_registry_destroy(reg);
        return kiln_fail_context(s, "registering kiln's built-in plugins");
    }
    *out = reg;
    return KILN_OK;
}

void kiln_registry_destroy(kiln_registry *reg)
{
    if (!reg)
        return;
    /* Reverse load order, so a library is closed before the ones loaded
     * ahead of it (which it may depend on). */
    for (int32_t i = reg->n_libraries - 1; i >= 0; i--) {
        dlclose(reg->libraries[i].handle);
        free(reg->libraries[i].path);
    }
    free(reg->libraries);
    free(reg->entries);
    free(reg);
}

/* An entry made by the library being loaded has the index that library
 * will get, which is not in reg->libraries yet. */
static const char *entry_library(const kiln_registry *reg, const registry_entry *e)
{
    if (e->library < 0)
        return KILN_BUILTIN_LIBRARY;
    if (e->library >= reg->n_libraries)
        return reg->loading_path ? reg->loading_path : "a library being loaded";
    return reg->libraries[e->library].path;
}

static const char *current_library(const kiln_registry *reg)
{
    return reg->loading_path ? reg->loading_path : KILN_BUILTIN_LIBRARY;
}

/* ---- registration ---------------------------------------------------------- */

static kiln_status check_field_schema(const kiln_registry *reg, const kiln_plugin_creator *c)
{
    const char *lib = current_library(reg);
    if (c->n_fields < 0 || (c->n_fields > 0 && !c->fields))
        return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" from %s: field schema has %d entries at %p", c->name, lib,
                         (int)c->n_fields, (const void *)c->fields);
    for (int32_t i = 0; i < c->n_fields; i++) {
        const kiln_field_spec *s = &c->fields[i];
        if (s->struct_size < KILN_FIELD_SPEC_V1_SIZE)
            return kiln_fail(KILN_ERROR_VERSION,
                             "plugin \"%s\" from %s: field spec %d has struct_size %u, smaller than "
                             "ABI version 1's %zu",
                             c->name, lib, (int)i, s->struct_size, KILN_FIELD_SPEC_V1_SIZE);
        if (!s->name || !s->name[0])
            return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" from %s: field spec %d has no name", c->name, lib,
                             (int)i);
        if ((unsigned)s->type >= KILN_FIELD_TYPE_COUNT)
            return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" from %s: field \"%s\" has unknown type %d", c->name, lib,
                             s->name, (int)s->type);
        if (s->count != KILN_FIELD_ANY_COUNT && (s->count < 1 || (s->type == KILN_FIELD_STRING && s->count != 1)))
            return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" from %s: field \"%s\" has invalid count %lld", c->name,
                             lib, s->name, (long long)s->count);
        if (s->default_data &&
            (s->default_count < 1 || (s->count != KILN_FIELD_ANY_COUNT && s->default_count != s->count)))
            return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" from %s: field \"%s\" has a default of %lld values",
                             c->name, lib, s->name, (long long)s->default_count);
        for (int32_t j = 0; j < i; j++)
            if (strcmp(c->fields[j].name, s->name) == 0)
                return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" from %s: field \"%s\" is declared twice", c->name,
                                 lib, s->name);
    }
    return KILN_OK;
}

static kiln_status check_creator(const kiln_registry *reg, const kiln_plugin_creator *c)
{
    const char *lib = current_library(reg);
    if (c->struct_size < KILN_CREATOR_V1_SIZE)
        return kiln_fail(KILN_ERROR_VERSION,
                         "plugin library %s: creator struct_size %u is smaller than plugin ABI "
                         "version 1's %zu",
                         lib, c->struct_size, KILN_CREATOR_V1_SIZE);
    const char *name = c->name ? c->name : "(null)";
    if (c->abi_version > KILN_PLUGIN_ABI_VERSION)
        return kiln_fail(KILN_ERROR_VERSION,
                         "plugin library %s: plugin \"%s\" uses plugin ABI version %u, newer than this "
                         "kiln supports (%u)",
                         lib, name, c->abi_version, KILN_PLUGIN_ABI_VERSION);
    if (c->abi_version < 1)
        return kiln_fail(KILN_ERROR_VERSION,
                         "plugin library %s: plugin \"%s\" uses plugin ABI version %u, older than this "
                         "kiln supports (1 to %u)",
                         lib, name, c->abi_version, KILN_PLUGIN_ABI_VERSION);
    if (!c->name || !c->name[0] || !c->version || !c->plugin_namespace)
        return kiln_fail(KILN_ERROR_PLUGIN, "plugin library %s: creator \"%s\" lacks a name, version or namespace", lib,
                         name);
    if (!c->create || !c->deserialize)
        return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" from %s: creator has no %s function", c->name, lib,
                         c->create ? "deserialize" : "create");
    return check_field_schema(reg, c);
}

static registry_entry *find_entry(const kiln_registry *reg, const char *name, const char *version, const char *ns)
{
    for (int32_t i = 0; i < reg->n_entries; i++) {
        const kiln_plugin_creator *c = reg->entries[i].creator;
        if (strcmp(c->name, name) == 0 && strcmp(c->version, version) == 0 && strcmp(c->plugin_namespace, ns) == 0)
            return &reg->entries[i];
    }
    return NULL;
}

static kiln_status register_checked(kiln_registry *reg, const kiln_plugin_creator *c)
{
    KILN_TRY(check_creator(reg, c));
    const registry_entry *old = find_entry(reg, c->name, c->version, c->plugin_namespace);
    if (old && old->library >= 0 && old->library >= reg->n_libraries)
        return kiln_fail(KILN_ERROR_PLUGIN, "plugin \"%s\" version \"%s\" namespace \"%s\" is registered twice by %s",
                         c->name, c->version, c->plugin_namespace, current_library(reg));
    if (old)
        return kiln_fail(KILN_ERROR_PLUGIN,
                         "plugin \"%s\" version \"%s\" namespace \"%s\" from %s is already registered by %s", c->name,
                         c->version, c->plugin_namespace, current_library(reg), entry_library(reg, old));
    if (reg->n_entries == reg->cap_entries) {
        int32_t cap = reg->cap_entries ? 2 * reg->cap_entries : 16;
        registry_entry *e = realloc(reg->entries, (size_t)cap * sizeof *e);
        if (!e)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "registering plugin \"%s\": out of memory", c->name);
        reg->entries = e;
        reg->cap_entries = cap;
    }
    /* A library being loaded gets the next library index; it is appended
     * only if its init succeeds, and its entries are dropped otherwise. */
    reg->entries[reg->n_entries].creator = c;
    reg->entries[reg->n_entries].library = reg->loading_path ? reg->n_libraries : -1;
    reg->n_entries++;
    return KILN_OK;
}

kiln_status kiln_registry_register(kiln_registry *reg, const kiln_plugin_creator *creator)
{
    if (!reg || !creator)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "register_creator: %s is NULL", reg ? "creator" : "registry");
    kiln_status s = register_checked(reg, creator);
    if (s != KILN_OK && reg->loading_path && reg->loading_failure == KILN_OK) {
        reg->loading_failure = s;
        snprintf(reg->loading_message, sizeof reg->loading_message, "%s", kiln_last_error());
    }
    return s;
}

/* ---- loading libraries ----------------------------------------------------- */

/* The file dlopen actually mapped (it may have searched for a bare name). */
static int library_identity(void *handle, const char *path, struct stat *st)
{
    struct link_map *lm = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0] && stat(lm->l_name, st) == 0)
        return 0;
    return stat(path, st);
}

static kiln_status append_library(kiln_registry *reg, const char *path, void *handle, const struct stat *st)
{
    if (reg->n_libraries == reg->cap_libraries) {
        int32_t cap = reg->cap_libraries ? 2 * reg->cap_libraries : 4;
        registry_library *l = realloc(reg->libraries, (size_t)cap * sizeof *l);
        if (!l)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "plugin library %s: out of memory", path);
        reg->libraries = l;
        reg->cap_libraries = cap;
    }
    char *copy = kiln_strdup(path);
    if (!copy)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "plugin library %s: out of memory", path);
    reg->libraries[reg->n_libraries] = (registry_library){copy, handle, st->st_dev, st->st_ino};
    reg->n_libraries++;
    return KILN_OK;
}

kiln_status kiln_registry_load_library(kiln_registry *reg, const char *path)
{
    if (!reg || !path || !path[0])
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_registry_load_library: %s",
                         reg ? "empty path" : "registry is NULL");
    if (reg->loading_path)
        return kiln_fail(KILN_ERROR_PLUGIN, "plugin library %s: loaded from the init of %s", path, reg->loading_path);

    dlerror();
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *why = dlerror();
        size_t n = strlen(path);
        /* glibc's message usually starts with the path already. */
        if (why && strncmp(why, path, n) == 0 && strncmp(why + n, ": ", 2) == 0)
            why += n + 2;
        return kiln_fail(KILN_ERROR_IO, "plugin library %s: %s", path, why ? why : "dlopen failed");
    }
    struct stat st;
    if (library_identity(handle, path, &st) != 0) {
        int err = errno;
        dlclose(handle);
        return kiln_fail(KILN_ERROR_IO, "plugin library %s: %s", path, strerror(err));
    }
    for (int32_t i = 0; i < reg->n_libraries; i++) {
        if (reg->libraries[i].dev == st.st_dev && reg->libraries[i].ino == st.st_ino) {
            /* Drop the reference this dlopen added; the first one stays. */
            dlclose(handle);
            return KILN_OK;
        }
    }

    kiln_plugin_library_init_fn init;
    void *sym = dlsym(handle, KILN_PLUGIN_INIT_SYMBOL);
    if (!sym) {
        dlclose(handle);
        return kiln_fail(KILN_ERROR_PLUGIN, "plugin library %s: no symbol %s (is it a kiln plugin?)", path,
                         KILN_PLUGIN_INIT_SYMBOL);
    }
    /* POSIX guarantees a data pointer from dlsym converts to a function
     * pointer; memcpy keeps -Wpedantic quiet about it. */
    memcpy(&init, &sym, sizeof init);

    int32_t n_before = reg->n_entries;
    unsigned long fails_before = kiln_host_fail_count();
    reg->loading_path = path;
    reg->loading_failure = KILN_OK;
    kiln_status s = init(kiln_host(), reg);
    reg->loading_path = NULL;

    if (reg->loading_failure != KILN_OK) {
        s = reg->loading_failure;
        kiln_fail(s, "%s", reg->loading_message);
    } else if (s != KILN_OK) {
        if (kiln_host_fail_count() != fails_before)
            kiln_fail_context(KILN_ERROR_PLUGIN, "plugin library %s: init failed", path);
        else
            kiln_fail(KILN_ERROR_PLUGIN, "plugin library %s: init failed with %s and gave no message", path,
                      kiln_status_name(s));
        s = KILN_ERROR_PLUGIN;
    } else {
        s = append_library(reg, path, handle, &st);
    }
    if (s != KILN_OK) {
        reg->n_entries = n_before;
        dlclose(handle);
    }
    return s;
}

/* ---- lookups --------------------------------------------------------------- */

const kiln_plugin_creator *kiln_registry_find(const kiln_registry *reg, const char *name, const char *version,
                                              const char *plugin_namespace, const char **library)
{
    if (!reg || !name || !version)
        return NULL;
    const registry_entry *e = find_entry(reg, name, version, plugin_namespace ? plugin_namespace : "");
    if (!e)
        return NULL;
    if (library)
        *library = entry_library(reg, e);
    return e->creator;
}

int32_t kiln_registry_count(const kiln_registry *reg) { return reg ? reg->n_entries : 0; }

const kiln_plugin_creator *kiln_registry_get(const kiln_registry *reg, int32_t i, const char **library)
{
    if (!reg || i < 0 || i >= reg->n_entries)
        return NULL;
    if (library)
        *library = entry_library(reg, &reg->entries[i]);
    return reg->entries[i].creator;
}

void kiln_registry_near_misses(const kiln_registry *reg, const char *name, const char *version,
                               const char *plugin_namespace, char *buf, size_t size)
{
    if (!buf || size == 0)
        return;
    buf[0] = '\0';
    if (!reg || !name)
        return;
    const char *ns = plugin_namespace ? plugin_namespace : "";
    size_t used = 0;
    for (int32_t i = 0; i < reg->n_entries && used < size - 1; i++) {
        const kiln_plugin_creator *c = reg->entries[i].creator;
        if (strcmp(c->name, name) != 0)
            continue;
        if (version && strcmp(c->version, version) == 0 && strcmp(c->plugin_namespace, ns) == 0)
            continue;
        int n = snprintf(buf + used, size - used, "%s%s %s (namespace \"%s\") from %s", used ? ", " : "", c->name,
                         c->version, c->plugin_namespace, entry_library(reg, &reg->entries[i]));
        if (n < 0)
            break;
        used += (size_t)n < size - used ? (size_t)n : size - used - 1;
    }
}
