#include "llm/import_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/file.h"

kiln_status kiln_llm_read_file(const char *path, char **data, size_t *len)
{
    FILE *f;
    size_t size;
    KILN_TRY(kiln_file_fopen_read(path, &f, &size));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = ncap > cap ? realloc(buf, ncap + 1) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory reading the file", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return kiln_fail(KILN_ERROR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return KILN_OK;
}

char *kiln_llm_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}
