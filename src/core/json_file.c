/* Reading JSON that kiln did not write: every number as a real. */
#include "core/json_file.h"

#include <math.h>

json_t *kiln_json_load_file_text(const char *text, size_t len, size_t flags, json_error_t *err)
{
    return json_loadb(text, len, flags | JSON_DECODE_INT_AS_REAL, err);
}

bool kiln_json_int(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    if (!json_is_real(v))
        return false;
    /* 2^53: the largest range where every integer is a double */
    double x = json_real_value(v);
    if (!(fabs(x) <= 9007199254740992.0) || x != trunc(x))
        return false;
    *out = (int64_t)x;
    return true;
}
