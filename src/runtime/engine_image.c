/* Engine files read without loading (engine_image.h), the file description
 * and section lookup of include/kiln/engine.h. */
#include "runtime/engine_image.h"

#include <kiln/kiln.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "runtime/runtime_internal.h"

kiln_status kiln_engine_map_file(const char *path, void **data, size_t *size)
{
    int fd;
    size_t n;
    if (kiln_file_open_read(path, &fd, &n) != KILN_OK)
        return kiln_fail_context(KILN_ERROR_IO, "cannot open engine");
    if (n == 0) {
        close(fd);
        return kiln_fail(KILN_ERROR_FORMAT, "engine %s is empty (0 bytes)", path);
    }
    void *map = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED)
        return kiln_fail(KILN_ERROR_IO, "cannot map engine %s: %s", path, strerror(err));
    *data = map;
    *size = n;
    return KILN_OK;
}

kiln_status kiln_engine_image_open(const char *path, kiln_engine_image *img)
{
    memset(img, 0, sizeof *img);
    void *map = NULL; /* set by kiln_engine_map_file (GCC -O3: maybe-uninitialized) */
    size_t size = 0;
    KILN_TRY(kiln_engine_map_file(path, &map, &size));
    kiln_graph_init(&img->graph);
    kiln_status s = kiln_engine_read(map, size, 1, &img->graph, &img->info);
    if (s != KILN_OK) {
        kiln_graph_free(&img->graph);
        munmap(map, size);
        return kiln_fail_context(s, "%s", path);
    }
    img->data = map;
    img->size = size;
    return KILN_OK;
}

void kiln_engine_image_close(kiln_engine_image *img)
{
    if (!img->data)
        return;
    kiln_graph_free(&img->graph);
    munmap(img->data, img->size);
    img->data = NULL;
}

const kiln_section_rec *kiln_graph_find_section(const kiln_graph *g, uint32_t id)
{
    for (int32_t i = 0; i < g->n_sections; i++)
        if (g->sections[i].id == id)
            return &g->sections[i];
    return NULL;
}

kiln_status kiln_engine_describe_file_json(kiln_registry *reg, const char *path, char **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_describe_file_json: path and out are required");
    kiln_engine_image img;
    KILN_TRY(kiln_engine_image_open(path, &img));
    /* Only the creator's presence is described: nothing is deserialized. */
    for (int32_t i = 0; i < img.graph.n_plugins; i++) {
        kiln_plugin_rec *r = &img.graph.plugins[i];
        r->creator = reg ? kiln_registry_find(reg, r->name, r->version, r->plugin_namespace, NULL) : NULL;
    }
    kiln_status s = kiln_engine_describe_graph_json(&img.graph, &img.info, out);
    kiln_engine_image_close(&img);
    return s;
}

kiln_status kiln_engine_find_section(const kiln_engine *engine, uint32_t id, const void **data, size_t *size)
{
    if (!engine || !data || !size)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_find_section: engine, data and size are required");
    const kiln_section_rec *r = kiln_graph_find_section(&engine->graph, id);
    if (!r) {
        char name[5] = {(char)(id & 0xff), (char)(id >> 8 & 0xff), (char)(id >> 16 & 0xff), (char)(id >> 24 & 0xff), 0};
        return kiln_fail(KILN_ERROR_NOT_FOUND, "the engine has no section %s", name);
    }
    *data = r->data;
    *size = r->size;
    return KILN_OK;
}
