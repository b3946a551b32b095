/* kiln/builder.h — building a network into a serialized engine. */
#ifndef KILN_BUILDER_H
#define KILN_BUILDER_H

#include <kiln/network.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Turn off a pass (for debugging and for `--check`-style comparisons). */
#define KILN_BUILD_NO_FUSION 0x1u
#define KILN_BUILD_NO_CONSTANT_FOLDING 0x2u

typedef struct kiln_build_config {
    uint32_t struct_size;
    uint32_t abi_version;
    kiln_backend backend;
    uint32_t flags; /* KILN_BUILD_* */
    /* GPU architectures (e.g. 90 for sm_90) the engine targets; 0 entries
     * means the library's default set. Ignored for the CPU backend. */
    int32_t n_gpu_archs;
    int32_t gpu_archs[8];
    /* Called with progress in [0, 1] and the current pass name; may be
     * NULL. */
    void (*progress)(void *user, double fraction, const char *what);
    void *progress_user;
} kiln_build_config;

/* Fills a config with defaults: CPU backend, all passes on; struct_size
 * and abi_version (KILN_API_VERSION). */
KILN_API void kiln_build_config_init(kiln_build_config *config);

/* An engine in memory. `data` is owned by the buffer; free with
 * kiln_buffer_free. A fixed-layout value type: it never grows. */
typedef struct kiln_buffer {
    void *data;
    size_t size;
} kiln_buffer;

/* Frees buf->data and zeroes the buffer. NULL is a no-op. */
KILN_API void kiln_buffer_free(kiln_buffer *buf);

/* Runs the build passes (validation, per-profile shape checks, dead-layer
 * removal, constant folding, fusion, memory planning, workspace sizing,
 * tactic selection) and serializes the engine into *out. Each pass logs
 * what it did at KILN_LOG_INFO. The network is not modified. */
KILN_API kiln_status kiln_build(const kiln_network *net, const kiln_build_config *config, kiln_buffer *out);

/* kiln_build, then writes the engine to `path` atomically (a unique temp
 * file beside it, then rename). path must be new or a regular file: a
 * FIFO, device or directory is refused before the build, never replaced.
 * Write errors give the system's reason. The weights are streamed from
 * the network into the file, so the build holds them once, not twice. */
KILN_API kiln_status kiln_build_to_file(const kiln_network *net, const kiln_build_config *config, const char *path);

#ifdef __cplusplus
}
#endif

#endif
