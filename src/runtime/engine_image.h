/* An engine file read without being loaded: mapped and checked (magic,
 * format version, bounds, checksums) but neither its target checked nor its
 * plugins resolved. What `kiln inspect` shows of engines that cannot run
 * here, and how the LLM description reads LLMC and TOKN. */
#ifndef KILN_RUNTIME_ENGINE_IMAGE_H
#define KILN_RUNTIME_ENGINE_IMAGE_H

#include <kiln/engine.h>

#include "core/graph.h"
#include "engine/engine_file.h"

typedef struct kiln_engine_image {
    void *data; /* the mapping */
    size_t size;
    kiln_graph graph; /* borrows from data */
    kiln_engine_header_info info;
} kiln_engine_image;

/* Maps a regular, non-empty file read-only. Errors name the path. */
kiln_status kiln_engine_map_file(const char *path, void **data, size_t *size);

/* Maps and reads an engine file; errors are prefixed with the path. */
kiln_status kiln_engine_image_open(const char *path, kiln_engine_image *img);
/* Unmaps; a zeroed or closed image is a no-op. */
void kiln_engine_image_close(kiln_engine_image *img);

/* The section with this id, NULL when absent. */
const kiln_section_rec *kiln_graph_find_section(const kiln_graph *g, uint32_t id);

#endif
