/* A plugin library whose init registers two creators and then fails: the
 * registry must roll both registrations back and unload the library. */
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

static const kiln_plugin_creator creators[2] = {
    {.struct_size = sizeof(kiln_plugin_creator),
     .abi_version = KILN_PLUGIN_ABI_VERSION,
     .name = "InitFailA",
     .version = "1",
     .plugin_namespace = "test",
     .blob_version = 1,
     .create = never_create,
     .deserialize = never_deserialize},
    {.struct_size = sizeof(kiln_plugin_creator),
     .abi_version = KILN_PLUGIN_ABI_VERSION,
     .name = "InitFailB",
     .version = "1",
     .plugin_namespace = "test",
     .blob_version = 1,
     .create = never_create,
     .deserialize = never_deserialize},
};

KILN_PLUGIN_EXPORT kiln_status kiln_plugin_library_init(const kiln_host_api *host_api, kiln_registry *reg)
{
    host = host_api;
    for (int i = 0; i < 2; i++) {
        kiln_status s = host->register_creator(reg, &creators[i]);
        if (s != KILN_OK)
            return s;
    }
    return host->fail(KILN_ERROR_PLUGIN, "test_initfail: the device this plugin needs is missing");
}
