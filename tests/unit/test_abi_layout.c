/* Pins the layout of every struct of the plugin ABI (plugin.h, types.h) on
 * x86-64 (LP64: pointers and int64_t 8 bytes, aligned to 8; enums 4 bytes).
 * The numbers were worked out by hand from the C layout rules, member by
 * member: plugins built against an older header rely on them, so a change
 * here is an ABI break, never a test to update. Members may only be
 * appended (which grows a sizeof and adds a line here). */
#include "test.h"

#include <kiln/plugin.h>

#include <stddef.h>

#define CHECK_OFFSET(type, member, expected) CHECK(offsetof(type, member) == (expected))
#define CHECK_SIZE(type, expected) CHECK(sizeof(type) == (expected))

static void test_dims_and_desc(void)
{
    CHECK_OFFSET(kiln_dims, rank, 0);
    CHECK_OFFSET(kiln_dims, reserved, 4);
    CHECK_OFFSET(kiln_dims, d, 8);
    CHECK_SIZE(kiln_dims, 72); /* 8 + 8 * 8 */

    CHECK_OFFSET(kiln_tensor_desc, struct_size, 0);
    CHECK_OFFSET(kiln_tensor_desc, abi_version, 4);
    CHECK_OFFSET(kiln_tensor_desc, dtype, 8);
    CHECK_OFFSET(kiln_tensor_desc, format, 12);
    CHECK_OFFSET(kiln_tensor_desc, dims, 16);
    CHECK_SIZE(kiln_tensor_desc, 88); /* 16 + 72 */
}

static void test_shape_expr(void)
{
    CHECK_OFFSET(kiln_shape_expr, rank, 0);
    CHECK_OFFSET(kiln_shape_expr, d, 4);
    CHECK_SIZE(kiln_shape_expr, 36); /* 4 + 8 * 4, all 4-byte aligned */
    CHECK_SIZE(kiln_expr, 4);
}

static void test_fields(void)
{
    CHECK_OFFSET(kiln_field, struct_size, 0);
    CHECK_OFFSET(kiln_field, abi_version, 4);
    CHECK_OFFSET(kiln_field, name, 8);
    CHECK_OFFSET(kiln_field, type, 16);
    CHECK_OFFSET(kiln_field, count, 24); /* 4 bytes of padding after type */
    CHECK_OFFSET(kiln_field, data, 32);
    CHECK_SIZE(kiln_field, 40);

    CHECK_OFFSET(kiln_field_spec, struct_size, 0);
    CHECK_OFFSET(kiln_field_spec, abi_version, 4);
    CHECK_OFFSET(kiln_field_spec, name, 8);
    CHECK_OFFSET(kiln_field_spec, type, 16);
    CHECK_OFFSET(kiln_field_spec, count, 24);
    CHECK_OFFSET(kiln_field_spec, required, 32);
    CHECK_OFFSET(kiln_field_spec, reserved, 36);
    CHECK_OFFSET(kiln_field_spec, default_data, 40);
    CHECK_OFFSET(kiln_field_spec, default_count, 48);
    CHECK_OFFSET(kiln_field_spec, doc, 56);
    CHECK_SIZE(kiln_field_spec, 64);
}

static void test_plugin_ops(void)
{
    CHECK_OFFSET(kiln_plugin_ops, struct_size, 0);
    CHECK_OFFSET(kiln_plugin_ops, abi_version, 4);
    CHECK_OFFSET(kiln_plugin_ops, flags, 8);
    CHECK_OFFSET(kiln_plugin_ops, backends, 12);
    CHECK_OFFSET(kiln_plugin_ops, num_outputs, 16);
    CHECK_OFFSET(kiln_plugin_ops, output_shapes, 24);
    CHECK_OFFSET(kiln_plugin_ops, output_dtypes, 32);
    CHECK_OFFSET(kiln_plugin_ops, supports, 40);
    CHECK_OFFSET(kiln_plugin_ops, workspace_size, 48);
    CHECK_OFFSET(kiln_plugin_ops, enqueue, 56);
    CHECK_OFFSET(kiln_plugin_ops, serialize, 64);
    CHECK_OFFSET(kiln_plugin_ops, clone, 72);
    CHECK_OFFSET(kiln_plugin_ops, destroy, 80);
    CHECK_SIZE(kiln_plugin_ops, 88);

    CHECK_OFFSET(kiln_plugin, struct_size, 0);
    CHECK_OFFSET(kiln_plugin, abi_version, 4);
    CHECK_OFFSET(kiln_plugin, ops, 8);
    CHECK_SIZE(kiln_plugin, 16);
}

