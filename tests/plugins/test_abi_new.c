/* A creator from a future plugin ABI (abi_version one past the host's, one
 * appended member): the host must refuse it with KILN_ERROR_VERSION rather
 * than guess at members it does not know. */
#include <kiln/plugin.h>

static const kiln_host_api *host;

static kiln_status never_create(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                                kiln_plugin **out)
{
    return host->fail(KILN_ERROR_UNSUPPORTED, "%s cannot be created", creator->name);
}

static kiln_status never_deserialize(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob,
                                     size_t size, kiln_plugin **out)
{
    return host->fail(KILN_ERROR_UNSUPPORTED, "%s cannot be deserialized", creator->name);
}

/* What a creator of the next ABI version would look like: v1 plus a member. */
typedef struct future_creator {
    kiln_plugin_creator v1;
    uint64_t appended;
} future_creator;

static const future_creator creator = {
    .v1 = {.struct_size = sizeof(future_creator),
           .abi_version = KILN_PLUGIN_ABI_VERSION + 1,
           .name = "FutureAbi",
           .version = "1",
           .plugin_namespace = "test",
           .blob_version = 1,
           .create = never_create,
           .deserialize = never_deserialize},
    .appended = 0,
};

KILN_PLUGIN_EXPORT kiln_status kiln_plugin_library_init(const kiln_host_api *host_api, kiln_registry *reg)
{
    host = host_api;
    return host->register_creator(reg, &creator.v1);
}
