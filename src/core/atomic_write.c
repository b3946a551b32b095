/* kiln_write_file_atomic: engines are written temp + rename. */
#include "core/atomic_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"

static kiln_status write_all(int fd, const void *data, size_t size, const char *path)
{
    const char *p = data;
    while (size > 0) {
        ssize_t w = write(fd, p, size);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", path, w < 0 ? strerror(errno) : "no progress");
        p += w;
        size -= (size_t)w;
    }
    return KILN_OK;
}

kiln_status kiln_write_file_atomic(const char *path, const void *data, size_t size)
{
    KILN_TRY(kiln_file_check_output(path));
    /* A temp file beside the target, so rename() is atomic (same file
     * system) and a reader never sees a half-written file. O_EXCL with
     * the pid and a counter avoids clobbering a concurrent writer's temp. */
    static _Atomic unsigned counter;
    size_t n = strlen(path) + 64;
    char *tmp = malloc(n);
    if (!tmp)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "writing \"%s\"", path);
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), counter++);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    kiln_status s = KILN_OK;
    if (fd < 0) {
        s = kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", path, strerror(errno));
    } else {
        /* Errors name the target, which is what the user asked for; the
         * temporary file is gone by the time they read it. */
        s = write_all(fd, data, size, path);
        if (s == KILN_OK && fsync(fd) != 0)
            s = kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", path, strerror(errno));
        if (close(fd) != 0 && s == KILN_OK)
            s = kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", path, strerror(errno));
        if (s == KILN_OK && rename(tmp, path) != 0)
            s = kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", path, strerror(errno));
        if (s != KILN_OK)
            unlink(tmp);
    }
    free(tmp);
    return s;
}
