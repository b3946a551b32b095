/* The engine file: writing a planned graph and reading it back.
 * The format is specified in docs/engine-format.md. */
#ifndef KILN_ENGINE_FILE_H
#define KILN_ENGINE_FILE_H

#include <kiln/builder.h>
#include "core/graph.h"

#define KILN_ENGINE_MAGIC "KILNENG\0"
#define KILN_ENGINE_FORMAT_VERSION 1u
#define KILN_ENGINE_WEIGHT_ALIGN 256u
/* Every activation's arena offset and size, and the workspace size, are
 * multiples of this (the builder's memory plan guarantees it; the reader
 * requires it, so kernels may load any dtype, vectorized, from them). */
#define KILN_ENGINE_ARENA_ALIGN 256u

/* What the fixed header says, readable before the rest is validated. */
typedef struct kiln_engine_header_info {
    uint32_t format_version;
    char kiln_version[16];
    kiln_backend backend;
    int32_t n_gpu_archs;
    int32_t gpu_archs[8];
    uint64_t file_size;
    int32_t n_sections;
} kiln_engine_header_info;

/* Serializes a planned graph (after kiln_builder_run): plan, plugin blobs
 * (each plugin instance is serialized now), weights aligned to
 * KILN_ENGINE_WEIGHT_ALIGN, extra sections. */
kiln_status kiln_engine_write(const kiln_graph *g, kiln_buffer *out);
/* The same engine written to `path` (temp file, sync, rename, as
 * kiln_write_file_atomic) with the weights streamed from the graph's
 * constants where they are: only the bytes before the weights section
 * are held in memory. */
kiln_status kiln_engine_write_file(const kiln_graph *g, const char *path);

/* Validates and parses an engine image. Checks magic, format version,
 * section table bounds with overflow-safe arithmetic, every checksum,
 * and every index and offset inside the plan. On success *out holds the
 * graph with plugin records unresolved (creator and instance NULL). With
 * borrow != 0 constant data and extra sections point into `data`, which
 * must then outlive the graph; otherwise they are copied. Never crashes or
 * hangs on any input. */
kiln_status kiln_engine_read(const void *data, size_t size, int borrow, kiln_graph *out, kiln_engine_header_info *info);

/* Reads only the fixed header (magic, version, target). */
kiln_status kiln_engine_read_header(const void *data, size_t size, kiln_engine_header_info *info);

#endif
