/* The versioned public structs and kiln_free (kiln/kiln.h). */
#include "core/api_struct.h"

#include <kiln/kiln.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

kiln_status kiln_api_struct_read(void *dst, size_t dst_size, const void *src, const char *what)
{
    uint32_t size;
    memcpy(&size, src, sizeof size);
    if (size < 2 * sizeof(uint32_t))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "%s: struct_size %u is too small (set it up with its _init function)", what, (unsigned)size);
    memcpy(dst, src, size < dst_size ? size : dst_size);
    uint32_t full = (uint32_t)dst_size;
    memcpy(dst, &full, sizeof full);
    return KILN_OK;
}

void kiln_free(void *ptr) { free(ptr); }
