/* kiln/status.h — status codes, error messages and logging. */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include <kiln/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Short constant name of a status ("KILN_ERROR_SHAPE"); never NULL. */
KILN_API const char *kiln_status_name(kiln_status status);

/* The message of the last failure in the calling thread: one line, no
 * trailing newline, "" when no call has failed. Every fallible call sets it
 * when it fails and leaves it alone when it succeeds. Borrowed: valid until
 * the next failing kiln call in this thread. */
KILN_API const char *kiln_last_error(void);

/* Clears the calling thread's last error. */
KILN_API void kiln_clear_error(void);

typedef enum kiln_log_level {
    KILN_LOG_ERROR = 0,
    KILN_LOG_WARNING,
    KILN_LOG_INFO, /* what each build pass did, shown with --verbose */
    KILN_LOG_DEBUG,
    KILN_LOG_LEVEL_COUNT
} kiln_log_level;

/* Receives one message, without trailing newline. */
typedef void (*kiln_log_fn)(void *user, kiln_log_level level, const char *message);

/* Installs a process-wide log sink and the most verbose level passed to it.
 * fn NULL restores the default: level <= WARNING to stderr. Not
 * thread-safe against concurrent logging; call it at start-up. */
KILN_API void kiln_set_log(kiln_log_fn fn, void *user, kiln_log_level max_level);

#ifdef __cplusplus
}
#endif

#endif
