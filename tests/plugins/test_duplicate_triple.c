/* A library that registers the same triple twice from one init: the
 * second registration must fail naming this library (not a library that
 * is not loaded yet), and the load with it. */
#define SCALE_BIAS_NAME "Twice"
#define SCALE_BIAS_NAMESPACE "kiln.test"
#define kiln_plugin_library_init scale_bias_library_init
#include "../../examples/scale_bias/scale_bias.c"
#undef kiln_plugin_library_init

KILN_PLUGIN_EXPORT kiln_status kiln_plugin_library_init(const kiln_host_api *host_api, kiln_registry *reg)
{
    kiln_status s = scale_bias_library_init(host_api, reg);
    if (s != KILN_OK)
        return s;
    return host_api->register_creator(reg, &scale_bias_creator);
}
