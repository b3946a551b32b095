/* Pins the layout of every public struct: the plugin ABI (plugin.h,
 * types.h) and the API (builder.h, network.h, llm.h) on x86-64 (LP64:
 * pointers, size_t and int64_t 8 bytes, aligned to 8; enums 4 bytes). The
 * numbers were worked out by hand from the C layout rules, member by
 * member: plugins and programs built against an older header rely on them,
 * so a change here is an ABI break, never a test to update. Members may
 * only be appended (which grows a sizeof and adds a line here). */
#include "test.h"

#include <kiln/kiln.h>

#include <stddef.h>

#define CHECK_OFFSET(type, member, expected) CHECK(offsetof(type, member) == (expected))
#define CHECK_SIZE(type, expected) CHECK(sizeof(type) == (expected))
/* A growable struct ends exactly at its last member: no tail padding, so a
 * member appended later never falls inside the struct_size an older caller
 * reports (which would make the library read the old caller's padding). */
#define CHECK_ENDS_AT(type, member) CHECK(sizeof(type) == offsetof(type, member) + sizeof(((type *)0)->member))
/* An _init function stores the library's size and KILN_API_VERSION. */
#define CHECK_INIT(type, init) \
    do { \
        type v_; \
        memset(&v_, 0xA5, sizeof v_); \
        init(&v_); \
        CHECK(v_.struct_size == sizeof(type) && v_.abi_version == KILN_API_VERSION); \
    } while (0)

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
    CHECK_OFFSET(kiln_host_api, ggml_dequantize, 96);
    CHECK_OFFSET(kiln_host_api, upcoming_constants, 104);
    CHECK_SIZE(kiln_host_api, 112);

    /* The table the host hands out is the one this header describes. */
    const kiln_host_api *h = kiln_host();
    CHECK(h->struct_size == 112);
    CHECK(h->abi_version == KILN_PLUGIN_ABI_VERSION);
}

static void test_builder_and_network(void)
{
    CHECK_OFFSET(kiln_build_config, struct_size, 0);
    CHECK_OFFSET(kiln_build_config, abi_version, 4);
    CHECK_OFFSET(kiln_build_config, backend, 8);
    CHECK_OFFSET(kiln_build_config, flags, 12);
    CHECK_OFFSET(kiln_build_config, n_gpu_archs, 16);
    CHECK_OFFSET(kiln_build_config, gpu_archs, 20); /* 8 x 4 bytes, to 52 */
    CHECK_OFFSET(kiln_build_config, progress, 56);  /* 4 bytes of padding before it */
    CHECK_OFFSET(kiln_build_config, progress_user, 64);
    CHECK_SIZE(kiln_build_config, 72);
    CHECK_ENDS_AT(kiln_build_config, progress_user);
    CHECK_INIT(kiln_build_config, kiln_build_config_init);

    /* Fixed-layout value types: they never grow. */
    CHECK_OFFSET(kiln_buffer, data, 0);
    CHECK_OFFSET(kiln_buffer, size, 8);
    CHECK_SIZE(kiln_buffer, 16);
    CHECK_OFFSET(kiln_tensor, id, 0);
    CHECK_SIZE(kiln_tensor, 4);

    CHECK_OFFSET(kiln_shuffle_desc, struct_size, 0);
    CHECK_OFFSET(kiln_shuffle_desc, abi_version, 4);
    CHECK_OFFSET(kiln_shuffle_desc, has_first_transpose, 8);
    CHECK_OFFSET(kiln_shuffle_desc, first_transpose, 12); /* 8 x 4 bytes, to 44 */
    CHECK_OFFSET(kiln_shuffle_desc, has_reshape, 44);
    CHECK_OFFSET(kiln_shuffle_desc, reshape, 48); /* kiln_dims, 72 bytes */
    CHECK_OFFSET(kiln_shuffle_desc, has_second_transpose, 120);
    CHECK_OFFSET(kiln_shuffle_desc, second_transpose, 124); /* to 156 */
    CHECK_OFFSET(kiln_shuffle_desc, reserved, 156);
    CHECK_SIZE(kiln_shuffle_desc, 160);
    CHECK_ENDS_AT(kiln_shuffle_desc, reserved);
    CHECK_INIT(kiln_shuffle_desc, kiln_shuffle_desc_init);
}

