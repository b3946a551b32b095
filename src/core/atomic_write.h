/* Writing a whole file so that a reader never sees half of it. */
#ifndef KILN_CORE_ATOMIC_WRITE_H
#define KILN_CORE_ATOMIC_WRITE_H

#include <kiln/status.h>

#include <stddef.h>

/* Writes size bytes to a temp file beside `path`, syncs it and renames it
 * over `path`. On failure the temp file is removed and `path` is left as it
 * was; errors name the file and the call that failed. */
kiln_status kiln_write_file_atomic(const char *path, const void *data, size_t size);

#endif
