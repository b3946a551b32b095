/* What the engine writer and reader share: the layout constants and
 * byte helpers of docs/engine-format.md, and the plan parser the writer
 * runs on what it wrote. Internal to src/engine/. */
#ifndef KILN_ENGINE_FORMAT_H
#define KILN_ENGINE_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine_file.h"

/* ---- layout ------------------------------------------------------------------ */

#define HEADER_SIZE 96u
#define ENTRY_SIZE 32u
#define OFF_FORMAT_VERSION 8u
#define OFF_HEADER_SIZE 12u
#define OFF_KILN_VERSION 16u
#define OFF_BACKEND 32u
#define OFF_N_GPU_ARCHS 36u
#define OFF_GPU_ARCHS 40u
#define OFF_FILE_SIZE 72u
#define OFF_N_SECTIONS 80u
#define OFF_RESERVED 84u
#define OFF_HEADER_CHECKSUM 88u

#define WEIGHTS_PAGE 4096u
#define SECTION_ALIGN 8u

#define SECTION_PLAN KILN_FOURCC('P', 'L', 'A', 'N')
#define SECTION_WEIGHTS KILN_FOURCC('W', 'G', 'H', 'T')
#define SECTION_BLOBS KILN_FOURCC('B', 'L', 'O', 'B')

/* The ops a version-1 engine may hold (docs/engine-format.md section 6).
 * A new kiln_op does not compile until someone decides whether it needs a
 * new format version (section 9: readers that predate it refuse it by
 * value), documents it in section 6 and raises this count. */
#define KILN_ENGINE_OPS_KNOWN 13
_Static_assert(KILN_OP_COUNT == KILN_ENGINE_OPS_KNOWN,
               "a new kiln_op: decide on the engine format version (docs/engine-format.md "
               "section 9), document the op in section 6, then raise KILN_ENGINE_OPS_KNOWN");

static inline void kiln_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void kiln_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t kiln_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static inline uint64_t kiln_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* XXH64 of the header (checksum field read as zero) and the section table
 * of table_bytes. */
uint64_t kiln_engine_header_checksum(const uint8_t *image, size_t table_bytes);

/* A fourcc as printable text ('?' for other bytes). */
void kiln_engine_fourcc_str(uint32_t id, char out[5]);

/* The bytes of a plan's BLOB and WGHT sections. */
typedef struct kiln_engine_sections {
    const uint8_t *blobs;
    uint64_t blobs_size;
    const uint8_t *weights;
    uint64_t weights_size;
} kiln_engine_sections;

/* Parses and checks the plan JSON (section 6 and the plan checks) into *g,
 * which must be freshly initialized and is left partly filled on failure
 * (free it either way). With borrow set constant data points into
 * secs->weights. */
kiln_status kiln_engine_parse_plan(const uint8_t *text, size_t size, const kiln_engine_sections *secs, int borrow,
                                   kiln_graph *g);

/* The plan checks beyond syntax (engine_check.c): every tensor's role
 * (outputs are activations written by one earlier layer), native layers'
 * dtypes and ranks by their rules, profiles present for dynamic inputs,
 * arena ranges aligned to KILN_ENGINE_ARENA_ALIGN, and every tensor's size
 * at every profile bound within what the plan gives it. */
kiln_status kiln_engine_check_plan(const kiln_graph *g);

#endif
