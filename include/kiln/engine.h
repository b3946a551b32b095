/* kiln/engine.h — loading an engine file and asking what it holds.
 *
 * An engine is immutable once loaded and may be shared by any number of
 * threads; execution state lives in contexts (runtime.h).
 */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include <kiln/registry.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_engine kiln_engine;

/* Maps and validates an engine file: magic, format version, every section's
 * bounds (overflow-safe) and checksum, the target (backend, GPU
 * architecture), then resolves every plugin triple in `reg` (all missing
 * ones are reported in one error, with near misses and the library named in
 * the engine) and deserializes each plugin's blob. `reg` is borrowed for
 * the engine's lifetime. */
KILN_API kiln_status kiln_engine_load(kiln_registry *reg, const char *path, kiln_engine **out);

/* Same from memory; `data` is copied. */
KILN_API kiln_status kiln_engine_load_memory(kiln_registry *reg, const void *data, size_t size, kiln_engine **out);

/* NULL is a no-op. All contexts must be destroyed first. */
KILN_API void kiln_engine_destroy(kiln_engine *engine);

KILN_API kiln_backend kiln_engine_backend(const kiln_engine *engine);

/* Free and total bytes of the memory the engine's contexts allocate from:
 * the GPU's (cudaMemGetInfo) for a cuda engine, physical memory (available
 * and installed) on the CPU. Sizes caches such as an LLM's KV cache. */
KILN_API kiln_status kiln_engine_memory_info(const kiln_engine *engine, size_t *free_bytes, size_t *total_bytes);

/* Input and output tensors ("I/O tensors"), inputs first. */
KILN_API int32_t kiln_engine_num_io_tensors(const kiln_engine *engine);
/* Borrowed name of the i-th I/O tensor; NULL out of range. */
KILN_API const char *kiln_engine_io_tensor_name(const kiln_engine *engine, int32_t i);
/* dtype, whether it is an input, and its declared dims (-1 dynamic). */
KILN_API kiln_status kiln_engine_io_tensor_info(const kiln_engine *engine, const char *name, kiln_dtype *dtype,
                                                int32_t *is_input, kiln_dims *dims);

KILN_API int32_t kiln_engine_num_profiles(const kiln_engine *engine);
/* min/opt/max of an input in a profile. */
KILN_API kiln_status kiln_engine_profile_shape(const kiln_engine *engine, int32_t profile, const char *input,
                                               kiln_dims *min, kiln_dims *opt, kiln_dims *max);

/* Writes a JSON description of the whole engine (header, target, profiles,
 * tensors, layers and fused groups, memory plan, plugin records, extra
 * sections) to *out (malloc'd, NUL-terminated; free with kiln_free). Used
 * by `kiln inspect`. */
KILN_API kiln_status kiln_engine_describe_json(const kiln_engine *engine, char **out);

/* The same description of an engine file that may not load here: the file
 * is mapped and checked (magic, format version, bounds, checksums) but its
 * target is not checked and its plugins are not resolved; a plugin record
 * whose triple `reg` (may be NULL) lacks is described as not registered.
 * For `kiln inspect` on engines whose plugin libraries are missing. *out
 * malloc'd, NUL-terminated: free with kiln_free. */
KILN_API kiln_status kiln_engine_describe_file_json(kiln_registry *reg, const char *path, char **out);

/* An extra section of the engine (an LLM engine's LLMC and TOKN, ids made
 * with KILN_FOURCC): its bytes, borrowed from the engine and valid as long
 * as it. KILN_ERROR_NOT_FOUND when the engine has no such section. */
KILN_API kiln_status kiln_engine_find_section(const kiln_engine *engine, uint32_t id, const void **data, size_t *size);

#ifdef __cplusplus
}
#endif

#endif
