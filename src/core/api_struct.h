/* Reading the versioned structs of the public API (kiln/kiln.h "Growth"):
 * a caller's struct is taken only as far as its struct_size reaches. */
#ifndef KILN_CORE_API_STRUCT_H
#define KILN_CORE_API_STRUCT_H

#include <kiln/status.h>

/* Copies the caller's struct `src` (which begins with uint32_t
 * struct_size) over `dst`, which holds the defaults at the library's size
 * `dst_size`: only the first min(struct_size, dst_size) bytes are taken, so
 * members a caller compiled against an older header does not know keep
 * their defaults; dst->struct_size becomes dst_size. Fails with
 * KILN_ERROR_INVALID_ARGUMENT naming `what` when struct_size is below the
 * 8-byte header (the struct was not set up with its _init function). */
kiln_status kiln_api_struct_read(void *dst, size_t dst_size, const void *src, const char *what);

#endif
