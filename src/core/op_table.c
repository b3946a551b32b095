/* The native op table (op_table.h). */
#include "core/op_table.h"

#include <string.h>

#include <kiln/kiln.h>

/* Enum-valued attributes are stored as their C enum; the table reads them
 * as int32_t. */
_Static_assert(sizeof(kiln_binary_op) == sizeof(int32_t), "kiln_binary_op is not 32-bit");
_Static_assert(sizeof(kiln_unary_op) == sizeof(int32_t), "kiln_unary_op is not 32-bit");
_Static_assert(sizeof(kiln_reduce_op) == sizeof(int32_t), "kiln_reduce_op is not 32-bit");
_Static_assert(sizeof(kiln_dtype) == sizeof(int32_t), "kiln_dtype is not 32-bit");

static const char *binary_name(int32_t v) { return kiln_binary_op_name((kiln_binary_op)v); }
static const char *unary_name(int32_t v) { return kiln_unary_op_name((kiln_unary_op)v); }
static const char *reduce_name(int32_t v) { return kiln_reduce_op_name((kiln_reduce_op)v); }
static const char *dtype_name(int32_t v) { return kiln_dtype_name((kiln_dtype)v); }

#define P(member) offsetof(kiln_layer_params, member)
#define I32(key, member, lo, hi, bound, names) \
    { \
        key, KILN_ATTR_I32, P(member), 0, lo, hi, bound, names \
    }
#define AXIS(key, member) I32(key, member, 0, 0, KILN_BOUND_RANK, NULL)

/* Sized by its last designated entry: an op appended to kiln_op without a
 * row here fails the assertion below. */
static const kiln_op_info ops[] = {
    [KILN_OP_CONSTANT] = {"constant", 0, 0, 1, 1, 1, 0, {{0}}},
    [KILN_OP_MATMUL] = {"matmul",
                        2,
                        2,
                        1,
                        1,
                        1,
                        2,
                        {I32("transpose_a", matmul.transpose_a, 0, 1, KILN_BOUND_FIXED, NULL),
                         I32("transpose_b", matmul.transpose_b, 0, 1, KILN_BOUND_FIXED, NULL)}},
    [KILN_OP_BINARY] = {"binary",
                        2,
                        2,
                        1,
                        1,
                        1,
                        1,
                        {I32("op", binary.op, 0, KILN_BINARY_OP_COUNT - 1, KILN_BOUND_FIXED, binary_name)}},
    [KILN_OP_UNARY] =
        {"unary", 1, 1, 1, 1, 1, 1, {I32("op", unary.op, 0, KILN_UNARY_OP_COUNT - 1, KILN_BOUND_FIXED, unary_name)}},
    [KILN_OP_REDUCE] = {"reduce",
                        1,
                        1,
                        1,
                        1,
                        1,
                        3,
                        {I32("op", reduce.op, 0, KILN_REDUCE_OP_COUNT - 1, KILN_BOUND_FIXED, reduce_name),
                         {"axes", KILN_ATTR_AXES, P(reduce.axes), 0, 0, 0, KILN_BOUND_RANK, NULL},
                         I32("keep_dims", reduce.keep_dims, 0, 1, KILN_BOUND_FIXED, NULL)}},
    [KILN_OP_SOFTMAX] = {"softmax", 1, 1, 1, 1, 1, 1, {AXIS("axis", softmax.axis)}},
    [KILN_OP_CONCAT] = {"concat", 1, -1, 1, 1, 1, 1, {AXIS("axis", concat.axis)}},
    [KILN_OP_SLICE] =
        {"slice",
         1,
         1,
         1,
         1,
         1,
         2,
         {{"start", KILN_ATTR_I64_RANK, P(slice.start), 0, 0, INT64_MAX, KILN_BOUND_FIXED, NULL},
          {"stride", KILN_ATTR_I64_RANK, P(slice.stride), 0, 1, INT64_MAX, KILN_BOUND_FIXED, NULL}}},
    [KILN_OP_SHUFFLE] =
        {"shuffle",
         1,
         1,
         1,
         1,
         1,
         3,
         {{"first", KILN_ATTR_PERM, P(shuffle.first), P(shuffle.has_first), 0, 0, KILN_BOUND_RANK, NULL},
          {"mid", KILN_ATTR_EXPRS, P(shuffle.mid), P(shuffle.mid_rank), 0, 0, KILN_BOUND_FIXED, NULL},
          {"second", KILN_ATTR_PERM, P(shuffle.second), P(shuffle.has_second), 0, 0, KILN_BOUND_MID_RANK, NULL}}},
    [KILN_OP_GATHER] = {"gather", 2, 2, 1, 1, 1, 1, {AXIS("axis", gather.axis)}},
    [KILN_OP_CAST] =
        {"cast", 1, 1, 1, 1, 1, 1, {I32("to", cast.to, 0, KILN_DTYPE_COUNT - 1, KILN_BOUND_FIXED, dtype_name)}},
    [KILN_OP_PLUGIN] = {"plugin",
                        0,
                        KILN_PLUGIN_MAX_INPUTS,
                        1,
                        KILN_PLUGIN_MAX_OUTPUTS,
                        1,
                        1,
                        {I32("index", plugin.index, 0, 0, KILN_BOUND_PLUGINS, NULL)}},
    [KILN_OP_FUSED] = {"fused_elementwise",
                       1,
                       KILN_FUSED_MAX_INPUTS,
                       1,
                       1,
                       0,
                       1,
                       {{"steps", KILN_ATTR_STEPS, P(fused), 0, 0, 0, KILN_BOUND_FIXED, NULL}}},
};

_Static_assert(sizeof ops / sizeof ops[0] == KILN_OP_COUNT, "every kiln_op needs a row in the op table");

const kiln_op_info *kiln_op_info_get(kiln_op op) { return (unsigned)op < KILN_OP_COUNT ? &ops[op] : NULL; }

int32_t kiln_op_find(const char *name)
{
    for (int32_t i = 0; i < KILN_OP_COUNT && name; i++)
        if (strcmp(ops[i].name, name) == 0)
            return i;
    return -1;
}

int64_t kiln_op_attr_hi(const kiln_op_attr *a, int32_t rank, int32_t mid_rank, int32_t n_plugins)
{
    switch (a->bound) {
    case KILN_BOUND_RANK: return (int64_t)rank - 1;
    case KILN_BOUND_MID_RANK: return (int64_t)mid_rank - 1;
    case KILN_BOUND_PLUGINS: return (int64_t)n_plugins - 1;
    case KILN_BOUND_FIXED:
    case KILN_BOUND_COUNT: break;
    }
    return a->hi;
}

const char *kiln_op_name(kiln_op op)
{
    const kiln_op_info *i = kiln_op_info_get(op);
    return i ? i->name : "?";
}
