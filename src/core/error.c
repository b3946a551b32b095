/* Status names, the thread-local last error, and the log sink. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Long enough for a message naming a layer, a field and a file path. */
#define KILN_ERROR_MAX 1024

static _Thread_local char kiln_error_buf[KILN_ERROR_MAX];
static _Thread_local unsigned long kiln_fail_calls;

unsigned long kiln_fail_count(void) { return kiln_fail_calls; }

const char *kiln_status_name(kiln_status status)
{
    static const char *const names[KILN_STATUS_COUNT] = {
        [KILN_OK] = "KILN_OK",
        [KILN_ERROR_INVALID_ARGUMENT] = "KILN_ERROR_INVALID_ARGUMENT",
        [KILN_ERROR_OUT_OF_MEMORY] = "KILN_ERROR_OUT_OF_MEMORY",
        [KILN_ERROR_IO] = "KILN_ERROR_IO",
        [KILN_ERROR_FORMAT] = "KILN_ERROR_FORMAT",
        [KILN_ERROR_CHECKSUM] = "KILN_ERROR_CHECKSUM",
        [KILN_ERROR_VERSION] = "KILN_ERROR_VERSION",
        [KILN_ERROR_SHAPE] = "KILN_ERROR_SHAPE",
        [KILN_ERROR_PLUGIN] = "KILN_ERROR_PLUGIN",
        [KILN_ERROR_NOT_FOUND] = "KILN_ERROR_NOT_FOUND",
        [KILN_ERROR_UNSUPPORTED] = "KILN_ERROR_UNSUPPORTED",
        [KILN_ERROR_TARGET] = "KILN_ERROR_TARGET",
        [KILN_ERROR_BACKEND] = "KILN_ERROR_BACKEND",
        [KILN_ERROR_INTERNAL] = "KILN_ERROR_INTERNAL",
        [KILN_ERROR_CANCELLED] = "KILN_ERROR_CANCELLED",
        [KILN_ERROR_LIMIT] = "KILN_ERROR_LIMIT",
    };
    if ((unsigned)status >= KILN_STATUS_COUNT)
        return "KILN_ERROR_UNKNOWN";
    return names[status];
}

const char *kiln_last_error(void) { return kiln_error_buf; }

void kiln_clear_error(void) { kiln_error_buf[0] = '\0'; }

/* Messages are one line: a multi-line message would break log parsers and
 * the CLI's "error: ..." output. */
static void flatten_lines(char *s)
{
    for (; *s; s++)
        if (*s == '\n' || *s == '\r')
            *s = ' ';
}

kiln_status kiln_fail(kiln_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kiln_error_buf, sizeof kiln_error_buf, fmt, ap);
    va_end(ap);
    flatten_lines(kiln_error_buf);
    kiln_fail_calls++;
    return status;
}

kiln_status kiln_fail_context(kiln_status status, const char *fmt, ...)
{
    char old[KILN_ERROR_MAX];
    memcpy(old, kiln_error_buf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(kiln_error_buf, sizeof kiln_error_buf, fmt, ap);
    va_end(ap);
    /* Append ": <old message>"; whatever does not fit is cut at the end. */
    size_t pos = n < 0 ? 0 : (size_t)n < sizeof kiln_error_buf ? (size_t)n : sizeof kiln_error_buf - 1;
    if (old[0] && pos + 2 < sizeof kiln_error_buf) {
        size_t len = strnlen(old, sizeof old - 1);
        memcpy(kiln_error_buf + pos, ": ", 2);
        pos += 2;
        if (len > sizeof kiln_error_buf - 1 - pos)
            len = sizeof kiln_error_buf - 1 - pos;
        memcpy(kiln_error_buf + pos, old, len);
        pos += len;
        kiln_error_buf[pos] = '\0';
    }
    flatten_lines(kiln_error_buf);
    return status;
}

char *kiln_strdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* ---- logging ------------------------------------------------------------------ */

static kiln_log_fn log_fn;
static void *log_user;
static kiln_log_level log_max = KILN_LOG_WARNING;

void kiln_set_log(kiln_log_fn fn, void *user, kiln_log_level max_level)
{
    log_fn = fn;
    log_user = fn ? user : NULL;
    log_max = fn ? max_level : KILN_LOG_WARNING;
}

void kiln_log(kiln_log_level level, const char *fmt, ...)
{
    if (level > log_max)
        return;
    char msg[KILN_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    flatten_lines(msg);
    if (log_fn) {
        log_fn(log_user, level, msg);
        return;
    }
    static const char *const prefixes[KILN_LOG_LEVEL_COUNT] = {"error", "warning", "info", "debug"};
    const char *p = (unsigned)level < KILN_LOG_LEVEL_COUNT ? prefixes[level] : "log";
    fprintf(stderr, "kiln: %s: %s\n", p, msg);
}
