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

kiln_status kiln_atomic_file_open(const char *path, kiln_atomic_file *f)
{
    f->fd = -1;
    f->path = path;
    KILN_TRY(kiln_file_check_output(path));
    /* A temp file beside the target, so rename() is atomic (same file
     * system) and a reader never sees a half-written file. O_EXCL with
     * the pid and a counter avoids clobbering a concurrent writer's temp. */
    static _Atomic unsigned counter;
    size_t n = strlen(path) + 64;
    f->tmp = malloc(n);
    if (!f->tmp)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "writing \"%s\"", path);
    for (int attempt = 0; attempt < 100 && f->fd < 0; attempt++) {
        snprintf(f->tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), counter++);
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (f->fd < 0 && errno != EEXIST)
            break;
    }
    if (f->fd < 0) {
        kiln_status s = kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", path, strerror(errno));
        free(f->tmp);
        f->tmp = NULL;
        return s;
    }
    return KILN_OK;
}

/* Errors name the target, which is what the user asked for; the temporary
 * file is gone by the time they read it. */
kiln_status kiln_atomic_file_write(kiln_atomic_file *f, const void *data, size_t size)
{
    return write_all(f->fd, data, size, f->path);
}

void kiln_atomic_file_abort(kiln_atomic_file *f)
{
    if (f->fd >= 0) {
        close(f->fd);
        unlink(f->tmp);
    }
    f->fd = -1;
    free(f->tmp);
    f->tmp = NULL;
}

kiln_status kiln_atomic_file_commit(kiln_atomic_file *f)
{
    kiln_status s = KILN_OK;
    if (fsync(f->fd) != 0)
        s = kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", f->path, strerror(errno));
    if (close(f->fd) != 0 && s == KILN_OK)
        s = kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", f->path, strerror(errno));
    f->fd = -1;
    if (s == KILN_OK && rename(f->tmp, f->path) != 0)
        s = kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", f->path, strerror(errno));
    if (s != KILN_OK)
        unlink(f->tmp);
    free(f->tmp);
    f->tmp = NULL;
    return s;
}

kiln_status kiln_write_file_atomic(const char *path, const void *data, size_t size)
{
    kiln_atomic_file f;
    KILN_TRY(kiln_atomic_file_open(path, &f));
    kiln_status s = kiln_atomic_file_write(&f, data, size);
    if (s != KILN_OK) {
        kiln_atomic_file_abort(&f);
        return s;
    }
    return kiln_atomic_file_commit(&f);
}
