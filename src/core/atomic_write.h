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

#endif
