/* Fuzzes the engine reader twice per input: the bytes as a whole engine
 * file, and the bytes as the PLAN section of an otherwise valid,
 * correctly checksummed engine, so that mutations reach the plan parser
 * instead of dying at the first checksum. A plan the reader accepts must
 * write and read back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "core/graph.h"
#include "engine/engine_file.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* An accepted graph is valid input for the writer, and what it writes
 * reads back. */
static void check_rewrite(const kiln_graph *g)
{
    kiln_buffer buf = {0};
    if (kiln_engine_write(g, &buf) != KILN_OK)
        __builtin_trap();
    kiln_graph back;
    if (kiln_engine_read(buf.data, buf.size, 0, &back, NULL) != KILN_OK)
        __builtin_trap();
    if (back.n_tensors != g->n_tensors || back.n_layers != g->n_layers || back.exprs.n != g->exprs.n)
        __builtin_trap();
    kiln_graph_free(&back);
    kiln_buffer_free(&buf);
}

static void read_engine(const uint8_t *data, size_t size)
{
    kiln_graph g;
    if (kiln_engine_read(data, size, 0, &g, NULL) == KILN_OK) {
        check_rewrite(&g);
        kiln_graph_free(&g);
    }
    if (kiln_engine_read(data, size, 1, &g, NULL) == KILN_OK)
        kiln_graph_free(&g);
}

/* docs/engine-format.md: header, a table of PLAN, BLOB, WGHT, then the
 * sections; WGHT page-aligned. BLOB and WGHT hold fixed patterns that plans
 * may point into. */
static uint8_t *engine_around_plan(const uint8_t *plan, size_t plan_size, size_t *out_size)
{
    enum { N = 3, BLOB_SIZE = 64, WGHT_SIZE = 4096 };
    uint64_t plan_off = 96 + 32 * N;
    uint64_t blob_off = (plan_off + plan_size + 7) / 8 * 8;
    uint64_t wght_off = (blob_off + BLOB_SIZE + 4095) / 4096 * 4096;
    uint64_t total = wght_off + WGHT_SIZE;
    uint8_t *img = calloc(1, total);
    if (!img)
        return NULL;
    if (plan_size)
        memcpy(img + plan_off, plan, plan_size);
    for (int i = 0; i < BLOB_SIZE; i++)
        img[blob_off + i] = (uint8_t)(i * 3);
    for (int i = 0; i < WGHT_SIZE; i++)
        img[wght_off + i] = (uint8_t)i;
    memcpy(img, KILN_ENGINE_MAGIC, 8);
    put32(img + 8, KILN_ENGINE_FORMAT_VERSION);
    put32(img + 12, 96);
    memcpy(img + 16, "0.1.0", 5);
    put64(img + 72, total);
    put32(img + 80, N);
    const struct {
        const char *id;
        uint64_t off, size;
    } secs[N] = {{"PLAN", plan_off, plan_size}, {"BLOB", blob_off, BLOB_SIZE}, {"WGHT", wght_off, WGHT_SIZE}};
    for (int i = 0; i < N; i++) {
        uint8_t *e = img + 96 + 32 * i;
        memcpy(e, secs[i].id, 4);
        put64(e + 8, secs[i].off);
        put64(e + 16, secs[i].size);
        put64(e + 24, XXH64(img + secs[i].off, secs[i].size, 0));
    }
    put64(img + 88, XXH64(img, 96 + 32 * N, 0));
    *out_size = total;
    return img;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_engine_header_info info;
    (void)kiln_engine_read_header(data, size, &info);
    read_engine(data, size);

    size_t n;
    uint8_t *img = engine_around_plan(data, size, &n);
    if (img) {
        read_engine(img, n);
        free(img);
    }
    return 0;
}
