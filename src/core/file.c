/* Opening and writing files by path (file.h). */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

const char *kiln_file_type_name(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return S_ISREG(mode) ? "a regular file" : "not a regular file";
}

kiln_status kiln_file_open_read(const char *path, int *fd, size_t *size)
{
    if (!path || !*path)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "no file name (an empty path)");
    /* O_NONBLOCK: opening a FIFO with no writer would otherwise wait
     * forever; a regular file ignores the flag, and it is cleared below. */
    int d = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (d < 0)
        return kiln_fail(errno == ENOENT ? KILN_ERROR_NOT_FOUND : KILN_ERROR_IO, "%s: cannot open: %s", path,
                         strerror(errno));
    struct stat st;
    if (fstat(d, &st) != 0) {
        int err = errno;
        close(d);
        return kiln_fail(KILN_ERROR_IO, "%s: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(d);
        return kiln_fail(KILN_ERROR_IO, "%s: is %s, not a regular file", path, kiln_file_type_name(st.st_mode));
    }
    int flags = fcntl(d, F_GETFL);
    if (flags < 0 || fcntl(d, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int err = errno;
        close(d);
        return kiln_fail(KILN_ERROR_IO, "%s: %s", path, strerror(err));
    }
    *fd = d;
    *size = (size_t)st.st_size;
    return KILN_OK;
}

kiln_status kiln_file_fopen_read(const char *path, FILE **f, size_t *size)
{
    int fd = -1; /* set by kiln_file_open_read; GCC -O3 cannot see it (maybe-uninitialized) */
    KILN_TRY(kiln_file_open_read(path, &fd, size));
    FILE *s = fdopen(fd, "rb");
    if (!s) {
        int err = errno;
        close(fd);
        return kiln_fail(KILN_ERROR_IO, "%s: %s", path, strerror(err));
    }
    *f = s;
    return KILN_OK;
}

kiln_status kiln_file_check_output(const char *path)
{
    if (!path || !*path)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "no output file name (an empty path)");
    struct stat st;
    if (stat(path, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return kiln_fail(KILN_ERROR_IO, "%s: is %s; kiln writes only to a regular file or a new path", path,
                             kiln_file_type_name(st.st_mode));
    } else if (errno != ENOENT) {
        return kiln_fail(KILN_ERROR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    return KILN_OK;
}
