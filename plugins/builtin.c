/* Registers kiln's built-in plugins into a new registry. */
#include "builtin.h"

#include "plugin_util.h"

kiln_status kiln_register_builtin_plugins(const kiln_host_api *host, kiln_registry *reg)
{
    kiln_status (*const all[])(const kiln_host_api *, kiln_registry *) = {
        kiln_rmsnorm_register, kiln_rope_register,    kiln_swiglu_register, kiln_attention_register,
        kiln_qmatmul_register, kiln_qgather_register, kiln_sample_register, kiln_woq_register,
        kiln_fp8_register,     kiln_fusedmm_register};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        kiln_status s = all[i](host, reg);
        if (s != KILN_OK)
            return s;
    }
    return KILN_OK;
}
