/* The sampling layer of LLM step networks (model.h: kiln_llm_add_sampling).
 * It lives in the network so that the token choice runs where the logits
 * are (on the GPU for a cuda engine, inside the decode step's CUDA graph)
 * and only the sampled ids come back to the host. */
#include <kiln/plugin.h>
#include <string.h>

#include "sample/sample.h"
#include "core/error.h"
#include "llm/model.h"

/* A per-sequence input [S, cols], S in [1, max_batch]. */
static kiln_status add_rows(kiln_network *net, const char *name, kiln_dtype dtype, int64_t cols, int32_t max_batch,
                            kiln_tensor *out)
{
    kiln_dims d = {.rank = 2, .d = {-1, cols}};
    kiln_dims mn = {.rank = 2, .d = {1, cols}}, mx = {.rank = 2, .d = {max_batch, cols}};
    KILN_TRY(kiln_network_add_input(net, name, dtype, &d, out));
    return kiln_network_set_profile_shape(net, 0, name, &mn, &mn, &mx);
}

kiln_status kiln_llm_add_sampling(kiln_network *net, int32_t max_batch, int32_t vocab)
{
    /* logits, params, seq, tokens, positions, query_start, state */
    kiln_tensor in[7], out[4];
    const char *step[3] = {"tokens", "positions", "query_start"};
    if (kiln_network_find_tensor(net, "logits", &in[0]) != KILN_OK)
        return kiln_fail(KILN_ERROR_INTERNAL, "LLM build: the step network has no \"logits\" to sample from");
    for (int i = 0; i < 3; i++)
        if (kiln_network_find_tensor(net, step[i], &in[3 + i]) != KILN_OK)
            return kiln_fail(KILN_ERROR_INTERNAL, "LLM build: the step network has no input \"%s\"", step[i]);
    KILN_TRY(add_rows(net, "sample_params", KILN_DTYPE_F32, SAMPLE_PARAMS_LOGPROBS, max_batch, &in[1]));
    KILN_TRY(add_rows(net, "sample_seq", KILN_DTYPE_I32, SAMPLE_SEQ, max_batch, &in[2]));
    kiln_dims sd = {.rank = 2, .d = {max_batch, vocab}};
    KILN_TRY(kiln_network_add_input(net, "sample_state", KILN_DTYPE_I32, &sd, &in[6]));
    int32_t top = SAMPLE_MAX_TOP;
    kiln_field f = {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "logprobs", KILN_FIELD_I32, 1, &top};
    int32_t n_out = 0;
    KILN_TRY(kiln_network_add_plugin(net, "sample", "Sample", "1", "kiln", &f, 1, in, 7, out, 4, &n_out));
    static const char *const names[4] = {"next_token", "logprob", "top_ids", "top_logprobs"};
    for (int i = 0; i < 4; i++)
        KILN_TRY(kiln_network_mark_output(net, out[i], names[i]));
    return KILN_OK;
}
