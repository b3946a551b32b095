/* Helpers shared by the checkpoint importers (import_*.c). */
#ifndef KILN_LLM_IMPORT_UTIL_H
#define KILN_LLM_IMPORT_UTIL_H

#include <kiln/status.h>
#include <stddef.h>

/* Reads a whole file into a malloc'd, NUL-terminated buffer (*len without
 * the NUL). KILN_ERROR_NOT_FOUND when it does not exist, KILN_ERROR_IO on
 * other failures; the message names the path. */
kiln_status kiln_llm_read_file(const char *path, char **data, size_t *len);

/* dir + "/" + name into a malloc'd string, or NULL (out of memory). */
char *kiln_llm_path_join(const char *dir, const char *name);

#endif