static void test_creator(void)
{
    CHECK_OFFSET(kiln_plugin_creator, struct_size, 0);
    CHECK_OFFSET(kiln_plugin_creator, abi_version, 4);
    CHECK_OFFSET(kiln_plugin_creator, name, 8);
    CHECK_OFFSET(kiln_plugin_creator, version, 16);
    CHECK_OFFSET(kiln_plugin_creator, plugin_namespace, 24);
    CHECK_OFFSET(kiln_plugin_creator, fields, 32);
    CHECK_OFFSET(kiln_plugin_creator, n_fields, 40);
    CHECK_OFFSET(kiln_plugin_creator, blob_version, 44);
    CHECK_OFFSET(kiln_plugin_creator, create, 48);
    CHECK_OFFSET(kiln_plugin_creator, deserialize, 56);
    CHECK_OFFSET(kiln_plugin_creator, description, 64);
    CHECK_OFFSET(kiln_plugin_creator, user_data, 72);
    CHECK_SIZE(kiln_plugin_creator, 80);
}

static void test_host_api(void)
{
    CHECK_OFFSET(kiln_host_api, struct_size, 0);
    CHECK_OFFSET(kiln_host_api, abi_version, 4);
    CHECK_OFFSET(kiln_host_api, register_creator, 8);
    CHECK_OFFSET(kiln_host_api, log, 16);
    CHECK_OFFSET(kiln_host_api, fail, 24);
    CHECK_OFFSET(kiln_host_api, expr_constant, 32);
    CHECK_OFFSET(kiln_host_api, expr_operation, 40);
    CHECK_OFFSET(kiln_host_api, expr_is_constant, 48);
    CHECK_OFFSET(kiln_host_api, parallel_for, 56);
    CHECK_OFFSET(kiln_host_api, half_to_float, 64);
    CHECK_OFFSET(kiln_host_api, float_to_half, 72);
    CHECK_OFFSET(kiln_host_api, bf16_to_float, 80);
    CHECK_OFFSET(kiln_host_api, float_to_bf16, 88);
    CHECK_SIZE(kiln_host_api, 96);

    /* The table the host hands out is the one this header describes. */
    const kiln_host_api *h = kiln_host();
    CHECK(h->struct_size == 96);
    CHECK(h->abi_version == KILN_PLUGIN_ABI_VERSION);
}

/* Enum values cross the boundary too (and are stored in engine files). */
static void test_enum_values(void)
{
    CHECK(KILN_PLUGIN_ABI_VERSION == 1u);
    CHECK(sizeof(kiln_status) == 4 && sizeof(kiln_dtype) == 4 && sizeof(kiln_field_type) == 4);
    CHECK(KILN_ERROR_INVALID_ARGUMENT == 1 && KILN_ERROR_VERSION == 6 && KILN_ERROR_PLUGIN == 8 &&
          KILN_ERROR_LIMIT == 15);
    CHECK(KILN_DTYPE_F32 == 0 && KILN_DTYPE_F16 == 1 && KILN_DTYPE_BF16 == 2 && KILN_DTYPE_I8 == 3 &&
          KILN_DTYPE_U8 == 4 && KILN_DTYPE_I32 == 5 && KILN_DTYPE_I64 == 6 && KILN_DTYPE_BOOL == 7 &&
          KILN_DTYPE_FP8_E4M3 == 8 && KILN_DTYPE_FP8_E5M2 == 9);
    CHECK(KILN_FORMAT_LINEAR == 0);
    CHECK(KILN_BACKEND_CPU == 0 && KILN_BACKEND_CUDA == 1);
    CHECK(KILN_FIELD_F32 == 0 && KILN_FIELD_F64 == 1 && KILN_FIELD_I32 == 2 && KILN_FIELD_I64 == 3 &&
          KILN_FIELD_STRING == 4);
    CHECK(KILN_FIELD_ANY_COUNT == -1);
    CHECK(KILN_EXPR_ADD == 0 && KILN_EXPR_SUB == 1 && KILN_EXPR_MUL == 2 && KILN_EXPR_FLOOR_DIV == 3 &&
          KILN_EXPR_CEIL_DIV == 4 && KILN_EXPR_MAX == 5 && KILN_EXPR_MIN == 6);
    CHECK(KILN_PLUGIN_FLAG_CAPTURE_SAFE == 1u);
    CHECK(KILN_BACKEND_BIT(KILN_BACKEND_CUDA) == 2u);
    CHECK(KILN_MAX_RANK == 8);
}

static const test_case_ tests[] = {
    TEST(test_dims_and_desc), TEST(test_shape_expr), TEST(test_fields),     TEST(test_plugin_ops),
    TEST(test_creator),       TEST(test_host_api),   TEST(test_enum_values),
};

TEST_MAIN(tests)
