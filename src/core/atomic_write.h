/* Writing a whole file so that a reader never sees half of it. */
#ifndef KILN_CORE_ATOMIC_WRITE_H
#define KILN_CORE_ATOMIC_WRITE_H

#include <kiln/status.h>

#include <stddef.h>

/* Writes size bytes to a temp file beside `path` (a unique name), syncs
 * it and renames it over `path`. `path` must be new or a regular file
 * (kiln_file_check_output). On failure the temp file is removed and `path`
 * is left as it was; errors name `path` and give the system's reason. */
kiln_status kiln_write_file_atomic(const char *path, const void *data, size_t size);

/* The same in pieces, for files too large to hold in memory: open makes
 * the temp file (nothing to undo on failure), write appends, commit syncs,
 * closes and renames (removing the temp file on failure), abort removes
 * it. Exactly one of commit and abort follows a successful open. */
typedef struct kiln_atomic_file {
    int fd;
    const char *path; /* borrowed until commit or abort */
    char *tmp;
} kiln_atomic_file;

kiln_status kiln_atomic_file_open(const char *path, kiln_atomic_file *f);
kiln_status kiln_atomic_file_write(kiln_atomic_file *f, const void *data, size_t size);
kiln_status kiln_atomic_file_commit(kiln_atomic_file *f);
void kiln_atomic_file_abort(kiln_atomic_file *f);

#endif
