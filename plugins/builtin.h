/* kiln's built-in plugins (RMSNorm, RoPE, SwiGLU, PagedAttention,
 * QuantMatMul, QuantGather, WeightOnlyMatMul, Fp8MatMul, FusedMatMul, Sample, all in
 * namespace "kiln"), registered into every registry under the library name
 * KILN_BUILTIN_LIBRARY. */
#ifndef KILN_PLUGINS_BUILTIN_H
#define KILN_PLUGINS_BUILTIN_H

#include <kiln/plugin.h>

kiln_status kiln_register_builtin_plugins(const kiln_host_api *host, kiln_registry *reg);

#endif
