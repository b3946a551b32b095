/* Setting the thread-local last error, and logging, from inside kiln. */
#ifndef KILN_CORE_ERROR_H
#define KILN_CORE_ERROR_H

#include <kiln/status.h>

/* Formats a one-line message into the calling thread's last error and
 * returns `status` (so callers write `return kiln_fail(...)`). Newlines in
 * the message are replaced by spaces. */
kiln_status kiln_fail(kiln_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the current last error with "<prefix>: " and returns status;
 * used to add context ("layer \"fc1\": ...") while an error propagates. */
kiln_status kiln_fail_context(kiln_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* How many messages kiln_fail has recorded on the calling thread: a call
 * that fails without this changing left no message of its own. */
unsigned long kiln_fail_count(void);

void kiln_log(kiln_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Return the status if an expression fails. */
#define KILN_TRY(expr) \
    do { \
        kiln_status kiln_try_s_ = (expr); \
        if (kiln_try_s_ != KILN_OK) \
            return kiln_try_s_; \
    } while (0)

/* Overflow-checked size arithmetic for anything derived from a file:
 * return nonzero on overflow. */
static inline int kiln_add_overflow(size_t a, size_t b, size_t *out) { return __builtin_add_overflow(a, b, out); }
static inline int kiln_mul_overflow(size_t a, size_t b, size_t *out) { return __builtin_mul_overflow(a, b, out); }

/* strdup that returns NULL on NULL. */
char *kiln_strdup(const char *s);

#endif
