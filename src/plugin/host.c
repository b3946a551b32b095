/* The kiln_host_api table: everything a plugin may call on the host. */
#include "plugin/plugin_internal.h"

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/expr.h"
#include "core/threadpool.h"
#include "llm/gguf.h"

#include <stdarg.h>
#include <stdio.h>

/* Same length as the thread-local error buffer in core/error.c. */
#define HOST_MESSAGE_MAX 1024

/* Every message, through host->fail or not (a plugin built into kiln may
 * call kiln_fail), counts as the plugin's own. */
unsigned long kiln_host_fail_count(void) { return kiln_fail_count(); }

static void host_log(int32_t level, const char *fmt, ...)
{
    char msg[HOST_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (level < KILN_LOG_ERROR)
        level = KILN_LOG_ERROR;
    if (level >= KILN_LOG_LEVEL_COUNT)
        level = KILN_LOG_DEBUG;
    kiln_log((kiln_log_level)level, "%s", msg);
}

static kiln_status host_fail(kiln_status status, const char *fmt, ...)
{
    char msg[HOST_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_fail(status, "%s", msg);
}

static kiln_expr host_expr_constant(kiln_expr_builder *eb, int64_t value)
{
    return eb ? kiln_expr_const(eb, value) : -1;
}

static kiln_expr host_expr_operation(kiln_expr_builder *eb, kiln_expr_op op, kiln_expr a, kiln_expr b)
{
    if (!eb || (unsigned)op >= KILN_EXPR_OP_COUNT)
        return -1;
    return kiln_expr_op(eb, op, a, b);
}

static int32_t host_expr_is_constant(kiln_expr_builder *eb, kiln_expr e, int64_t *value)
{
    return eb && value ? kiln_expr_is_const(eb, e, value) != 0 : 0;
}

static void host_parallel_for(void *stream, int64_t n, kiln_parallel_fn fn, void *arg)
{
    if (n <= 0 || !fn)
        return;
    kiln_threadpool_run((kiln_threadpool *)stream, n, fn, arg);
}

static int32_t host_upcoming_constants(void *stream, int64_t budget, const void **ptr, int64_t *bytes, int32_t max)
{
    (void)stream;
    return kiln_exec_upcoming_constants(budget, ptr, bytes, max);
}

static const kiln_host_api host_api = {
    .struct_size = sizeof(kiln_host_api),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .register_creator = kiln_registry_register,
    .log = host_log,
    .fail = host_fail,
    .expr_constant = host_expr_constant,
    .expr_operation = host_expr_operation,
    .expr_is_constant = host_expr_is_constant,
    .parallel_for = host_parallel_for,
    .half_to_float = kiln_half_to_float,
    .float_to_half = kiln_float_to_half,
    .bf16_to_float = kiln_bf16_to_float,
    .float_to_bf16 = kiln_float_to_bf16,
    .ggml_dequantize = kiln_ggml_dequantize,
    .upcoming_constants = host_upcoming_constants,
};

const kiln_host_api *kiln_host(void) { return &host_api; }