static void test_llm(void)
{
    CHECK_OFFSET(kiln_llm_build_options, struct_size, 0);
    CHECK_OFFSET(kiln_llm_build_options, abi_version, 4);
    CHECK_OFFSET(kiln_llm_build_options, dtype, 8);
    CHECK_OFFSET(kiln_llm_build_options, native, 12);
    CHECK_OFFSET(kiln_llm_build_options, max_batch, 16);
    CHECK_OFFSET(kiln_llm_build_options, max_seq_len, 20);
    CHECK_OFFSET(kiln_llm_build_options, max_tokens, 24);
    CHECK_OFFSET(kiln_llm_build_options, block_size, 28);
    CHECK_OFFSET(kiln_llm_build_options, tokenizer, 32);
    CHECK_OFFSET(kiln_llm_build_options, progress, 40);
    CHECK_OFFSET(kiln_llm_build_options, progress_user, 48);
    CHECK_OFFSET(kiln_llm_build_options, backend, 56);
    CHECK_OFFSET(kiln_llm_build_options, reserved, 60);
    CHECK_OFFSET(kiln_llm_build_options, weights, 64);
    CHECK_OFFSET(kiln_llm_build_options, weights_group, 68);
    CHECK_OFFSET(kiln_llm_build_options, weights_lm_head, 72);
    CHECK_OFFSET(kiln_llm_build_options, kv_cache, 76);
    CHECK_OFFSET(kiln_llm_build_options, calibrate, 80);
    CHECK_OFFSET(kiln_llm_build_options, calibrate_tokens, 88);
    CHECK_OFFSET(kiln_llm_build_options, reserved2, 92);
    CHECK_SIZE(kiln_llm_build_options, 96);
    CHECK_ENDS_AT(kiln_llm_build_options, reserved2);
    CHECK_INIT(kiln_llm_build_options, kiln_llm_build_options_init);

    CHECK_OFFSET(kiln_llm_options, struct_size, 0);
    CHECK_OFFSET(kiln_llm_options, abi_version, 4);
    CHECK_OFFSET(kiln_llm_options, kv_cache_mb, 8);
    CHECK_OFFSET(kiln_llm_options, kv_cache_blocks, 16);
    CHECK_OFFSET(kiln_llm_options, reserved, 20);
    CHECK_OFFSET(kiln_llm_options, kv_cache_fraction, 24);
    CHECK_OFFSET(kiln_llm_options, no_cuda_graphs, 28);
    CHECK_OFFSET(kiln_llm_options, n_threads, 32);
    CHECK_OFFSET(kiln_llm_options, no_prefix_caching, 36);
    CHECK_SIZE(kiln_llm_options, 40);
    CHECK_ENDS_AT(kiln_llm_options, no_prefix_caching);
    CHECK_INIT(kiln_llm_options, kiln_llm_options_init);

    CHECK_OFFSET(kiln_llm_info, struct_size, 0);
    CHECK_OFFSET(kiln_llm_info, abi_version, 4);
    CHECK_OFFSET(kiln_llm_info, architecture, 8);
    CHECK_OFFSET(kiln_llm_info, chat_template, 16);
    CHECK_OFFSET(kiln_llm_info, dtype, 24);
    CHECK_OFFSET(kiln_llm_info, vocab_size, 28);
    CHECK_OFFSET(kiln_llm_info, n_layers, 32);
    CHECK_OFFSET(kiln_llm_info, max_seq_len, 36);
    CHECK_OFFSET(kiln_llm_info, max_batch, 40);
    CHECK_OFFSET(kiln_llm_info, max_tokens, 44);
    CHECK_OFFSET(kiln_llm_info, block_size, 48);
    CHECK_OFFSET(kiln_llm_info, n_blocks, 52);
    CHECK_OFFSET(kiln_llm_info, cache_tokens, 56);
    CHECK_OFFSET(kiln_llm_info, cache_bytes, 64);
    CHECK_OFFSET(kiln_llm_info, bos_id, 72);
    CHECK_OFFSET(kiln_llm_info, n_eos, 76);
    CHECK_OFFSET(kiln_llm_info, eos_ids, 80);
    CHECK_OFFSET(kiln_llm_info, backend, 88);
    CHECK_OFFSET(kiln_llm_info, n_graphs, 92);
    CHECK_OFFSET(kiln_llm_info, graph_capture_ms, 96);
    CHECK_OFFSET(kiln_llm_info, graph_nodes, 104);
    CHECK_OFFSET(kiln_llm_info, n_threads, 112);
    CHECK_OFFSET(kiln_llm_info, reserved, 116);
    CHECK_SIZE(kiln_llm_info, 120);
    CHECK_ENDS_AT(kiln_llm_info, reserved);

    CHECK_OFFSET(kiln_llm_sampling, struct_size, 0);
    CHECK_OFFSET(kiln_llm_sampling, abi_version, 4);
    CHECK_OFFSET(kiln_llm_sampling, temperature, 8);
    CHECK_OFFSET(kiln_llm_sampling, top_k, 12);
    CHECK_OFFSET(kiln_llm_sampling, top_p, 16);
    CHECK_OFFSET(kiln_llm_sampling, min_p, 20);
    CHECK_OFFSET(kiln_llm_sampling, repetition_penalty, 24);
    CHECK_OFFSET(kiln_llm_sampling, presence_penalty, 28);
    CHECK_OFFSET(kiln_llm_sampling, frequency_penalty, 32);
    CHECK_OFFSET(kiln_llm_sampling, reserved, 36);
    CHECK_OFFSET(kiln_llm_sampling, seed, 40);
    CHECK_SIZE(kiln_llm_sampling, 48);
    CHECK_ENDS_AT(kiln_llm_sampling, seed);
    CHECK_INIT(kiln_llm_sampling, kiln_llm_sampling_init);

    CHECK_OFFSET(kiln_llm_request, struct_size, 0);
    CHECK_OFFSET(kiln_llm_request, abi_version, 4);
    CHECK_OFFSET(kiln_llm_request, prompt, 8);
    CHECK_OFFSET(kiln_llm_request, prompt_len, 16);
    CHECK_OFFSET(kiln_llm_request, prompt_ids, 24);
    CHECK_OFFSET(kiln_llm_request, n_prompt_ids, 32);
    CHECK_OFFSET(kiln_llm_request, max_tokens, 40);
    CHECK_OFFSET(kiln_llm_request, ignore_eos, 44);
    CHECK_OFFSET(kiln_llm_request, sampling, 48);
    CHECK_OFFSET(kiln_llm_request, stop, 56);
    CHECK_OFFSET(kiln_llm_request, n_stop, 64);
    CHECK_OFFSET(kiln_llm_request, reserved, 68);
    CHECK_OFFSET(kiln_llm_request, logprobs, 72);
    CHECK_OFFSET(kiln_llm_request, reserved2, 76);
    CHECK_SIZE(kiln_llm_request, 80);
    CHECK_ENDS_AT(kiln_llm_request, reserved2);
    CHECK_INIT(kiln_llm_request, kiln_llm_request_init);

    CHECK_OFFSET(kiln_llm_result, struct_size, 0);
    CHECK_OFFSET(kiln_llm_result, abi_version, 4);
    CHECK_OFFSET(kiln_llm_result, prompt_ids, 8);
    CHECK_OFFSET(kiln_llm_result, n_prompt_ids, 16);
    CHECK_OFFSET(kiln_llm_result, ids, 24);
    CHECK_OFFSET(kiln_llm_result, n_ids, 32);
    CHECK_OFFSET(kiln_llm_result, text, 40);
    CHECK_OFFSET(kiln_llm_result, text_len, 48);
    CHECK_OFFSET(kiln_llm_result, finish, 56);
    CHECK_OFFSET(kiln_llm_result, reserved, 60);
    CHECK_OFFSET(kiln_llm_result, prompt_ms, 64);
    CHECK_OFFSET(kiln_llm_result, generate_ms, 72);
    CHECK_OFFSET(kiln_llm_result, prompt_tok_s, 80);
    CHECK_OFFSET(kiln_llm_result, generate_tok_s, 88);
    CHECK_OFFSET(kiln_llm_result, error, 96);
    CHECK_OFFSET(kiln_llm_result, logprobs, 104);
    CHECK_SIZE(kiln_llm_result, 112);
    CHECK_ENDS_AT(kiln_llm_result, logprobs);

    CHECK_OFFSET(kiln_llm_message, struct_size, 0);
    CHECK_OFFSET(kiln_llm_message, abi_version, 4);
    CHECK_OFFSET(kiln_llm_message, role, 8);
    CHECK_OFFSET(kiln_llm_message, content, 16);
    CHECK_SIZE(kiln_llm_message, 24);
    CHECK_ENDS_AT(kiln_llm_message, content);
    CHECK_INIT(kiln_llm_message, kiln_llm_message_init);

    CHECK_OFFSET(kiln_llm_scheduler_options, struct_size, 0);
    CHECK_OFFSET(kiln_llm_scheduler_options, abi_version, 4);
    CHECK_OFFSET(kiln_llm_scheduler_options, max_queue, 8);
    CHECK_OFFSET(kiln_llm_scheduler_options, thread, 12);
    CHECK_OFFSET(kiln_llm_scheduler_options, prefix_caching, 16);
    CHECK_OFFSET(kiln_llm_scheduler_options, admission, 20);
    CHECK_OFFSET(kiln_llm_scheduler_options, run_ahead, 24);
    CHECK_SIZE(kiln_llm_scheduler_options, 28);
    CHECK_ENDS_AT(kiln_llm_scheduler_options, run_ahead);
    CHECK_INIT(kiln_llm_scheduler_options, kiln_llm_scheduler_options_init);

    CHECK_OFFSET(kiln_llm_token, struct_size, 0);
    CHECK_OFFSET(kiln_llm_token, abi_version, 4);
    CHECK_OFFSET(kiln_llm_token, id, 8);
    CHECK_OFFSET(kiln_llm_token, n_top, 12);
    CHECK_OFFSET(kiln_llm_token, text, 16);
    CHECK_OFFSET(kiln_llm_token, len, 24);
    CHECK_OFFSET(kiln_llm_token, logprob, 32);
    CHECK_OFFSET(kiln_llm_token, reserved, 36);
    CHECK_OFFSET(kiln_llm_token, top_ids, 40);
    CHECK_OFFSET(kiln_llm_token, top_logprobs, 48);
    CHECK_SIZE(kiln_llm_token, 56);
    CHECK_ENDS_AT(kiln_llm_token, top_logprobs);

    CHECK_OFFSET(kiln_llm_callbacks, struct_size, 0);
    CHECK_OFFSET(kiln_llm_callbacks, abi_version, 4);
    CHECK_OFFSET(kiln_llm_callbacks, on_token, 8);
    CHECK_OFFSET(kiln_llm_callbacks, on_finish, 16);
    CHECK_OFFSET(kiln_llm_callbacks, user, 24);
    CHECK_SIZE(kiln_llm_callbacks, 32);
    CHECK_ENDS_AT(kiln_llm_callbacks, user);
    CHECK_INIT(kiln_llm_callbacks, kiln_llm_callbacks_init);

    CHECK_OFFSET(kiln_llm_scheduler_stats, struct_size, 0);
    CHECK_OFFSET(kiln_llm_scheduler_stats, abi_version, 4);
    CHECK_OFFSET(kiln_llm_scheduler_stats, running, 8);
    CHECK_OFFSET(kiln_llm_scheduler_stats, waiting, 12);
    CHECK_OFFSET(kiln_llm_scheduler_stats, blocks_total, 16);
    CHECK_OFFSET(kiln_llm_scheduler_stats, blocks_used, 20);
    CHECK_OFFSET(kiln_llm_scheduler_stats, blocks_peak, 24);
    CHECK_OFFSET(kiln_llm_scheduler_stats, reserved, 28);
    CHECK_OFFSET(kiln_llm_scheduler_stats, steps, 32);
    CHECK_OFFSET(kiln_llm_scheduler_stats, preemptions, 40);
    CHECK_OFFSET(kiln_llm_scheduler_stats, prefix_hit_tokens, 48);
    CHECK_OFFSET(kiln_llm_scheduler_stats, prompt_tokens, 56);
    CHECK_OFFSET(kiln_llm_scheduler_stats, generated_tokens, 64);
    CHECK_OFFSET(kiln_llm_scheduler_stats, finished, 72);
    CHECK_OFFSET(kiln_llm_scheduler_stats, cancelled, 80);
    CHECK_OFFSET(kiln_llm_scheduler_stats, failed, 88);
    CHECK_OFFSET(kiln_llm_scheduler_stats, steps_ahead, 96);
    CHECK_OFFSET(kiln_llm_scheduler_stats, dropped_rows, 104);
    CHECK_OFFSET(kiln_llm_scheduler_stats, decode_steps, 112);
    CHECK_OFFSET(kiln_llm_scheduler_stats, decode_us, 120);
    CHECK_OFFSET(kiln_llm_scheduler_stats, prompt_step_us, 128);
    CHECK_SIZE(kiln_llm_scheduler_stats, 136);
    CHECK_ENDS_AT(kiln_llm_scheduler_stats, prompt_step_us);
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
    CHECK(KILN_API_VERSION == 1u);
    CHECK(KILN_FOURCC('L', 'L', 'M', 'C') == 0x434d4c4cu); /* bytes 'L' 'L' 'M' 'C' in file order */
    CHECK(KILN_BUILD_NO_FUSION == 1u && KILN_BUILD_NO_CONSTANT_FOLDING == 2u);
    CHECK(KILN_LOG_ERROR == 0 && KILN_LOG_WARNING == 1 && KILN_LOG_INFO == 2 && KILN_LOG_DEBUG == 3);
    CHECK(KILN_LLM_FINISH_LENGTH == 0 && KILN_LLM_FINISH_EOS == 1 && KILN_LLM_FINISH_STOP == 2 &&
          KILN_LLM_FINISH_CANCELLED == 3);
    CHECK(KILN_LLM_TOKENIZE_ADD_SPECIAL == 1u && KILN_LLM_TOKENIZE_PARSE_SPECIAL == 2u);
}

static const test_case_ tests[] = {
    TEST(test_dims_and_desc),       TEST(test_shape_expr), TEST(test_fields),
    TEST(test_plugin_ops),          TEST(test_creator),    TEST(test_host_api),
    TEST(test_builder_and_network), TEST(test_llm),        TEST(test_enum_values),
};

TEST_MAIN(tests)
