/* kiln/kiln.h — umbrella header: the whole public API of libkiln. */
#ifndef KILN_H
#define KILN_H

#include <kiln/types.h>
#include <kiln/status.h>
#include <kiln/plugin.h>
#include <kiln/registry.h>
#include <kiln/network.h>
#include <kiln/builder.h>
#include <kiln/engine.h>
#include <kiln/runtime.h>
#include <kiln/llm.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_STRING "0.1.0"

/* Version of the linked library ("0.1.0"); static storage. */
KILN_API const char *kiln_version(void);

/* Lower-case name of a dtype ("bf16"); "?" when out of range. */
KILN_API const char *kiln_dtype_name(kiln_dtype dtype);

/* Parses a dtype name as written by kiln_dtype_name. Returns
 * KILN_ERROR_INVALID_ARGUMENT for an unknown name. */
KILN_API kiln_status kiln_dtype_parse(const char *name, kiln_dtype *out);

/* Bytes per element; 0 when out of range. */
KILN_API size_t kiln_dtype_size(kiln_dtype dtype);

/* Lower-case backend name ("cpu", "cuda"). */
KILN_API const char *kiln_backend_name(kiln_backend backend);

#ifdef __cplusplus
}
#endif

#endif
