/* The sampling layer of LLM step networks (model.h: kiln_llm_add_sampling).
 * It lives in the network so that the token choice runs where the logits
 * are (on the GPU for a cuda engine, inside the decode step's CUDA graph)
 * and only the sampled ids come back to the host. */
#include <string.h>

#include "../core/error.h"
#include "model.h"

kiln_status kiln_llm_add_sampling(kiln_network *net, int32_t max_batch)
{
    kiln_tensor logits, params, random, next;
    if (kiln_network_find_tensor(net, "logits", &logits) != KILN_OK)
        return kiln_fail(KILN_ERROR_INTERNAL, "LLM build: the step network has no \"logits\" to sample from");
    kiln_dims d = {.rank = 2, .d = {-1, 4}};
    kiln_dims mn = {.rank = 2, .d = {1, 4}}, mx = {.rank = 2, .d = {max_batch, 4}};
    KILN_TRY(kiln_network_add_input(net, "sample_params", KILN_DTYPE_F32, &d, &params));
    KILN_TRY(kiln_network_set_profile_shape(net, 0, "sample_params", &mn, &mn, &mx));
    d.d[1] = mn.d[1] = mx.d[1] = 2;
    KILN_TRY(kiln_network_add_input(net, "sample_random", KILN_DTYPE_I32, &d, &random));
    KILN_TRY(kiln_network_set_profile_shape(net, 0, "sample_random", &mn, &mn, &mx));
    kiln_tensor in[3] = {logits, params, random};
    int32_t n_out = 0;
    KILN_TRY(kiln_network_add_plugin(net, "sample", "Sample", "1", "kiln", NULL, 0, in, 3, &next, 1, &n_out));
    return kiln_network_mark_output(net, next, "next_token");
}
