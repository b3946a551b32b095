/* Opening and writing files by path, with one file-type check for every
 * reader and writer in the library: a FIFO, device, socket or directory
 * where a file is expected is refused by name before anything can block on
 * it or replace it. */
#ifndef KILN_CORE_FILE_H
#define KILN_CORE_FILE_H

#include <stdio.h>
#include <sys/stat.h>

#include <kiln/kiln.h>

/* "a directory", "a FIFO", "a character device", ... for a non-regular mode. */
const char *kiln_file_type_name(mode_t mode);

/* Opens path for reading; it must be a regular file. The open cannot block
 * (a FIFO is opened non-blocking, then refused). On success *fd is the
 * descriptor (blocking, close-on-exec) and *size the file's size.
 * Errors: KILN_ERROR_NOT_FOUND when it does not exist, KILN_ERROR_IO
 * otherwise, "<path>: <reason>". */
kiln_status kiln_file_open_read(const char *path, int *fd, size_t *size);

/* kiln_file_open_read as a stdio stream ("rb"). */
kiln_status kiln_file_fopen_read(const char *path, FILE **f, size_t *size);

/* Checks that path can be written as a file: not empty, and either absent
 * or a regular file (never a FIFO, device or directory, which writing
 * would block on or replace). */
kiln_status kiln_file_check_output(const char *path);

#endif
